"""On the H200: one Qwen3-8B layer, per operator and whole, eager and torch.compile."""

import torch

from snippets.common.bench import ceilings, time_ms
from snippets.common.results import write_result
from snippets.qwen3_fusion.accounting import layer_ops
from snippets.qwen3_fusion.measure import (
    fusion_candidates,
    layer_step,
    per_op_table,
    profile_step,
)
from snippets.qwen3_fusion.model import QWEN3_8B

# --8<-- [start:run]
BATCH, SEQ, DTYPE = 2, 4096, torch.bfloat16
SOURCES = [
    "snippets/qwen3_fusion/bench_gpu.py",
    "snippets/qwen3_fusion/measure.py",
    "snippets/qwen3_fusion/accounting.py",
    "snippets/qwen3_fusion/model.py",
]
ceil = ceilings()
rows = per_op_table(
    QWEN3_8B, BATCH, SEQ, "cuda", DTYPE, lambda f: time_ms(f, warmup=25, rep=200), ceil
)
by_name = {r["op"]: r for r in rows}

profiles = []
for mode, compiled in (("eager", False), ("torch.compile", True)):
    step = layer_step(QWEN3_8B, BATCH, SEQ, "cuda", DTYPE, compiled=compiled)
    prof = profile_step(step)
    prof["step_ms"] = time_ms(step, warmup=100, rep=500)["median"]
    total = prof["matmul_ms"] + prof["attention_ms"] + prof["memory-bound_ms"]
    prof["memory_share"] = prof["memory-bound_ms"] / total
    profiles.append({"mode": mode, **prof})
    del step
    torch.cuda.empty_cache()

candidates = fusion_candidates(QWEN3_8B, BATCH, SEQ, by_name, ceil["copy_bytes_per_s"])
eager_step = profiles[0]["step_ms"]
for c in candidates:
    c["of_layer_step"] = c["saving_ms"] / eager_step
# --8<-- [end:run]

# --8<-- [start:record]
shape = f"{BATCH}×{SEQ} token，bf16，Qwen3-8B 一层"
common = {"sources": SOURCES}
write_result(
    "qwen3-fusion",
    "layer-ops",
    title=f"逐算子实测（{shape}，eager，前向/反向分别计时）",
    model="FLOP 与字节按 accounting.py：每个算子读一次输入、写一次输出（bf16）",
    values={
        "copy_tb_s": ceil["copy_bytes_per_s"] / 1e12,
        "matmul_tflops": ceil["bf16_matmul_flop_per_s"] / 1e12,
        "n_ops": len(layer_ops(QWEN3_8B, BATCH, SEQ)),
    },
    table={
        "columns": [
            {"key": "idx", "label": "#"},
            {"key": "op", "label": "算子"},
            {"key": "intensity", "label": "FLOP/B", "format": ".1f"},
            {"key": "fwd_ms", "label": "前向 ms", "format": ".3f"},
            {"key": "bwd_ms", "label": "反向 ms", "format": ".3f"},
            {"key": "fwd_tflops", "label": "前向 TFLOP/s", "format": ".1f"},
            {"key": "fwd_of_copy", "label": "前向占拷贝带宽", "format": ".0%"},
            {"key": "bwd_of_copy", "label": "反向占拷贝带宽", "format": ".0%"},
        ],
        "rows": rows,
    },
    plot={
        "kind": "roofline",
        "x": "intensity",
        "y": "fwd_tflops",
        "label": "idx",
        "peak_tflops": ceil["bf16_matmul_flop_per_s"] / 1e12,
        "bandwidth_tb_s": ceil["copy_bytes_per_s"] / 1e12,
        "x_label": "算术强度 (FLOP/B)",
        "y_label": "前向实测 TFLOP/s",
    },
    **common,
)
write_result(
    "qwen3-fusion",
    "layer-profile",
    title=f"一层前向 + 反向的 torch.profiler 分解（{shape}）",
    model="按 kernel 名归类：GEMM、注意力、其余（逐元素、归约、拷贝：受带宽约束）",
    values={
        "eager_step_ms": profiles[0]["step_ms"],
        "compiled_step_ms": profiles[1]["step_ms"],
        "eager_kernels": profiles[0]["kernels"],
        "compiled_kernels": profiles[1]["kernels"],
        "eager_memory_share": profiles[0]["memory_share"],
        "compiled_memory_share": profiles[1]["memory_share"],
    },
    table={
        "columns": [
            {"key": "mode", "label": "模式"},
            {"key": "step_ms", "label": "每步 ms", "format": ".2f"},
            {"key": "kernels", "label": "kernel 数/步", "format": ".0f"},
            {"key": "matmul_ms", "label": "GEMM ms", "format": ".2f"},
            {"key": "attention_ms", "label": "注意力 ms", "format": ".2f"},
            {"key": "memory-bound_ms", "label": "带宽型 ms", "format": ".2f"},
            {"key": "memory_share", "label": "带宽型占比", "format": ".0%"},
        ],
        "rows": profiles,
    },
    **common,
)
write_result(
    "qwen3-fusion",
    "fusion-candidates",
    title="融合候选排序：每层前向 + 反向最多能省的时间",
    model="上限 = eager 实测时间 − 融合后 kernel 只读一次输入、写一次输出所需字节 ÷ 实测拷贝带宽",
    values={
        "top": candidates[0]["fusion"],
        "top_saving_ms": candidates[0]["saving_ms"],
        # the add + RMSNorm fusion contains the plain RMSNorm one: count it once
        "disjoint_saving_share": sum(
            c["of_layer_step"] for c in candidates if not c["fusion"].startswith("RMSNorm")
        ),
    },
    table={
        "columns": [
            {"key": "fusion", "label": "融合"},
            {"key": "eager_ms", "label": "eager ms/层", "format": ".3f"},
            {"key": "floor_ms", "label": "字节下限 ms/层", "format": ".3f"},
            {"key": "saving_ms", "label": "最多省 ms/层", "format": ".3f"},
            {"key": "of_layer_step", "label": "占一层 eager 步时", "format": ".1%"},
        ],
        "rows": candidates,
    },
    plot={"x": "fusion", "y": "saving_ms", "x_label": "融合", "y_label": "最多省 ms/层"},
    **common,
)
# --8<-- [end:record]
