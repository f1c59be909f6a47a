"""On the GPU (nox -s gpu_docs): this post's kernels against scaled_dot_product_attention with
each backend and FlexAttention, at 32 K tokens per call; writes results/flash-attention/
attention.json and memory.json."""

import torch

from snippets.common.bench import kernel_ms_by, kernel_ms_each
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result
from snippets.flash_attention.measure import (
    IMPLS,
    breakdown,
    implementations,
    measure_tflops,
    naive,
    ours,
    peak_memory,
)
from snippets.triton_kernels.measure import peak_bytes_cuda  # the triton-kernels post's meter

# --8<-- [start:run]
TOKENS, HEADS, HEAD_DIM, DTYPE = 32768, 32, 128, torch.bfloat16  # 32 heads x 128 = hidden 4096
LENGTHS = (1024, 4096, 16384)  # batch = TOKENS / length: 32, 8 and 2 sequences
MEMORY_LENGTHS = (1024, 2048, 4096)  # naive attention at 8 K: more n x n tensors than 141 GB
gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()} is not in data/hardware.yaml")


def gpu_times(fns):  # the kernels' own time (CUPTI), one profiler session, about 5 ms per repeat;
    # each callable's repeats back to back after a settling run of it (bench._settle): the first
    # at least 2 s (after idle, a power-limited GPU's clocks drop only after a second or more of
    # heavy work), the rest at least 30 ms and until three 50 ms chunks agree; timed in turn, the
    # slowest backend's long kernels spread ±5-10 % (the clocks followed the previous kernel).
    # One warm-up call (compiles, cuDNN plans)
    settle = [2000.0] + [30.0] * (len(fns) - 1)
    return kernel_ms_each(fns, target_ms=5.0, warmup=1, interleave=False, settle_ms=settle)


impls, missing = implementations(IMPLS, "cuda")
rows, wide = measure_tflops(LENGTHS, TOKENS, HEADS, HEAD_DIM, "cuda", DTYPE, gpu_times,
                            gpu.bf16_dense_tflops, impls)  # fmt: skip
split = breakdown(LENGTHS[-1], TOKENS, HEADS, HEAD_DIM, "cuda", DTYPE, kernel_ms_by)
memory = peak_memory(MEMORY_LENGTHS, TOKENS, HEADS, HEAD_DIM, "cuda", DTYPE, peak_bytes_cuda,
                     {"ours": ours, "naive": naive})  # fmt: skip
# --8<-- [end:run]

# --8<-- [start:record]
write_result("flash-attention", "attention", {
    "gpu": gpu.name, "peak_tflops": gpu.bf16_dense_tflops,
    "unavailable": "; ".join(f"{k}: {why}" for k, why in missing.items()) or "无",
    "rows": rows, "wide": wide, "breakdown": split,
})  # fmt: skip
write_result("flash-attention", "memory", {"rows": memory})
# --8<-- [end:record]
