"""On the GPU (nox -s gpu_docs): this post's kernels against scaled_dot_product_attention's flash
and cuDNN backends and FlexAttention, at 32 K tokens per call; writes results/flash-attention/
attention.json and memory.json.

Wall time of the post on one H200 (budget 60 s from a cold start), estimated from the last
run's profile, scaled by callables and compiles. That run: 103.4 s = this file 66.8 (of which
kernel_ms_each 56.8 = settling 28.5 + warm-up 17.4 + timing and profiler 11.0; kernel_ms_by
1.6; the rest 8.3) + the GPU checks (check.py) 16.3 + the fp16 test 4.4 + the flex fence 3.5 +
the Inductor test 1.4 + pytest, imports and the rest 11.1. The warm-up's 17.4 s: one call and
one sizing call of 60 callables (2 x 1.55 s of GPU time by the model below), cuDNN's 12 plans
(PyTorch caches one per shape and mask, forward and backward; 0.4-0.55 s each as reported in
sgl-project/sglang#4650 and modelscope/FunASR#3704) and FlexAttention's two graphs with the rest
(about 8 s). The model: calls of FLOP / rate with
rate (TFLOP/s, forward / forward + backward, 16 K, no mask) ours 380 / 250, flash 349 / 323,
cuDNN 609 / 549, flex 396 / 330, efficient 200 / 140, x0.9 at 4 K, x0.75 at 1 K, x0.85 causal;
it gives the last run's timing as 11.4 s (measured 11.0 with the profiler).
  checks         16.3 -> 11.6  the mask is a runtime argument: 4 Triton compiles, not 7
                               (about 1.6 s each with its launcher)
  fp16 test       4.4 ->  0.4  its 4 kernels load from Triton's cache
  kernel_ms_each 56.8 -> 14.7
    settling     28.5 ->  2.9  settles(): 0.9 s once (under bench.POWER_MIN_S: no NVML wait,
                               which gave up after 6 s last time), 0.1 s per implementation,
                               cuDNN 0.5 s + its 7 other callables until steady (each at least
                               three 50 ms chunks), instead of all 60 callables
    warm-up      17.4 ->  8.0  cuDNN 6 new plans (3.0 s; the probe built 2 of the 8),
                               FlexAttention one graph for both masks (4.1 s, half of 8.2),
                               2 x 0.46 s of GPU time (32 callables, 16 heads)
    timing        11.0 -> 3.8  7 repeats x max(5 ms, a call): 3.5 s by the model, 0.3 s of
                               profiler (a session with far fewer settling kernels)
  kernel_ms_by    1.6 ->  0.9  half the heads
  rest            8.3 ->  8.3  torch.compile's import, the probes (now at 16 K), peak memory,
                               two records
  flex fence      3.5 ->  3.5
  Inductor test   1.4 ->  0    on the CPU only (the CPU tests cover torch.compile)
  pytest, rest   11.1 -> 11.1
  total         103.4 -> 50.5 s; uncertain by a few seconds (FlexAttention's compile, cuDNN's
                               plans); a timing retried by the harness adds about 3 s
Measured since: 46.7 s (d4df628), 57.7 s (45fbab4, forward with 3 stages). 8 K added after a
do_bench probe put each extra length at 2.5-3.9 s of wall time (cuDNN's 4 plans, the timing).
"""

import torch

from snippets.common.bench import _traced, kernel_ms_by, kernel_ms_each
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result
from snippets.flash_attention.measure import (
    DTYPE,
    HEAD_DIM,
    HEADS,
    LENGTHS,
    TOKENS,
    breakdown,
    implementations,
    measure_tflops,
    naive,
    ours,
    peak_memory,
    settles,
)
from snippets.triton_kernels.measure import peak_bytes_cuda  # the triton-kernels post's meter

# each phase's wall time in the harness's trace (HANDBOOK_BENCH_TRACE): where to cut next
implementations, breakdown, peak_memory = (_traced(f) for f in (implementations, breakdown,
                                                                 peak_memory))  # fmt: skip

# --8<-- [start:run]
# TOKENS, HEADS, HEAD_DIM, DTYPE, LENGTHS come from measure.py; check.py has already compiled
# what this runs and built cuDNN's plans for these shapes (warm.py)
MEMORY_LENGTHS = (1024, 2048, 4096)  # naive attention's peak grows as n^2
TIMED = ("ours", "flash", "flex", "cudnn")  # cuDNN last: the one whose clocks need settling
gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()} is not in data/hardware.yaml")


def gpu_times(fns, kinds):  # the kernels' own time (CUPTI), one profiler session, about 5 ms
    # per repeat; each callable's repeats back to back (interleave=False), one implementation
    # after another, each after the settling run settles() gives it; one warm-up call
    # (FlexAttention's trace, kernels loaded from the disk caches)
    return kernel_ms_each(fns, target_ms=5.0, warmup=1, interleave=False, settle_ms=settles(kinds))


probe = (TOKENS // LENGTHS[-1], HEADS, LENGTHS[-1], HEAD_DIM)  # a benchmarked shape
impls, missing = implementations((*TIMED, "efficient"), "cuda", probe)
untimed = [name for name in impls if name not in TIMED]  # efficient: checked, not timed
timed = {name: impls[name] for name in TIMED if name in impls}
rows, wide = measure_tflops(LENGTHS, TOKENS, HEADS, HEAD_DIM, "cuda", DTYPE, gpu_times,
                            gpu.bf16_dense_tflops, timed)  # fmt: skip
split = breakdown(LENGTHS[-1], TOKENS, HEADS, HEAD_DIM, "cuda", DTYPE, kernel_ms_by)
memory = peak_memory(MEMORY_LENGTHS, TOKENS, HEADS, HEAD_DIM, "cuda", DTYPE, peak_bytes_cuda,
                     {"ours": ours, "naive": naive})  # fmt: skip
# --8<-- [end:run]

# --8<-- [start:record]
write_result("flash-attention", "attention", {
    "gpu": gpu.name, "peak_tflops": gpu.bf16_dense_tflops,
    "unavailable": "; ".join(f"{k}: {why}" for k, why in missing.items()) or "无",
    "untimed": ", ".join(untimed) or "无",
    "rows": rows, "wide": wide, "breakdown": split,
})  # fmt: skip
write_result("flash-attention", "memory", {"rows": memory})
# --8<-- [end:record]
