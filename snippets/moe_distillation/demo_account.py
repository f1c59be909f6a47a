"""The account on published models: why an MoE gets distilled into a dense model, what storing
a teacher's logits costs at Qwen3's vocabulary, and what the teacher's forward pass costs."""

from dataclasses import asdict

from snippets.common.hardware import load_hardware
from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.common.models.qwen3_moe import QWEN3_30B_A3B
from snippets.common.results import computed_result
from snippets.metrics.qwen3 import qwen3_params
from snippets.moe_distillation.account import (
    DEEPSEEK_V3,
    QWEN3_235B_A22B,
    bytes_per_token,
    deepseek_v3_counts,
    distill_flops_per_token,
    experts_touched,
    gpus_to_hold,
    index_bytes,
    moe_counts,
    moe_step_params,
    student_config,
)

H200 = load_hardware()["h200-sxm"]

# --8<-- [start:teachers]
# the three MoE teachers counted from their configs, against the totals and activated counts
# their reports print (in billions); N leaves out the input embedding, a lookup
published = {"deepseek-v3": (671, 37), "qwen3-235b-a22b": (235, 22), "qwen3-30b-a3b": (30, 3)}
counted = {"deepseek-v3": deepseek_v3_counts(DEEPSEEK_V3),
           "qwen3-235b-a22b": moe_counts(QWEN3_235B_A22B),
           "qwen3-30b-a3b": moe_counts(QWEN3_30B_A3B)}  # fmt: skip
teachers = []
for name, c in counted.items():
    total, active = published[name]
    teachers.append({"model": name, "total_b": c["total"] / 1e9, "active_b": c["active"] / 1e9,
                     "n_b": c["n_matmul"] / 1e9, "published_total_b": total,
                     "published_active_b": active,
                     "bf16_gpus": gpus_to_hold(c["total"], 2, H200.memory_gb)})  # fmt: skip
    row = teachers[-1]
    counts = f"total {row['total_b']:7.2f}  active {row['active_b']:6.2f}  N {row['n_b']:6.2f}"
    print(f"{name:16} {counts}  (printed: {total}B / {active}B)")
    #> deepseek-v3      total  671.03  active  37.55  N  36.63  (printed: 671B / 37B)
    #> qwen3-235b-a22b  total  235.09  active  22.19  N  21.57  (printed: 235B / 22B)
    #> qwen3-30b-a3b    total   30.53  active   3.35  N   3.04  (printed: 30B / 3B)
# --8<-- [end:teachers]

# --8<-- [start:dense]
# Qwen3-30B-A3B and a dense model of its active size: its attention and depth, one MLP as wide
# as the 8 experts a token uses (the experiment's student_config)
dense = student_config(QWEN3_30B_A3B)
dense_n = qwen3_params(asdict(dense))["matmul"]
moe_n = moe_counts(QWEN3_30B_A3B)["n_matmul"]
print(dense.intermediate_size, round(dense_n / 1e9, 3), round(moe_n / 1e9, 3))
#> 6144 3.029 3.042
serving = []
for batch in (1, 4, 16, 64, 256):
    read = moe_step_params(QWEN3_30B_A3B, batch)
    serving.append({"batch": batch, "experts": experts_touched(128, 8, batch),
                    "moe_gb": 2 * read / 1e9, "dense_gb": 2 * dense_n / 1e9,
                    "ratio": read / dense_n,
                    "moe_ms": 2 * read / (H200.hbm_tb_per_s * 1e12) * 1e3,
                    "dense_ms": 2 * dense_n / (H200.hbm_tb_per_s * 1e12) * 1e3})  # fmt: skip
    row = serving[-1]
    print(f"batch {batch:<3} experts/layer {row['experts']:5.1f}  MoE reads {row['ratio']:.2f}x")
    #> batch 1   experts/layer   8.0  MoE reads 1.00x
    #> batch 4   experts/layer  29.1  MoE reads 2.58x
    #> batch 16  experts/layer  82.4  MoE reads 6.57x
    #> batch 64  experts/layer 125.9  MoE reads 9.82x
    #> batch 256 experts/layer 128.0  MoE reads 9.98x
hold = {"moe_gb": 2 * moe_counts(QWEN3_30B_A3B)["total"] / 1e9,  # bf16 weights to keep
        "dense_gb": 2 * qwen3_params(asdict(dense))["total"] / 1e9}  # fmt: skip
# --8<-- [end:dense]

# --8<-- [start:storage]
# offline teacher logits at Qwen3's vocabulary: the full distribution or the top-k (token ids
# in int32: 151,936 ids do not fit in 16 bits), per token and per billion tokens
V = QWEN3_30B_A3B.vocab_size
ids = index_bytes(V)
storage = [{"store": "full-fp32", "bytes": bytes_per_token(V, 1, 4, ids)["full"]},
           {"store": "full-bf16", "bytes": bytes_per_token(V, 1, 2, ids)["full"]}]  # fmt: skip
storage += [{"store": f"top-{k}", "bytes": bytes_per_token(V, k, 2, ids)["topk"]}
            for k in (16, 64, 256)]  # bf16 values, int32 ids  # fmt: skip
for row in storage:
    row["tb_per_billion"] = row["bytes"] * 1e9 / 1e12
    print(f"{row['store']:9} {row['bytes']:>7,} B/token  {row['tb_per_billion']:8.3f} TB/1e9")
    #> full-fp32 607,744 B/token   607.744 TB/1e9
    #> full-bf16 303,872 B/token   303.872 TB/1e9
    #> top-16         96 B/token     0.096 TB/1e9
    #> top-64        384 B/token     0.384 TB/1e9
    #> top-256     1,536 B/token     1.536 TB/1e9
# --8<-- [end:storage]

# --8<-- [start:compute]
# per training token: the teacher's forward pass against the student's training step, for each
# teacher and three Qwen3 dense students (N from data/qwen3.yaml)
students = {m: qwen3_params(c.fields)["matmul"] for m, c in load_qwen3_configs().items()
            if m in ("qwen3-1.7b", "qwen3-4b", "qwen3-8b")}  # fmt: skip
compute = []
for t in teachers:
    for s_name, s_n in students.items():
        f = distill_flops_per_token(t["n_b"] * 1e9, s_n)
        compute.append({"teacher": t["model"], "student": s_name,
                        "teacher_gflop": f["teacher_forward"] / 1e9,
                        "student_gflop": f["student_train"] / 1e9,
                        "teacher_share": f["teacher_share"]})  # fmt: skip
first = compute[0]
print(f"{first['teacher']} -> {first['student']}: teacher {first['teacher_share']:.0%} of FLOPs")
#> deepseek-v3 -> qwen3-1.7b: teacher 88% of FLOPs
# --8<-- [end:compute]

# --8<-- [start:qwen3]
# Qwen3 report, Table 21: on-policy distillation against RL from the same off-policy checkpoint
qwen3_gpu_hours = {"rl": 17_920, "on_policy_distillation": 1_800}
qwen3_gpu_hours["ratio"] = qwen3_gpu_hours["on_policy_distillation"] / qwen3_gpu_hours["rl"]
print(f"{qwen3_gpu_hours['ratio']:.3f}")
#> 0.100
# --8<-- [end:qwen3]

computed_result("moe-distillation", "account",
                {"teachers": teachers, "serving": serving, "hold": hold, "storage": storage,
                 "compute": compute, "qwen3_gpu_hours": qwen3_gpu_hours})  # fmt: skip
