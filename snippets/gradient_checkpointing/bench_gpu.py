"""On the H200: every policy on a Qwen3-8B-shaped stack of 4 layers, bf16, one 8192-token
sequence: bytes kept, peak memory, step time; the front; what fits 36 layers on one GPU."""

import dataclasses
import re

import torch

from snippets.common.bench import time_ms
from snippets.common.hardware import load_hardware
from snippets.common.results import write_result
from snippets.gradient_checkpointing import accounting as acc
from snippets.gradient_checkpointing.measure import OpNames, autograd_saved, is_attention
from snippets.gradient_checkpointing.policies import POLICIES, apply_policy
from snippets.gradient_checkpointing.runner import CudaMeter, analyze, measure
from snippets.qwen3_fusion.model import QWEN3_8B, Qwen3ForCausalLM, count_parameters, rope_tables

# --8<-- [start:run]
LAYERS, SEQ, DTYPE = 4, 8192, torch.bfloat16
cfg = dataclasses.replace(QWEN3_8B, num_hidden_layers=LAYERS, vocab_size=1024)  # full width
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg).to(DTYPE)


def inputs(seq):
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device="cuda")
    return ids, torch.randn(1, seq, cfg.hidden_size, device="cuda", dtype=DTYPE)


ids, dy = inputs(SEQ)
rows = []
for policy in POLICIES:
    apply_policy(model, policy)

    def step():
        model.hidden_states(ids).backward(dy)

    step()  # warm-up: gradients and library workspaces are allocated once, before measuring
    row = measure(model, policy, ids, dy, CudaMeter())
    t = time_ms(step, warmup=50, rep=300)
    row.update(ms=t["median"], ms_p20=t["p20"], ms_p80=t["p80"])
    row["peak_half"] = measure(model, policy, *inputs(SEQ // 2), CudaMeter())["peak"]
    rows.append(row)
fixed = torch.cuda.memory_allocated()  # parameters, gradients, library workspaces
# --8<-- [end:run]

# --8<-- [start:saved]
apply_policy(model, POLICIES[0])  # one plain layer: what autograd saves on CUDA
layer = model.model.layers[0]
x = torch.randn(1, SEQ, cfg.hidden_size, device="cuda", dtype=DTYPE, requires_grad=True)
cos, sin = rope_tables(cfg, SEQ, "cuda")
with OpNames() as ops:
    out, saved = autograd_saved(layer, x, cos, sin, model_state=list(model.parameters()))
saved_cuda = sum(n for n, _ in saved)
saved_formula = sum(s.bytes for s in acc.saved_tensors(cfg, 1, SEQ, DTYPE.itemsize))
attention_kernel = next(name for name in ops.names if is_attention(name))
del out, x, cos, sin, saved  # and the graph that holds the saved tensors
# --8<-- [end:saved]

# --8<-- [start:record]
psi = count_parameters(QWEN3_8B)["total"]
scenario = {  # Qwen3-8B, 36 layers, one H200 of 8 in ZeRO-1 (bf16 weights and grads, Adam / 8)
    "layers": QWEN3_8B.num_hidden_layers,
    "fixed": (2 + 2 + 12 / 8) * psi,
    "budget": load_hardware()["h200-sxm"].memory_gb * 1e9,
    "micro_batches": (1, 2, 4, 8),
}
measured, deep, values = analyze(rows, POLICIES, cfg, SEQ, LAYERS, DTYPE.itemsize, scenario)


def key(name):
    return re.sub(r"\W+", "_", name).strip("_")


values.update(
    {
        "layers": LAYERS,
        "seq": SEQ,
        "fixed_gib": fixed / 2**30,
        "front_text": "、".join(values["front"]),
        "max_offset_gib": max(d["offset_gib"] for d in deep),
        "slowdown": {key(r["policy"]): r["slowdown"] for r in measured},
        "peak_gib": {key(r["policy"]): r["peak_gib"] for r in measured},
        "saved_cuda_bytes": saved_cuda,
        "saved_formula_bytes": saved_formula,
        "saved_extra_bytes": saved_cuda - saved_formula,
        "attention_kernel": attention_kernel,
    }
)
sources = [
    "snippets/gradient_checkpointing/bench_gpu.py",
    "snippets/gradient_checkpointing/runner.py",
    "snippets/gradient_checkpointing/policies.py",
    "snippets/gradient_checkpointing/measure.py",
    "snippets/gradient_checkpointing/accounting.py",
    "snippets/gradient_checkpointing/pareto.py",
    "snippets/qwen3_fusion/accounting.py",
    "snippets/qwen3_fusion/model.py",
]
write_result(
    "gradient-checkpointing",
    "checkpoint-pareto",
    title=f"Qwen3-8B 形状的 {LAYERS} 层，1 × {SEQ} token，bf16：每种策略的显存与每步时间",
    model=(
        "显存为前向开始前之后新分配的字节（torch.cuda.memory_allocated / max_memory_allocated）；"
        "“公式”列按 accounting.py 逐张量计算；FLOP 模型只计矩阵乘与注意力，重算见 recompute_flops"
    ),
    values=values,
    table={
        "columns": [
            {"key": "idx", "label": "#"},
            {"key": "policy", "label": "策略"},
            {"key": "kept_gib", "label": "前向后保留 (GiB)", "format": ".2f"},
            {"key": "kept_predicted_gib", "label": "公式 (GiB)", "format": ".2f"},
            {"key": "peak_gib", "label": "峰值 (GiB)", "format": ".2f"},
            {"key": "ms", "label": "每步 ms", "format": ".1f"},
            {"key": "ms_p20", "label": "p20", "format": ".1f"},
            {"key": "ms_p80", "label": "p80", "format": ".1f"},
            {"key": "slowdown", "label": "比不重算慢", "format": "+.1%"},
            {"key": "flop_slowdown", "label": "FLOP 模型", "format": "+.1%"},
            {"key": "mark", "label": "前沿 ✓ / 推荐 ★"},
        ],
        "rows": measured,
    },
    plot={
        "kind": "scatter",
        "x": "peak_gib",
        "y": "ms",
        "label": "idx",
        "front": "front",
        "highlight": "recommended",
        "x_label": "峰值显存，参数与梯度之外 (GiB)",
        "y_label": "每步时间 (ms)",
    },
    sources=sources,
)
write_result(
    "gradient-checkpointing",
    "checkpoint-budget",
    title="推到 36 层：一张 H200（141 GB，8 卡 ZeRO-1）每个微批能放几条 8192 token 的序列",
    model=(
        "固定显存 = Qwen3-8B 全部参数 ×（2 + 2 + 12/8）B；每层每 token 保留的字节与时间取自同类层"
        "实测，反向额外需要的字节取自本策略在 8192 与 4096 token 两次实测的直线；"
        "不计嵌入层、LM head 与损失的激活"
    ),
    values={
        "fixed_gb": scenario["fixed"] / 1e9,
        "budget_gb": scenario["budget"] / 1e9,
        "layers": scenario["layers"],
        "recommend": values["recommend"],
    },
    table={
        "columns": [
            {"key": "policy", "label": "策略"},
            {"key": "gib_per_sequence", "label": "每条序列 (GiB)", "format": ".2f"},
            {"key": "offset_gib", "label": "与 token 数无关 (GiB)", "format": ".2f"},
            {"key": "max_sequences", "label": "最多几条"},
            {"key": "ms_per_sequence", "label": "每条 ms", "format": ".0f"},
        ],
        "rows": deep,
    },
    sources=[*sources, "snippets/common/hardware.py", "data/hardware.yaml"],
)
# --8<-- [end:record]
