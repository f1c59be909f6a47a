"""The GPU run, as functions: the three gates for our Triton kernels in bf16 on the Qwen3 model,
the GPU-only sources (TF32, atomics), and the result records. bench_gpu.py calls them with the
H200 plan; tests/snippets/test_precision_alignment.py runs them with a tiny plan on the CPU.
"""

from dataclasses import dataclass, replace

import torch

from snippets.precision_alignment import e2e_gate as e2e
from snippets.precision_alignment import model_gate as mg
from snippets.precision_alignment import op_gate as og
from snippets.precision_alignment import planted, sources
from snippets.precision_alignment.techniques import one_at_a_time, strict_numerics
from snippets.qwen3_fusion.model import QWEN3_8B, TINY, Kernels, Qwen3Config
from snippets.triton_kernels.numerics import gamma
from snippets.triton_kernels.qwen3 import TRITON, fused_loss

SLUG = "precision-alignment"
SOURCES = [
    "snippets/precision_alignment/bench_gpu.py",
    "snippets/precision_alignment/collect.py",
    "snippets/precision_alignment/e2e_gate.py",
    "snippets/precision_alignment/metrics.py",
    "snippets/precision_alignment/model_gate.py",
    "snippets/precision_alignment/op_gate.py",
    "snippets/precision_alignment/planted.py",
    "snippets/precision_alignment/sources.py",
    "snippets/precision_alignment/techniques.py",
    "snippets/qwen3_fusion/model.py",
    "snippets/triton_kernels/cross_entropy.py",
    "snippets/triton_kernels/numerics.py",
    "snippets/triton_kernels/qwen3.py",
    "snippets/triton_kernels/rmsnorm.py",
    "snippets/triton_kernels/rope.py",
    "snippets/triton_kernels/swiglu.py",
]


# --8<-- [start:plan]
@dataclass(frozen=True)
class Plan:
    op_cases: tuple  # (case builder, args) at these shapes
    model: Qwen3Config  # the model gate's model, with batch x seq tokens
    model_tokens: tuple
    e2e: Qwen3Config  # the end-to-end gate's model, trained on e2e_data for e2e_steps
    e2e_data: tuple  # (sequences, seq, batch)
    e2e_steps: int
    e2e_lr: float
    e2e_runs: int  # perturbed eager runs behind the band
    matmul: tuple  # (m, k, n) of the TF32 measurement
    index_add: int  # values added into 64 bins


H200 = Plan(
    op_cases=(  # Qwen3-8B's widths: hidden 4096, MLP 12288, 32:8 heads of 128, a 32k vocabulary
        (og.rmsnorm_case, (4096, 4096)),
        (og.rmsnorm_case, (4096, 4096), {"residual": True}),
        (og.swiglu_case, (2048, 12288)),
        (og.rope_case, (2, 32, 8, 512, 128)),
        (og.cross_entropy_case, (1024, 1024, 32_000)),
    ),
    model=replace(
        QWEN3_8B,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=8192,
    ),
    model_tokens=(2, 512),
    e2e=replace(
        QWEN3_8B,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=512,
    ),
    e2e_data=(4096, 128, 16),
    e2e_steps=200,
    e2e_lr=1e-3,
    e2e_runs=8,
    matmul=(1024, 4096, 1024),
    index_add=1 << 22,
)
CPU_SMOKE = Plan(  # the same code at CPU sizes, for the unit test
    op_cases=((og.rmsnorm_case, (9, 100)), (og.swiglu_case, (3, 40))),
    model=TINY,
    model_tokens=(1, 6),
    e2e=TINY,
    e2e_data=(16, 6, 2),
    e2e_steps=2,
    e2e_lr=3e-3,
    e2e_runs=2,
    matmul=(8, 64, 8),
    index_add=1 << 10,
)
# --8<-- [end:plan]


# --8<-- [start:gates]
def op_rows(plan: Plan, dtype, device) -> list[dict]:
    rows = []
    for builder, args, *kw in plan.op_cases:
        case = builder(*args, dtype, device, **(kw[0] if kw else {}))
        with strict_numerics():  # the cross-entropy bound assumes fp32 accumulation in cuBLAS
            report = og.op_gate(case, og.OURS[case.name])
        for key, ratio in report.ratios.items():
            mismatch, ulps, allowed = report.parity.get(key, (None, None, None))
            rows.append({"op": case.name, "tensor": key, "ratio": ratio, "mismatch": mismatch,
                         "max_ulp": ulps, "allowed": allowed, "passed": report.passed})  # fmt: skip
    return rows


