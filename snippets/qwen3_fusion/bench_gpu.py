"""On the H200: one Qwen3-8B layer, eager, per operator and whole."""

from itertools import pairwise

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


def gpu_times(fns, kinds):  # the kernels' own time, summed (CUPTI), in one profiler session:
    # each operator's repeats back to back, 100 ms a repeat, after a settling run inside the
    # session (bench._settle): the first callable, a matmul, 2 s -- after the GPU idled, the clocks
    # of a power-limited GPU drop only after about a second of heavy work; each kind's first 0.5 s;
    # the rest 0.2 s (per_op_table passes the matmuls first, then attention, then the rest)
    settle = [2000.0] + [500.0 if k != before else 200.0 for before, k in pairwise(kinds)]
    return kernel_ms_each(fns, target_ms=100.0, interleave=False, settle_ms=settle)


ceil = ceilings()  # measured in this run: copy bandwidth and bf16 matmul throughput
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
