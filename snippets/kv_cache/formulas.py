"""KV-cache bytes from a Hugging Face-style config: MHA / GQA / MQA, MLA, sliding windows,
quantized formats, and the bytes one decode step reads."""

from __future__ import annotations

import math

from snippets.common.hardware import load_hardware
from snippets.common.models.kv_configs import kv_config
from snippets.common.results import computed_result
from snippets.metrics.qwen3 import qwen3_params

# --8<-- [start:format]
BITS = {"fp32": 32, "bf16": 16, "fp16": 16, "fp8": 8, "int8": 8, "int4": 4}


def bytes_per_element(fmt: str | float = "bf16", group: int | None = None, scale_bytes: int = 2):
    """Average bytes per cached element: the value's bits, plus one scale (fp16: 2 bytes, or 4
    for a scale and a zero point) shared by `group` elements. group=None: a per-tensor scale,
    whose cost per element is negligible. A number instead of a name means bits per element."""
    bits = fmt if isinstance(fmt, int | float) and not isinstance(fmt, bool) else BITS.get(fmt)
    if bits is None or bits <= 0:
        raise ValueError(f"unknown KV format {fmt!r}; known: {', '.join(BITS)} or bits > 0")
    if group is not None and group <= 0:
        raise ValueError(f"group must be a positive number of elements, got {group}")
    return bits / 8 + (scale_bytes / group if group else 0)


# --8<-- [end:format]


# --8<-- [start:layers]
def elements_per_token_layer(cfg: dict) -> int:
    """Elements one layer caches per token.
    MLA (kv_lora_rank present): the latent c^KV plus the decoupled RoPE key k^R, shared by all
    heads.
    Otherwise K and V, each num_key_value_heads x head_dim: MHA when the KV heads equal the query
    heads, GQA when fewer, MQA when one."""
    if "kv_lora_rank" in cfg:
        return cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    n_kv = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    return 2 * n_kv * head_dim


def layer_windows(cfg: dict) -> list[int | None]:
    """Per layer, how many past tokens it keeps: the sliding window, or None (all of them)."""
    window, pattern = cfg.get("sliding_window"), cfg.get("sliding_window_pattern")
    layers = range(1, cfg["num_hidden_layers"] + 1)
    if window is None:
        return [None for _ in layers]
    return [None if pattern and i % pattern == 0 else window for i in layers]


def kv_bytes_per_token(cfg: dict, fmt="bf16", group=None) -> float:
    """Bytes each token adds to the cache while the context is shorter than every window."""
    return cfg["num_hidden_layers"] * elements_per_token_layer(cfg) * bytes_per_element(fmt, group)


def kv_bytes_per_sequence(cfg: dict, tokens: int, fmt="bf16", group=None) -> float:
    """Bytes one sequence of `tokens` tokens holds: a sliding layer keeps at most its window."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    kept = sum(tokens if w is None else min(tokens, w) for w in layer_windows(cfg))
    return kept * elements_per_token_layer(cfg) * bytes_per_element(fmt, group)


# --8<-- [end:layers]


# --8<-- [start:decode]
def decode_bytes(weight_bytes: float, kv_bytes: list[float]) -> float:
    """Bytes one decode step reads at least: every weight once (shared by the batch) plus each
    sequence's whole cache once."""
    return weight_bytes + sum(kv_bytes)


def decode_floor_s(weight_bytes: float, kv_bytes: list[float], bandwidth: float) -> float:
    """A lower bound on the step time: those bytes at the peak HBM bandwidth (bytes/s)."""
    return decode_bytes(weight_bytes, kv_bytes) / bandwidth


# --8<-- [end:decode]


# --8<-- [start:capacity]
def kv_budget(memory: float, weights: float, workspace: float, utilization: float = 0.9) -> float:
    """Bytes left for the cache: the fraction of GPU memory the server may use (vLLM's
    gpu_memory_utilization, default 0.9) minus the weights and the activation workspace."""
    budget = memory * utilization - weights - workspace
    if budget <= 0:
        raise ValueError(f"no room for a KV cache: {memory * utilization:.3g} B usable, "
                         f"{weights + workspace:.3g} B taken by weights and workspace")  # fmt: skip
    return budget


def max_tokens(budget: float, cfg: dict, fmt="bf16", group=None, block: int = 16) -> int:
    """Tokens the cache holds, in whole blocks of `block` tokens (full-attention layers)."""
    per_block = block * kv_bytes_per_token(cfg, fmt, group)
    return math.floor(budget / per_block) * block


def max_sequences(budget: float, cfg: dict, tokens: int, fmt="bf16", group=None) -> int:
    """Sequences of `tokens` tokens that fit at once (sliding windows included)."""
    return math.floor(budget / kv_bytes_per_sequence(cfg, tokens, fmt, group))


# --8<-- [end:capacity]

