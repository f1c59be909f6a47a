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
    """Copy bandwidth (bytes read + written per second) and bf16 matmul FLOP/s, measured."""
    n = 1 << 30  # 1 GiB source: far larger than the L2
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = time_ms(lambda: dst.copy_(src))
    size = 8192
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)  # random, never zeros
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    mm = time_ms(lambda: a @ b)
    return {
        "copy_bytes_per_s": 2 * n / (copy["median"] * 1e-3),
        "bf16_matmul_flop_per_s": 2 * size**3 / (mm["median"] * 1e-3),
    }


def rate(amount: float, ms: float) -> float:
    """Bytes or FLOPs per second for `amount` done in `ms` milliseconds."""
    return amount / (ms * 1e-3)
