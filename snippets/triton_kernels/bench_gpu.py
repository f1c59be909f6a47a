"""On the GPU (nox -s gpu_docs): the kernels at Qwen3-8B shapes against eager PyTorch,
torch.compile and Liger Kernel (when installed); writes results/triton-kernels/*.json."""

import torch

from snippets.common.bench import ceilings, time_ms
from snippets.common.results import write_result
from snippets.triton_kernels.measure import (
    OPS,
    Shapes,
    implementations,
    kernel_ms,
    liger_ops,
    loss_flops,
    measure_loss,
    measure_ops,
    peak_bytes_cuda,
    sweep_rmsnorm,
    sweep_rows_per_program,
)
from snippets.triton_kernels.rmsnorm import ROWS_PER_PROGRAM as ROWS_DEFAULT

# --8<-- [start:run]
SHAPES, DTYPE = Shapes(), torch.bfloat16  # 2 x 4096 tokens, H 4096, I 12288, V 151,936
NAMES = ("ours", "eager", "torch.compile", "Liger Kernel")
HIDDEN_SWEEP = (1024, 2048, 4096, 8192, 16384)  # 16384 > MAX_BLOCK: our two-pass path
LOSS_VARIANTS = [  # (row label, implementation, (chunk rows, dW accumulator) for ours)
    ("ours：1024 行/块，dW 累加 fp32", "ours", (1024, torch.float32)),
    ("ours：256 行/块，dW 累加 fp32", "ours", (256, torch.float32)),
    ("ours：1024 行/块，dW 累加 bf16", "ours", (1024, torch.bfloat16)),
    ("ours：256 行/块，dW 累加 bf16", "ours", (256, torch.bfloat16)),
    ("eager", "eager", None),
    ("torch.compile", "torch.compile", None),
    ("Liger Kernel", "Liger Kernel", None),
]
SOURCES = [
    "snippets/triton_kernels/bench_gpu.py",
    "snippets/triton_kernels/measure.py",
    "snippets/triton_kernels/rmsnorm.py",
    "snippets/triton_kernels/swiglu.py",
    "snippets/triton_kernels/rope.py",
    "snippets/triton_kernels/cross_entropy.py",
    "snippets/qwen3_fusion/model.py",
]

ceil = ceilings()  # measured in this run: copy bandwidth and bf16 matmul throughput
impls = implementations(NAMES, SHAPES.hidden, SHAPES.eps)
liger = impls["Liger Kernel"]["version"] if "Liger Kernel" in impls else liger_ops()  # or why not


def timer(fn):
    return time_ms(fn, warmup=25, rep=100)


def slow_timer(fn):  # the loss takes tens of ms per call: more calls for a stable median
    return time_ms(fn, warmup=100, rep=500)


copy = ceil["copy_bytes_per_s"]
ops = measure_ops(SHAPES, "cuda", DTYPE, timer, copy, impls, gpu_time=kernel_ms)
sweep = sweep_rmsnorm(HIDDEN_SWEEP, SHAPES.tokens, "cuda", DTYPE, kernel_ms, copy, impls)
rows = sweep_rows_per_program(SHAPES, "cuda", DTYPE, kernel_ms, copy, (4, 8, 16, 32, 64))
loss = measure_loss(SHAPES, "cuda", DTYPE, slow_timer, ceil["bf16_matmul_flop_per_s"], impls,
                    peak_bytes_cuda, LOSS_VARIANTS)  # fmt: skip
# --8<-- [end:run]

# --8<-- [start:record]
KEYS = {"RMSNorm": "rmsnorm", "残差加 + RMSNorm": "add_rmsnorm", "SwiGLU": "swiglu",
        "RoPE (q, k)": "rope"}  # fmt: skip
by = {(r["op"], r["impl"]): r for r in ops}
values = {"copy_tb_s": ceil["copy_bytes_per_s"] / 1e12, "liger": liger}
for op in OPS:
    ours = by[(op, "ours")]
    values[f"{KEYS[op]}_fwd_of_copy"] = ours["fwd_of_copy"]
    values[f"{KEYS[op]}_bwd_of_copy"] = ours["bwd_of_copy"]
    for other, key in (("torch.compile", "compile"), ("Liger Kernel", "liger")):
        row = by.get((op, other))  # ratio > 1: ours is faster, forward + backward
        ratio = row["fwdbwd_ms"] / ours["fwdbwd_ms"] if row else None
        values[f"{KEYS[op]}_{key}_over_ours"] = ratio
    values[f"{KEYS[op]}_launch_over_kernels"] = ours["launch_ms"] / ours["fwdbwd_ms"]
