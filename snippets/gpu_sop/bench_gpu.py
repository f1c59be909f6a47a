"""On the H200 (nox -s gpu_docs): every program of programs.py traced in one torch.profiler
session and diagnosed by every analyzer (the confusion matrix), then each pathology and its fix
timed; writes results/gpu-sop/leaves.json.

Wall time. The first H200 run (d4df628) took 93.3 s; its harness calls took 15.7 s (python_ms
7.36 s in 9 calls, step_ms 3.15 s in 3, graph_ms 3.14 s in 2 plus 2.04 s settling); the rest
has no breakdown (the crash of the CUDA-only test aborted pytest before --durations). Now:
  harness   15.7 - 1.5 (pageable out of python_ms: 123 steps x 12.1 ms)
            + 1.1 (pageable in step_ms: 0.3 s settling + 63 steps x 12.1 ms)       = 15.3 s
  settled() before 8 loop_ms calls, 0.3 s each                                      =  2.4 s
  building and warming up 14 programs (8 workers forked, 2 compiles, 0.5 GiB of
  decode weights); the two fresh processes (interpreter, torch, CUDA context, one
  small profiler session: ~4 s each) run meanwhile, ~1 s left to wait for           =  5   s
  the profiled session: ~0.5 s of work at 8 steps, ~3 s to start, stop, export, read =  3.5 s
  bench_gpu.py                                                                      ~ 26   s
The rest of the post, measured on the 2-core CPU machine: the page's CPU trace (section 2.5)
4.7 s, the gloo demo 3.3 s, the simulated traces and the CLI 0.5 s, the unit tests ~1 s (the
live gloo tests, 3.3 s, repeated the demo and are gone; so is the CUDA-only test that built all
programs again and profiled them in a second session), pytest's start and imports ~6 s:
~42 s of the 60 s budget.
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
# 8 steps a program: the GPU idles only while the first batch is made (prep_s, 1 ms), so a
# healthy loop's data share is at most 1 / (1 + 8 x ~3.5 ms) = 0.034, a third of THRESHOLD;
# 4 of the data stall, 2 of the recompiles (each step is one: the share is ~1 at any count)
path = record(progs, os.path.join(folder, "trace.json"), steps={"data": 4, "recompile": 2},
              default_steps=8)  # fmt: skip
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