def model_rows(plan: Plan, dtype, device):
    """The model gate with all kernels (fused add + RMSNorm forward), then one kernel at a time."""
    batch, seq = plan.model_tokens
    ids = e2e.sequences(batch, seq, plan.model.vocab_size, seed=1).to(device)
    eager = e2e.initial_model(plan.model, None, dtype, device)

    def gate(kernels, forward=None):
        fused = e2e.initial_model(plan.model, kernels, dtype, device)
        return mg.model_gate(eager, fused, ids, ids, forward)

    report = gate(TRITON, fused_loss)
    kinds = {"activation": "激活", "loss": "损失", "gradient": "梯度"}
    kinds["parameter gradient"] = "参数梯度"
    rows = [{"index": i + 1, "site": s.name, "kind": kinds[s.kind], "eager": s.eager,
             "fused": s.fused, "of_bound": s.fused / s.bound, "ok": "✓" if s.ok else "✗"}
            for i, s in enumerate(report.sites)]  # fmt: skip
    ablation = {}
    for name, kernels in one_at_a_time(TRITON):
        one = gate(kernels)
        ablation[name] = {"passed": one.passed, "worst": max(s.fused / s.bound for s in one.sites)}
    bug = gate(Kernels(rope=planted.rope_bf16_tables(plan.model.rope_theta)))  # planted bug 4
    rope_bug = {"passed": bug.passed, "first": bug.first_failure("activation"),
                "worst": max(s.fused / s.bound for s in bug.sites)}  # fmt: skip
    return report, rows, ablation, rope_bug


def e2e_curves(plan: Plan, dtype, device) -> dict:
    n, seq, batch = plan.e2e_data
    steps = e2e.batches(e2e.sequences(n, seq, plan.e2e.vocab_size), plan.e2e_steps, batch)
    runs = e2e.eager_runs(plan.e2e, steps, plan.e2e_lr, dtype, device, runs=plan.e2e_runs)
    fused = e2e.e2e_gate(plan.e2e, TRITON, steps, plan.e2e_lr, dtype, device, fused_loss, runs)
    rope_bug = Kernels(rope=planted.rope_bf16_tables(plan.e2e.rope_theta))  # planted bug 4
    bug = e2e.e2e_gate(plan.e2e, rope_bug, steps, plan.e2e_lr, dtype, device, runs=runs)
    repeat = e2e.train(e2e.initial_model(plan.e2e, None, dtype, device), steps, plan.e2e_lr)
    other_seed = e2e.train(e2e.initial_model(plan.e2e, None, dtype, device, seed=1), steps,
                           plan.e2e_lr)  # fmt: skip
    return {"fused": fused, "bug": bug, "repeat_identical": torch.equal(repeat, runs[0]),
            "repeat_max": (repeat - runs[0]).abs().max().item(),
            "seed_spread": (other_seed - runs[0]).abs().max().item()}  # fmt: skip


def source_rows(plan: Plan, device) -> list[dict]:
    m, k, n = plan.matmul
    err = sources.matmul_errors(device, m, k, n)
    runs = {d: sources.index_add_distinct(device, d, n=plan.index_add) for d in (False, True)}
    return [
        {"source": "fp32 矩阵乘，fp32_precision='ieee'", "metric": "max |ΔC| / (|A||B|)",
         "value": err["ieee"], "reference": gamma(k)},
        {"source": "fp32 矩阵乘，fp32_precision='tf32'", "metric": "max |ΔC| / (|A||B|)",
         "value": err["tf32"], "reference": 2 * 2.0**-10 + 2.0**-20 + gamma(k)},
        {"source": "index_add_（原子加）", "metric": "8 次相同调用的不同结果数",
         "value": runs[False], "reference": None},
        {"source": "index_add_，确定性算法", "metric": "8 次相同调用的不同结果数",
         "value": runs[True], "reference": 1},
    ]  # fmt: skip


# --8<-- [end:gates]


# --8<-- [start:records]
def col(key, label, fmt=None) -> dict:
    return {"key": key, "label": label} | ({"format": fmt} if fmt else {})


def curve(y, label) -> dict:
    """A loss-curve plot: one point per table row, joined by a line."""
    return {"kind": "scatter", "x": "step", "y": y, "label": "mark", "front": "line",
            "x_label": "训练步", "y_label": label}  # fmt: skip