# --8<-- [start:vllm]
# vLLM paper (arXiv:2309.06180) §3: OPT-13B in fp16 needs "800 KB" per token and "1.6 GB"
# for a request of 2048 tokens
opt = kv_config("opt-13b")
opt_token = kv_bytes_per_token(opt, "fp16")
opt_request = kv_bytes_per_sequence(opt, opt["max_position_embeddings"], "fp16")
print(opt_token / 2**10, round(opt_request / 2**30, 1))  # KiB, GiB
#> 800.0 1.6
# --8<-- [end:vllm]

# --8<-- [start:mla]
# DeepSeek-V2 (arXiv:2405.04434, abstract and §3.2.3): "reduces the KV cache by 93.3%" against
# DeepSeek 67B; the deployed V2 stores its cache at about 6 bits per element, 67B at bf16.
v2, dense_67b = kv_config("deepseek-v2"), kv_config("deepseek-llm-67b")
mla_deployed = 1 - kv_bytes_per_token(v2, 6) / kv_bytes_per_token(dense_67b, "bf16")
mla_same_format = 1 - kv_bytes_per_token(v2) / kv_bytes_per_token(dense_67b)
gqa_groups = elements_per_token_layer(v2) / (2 * v2["v_head_dim"])  # V2 Table 1: GQA, 2.25 groups
print(f"{mla_deployed:.1%}", f"{mla_same_format:.1%}", gqa_groups)
#> 93.3% 82.2% 2.25
# --8<-- [end:mla]

# --8<-- [start:sliding]
# Mistral 7B (arXiv:2310.06825 §2): the rolling buffer "reduces the cache memory usage by 8x" at 32k
mistral = kv_config("mistral-7b-v0.1")
full = dict(mistral, sliding_window=None)  # the same model without its window
rolling = kv_bytes_per_sequence(full, 32768) / kv_bytes_per_sequence(mistral, 32768)
gemma = kv_config("gemma-2-9b")  # Gemma 2: every other layer slides over 4096 tokens
gemma_at_8k = kv_bytes_per_sequence(gemma, 8192) / kv_bytes_per_sequence(
    dict(gemma, sliding_window=None), 8192
)
print(rolling, gemma_at_8k)
#> 8.0 0.75
# --8<-- [end:sliding]

# --8<-- [start:table]
MODELS = ("opt-13b", "qwen3-8b", "mistral-7b-v0.1", "gemma-2-9b", "deepseek-llm-67b",
          "deepseek-v2", "deepseek-v3")  # fmt: skip
CONTEXT = 32768
rows = []
for name in MODELS:
    cfg = kv_config(name)
    n = min(CONTEXT, cfg.get("max_position_embeddings", CONTEXT))  # the config's position limit
    rows.append({
        "model": name,
        "context": n,
        "per_token_kib": kv_bytes_per_token(cfg) / 2**10,  # bf16
        "seq_gib": kv_bytes_per_sequence(cfg, n) / 2**30,
        "seq_fp8_gib": kv_bytes_per_sequence(cfg, n, "fp8") / 2**30,
        "seq_int4_gib": kv_bytes_per_sequence(cfg, n, "int4", group=64) / 2**30,
    })  # fmt: skip
print(len(rows))
#> 7
# --8<-- [end:table]

# --8<-- [start:qwen3]
h200 = load_hardware()["h200-sxm"]
bandwidth, memory = h200.hbm_tb_per_s * 1e12, h200.memory_gb * 1e9
qwen3 = kv_config("qwen3-8b")
weights = 2 * qwen3_params(qwen3)["total"]  # bf16 weights resident in memory
weights_read = 2 * qwen3_params(qwen3)["matmul"]  # read once per decode step
budget = kv_budget(memory, weights, workspace=4e9)  # workspace: a page input, 4 GB
tokens = max_tokens(budget, qwen3)
seqs_8k = max_sequences(budget, qwen3, 8192)
seq_8k = kv_bytes_per_sequence(qwen3, 8192)
step_ms = {
    b: 1e3 * decode_floor_s(weights_read, [seq_8k] * b, bandwidth) for b in (1, 8, 32, seqs_8k)
}
print(seqs_8k, tokens // 1000)
#> 88 722
# --8<-- [end:qwen3]

computed_result(
    "kv-cache",
    "formulas",
    {
        "opt_token_kib": opt_token / 2**10,
        "opt_request_gib": opt_request / 2**30,
        "mla_deployed": mla_deployed,
        "mla_same_format": mla_same_format,
        "gqa_groups": gqa_groups,
        "mistral_rolling": rolling,
        "gemma_at_8k": gemma_at_8k,
        "rows": rows,
        "qwen3": {
            "budget_gib": budget / 2**30,
            "max_tokens": tokens,
            "seqs_8k": seqs_8k,
            "step_ms": [{"batch": b, "ms": ms} for b, ms in step_ms.items()],
            "kv_share_at_max": 1 - weights_read / decode_bytes(weights_read, [seq_8k] * seqs_8k),
        },
    },
)
