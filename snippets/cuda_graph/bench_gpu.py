"""On the H200 (nox -s gpu_docs): decode latency eager / CUDA graph / reduce-overhead for two
Qwen3 widths, the training step eager / graph, and graph memory pools; writes
results/cuda-graph/*.json."""

import torch

from snippets.common.bench import step_ms
from snippets.common.hostbound import fastest_interleaved
from snippets.common.results import write_result
from snippets.cuda_graph.measure import (
    MID,
    SMALL,
    TRAIN_CALLS,
    compiled_latency,
    decode_steps,
    latency_row,
    train_row,
    train_step,
)
from snippets.cuda_graph.traps import pool_bytes

# --8<-- [start:run]
DTYPE = torch.bfloat16
BATCHES = (1, 64)  # one graph per bucket, in one shared pool
COMPILED = ("small", 64)  # reduce-overhead once: every new shape or width compiles again
MODELS = (("small", SMALL), ("mid", MID))
steps = {(name, *key): step for name, cfg in MODELS
         for key, step in decode_steps(cfg, BATCHES, DTYPE).items()}  # fmt: skip
eager, graph = train_step(SMALL, 4, 256, DTYPE)  # batch 4 x 256 tokens
steps["train", "small", "eager"] = (eager, TRAIN_CALLS["small"])
steps["train", "small", "graph"] = (graph, TRAIN_CALLS["small"])
# every step the host's speed moves, round by round over one window: ~15 s
host = fastest_interleaved(steps)
# the 8B-wide training step is bound by the GPU (~85 ms): all 15 repeats
eager, graph = train_step(MID, 4, 1024, DTYPE)  # batch 4 x 1024 tokens
mid_train = (step_ms(eager, calls=TRAIN_CALLS["mid"], settle_s=1.0),
             step_ms(graph, calls=TRAIN_CALLS["mid"], settle_s=0.25))  # fmt: skip
pools = {"shared": pool_bytes(True), "separate": pool_bytes(False)}
# last: torch.compile's workers would share the CPU with the eager timings above
compiled = compiled_latency(dict(MODELS)[COMPILED[0]], COMPILED[1], DTYPE)
# --8<-- [end:run]

# --8<-- [start:record]
rows = [{"model": name} | latency_row(b, host[name, b, "eager"], host[name, b, "graph"])
        | (compiled if (name, b) == COMPILED else {})
        for name, _ in MODELS for b in BATCHES]  # fmt: skip
train = [{"model": "small", "batch": 4, "seq": 256}
         | train_row(host["train", "small", "eager"], host["train", "small", "graph"]),
         {"model": "mid", "batch": 4, "seq": 1024} | train_row(*mid_train)]  # fmt: skip
write_result("cuda-graph", "decode-latency", {"rows": rows})
write_result("cuda-graph", "train-step", {"steps": train})
write_result("cuda-graph", "pool-memory", {f"{k}_mib": v / 2**20 for k, v in pools.items()})
# --8<-- [end:record]