common = {"sources": SOURCES}
shape = f"{SHAPES.tokens} token，H {SHAPES.hidden}，I {SHAPES.intermediate}，bf16"
write_result(
    "triton-kernels",
    "kernels",
    title=f"四个带宽型 kernel：前向、反向、前向 + 反向（{shape}）",
    model="字节 = 每个输入读一次、每个输出写一次（measure.py 的 byte_model）；"
    "前向、反向、前向+反向为 kernel 自身的时间（profiler 记录的 kernel 时长之和，20 次平均），"
    "占比相对同次实测的拷贝带宽；“从 Python 调用”为 do_bench 计的前向+反向，"
    "GPU 等 CPU 的时间也算在内",
    values=values,
    table={
        "columns": [
            {"key": "op", "label": "算子"},
            {"key": "impl", "label": "实现"},
            {"key": "fwd_ms", "label": "前向 ms", "format": ".3f"},
            {"key": "bwd_ms", "label": "反向 ms", "format": ".3f"},
            {"key": "fwdbwd_ms", "label": "前向+反向 ms", "format": ".3f"},
            {"key": "fwd_of_copy", "label": "前向占拷贝带宽", "format": ".0%"},
            {"key": "bwd_of_copy", "label": "反向占拷贝带宽", "format": ".0%"},
            {"key": "launch_ms", "label": "从 Python 调用 ms", "format": ".3f"},
        ],
        "rows": ops,
    },
    **common,
)
write_result(
    "triton-kernels",
    "rmsnorm-rows",
    title=f"RMSNorm 反向：每个程序处理的行数（{SHAPES.tokens} × {SHAPES.hidden}，bf16）",
    model="字节 = 3 T H × 2（读 dy、x，写 dx）；"
    "部分和缓冲区另计（程序数 × H × 4 字节，写一次读一次）；kernel 自身的时间",
    values={"default": ROWS_DEFAULT},
    table={
        "columns": [
            {"key": "rows_per_program", "label": "每程序行数"},
            {"key": "programs", "label": "程序数"},
            {"key": "bwd_ms", "label": "反向 ms", "format": ".3f"},
            {"key": "bwd_of_copy", "label": "占拷贝带宽", "format": ".0%"},
            {"key": "partial_mb", "label": "部分和 MB", "format": ".1f"},
        ],
        "rows": rows,
    },
    **common,
)
names = [n for n in NAMES if n in impls]
write_result(
    "triton-kernels",
    "rmsnorm-sweep",
    title=f"RMSNorm 前向 + 反向随隐藏维变化（{SHAPES.tokens} 行，bf16）",
    model="字节 = 5 T H × 2（前向读 x 写 y，反向读 dy、x 写 dx）；kernel 自身的时间，"
    "占比相对同次实测的拷贝带宽；调用之间不清空 L2，H ≤ 2048 时输入小于 L2",
    values={"hidden_sizes": list(HIDDEN_SWEEP)},
    table={
        "columns": [{"key": "hidden", "label": "H"}]
        + [{"key": n, "label": n, "format": ".0%"} for n in names],
        "rows": sweep,
    },
    plot=[
        {"x": "hidden", "y": n, "x_label": "隐藏维 H", "y_label": f"{n} 占拷贝带宽"}
        for n in ("ours", "torch.compile")
    ],
    **common,
)
loss_by = {r["impl"]: r for r in loss}
chunks = -(-SHAPES.tokens // LOSS_VARIANTS[0][2][0])
DW_TRAFFIC = chunks * 2 * SHAPES.vocab * SHAPES.hidden * 4  # fp32 dW read + written per chunk
ours_loss = loss_by[LOSS_VARIANTS[0][0]]
compiled_loss = loss_by.get("torch.compile")
write_result(
    "triton-kernels",
    "loss",
    title=f"线性层 + 交叉熵（{SHAPES.tokens} × {SHAPES.vocab:,} 的 logits，bf16）",
    model="FLOP = 6 N H V（logits、dh、dW 三个矩阵乘）；额外峰值显存 = 前向 + 反向期间的峰值"
    " − 输入 − 返回的 dh 与 dW；比例相对它省掉的 bf16 logits（N V × 2 字节）",
    values={
        "logits_gib": SHAPES.tokens * SHAPES.vocab * 2 / 2**30,
        "ours_extra_of_logits": ours_loss["extra_of_logits"],
        "ours_bf16_256_extra_of_logits": loss_by[LOSS_VARIANTS[3][0]]["extra_of_logits"],
        "ours_bf16_256_fwdbwd_ms": loss_by[LOSS_VARIANTS[3][0]]["fwdbwd_ms"],
        "ours_fwdbwd_ms": ours_loss["fwdbwd_ms"],
        "compile_over_ours": compiled_loss["fwdbwd_ms"] / ours_loss["fwdbwd_ms"]
        if compiled_loss
        else None,
        "compile_fwdbwd_ms": compiled_loss["fwdbwd_ms"] if compiled_loss else None,
        # lower bounds of our time: the matmuls at the measured throughput, and the fp32 dW
        # accumulator read and written once per chunk (cuBLAS addmm) at the copy bandwidth
        "matmul_floor_ms": loss_flops(SHAPES) / ceil["bf16_matmul_flop_per_s"] * 1e3,
        "dw_traffic_ms": DW_TRAFFIC / copy * 1e3,
        "dw_fp32_gib": SHAPES.vocab * SHAPES.hidden * 4 / 2**30,
    },
    table={
        "columns": [
            {"key": "impl", "label": "实现"},
            {"key": "fwd_ms", "label": "前向 ms", "format": ".2f"},
            {"key": "fwdbwd_ms", "label": "前向+反向 ms", "format": ".2f"},
            {"key": "of_matmul", "label": "占矩阵乘吞吐", "format": ".0%"},
            {"key": "extra_gib", "label": "额外峰值 GiB", "format": ".2f"},
            {"key": "extra_of_logits", "label": "占 logits", "format": ".1%"},
        ],
        "rows": loss,
    },
    **common,
)
# --8<-- [end:record]
