"""Qwen3-8B, the running example: its config and parameter counts (no side effects on import)."""

# --8<-- [start:config]
# Qwen/Qwen3-8B config.json on the Hugging Face Hub: the fields that set the parameter count.
QWEN3_8B = {
    "hidden_size": 4096,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 12288,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}


def qwen3_params(cfg: dict) -> dict:
    """Parameter counts of a dense Qwen3 model from its config (attention_bias is false)."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    attention = h * hq * d + 2 * h * hkv * d + hq * d * h + 2 * d  # q, k, v, o; q_norm, k_norm
    mlp = 3 * h * cfg["intermediate_size"]  # gate, up, down (SwiGLU)
    layer = attention + mlp + 2 * h  # + two RMSNorm weight vectors
    embedding = cfg["vocab_size"] * h
    lm_head = 0 if cfg["tie_word_embeddings"] else embedding
    layers = cfg["num_hidden_layers"] * layer
    return {
        "layers": layers,  # all transformer layers
        "lm_head": lm_head,
        "non_embedding": layers + h,  # + final norm: the model card's "non-embedding" count
        "total": layers + h + embedding + lm_head,
        "matmul": layers + lm_head,  # weights that multiply every token (not the lookup table)
    }


# --8<-- [end:config]
