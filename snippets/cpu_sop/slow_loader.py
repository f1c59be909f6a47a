"""A training loop whose DataLoader workers tokenize in __getitem__ (the planted fault), and a
report of where a profile says the time went: `python -m snippets.cpu_sop.slow_loader` runs the
loop; `python -m snippets.cpu_sop.slow_loader PROFILE` reads a py-spy raw or a cProfile file."""

import pstats
import sys
from pathlib import Path

from torch.utils.data import DataLoader

from snippets.cli_toolkit.stacks import LINE, frame_name
from snippets.cpu_sop.loader import Tokens


# --8<-- [start:loop]
def main(batches: int = 25) -> None:
    loader = DataLoader(Tokens(100_000, seq=1024, work="tokenize"), batch_size=32, num_workers=2)
    for i, _ in enumerate(loader):
        if i == batches:
            break


GETITEM = "Tokens.__getitem__ (loader.py)"


def share_in_getitem(path: Path) -> float:
    """Share of the workers' time spent inside Tokens.__getitem__. py-spy --subprocesses puts
    one `process` frame per level at the root of each stack: a worker's stacks have two. A
    cProfile file sees only the main process: its share of time in __getitem__ is returned."""
    if path.suffix == ".prof":  # cumulative time of __getitem__ over the whole run
        stats = pstats.Stats(str(path)).stats
        total = sum(v[2] for v in stats.values())  # tottime sums to the whole run
        inside = sum(v[3] for (f, _, name), v in stats.items()
                     if name == "__getitem__" and Path(f).name == "loader.py")  # fmt: skip
        return inside / total
    workers = inside = 0
    for i, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = LINE.match(raw.rstrip())
        if not m:
            raise ValueError(f"{path}:{i}: not a collapsed stack 'f1;f2;... <samples>': {raw!r}")
        frames = [frame_name(f, f"{path}:{i}") for f in m["stack"].split(";") if f.strip()]
        if frames.count("(process)") >= 2:
            workers += int(m["count"])
            inside += int(m["count"]) * (GETITEM in frames)
    if not workers:
        raise ValueError(f"{path}: no samples from worker processes (record with --subprocesses)")
    return inside / workers


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = Path(sys.argv[1])
        share = share_in_getitem(path)
        who = "main process (cProfile)" if path.suffix == ".prof" else "workers (py-spy)"
        print(f"{who}: most of the time in Tokens.__getitem__: {share > 0.5}")
    else:
        main()
# --8<-- [end:loop]
