"""The page's calculator, Python side: what offline teacher logits cost to store, and what the
teacher's forward pass costs against the student's training, for a teacher and a student.

docs/assets/calculator.js repeats it (formulas["distill"]) term by term; both are checked on
tests/fixtures/calculators/distill.json (snippets/common/calculator.py). The teachers' counts
are computed from their configs (account.py), the students' from data/qwen3.yaml, the GPUs'
peaks and memory from data/hardware.yaml.
"""

from __future__ import annotations

from snippets.common.calculator import Calculator
from snippets.common.models.qwen3_moe import QWEN3_30B_A3B
from snippets.metrics.calculators import gpu_presets, qwen3_presets
from snippets.moe_distillation.account import (
    DEEPSEEK_V3,
    QWEN3_235B_A22B,
    bytes_per_token,
    deepseek_v3_counts,
    distill_flops_per_token,
    gpus_to_hold,
    index_bytes,
    moe_counts,
)


# --8<-- [start:calculator]
def distill_calculator(vocab, k, value_bytes, id_bytes, tokens_b, epochs, teacher_total_b,
                       teacher_n_b, weight_bytes, student_n_b, peak_tflops, memory_gb,
                       mfu) -> dict:  # fmt: skip
    """Offline storage of the teacher's logits for tokens_b billion tokens (full or top-k), the
    FLOPs per token of the teacher's forward pass and the student's training step, the GPU
    hours each takes at an assumed MFU (the teacher once offline, every epoch online), and the
    GPUs the teacher's weights alone fill."""
    store = bytes_per_token(vocab, k, value_bytes, id_bytes)
    flops = distill_flops_per_token(teacher_n_b * 1e9, student_n_b * 1e9)
    tokens = tokens_b * 1e9
    rate = peak_tflops * 1e12 * mfu  # sustained FLOP/s of one GPU
    return {
        "full_bytes": store["full"], "topk_bytes": store["topk"], "ratio": store["ratio"],
        "full_store": tokens * store["full"], "topk_store": tokens * store["topk"],
        "teacher_flops": flops["teacher_forward"], "student_flops": flops["student_train"],
        "teacher_share": flops["teacher_share"],
        "offline_gpu_h": tokens * flops["teacher_forward"] / rate / 3600,
        "online_gpu_h": epochs * tokens * flops["teacher_forward"] / rate / 3600,
        "student_gpu_h": epochs * tokens * flops["student_train"] / rate / 3600,
        "teacher_gpus": gpus_to_hold(teacher_total_b * 1e9, weight_bytes, memory_gb),
    }  # fmt: skip


# --8<-- [end:calculator]


# --8<-- [start:presets]
def teacher_presets() -> list[dict]:
    """The MoE teachers, their counts computed from their configs (account.py)."""
    teachers = [("deepseek-v3", "DeepSeek-V3 / R1", deepseek_v3_counts(DEEPSEEK_V3)),
                ("qwen3-235b-a22b", "Qwen3-235B-A22B", moe_counts(QWEN3_235B_A22B)),
                ("qwen3-30b-a3b", "Qwen3-30B-A3B", moe_counts(QWEN3_30B_A3B))]  # fmt: skip
    return [{"id": i, "label": label, "values": {"teacher_total_b": c["total"] / 1e9,
                                                  "teacher_n_b": c["n_matmul"] / 1e9}}
            for i, label, c in teachers]  # fmt: skip


QWEN3_VOCAB = QWEN3_30B_A3B.vocab_size
CASES = [
    {"vocab": QWEN3_VOCAB, "k": k, "value_bytes": vb, "id_bytes": index_bytes(QWEN3_VOCAB),
     "tokens_b": tb, "epochs": ep, "teacher_total_b": t["values"]["teacher_total_b"],
     "teacher_n_b": t["values"]["teacher_n_b"], "weight_bytes": wb, "student_n_b": sn,
     "peak_tflops": 989.5, "memory_gb": 141, "mfu": 0.4}
    for k, vb, tb, ep in ((64, 2, 100, 1), (16, 4, 1, 3), (151936, 2, 0.5, 2))
    for t, wb in zip(teacher_presets(), (1, 2, 2), strict=True)
    for sn in (1.7, 8.19)
] + [  # a small vocabulary (2-byte ids), a small model
    {"vocab": 8192, "k": 16, "value_bytes": 2, "id_bytes": 2, "tokens_b": 0.001, "epochs": 1,
     "teacher_total_b": 0.0446, "teacher_n_b": 0.0163, "weight_bytes": 4, "student_n_b": 0.0163,
     "peak_tflops": 989.5, "memory_gb": 141, "mfu": 0.05},
]  # fmt: skip
CALCULATORS = {
    "distill": Calculator(
        distill_calculator,
        cases=CASES,
        presets={
            "teachers": teacher_presets(),
            "students": qwen3_presets(lambda cfg, n: {"student_n_b": n["matmul"] / 1e9}),
            "gpus": gpu_presets(peak_tflops="bf16_dense_tflops", memory_gb="memory_gb"),
        },
        defaults={"vocab": QWEN3_VOCAB, "id_bytes": index_bytes(QWEN3_VOCAB)},
    ),
}
# --8<-- [end:presets]
