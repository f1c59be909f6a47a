"""On the GPU: bf16 matmuls of two families of shapes, timed as CUDA-graph replays, rated
against the datasheet roofline and against this run's measured ceilings."""

import torch

from snippets.common.bench import ceilings, graph_ms
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result
from snippets.metrics.measure import matmul_sweep

# --8<-- [start:measure]
FIRST_SETTLE = iter([2000.0])  # ms: the first shape's settling; every later shape's: 500


def timer(fn):
    """CUDA-graph replays of back-to-back calls, about 100 ms a replay: long enough to average
    out the clock changes of a power-limited GPU under large matmuls. The smallest matmuls take
    microseconds: a replay may hold up to 4000 of them (at 2000, the 2048³ matmul's replays
    lasted 50 ms and spread ±6 %). Settling: the first shape 2 s (the GPU may have idled
    while the post started), each later one 0.5 s and until three replays agree within ±2 %
    (after other work the clocks reached their new state within 0.2 s)."""
    return graph_ms(fn, target_ms=100.0, max_calls=4000, settle_ms=next(FIRST_SETTLE, 500.0))


gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()!r} has no entry in data/hardware.yaml")
peak, bandwidth = gpu.bf16_dense_tflops * 1e12, gpu.hbm_tb_per_s * 1e12  # datasheet roofline
# ceilings(): measured in this run, a large copy and an 8192³ bf16 matmul
write_result("metrics", "matmul-roofline", matmul_sweep(timer, peak, bandwidth, ceilings()))
# --8<-- [end:measure]
