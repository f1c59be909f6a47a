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
from snippets.gpu_sop.analyzers import THRESHOLD, diagnose, named
from snippets.gpu_sop.programs import FIX, Sizes, programs, record
from snippets.gpu_sop.trace import Trace

# --8<-- [start:trace]
SZ = Sizes()
progs = programs(SZ, "cuda")
for run in progs.values():
    run(2)  # warm-up: cuBLAS, the workers' first batches, the allocator's segments
# 12 steps a program (the first step's wait for its batch is then a few % of the window), 4 of
# the slow ones, the growth once
path = record(progs, os.path.join(tempfile.mkdtemp(prefix="gpu-sop-"), "trace.json"),
              steps={"data": 4, "recompile": 4, "fragment": 1}, default_steps=12)  # fmt: skip
trace = Trace.load(path)
shares = {name: diagnose(trace.window(f"sop:{name}")) for name in progs}
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


times = {name: loop_ms(name) for name in ("healthy", "sync", "pinned", "pageable", "data_fixed")}
times["data"] = loop_ms("data", calls=4)
times["launch"] = host_bound_ms("launch")
times["launch_fixed"] = loop_ms("launch_fixed")
times["small"] = loop_ms("small")
times["small_fixed"] = loop_ms("small_fixed")
times["recompile"] = host_bound_ms("recompile", calls=1)
times["recompile_fixed"] = host_bound_ms("recompile_fixed", calls=8)
times["batch"] = graph_ms(progs["batch"].forward, settle_ms=500.0)
times["batch_fixed"] = graph_ms(progs["batch_fixed"].forward, settle_ms=1500.0)


def reserved(name):
    """Peak reserved and allocated bytes of one growth, beyond what was there before."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_r, base_a = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    progs[name](1)
    out = (torch.cuda.max_memory_reserved() - base_r, torch.cuda.max_memory_allocated() - base_a)
    torch.cuda.empty_cache()
    return out


memory = {name: reserved(name) for name in ("fragment", "fragment_fixed")}
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
