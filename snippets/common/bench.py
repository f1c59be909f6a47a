"""Benchmark harness: median and p20/p80 times, and the device's measured ceilings.

Every benchmark states its byte or FLOP model; rates are reported against the practical
ceilings measured in the same run (device-to-device copy; dense bf16 matmul), and against
the datasheet peak from data/hardware.yaml.
"""

from __future__ import annotations

import functools

import torch
import triton.testing


def time_ms(fn, *, warmup: int = 100, rep: int = 500) -> dict:
    """Median, p20 and p80 of fn's time in ms (CUDA events; L2 flushed before each call).

    `warmup` and `rep` are milliseconds of running, as in triton.testing.do_bench.
    """
    quantiles = [0.5, 0.2, 0.8]
    median, p20, p80 = triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=quantiles)
    return {"median": median, "p20": p20, "p80": p80}


@functools.cache
def ceilings() -> dict:
    """Practical ceilings, measured: copy bandwidth (bytes read + written per second) and the
    best bf16 matmul FLOP/s over a few large square shapes (random data, never zeros).

    A second of matmuls first lets the clocks leave their idle state, so the first
    measurement of a run is not taken on a cold GPU.
    """
    warm = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    time_ms(lambda: warm @ warm, warmup=1000, rep=100)
    n = 1 << 30  # 1 GiB source: far larger than the L2
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = time_ms(lambda: dst.copy_(src))
    best = 0.0
    for size in (4096, 6144, 8192):
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        best = max(best, 2 * size**3 / (time_ms(lambda: a @ b)["median"] * 1e-3))  # noqa: B023
    return {"copy_bytes_per_s": 2 * n / (copy["median"] * 1e-3), "bf16_matmul_flop_per_s": best}


def rate(amount: float, ms: float) -> float:
    """Bytes or FLOPs per second for `amount` done in `ms` milliseconds."""
    return amount / (ms * 1e-3)
