"""Measured on the GPU: achieved bf16 matmul FLOP/s over a sweep of shapes, against the roofline."""

import torch

from snippets.common.bench import ceilings, rate, time_ms
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result
from snippets.metrics.roofline import (
    arithmetic_intensity,
    attainable_flops,
    matmul_bytes,
    matmul_flops,
)

# --8<-- [start:shapes]
SQUARE = [(n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)]
# Skinny: m tokens through Qwen3-8B's MLP up-projection (k = 4096 -> n = 12288), decode to prefill.
SKINNY = [(m, 12288, 4096) for m in (1, 16, 64, 256, 1024)]


def measure(m: int, n: int, k: int, peak: float, bandwidth: float) -> dict:
    """Median time of a bf16 (m x k) @ (k x n) and its rates against the roofline."""
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)  # random data, never zeros
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    t = time_ms(lambda: a @ b, warmup=25, rep=100)
    flops, moved = matmul_flops(m, n, k), matmul_bytes(m, n, k)
    intensity = arithmetic_intensity(flops, moved)
    achieved = rate(flops, t["median"])
    bound = attainable_flops(intensity, peak, bandwidth)
    return {
        "shape": f"{n}³" if m == n == k else f"m={m}",  # short labels for the plot's x axis
        "intensity": intensity,
        "us": t["median"] * 1e3,
        "tflops": achieved / 1e12,
        "roofline_tflops": bound / 1e12,
        "of_roofline": achieved / bound,
        "of_matmul_ceiling": achieved / ceilings()["bf16_matmul_flop_per_s"],
    }


# --8<-- [end:shapes]


# --8<-- [start:measure]
gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()!r} has no entry in data/hardware.yaml")
peak, bandwidth = gpu.bf16_dense_tflops * 1e12, gpu.hbm_tb_per_s * 1e12
rows = [measure(m, n, k, peak, bandwidth) for m, n, k in SQUARE + SKINNY]
by_shape = {r["shape"]: r for r in rows}
SHAPE_LABEL = "形状（n³ 或 m×12288×4096）"
write_result(
    "metrics",
    "matmul-roofline",
    title="bf16 矩阵乘：实测 TFLOP/s 与屋顶线上限（方阵 n³；m=… 为 m×12288×4096）",
    model=(
        "FLOPs = 2mnk；字节 = 2(mk + kn + mn)（A、B 各读一次，C 写一次）；"
        "屋顶线上限 = min(峰值, 算术强度 × HBM 带宽)，峰值与带宽取自 data/hardware.yaml"
    ),
    values={
        "gpu_id": gpu.id,
        "datasheet_bf16_tflops": gpu.bf16_dense_tflops,
        "hbm_tb_per_s": gpu.hbm_tb_per_s,
        "ridge_flop_per_byte": peak / bandwidth,
        "matmul_ceiling_tflops": ceilings()["bf16_matmul_flop_per_s"] / 1e12,
        "best_tflops": max(r["tflops"] for r in rows),
        "square_8192_tflops": by_shape["8192³"]["tflops"],
        "square_8192_of_roofline": by_shape["8192³"]["of_roofline"],
        "square_256_of_roofline": by_shape["256³"]["of_roofline"],
        "decode_m1_tflops": by_shape["m=1"]["tflops"],
        "decode_m1_of_roofline": by_shape["m=1"]["of_roofline"],
        "decode_m1_tb_per_s": matmul_bytes(1, 12288, 4096) / (by_shape["m=1"]["us"] * 1e-6) / 1e12,
    },
    table={
        "columns": [
            {"key": "shape", "label": "形状"},
            {"key": "intensity", "label": "算术强度 (FLOP/B)", "format": ".1f"},
            {"key": "us", "label": "时间 (µs, 中位数)", "format": ".1f"},
            {"key": "tflops", "label": "实测 TFLOP/s", "format": ".1f"},
            {"key": "roofline_tflops", "label": "屋顶线上限 TFLOP/s", "format": ".1f"},
            {"key": "of_roofline", "label": "占屋顶线", "format": ".0%"},
            {"key": "of_matmul_ceiling", "label": "占实测矩阵乘上限", "format": ".0%"},
        ],
        "rows": rows,
    },
    plot=[
        {
            "kind": "roofline",  # the datasheet roofline of data/hardware.yaml, one point per shape
            "x": "intensity",
            "y": "tflops",
            "label": "shape",
            "peak_tflops": gpu.bf16_dense_tflops,
            "bandwidth_tb_s": gpu.hbm_tb_per_s,
            "x_label": "算术强度 (FLOP/B)",
            "y_label": "实测 TFLOP/s",
        },
        {"x": "shape", "y": "of_roofline", "x_label": SHAPE_LABEL, "y_label": "占屋顶线上限"},
    ],
    sources=[
        "snippets/metrics/bench_matmul.py",
        "snippets/metrics/roofline.py",
        "snippets/metrics/qwen3.py",
        "snippets/common/hardware.py",
        "data/hardware.yaml",
    ],
)
# --8<-- [end:measure]
