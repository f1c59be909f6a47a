"""On the H200 (nox -s gpu_docs): decode latency eager / CUDA graph / reduce-overhead for two
Qwen3 widths, the training step eager / graph, and graph memory pools; writes
results/cuda-graph/*.json."""

import torch

from snippets.common.results import write_result
from snippets.cuda_graph.measure import (
    MID,
    SMALL,
    compile_latency,
    decode_latency,
    train_step_times,
)
from snippets.cuda_graph.traps import pool_bytes

SOURCES = [
    "snippets/cuda_graph/bench_gpu.py",
    "snippets/cuda_graph/measure.py",
    "snippets/cuda_graph/decode.py",
    "snippets/cuda_graph/graphs.py",
    "snippets/cuda_graph/traps.py",
    "snippets/qwen3_fusion/model.py",
]

# --8<-- [start:run]
DTYPE = torch.bfloat16
BATCHES = (1, 2, 4, 8, 16, 32, 64)
COMPILED = (1, 64)  # reduce-overhead at two sizes: each new size compiles or records again
MODELS = (("small", SMALL), ("mid", MID))
decode = {name: decode_latency(cfg, BATCHES, DTYPE) for name, cfg in MODELS}
TRAIN = (("small", SMALL, 4, 256), ("mid", MID, 4, 2048))  # (name, config, batch, seq)
train = [{"model": n, "batch": b, "seq": s} | train_step_times(c, b, s, DTYPE)
         for n, c, b, s in TRAIN]  # fmt: skip
pools = {"shared": pool_bytes(True), "separate": pool_bytes(False)}
for name, cfg in MODELS:  # last: torch.compile's workers would share the CPU with eager
    compile_latency(cfg, decode[name], COMPILED, DTYPE)
# --8<-- [end:run]

# --8<-- [start:record]
LABEL = {"small": "Qwen3-0.6B 宽度，8 层", "mid": "Qwen3-8B 宽度，8 层"}
rows = [{"model": LABEL[name]} | r for name, rs in decode.items() for r in rs]
values = {f"pool_{k}_mib": v / 2**20 for k, v in pools.items()}
for name, rs in decode.items():
    by = {r["batch"]: r for r in rs}
    values[f"{name}_b1_eager_ms"] = by[1]["eager_ms"]
    values[f"{name}_b1_graph_ms"] = by[1]["graph_ms"]
    values[f"{name}_b1_speedup"] = by[1]["speedup"]
    values[f"{name}_b64_speedup"] = by[64]["speedup"]
    values[f"{name}_b1_compile_ms"] = by[1]["compile_ms"]
    values[f"{name}_b1_compile_s"] = by[1]["compile_s"]
    values[f"{name}_b64_compile_ms"] = by[64]["compile_ms"]
    values[f"{name}_b64_graph_ms"] = by[64]["graph_ms"]
    values[f"{name}_b64_eager_ms"] = by[64]["eager_ms"]
    values[f"{name}_compile_skipped"] = any(r.get("cudagraph_skipped") for r in rs)
for r in train:
    values[f"train_{r['model']}_speedup"] = r["speedup"]
PLOT = {"kind": "scatter", "x": "batch", "label": "model", "front": "line", "x_label": "batch"}
CURVES = (("eager_ms", "eager ms/token"), ("graph_ms", "CUDA graph ms/token"))
COLUMNS = [
    {"key": "model", "label": "模型"},
    {"key": "batch", "label": "batch"},
    {"key": "eager_ms", "label": "eager ms/token", "format": ".3f"},
    {"key": "graph_ms", "label": "CUDA graph ms/token", "format": ".3f"},
    {"key": "compile_ms", "label": "reduce-overhead ms/token", "format": ".3f"},
    {"key": "speedup", "label": "graph 加速", "format": ".2f"},
    {"key": "tokens_per_s", "label": "graph token/s", "format": ",.0f"},
    {"key": "cudagraph_skipped", "label": "compile 跳过了 graph"},
]
write_result(
    "cuda-graph",
    "decode-latency",
    title="每个 token 的 decode 延迟：eager、手动 CUDA graph、torch.compile(reduce-overhead)，bf16",
    model="一次 decode step（每条序列一个新 token，上下文位置 256，静态 KV cache 512 个位置）"
    "的墙钟时间，连续 30 次调用取平均、5 组取中位数；graph 按 batch 档位各捕获一张，共享一个内存池",
    values=values,
    table={"columns": COLUMNS, "rows": rows},
    plot=[PLOT | {"y": y, "y_label": label} for y, label in CURVES],
    sources=SOURCES,
)
write_result(
    "cuda-graph",
    "train-step",
    title="整个训练步（前向、反向、fused AdamW）：eager 与一张 CUDA graph，bf16",
    model="连续 5 步的墙钟时间取平均，3 组取中位数；graph 的输入是固定地址的 batch",
    values={r["model"]: r["speedup"] for r in train},
    table={
        "columns": [
            {"key": "model", "label": "模型"},
            {"key": "batch", "label": "batch"},
            {"key": "seq", "label": "序列长度"},
            {"key": "eager_ms", "label": "eager ms/步", "format": ".2f"},
            {"key": "graph_ms", "label": "graph ms/步", "format": ".2f"},
            {"key": "speedup", "label": "加速", "format": ".2f"},
        ],
        "rows": [r | {"model": LABEL[r["model"]]} for r in train],
    },
    sources=SOURCES,
)
# --8<-- [end:record]
