"""On the H200 (nox -s gpu_docs): decode latency eager / CUDA graph / reduce-overhead for two
Qwen3 widths, the training step eager / graph, and graph memory pools; writes
results/cuda-graph/*.json."""

import torch

from snippets.common.results import write_result
from snippets.cuda_graph.measure import (
    MID,
    SMALL,
    compiled_latency,
    decode_latency,
    train_step_times,
)
from snippets.cuda_graph.traps import pool_bytes

# --8<-- [start:run]
DTYPE = torch.bfloat16
BATCHES = (1, 64)  # one graph per bucket, in one shared pool
COMPILED = ("small", 64)  # reduce-overhead once: every new shape or width compiles again
MODELS = (("small", SMALL), ("mid", MID))
decode = {name: decode_latency(cfg, BATCHES, DTYPE) for name, cfg in MODELS}
# (name, config, batch, seq, steps per timed repeat): a repeat takes a few hundred ms
# the small model's eager step is bound by the CPU: the fastest third (python_ms of 15
# repeats of 8 back-to-back steps spread ±12 %); the mid one's is bound by the GPU
TRAIN = (("small", SMALL, 4, 256, 4, True), ("mid", MID, 4, 1024, 1, False))
train = [{"model": n, "batch": b, "seq": s} | train_step_times(c, b, s, DTYPE, calls, fastest)
         for n, c, b, s, calls, fastest in TRAIN]  # fmt: skip
pools = {"shared": pool_bytes(True), "separate": pool_bytes(False)}
# last: torch.compile's workers would share the CPU with the eager timings above
compiled = compiled_latency(dict(MODELS)[COMPILED[0]], COMPILED[1], DTYPE)
# --8<-- [end:run]

# --8<-- [start:record]
rows = [{"model": name} | r | (compiled if (name, r["batch"]) == COMPILED else {})
        for name, rs in decode.items() for r in rs]  # fmt: skip
write_result("cuda-graph", "decode-latency", {"rows": rows})
write_result("cuda-graph", "train-step", {"steps": train})
write_result("cuda-graph", "pool-memory", {f"{k}_mib": v / 2**20 for k, v in pools.items()})
# --8<-- [end:record]
