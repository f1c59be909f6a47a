"""One side of the fragmentation comparison in a process of its own (programs.in_fresh_process
starts it with the allocator setting in its environment, so torch reads it when CUDA starts):
`python -m snippets.gpu_sop.fresh fragment|fragment_fixed FOLDER GROW_MIB GROWS` warms the
growth up once, records it in a torch.profiler session (FOLDER/NAME.trace.json) and measures
its peak bytes; writes FOLDER/NAME.json."""

import json
import os
import sys

import torch

from snippets.gpu_sop.programs import FRESH, Sizes, growing, peak_growth, record


# --8<-- [start:fresh]
def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in FRESH:
        print(__doc__, file=sys.stderr)
        return 2
    name, folder, grow_mib, grows = argv[0], argv[1], int(argv[2]), int(argv[3])
    run = growing(Sizes(grow_mib=grow_mib, grows=grows), torch.device("cuda"),
                  expandable=name == "fragment_fixed")  # fmt: skip
    run(1)  # warm-up: CUDA's context, the allocator's first segment
    torch.cuda.empty_cache()  # the growth starts from an empty cache, as in a fresh process
    trace = record({name: run}, os.path.join(folder, f"{name}.trace.json"), default_steps=1)
    reserved, allocated = peak_growth(run)
    with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump({"trace": str(trace), "reserved": reserved, "allocated": allocated}, f)
    return 0


# --8<-- [end:fresh]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
