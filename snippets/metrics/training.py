"""Training metrics: tokens/s, TGS, FLOPs per token (6N, PaLM, Megatron-LM), MFU and HFU."""

from __future__ import annotations

from snippets.common.hardware import load_hardware
from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.common.results import computed_result
from snippets.metrics.qwen3 import QWEN3_8B, qwen3_params

# --8<-- [start:qwen3]
p = qwen3_params(QWEN3_8B)
print(p["total"], p["non_embedding"])  # model card: 8.2B total, 6.95B non-embedding
#> 8190735360 6946075648
# --8<-- [end:qwen3]

# --8<-- [start:tied]
qwen3_4b = load_qwen3_configs()["qwen3-4b"].fields  # config.json of Qwen/Qwen3-4B (data/qwen3.yaml)
t = qwen3_params(qwen3_4b)  # tie_word_embeddings: true
print(t["total"], t["non_embedding"], t["matmul"])  # model card: 4.0B total, 3.6B non-embedding
#> 4022468096 3633511936 4022465536
# --8<-- [end:tied]


# --8<-- [start:throughput]
def tokens_per_second(tokens: float, seconds: float) -> float:
    return tokens / seconds


def tgs(tokens: float, seconds: float, n_gpus: int) -> float:
    """Tokens per GPU per second: throughput normalised by the GPUs that produced it."""
    return tokens / seconds / n_gpus


# --8<-- [end:throughput]


# --8<-- [start:flops]
def flops_per_token_6n(n_params: float) -> float:
    """Training FLOPs per token from matmuls with weights: 2N forward + 4N backward."""
    return 6 * n_params


def flops_per_token_palm(n_params, n_layers, n_heads, head_dim, seq_len) -> float:
    """PaLM (arXiv:2204.02311, App. B): 6N + 12 L H Q T; attention scores in full (no mask)."""
    return 6 * n_params + 12 * n_layers * n_heads * head_dim * seq_len


def mfu(tokens_per_s: float, flops_per_token: float, n_chips: int, peak_flops: float) -> float:
    """Model FLOPs utilization: the model's required FLOP/s over the chips' peak FLOP/s."""
    return tokens_per_s * flops_per_token / (n_chips * peak_flops)


# --8<-- [end:flops]


# --8<-- [start:megatron]
def megatron_flops_per_iteration(batch, seq, layers, hidden, vocab, recompute="none") -> float:
    """FLOPs of one iteration of a GPT (4h MLP, MHA) of `layers` x `hidden`, batch x seq tokens.

    "none":      72 B s l h^2 (1 + s/6h + V/12lh)  model FLOPs (Korthikanti et al. 2022, eq. 7)
    "full":      96 B s l h^2 (1 + s/6h + V/16lh)  with full activation recomputation
                 (Narayanan et al. 2021, arXiv:2104.04473, eq. 3: one extra forward per layer)
    "selective": 72 B s l h^2 (1 + s/3h + V/12lh)  selective recomputation, eq. 8 of
                 Korthikanti et al. (arXiv:2205.05198) as printed (see the page on its s/3h).
    """
    B, s, l, h, V = batch, seq, layers, hidden, vocab
    if recompute == "none":
        return 72 * B * s * l * h**2 * (1 + s / (6 * h) + V / (12 * l * h))
    if recompute == "full":
        return 96 * B * s * l * h**2 * (1 + s / (6 * h) + V / (16 * l * h))
    if recompute == "selective":
        return 72 * B * s * l * h**2 * (1 + s / (3 * h) + V / (12 * l * h))
    raise ValueError(f"recompute must be none, full or selective, not {recompute!r}")


def megatron_params(layers, hidden, vocab, seq) -> float:
    """Parameters of that GPT, Narayanan et al. 2021 eq. 2: 12 l h^2 (1 + 13/12h + (V+s)/12lh)."""
    l, h = layers, hidden
    return 12 * l * h**2 * (1 + 13 / (12 * h) + (vocab + seq) / (12 * l * h))


def training_days(tokens, params, n_gpus, flops_per_gpu) -> float:
    """Narayanan et al. 2021 eq. 4: time ~ 8 T P / (n X), with recomputation (8 = 2 x 4 passes)."""
    return 8 * tokens * params / (n_gpus * flops_per_gpu) / 86400


def utilization(flops_per_iteration, seconds, n_gpus, peak_flops) -> float:
    """FLOP/s achieved over peak. Model FLOPs give MFU; FLOPs actually executed give HFU."""
    return flops_per_iteration / seconds / (n_gpus * peak_flops)


# --8<-- [end:megatron]


# --8<-- [start:hfu]
def flops_per_token(layer_params, head_params, n_layers, n_heads, head_dim, seq, recompute="none"):
    """Per-token FLOPs of any decoder from its counts; with full recomputation the layers run
    their forward twice (the logit layer is not recomputed)."""
    attention = n_layers * n_heads * head_dim * seq  # L H Q T
    model = 6 * (layer_params + head_params) + 12 * attention
    if recompute == "none":
        return model
    if recompute == "full":
        return model + 2 * layer_params + 4 * attention
    raise ValueError(f"recompute must be none or full, not {recompute!r}")


# --8<-- [end:hfu]


# --8<-- [start:qwen3_mfu]
h200 = load_hardware()["h200-sxm"]
peak = h200.bf16_dense_tflops * 1e12  # dense BF16, from data/hardware.yaml
L, H, Q, T = 36, 32, 128, 4096  # Qwen3-8B, 4096-token sequences
per_token = {
    "6N, N = total": flops_per_token_6n(p["total"]),
    "6N, N = matmul": flops_per_token_6n(p["matmul"]),
    "PaLM, N = matmul": flops_per_token_palm(p["matmul"], L, H, Q, T),
}
for name, f in per_token.items():  # the TGS one H200 needs for MFU = 40 %
    print(f"{name:18} {f / 1e9:6.2f} GFLOP/token  TGS at 40% MFU: {0.4 * peak / f:6.0f}")
    #> 6N, N = total       49.14 GFLOP/token  TGS at 40% MFU:   8054
    #> 6N, N = matmul      45.41 GFLOP/token  TGS at 40% MFU:   8716
    #> PaLM, N = matmul    52.66 GFLOP/token  TGS at 40% MFU:   7516
# --8<-- [end:qwen3_mfu]

# --8<-- [start:qwen3_hfu]
model_f = flops_per_token(p["layers"], p["lm_head"], L, H, Q, T)
hardware_f = flops_per_token(p["layers"], p["lm_head"], L, H, Q, T, recompute="full")
print(round(hardware_f / model_f, 3))  # HFU / MFU with full recomputation
#> 1.31
# --8<-- [end:qwen3_hfu]

# The figures the page quotes, checked on every run (results/metrics/qwen3-flops.json).
computed_result(
    "metrics",
    "qwen3-flops",
    {
        "params": {k: p[k] for k in ("total", "non_embedding", "matmul")},
        # at one MFU, TGS is inversely proportional to the FLOPs counted per token
        "tgs_max_over_min": max(per_token.values()) / min(per_token.values()),
        "hfu_over_mfu": hardware_f / model_f,
    },
)
