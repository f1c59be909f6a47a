"""On the H200 (nox -s gpu_docs): every program of programs.py traced in one torch.profiler
session and diagnosed by every analyzer (the confusion matrix), then each pathology and its fix
timed; writes results/gpu-sop/leaves.json.

Wall time, estimated from the sizes (no GPU run yet): building the programs ~3 s (eight
DataLoader workers forked, two first compiles, 0.5 GiB of decode weights), the profiled session
~1 s of work plus ~2 s to start, stop, export and read back the trace, the timings ~12 s (six
training loops ~0.8 s each after a short warm-up, the rest under 1 s each, the decode pair
~2.5 s with its settling): about 20 s. The whole post in gpu_docs adds pytest's start and
imports (~5 s), the page's and the tests' gloo runs (~7 s) and their CPU traces (~5 s): ~40 s
of the 60 s budget.
"""

import os
import tempfile

import torch

from snippets.common.bench import graph_ms, python_ms, step_ms
from snippets.common.results import write_result
from snippets.gpu_sop.analyzers import THRESHOLD, diagnose, missing_fields, named
from snippets.gpu_sop.programs import (
    FIX,
    FRESH,
    Sizes,
    fresh_result,
    in_fresh_process,
    programs,
    record,
)
from snippets.gpu_sop.synthetic import SIMULATED
from snippets.gpu_sop.trace import Trace

# --8<-- [start:trace]
SZ = Sizes()
folder = tempfile.mkdtemp(prefix="gpu-sop-")
# the allocator's setting is fixed when CUDA starts: each side of the fragmentation pair in a
# process of its own, started first so that it overlaps building the others
fresh = {name: in_fresh_process(name, folder, SZ) for name in sorted(FRESH)}
progs = programs(SZ, "cuda")
for run in progs.values():
    run(2)  # warm-up: cuBLAS, the workers' first batches
grown = {name: fresh_result(proc, name, folder) for name, proc in fresh.items()}
# 12 steps a training loop (the first step's wait for its batch is then a few % of the window),
# 4 of the data stall, 2 of the recompiles (each step is one: its share is ~1 at any count)
path = record(progs, os.path.join(folder, "trace.json"), steps={"data": 4, "recompile": 2},
              default_steps=12)  # fmt: skip
trace = Trace.load(path)
windows = {name: trace.window(f"sop:{name}") for name in progs}
windows |= {name: Trace.load(g["trace"]).window(f"sop:{name}") for name, g in grown.items()}
if missing := missing_fields(windows, SZ.decode_d):
    raise RuntimeError(f"{path}: the trace lacks what the analyzers read: {missing}")
shares = {name: diagnose(windows[name]) for name in SIMULATED}  # the page's order
# --8<-- [end:trace]


# --8<-- [start:time]
def settled(run, seconds=0.3):
    """Run a loop for a moment first: the GPU's clocks and the host reach the state the timed
    repeats see (after idle, matmuls ran fast for the first fraction of a second)."""
    t0 = torch.cuda.Event(enable_timing=True)
    t0.record()
    end = torch.cuda.Event(enable_timing=True)
    while True:
        run(1)
        end.record()
        end.synchronize()
        if t0.elapsed_time(end) > seconds * 1e3:
            return run


def loop_ms(name, calls=8):  # ms per step of a loop, seen from Python (no sync between steps)
    run = settled(progs[name])
    return python_ms(lambda: run(1), calls=calls)


def host_bound_ms(name, calls=4):  # a CPU-bound step: the fastest third of 15 repeats
    return step_ms(lambda: progs[name](1), calls=calls, repeats=5, settle_s=0.3, fastest=True)


times = {name: loop_ms(name) for name in ("healthy", "sync", "pinned", "data_fixed")}
# a copy from pageable memory waits for the stream, then the host copies 64 MiB through a
# staging buffer: each step is already synchronous and bound by the host's memcpy, whose speed
# moved from repeat to repeat (±9 % over 15 repeats of 8 steps from Python)
times["pageable"] = host_bound_ms("pageable")
times["data"] = loop_ms("data", calls=4)
times["launch"] = host_bound_ms("launch")
times["launch_fixed"] = loop_ms("launch_fixed")
times["small"] = loop_ms("small")
times["small_fixed"] = loop_ms("small_fixed")
times["recompile"] = host_bound_ms("recompile", calls=1)
times["recompile_fixed"] = host_bound_ms("recompile_fixed", calls=8)
times["batch"] = graph_ms(progs["batch"].forward, settle_ms=500.0)
times["batch_fixed"] = graph_ms(progs["batch_fixed"].forward, settle_ms=1500.0)


memory = {name: (g["reserved"], g["allocated"]) for name, g in grown.items()}  # peak bytes
# --8<-- [end:time]

# --8<-- [start:record]
UNIT = {"batch": "forward"}  # per token: a forward / its batch
rows = []
for name, s in shares.items():
    leaf = name if name in FIX else None
    kind = "pathology" if leaf else "healthy" if name == "healthy" else "fix"
    others = max(v for k, v in s.items() if k != leaf)
    rows.append({"program": name, "kind": kind, **s, "named": ", ".join(named(s)) or "—",
                 "own": s[leaf] if leaf else None, "others": others})  # fmt: skip
costs = []
for leaf, fix in FIX.items():
    if leaf == "fragment":
        continue
    sick, fixed = times[leaf], times[fix]
    per = SZ.big_batch / SZ.small_batch if leaf == "batch" else 1  # batch: per token
    costs.append({"leaf": leaf, "fix": fix, "unit": UNIT.get(leaf, "step"),
                  "sick_ms": sick, "fixed_ms": fixed, "gain": sick * per / fixed})  # fmt: skip
(sick_r, sick_a), (fixed_r, _) = memory["fragment"], memory["fragment_fixed"]
write_result("gpu-sop", "leaves", {
    "threshold": THRESHOLD, "rows": rows, "costs": costs,
    "fragment": {"reserved_gib": sick_r / 2**30, "fixed_gib": fixed_r / 2**30,
                 "allocated_gib": sick_a / 2**30, "gain": sick_r / fixed_r},
})  # fmt: skip
# --8<-- [end:record]
