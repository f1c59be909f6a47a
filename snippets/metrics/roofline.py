"""Hardware metrics: arithmetic intensity, roofline, ridge point, collective algbw / busbw."""

from __future__ import annotations

from snippets.common.hardware import load_hardware, ridge_point
from snippets.common.results import computed_result
from snippets.metrics.qwen3 import QWEN3_8B, qwen3_params


# --8<-- [start:roofline]
def matmul_flops(m: int, n: int, k: int) -> int:
    """C[m,n] = A[m,k] @ B[k,n]: one multiply and one add per (i, j, l)."""
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, bytes_per_element: int = 2) -> int:
    """Minimum HBM traffic: read A and B once, write C once (bf16: 2 bytes each)."""
    return bytes_per_element * (m * k + k * n + m * n)


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte of memory traffic."""
    return flops / bytes_moved


def attainable_flops(intensity: float, peak_flops: float, bandwidth: float) -> float:
    """Roofline (Williams, Waterman & Patterson, CACM 2009): min(peak, intensity x bandwidth)."""
    return min(peak_flops, intensity * bandwidth)


# --8<-- [end:roofline]

# --8<-- [start:h200]
h200 = load_hardware()["h200-sxm"]
peak, bandwidth = h200.bf16_dense_tflops * 1e12, h200.hbm_tb_per_s * 1e12
ridge = ridge_point(h200)  # FLOP per byte where the two roofs meet (dense BF16 / HBM)
print(round(ridge))
#> 206
up_proj = {}  # tokens in a batch -> intensity of Qwen3-8B's MLP up-projection 4096 -> 12288
for m in (1, 16, 256, 4096):
    up_proj[m] = arithmetic_intensity(matmul_flops(m, 12288, 4096), matmul_bytes(m, 12288, 4096))
    print(m, round(up_proj[m], 1), round(attainable_flops(up_proj[m], peak, bandwidth) / peak, 3))
    #> 1 1.0 0.005
    #> 16 15.9 0.077
    #> 256 236.3 1.0
    #> 4096 1755.4 1.0
# --8<-- [end:h200]

# --8<-- [start:decode]
# Qwen3-8B decode at batch 1: every step reads all matmul weights once (bf16), ~1 FLOP per byte.
weights = 2 * qwen3_params(QWEN3_8B)["matmul"]  # bytes: layers + lm_head, 2 bytes each
print(round(weights / bandwidth * 1e3, 2))  # ms per token at full HBM bandwidth: a TPOT floor
#> 3.15
# --8<-- [end:decode]


# --8<-- [start:busbw]
def bus_factor(op: str, n: int) -> float:
    """nccl-tests doc/PERFORMANCE.md: busbw = algbw x factor, for n ranks."""
    factors = {
        "all_reduce": 2 * (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "all_gather": (n - 1) / n,
        "all_to_all": (n - 1) / n,
        "broadcast": 1.0,
        "reduce": 1.0,
    }
    return factors[op]


def algbw(size_bytes: float, seconds: float) -> float:
    """S / t. For all-gather and reduce-scatter S is the WHOLE array (count per rank x n)."""
    return size_bytes / seconds


def busbw(algbw_bytes_per_s: float, n: int, op: str) -> float:
    """Bus bandwidth: comparable with the link's peak, whatever the number of ranks."""
    return algbw_bytes_per_s * bus_factor(op, n)


# --8<-- [end:busbw]

# --8<-- [start:busbw_demo]
grads = 2 * qwen3_params(QWEN3_8B)["total"]  # Qwen3-8B gradients in bf16, bytes
for n in (2, 8, 64):  # bytes each rank sends (= receives) in an optimal all-reduce: S x 2(n-1)/n
    print(n, round(grads * bus_factor("all_reduce", n) / 1e9, 2), "GB")
    #> 2 16.38 GB
    #> 8 28.67 GB
    #> 64 32.25 GB
# --8<-- [end:busbw_demo]

# The figures the page quotes, checked on every run (results/metrics/qwen3-roofline.json).
computed_result(
    "metrics",
    "qwen3-roofline",
    {
        "ridge_flop_per_byte": ridge,
        "up_proj": [
            {"m": m, "intensity": ai, "of_peak": attainable_flops(ai, peak, bandwidth) / peak}
            for m, ai in up_proj.items()
        ],
        "decode_floor_ms": weights / bandwidth * 1e3,
        "decode_max_tokens_per_s": bandwidth / weights,
        "grads_gb": grads / 1e9,
    },
)
