"""On the H200: one Qwen3-8B layer, eager, per operator and whole."""

import time

import torch

from snippets.common.bench import ceilings, kernel_ms_each
from snippets.common.models.qwen3 import QWEN3_8B
from snippets.common.results import write_result
from snippets.qwen3_fusion.measure import (
    fusion_candidates,
    layer_step,
    per_op_table,
    profile_step,
)

# --8<-- [start:run]
BATCH, SEQ, DTYPE = 2, 4096, torch.bfloat16


def gpu_times(fns):  # the kernels' own time, summed (CUPTI), in one profiler session: each
    # operator's repeats back to back, after 200 ms of it inside the session; 100 ms a repeat.
    # Without the settling run, a matmul's first repeats ran about 10 % fast (the clocks of a
    # power-limited GPU still held the state of the operator before, or of the idle GPU)
    return kernel_ms_each(fns, target_ms=100.0, interleave=False, settle_ms=200.0)


ceil = ceilings()  # measured in this run: copy bandwidth and bf16 matmul throughput
a = torch.randn(8192, 8192, device="cuda", dtype=DTYPE)
t0 = time.perf_counter()
while time.perf_counter() - t0 < 2.0:  # two seconds of matmuls: the clocks reach the state
    a @ a  # they hold under load (the ceilings, now measured once a run, used to do this here)
    torch.cuda.synchronize()
del a
ops = per_op_table(QWEN3_8B, BATCH, SEQ, "cuda", DTYPE, gpu_times, ceil)
classes = profile_step(layer_step(QWEN3_8B, BATCH, SEQ, "cuda", DTYPE))
layer_ms = sum(c["ms"] for c in classes)  # the layer's kernel time per step
by_op = {r["op"]: r for r in ops}
candidates = fusion_candidates(QWEN3_8B, BATCH, SEQ, by_op, ceil["copy_bytes_per_s"], layer_ms)
# --8<-- [end:run]

# --8<-- [start:record]
write_result(
    "qwen3-fusion",
    "layer-ops",
    {
        "copy_tb_s": ceil["copy_bytes_per_s"] / 1e12,
        "matmul_tflops": ceil["bf16_matmul_flop_per_s"] / 1e12,
        "ops": ops,
    },
)
write_result("qwen3-fusion", "layer-profile", {"classes": classes})
write_result("qwen3-fusion", "fusion-candidates", {"candidates": candidates})
# --8<-- [end:record]