def records(plan: Plan, measured, ops, model, sites, ablation, rope_bug, curves, every=10) -> dict:
    """name -> keyword arguments of write_result (title, model, values, table, plot)."""
    fused, bug = curves["fused"], curves["bug"]
    e2e_rows = []
    for t in [*range(0, plan.e2e_steps, every), plan.e2e_steps - 1]:
        e2e_rows.append({
            "step": t, "eager": fused.eager[t].item(), "fused": fused.fused[t].item(),
            "deviation": (fused.fused[t] - fused.eager[t]).abs().item(),
            "band": fused.band[t].item(), "ratio": fused.ratio[t].item(), "line": True, "mark": "",
        })  # fmt: skip
    for row in sites:
        row["line"], row["label"] = True, str(row["index"])
    cfg, e2e_cfg, (batch, seq) = plan.model, plan.e2e, plan.model_tokens
    sources_record = {
        "title": "只在 GPU 上出现的两个来源：TF32 矩阵乘与原子加",
        "model": "矩阵乘误差相对 fp64 参考、除以 |A||B|；参照列为正文推出的上界或应有的值",
        "values": {
            "ieee_error": measured[0]["value"],
            "tf32_error": measured[1]["value"],
            "tf32_over_ieee": measured[1]["value"] / measured[0]["value"],
            "atomic_distinct": measured[2]["value"],
            "deterministic_distinct": measured[3]["value"],
            "repeat_identical": curves["repeat_identical"],
            "repeat_max": curves["repeat_max"],
            "seed_spread": curves["seed_spread"],
        },
        "table": {
            "columns": [col("source", "来源"), col("metric", "度量"), col("value", "实测"),
                        col("reference", "参照")],
            "rows": measured,
        },
    }  # fmt: skip
    op_record = {
        "title": "算子关：bf16，Qwen3-8B 的宽度；误差 / 界，以及与同精度 eager 的逐位一致性",
        "model": (
            "误差 / 界 = max |kernel − fp64| / 逐元素界（triton_kernels/numerics.py）；一致性只查"
            "承诺了 Hugging Face 舍入顺序的输出：不同元素的占比不超过 2γ_{H+8}/u_bf16"
        ),
        "values": {
            "passed": all(r["passed"] for r in ops),
            "worst_ratio": max(r["ratio"] for r in ops),
        },
        "table": {
            "columns": [col("op", "算子"), col("tensor", "张量"), col("ratio", "误差 / 界", ".2f"),
                        col("mismatch", "与 eager 不同", ".3%"), col("allowed", "允许", ".1%"),
                        col("max_ulp", "最大 ULP 差")],
            "rows": ops,
        },
    }  # fmt: skip
    model_record = {
        "title": (
            f"模型关：{cfg.num_hidden_layers} 层 Qwen3（隐藏维 {cfg.hidden_size}），bf16，"
            f"{batch} × {seq} token，全部 Triton kernel 加融合的残差加 + RMSNorm"
        ),
        "model": (
            "误差 = ‖x − x_fp64‖ / ‖x_fp64‖，参考为同一组权重的 fp64 eager；"
            "界 = 2 × eager 误差 + u_bf16"
        ),
        "values": {
            "passed": model.passed,
            "first_activation": model.first_failure("activation"),
            "first_gradient": model.first_failure("gradient"),
            "worst": max(r["of_bound"] for r in sites),
            "ablation": ablation,
            "rope_bug": rope_bug,
        },
        "table": {
            "columns": [col("index", "#"), col("site", "检查点"), col("kind", "类别"),
                        col("eager", "eager 误差", ".2e"), col("fused", "fused 误差", ".2e"),
                        col("of_bound", "fused / 界", ".2f"), col("ok", "通过")],
            "rows": sites,
        },
        "plot": {"kind": "scatter", "x": "index", "y": "of_bound", "label": "label",
                 "front": "line", "x_label": "检查点（表中的 #）", "y_label": "fused 误差 / 界"},
    }  # fmt: skip
    e2e_record = {
        "title": (
            f"端到端关：{plan.e2e_steps} 步，{e2e_cfg.num_hidden_layers} 层 Qwen3（隐藏维 "
            f"{e2e_cfg.hidden_size}），bf16 + fp32 主权重，等差数列任务"
        ),
        "model": (
            f"band(t) = 2 × 前 t 步里 {plan.e2e_runs} 条扰动 eager 曲线（一半重排归约顺序，"
            f"一半权重 ±1 ULP）与 eager 之差的最大值 + 2ε₃₂|L|；表中每 {every} 步一行"
        ),
        "values": {
            "passed": fused.passed,
            "first_exceeded": fused.first_exceeded,
            "worst_ratio": fused.ratio.max().item(),
            "steps": plan.e2e_steps,
            "eager_first": fused.eager[0].item(),
            "eager_final": fused.eager[-1].item(),
            "fused_final": fused.fused[-1].item(),
            "bug_first_exceeded": bug.first_exceeded,
            "bug_worst_ratio": bug.ratio.max().item(),
        },
        "table": {
            "columns": [col("step", "步"), col("eager", "eager 损失", ".4f"),
                        col("fused", "fused 损失", ".4f"), col("deviation", "|差|", ".2e"),
                        col("band", "band", ".2e"), col("ratio", "|差| / band", ".2f")],
            "rows": e2e_rows,
        },
        "plot": [curve("eager", "eager 损失"), curve("fused", "fused 损失"),
                 curve("ratio", "|差| / band")],
    }  # fmt: skip
    return {
        "precision-sources": sources_record,
        "precision-op-gate": op_record,
        "precision-model-gate": model_record,
        "precision-e2e": e2e_record,
    }


# --8<-- [end:records]
