"""Qwen3-8B, the running example: its config and parameter counts, counted by hand."""

# --8<-- [start:config]
from dataclasses import asdict

from snippets.common.models.qwen3 import QWEN3_8B as SHARED_CONFIG

# The series' shared Qwen3-8B config (values of Qwen/Qwen3-8B's config.json), as a plain dict.
QWEN3_8B = asdict(SHARED_CONFIG)


def qwen3_params(cfg: dict) -> dict:
    """Parameter counts of a dense Qwen3 model from its config (attention_bias is false).

    Parameters and FLOPs are separate questions: a tied LM head (tie_word_embeddings) stores
    no matrix of its own, so "total" counts the vocab x hidden matrix once, but every token is
    still multiplied by it (2 V H FLOPs forward), so "lm_head" and "matmul" always include it."""
    h, d = cfg["hidden_size"], cfg["head_dim"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    attention = h * hq * d + 2 * h * hkv * d + hq * d * h + 2 * d  # q, k, v, o; q_norm, k_norm
    mlp = 3 * h * cfg["intermediate_size"]  # gate, up, down (SwiGLU)
    layer = attention + mlp + 2 * h  # + two RMSNorm weight vectors
    embedding = lm_head = cfg["vocab_size"] * h  # the head's matrix: its own, or the embedding
    stored_head = 0 if cfg["tie_word_embeddings"] else lm_head
    layers = cfg["num_hidden_layers"] * layer
    return {
        "layers": layers,  # all transformer layers
        "lm_head": lm_head,  # weights the logits multiply every token by, tied or not
        "non_embedding": layers + h,  # + final norm: the model card's "non-embedding" count
        "total": layers + h + embedding + stored_head,  # parameters stored, each tensor once
        "matmul": layers + lm_head,  # weights that multiply every token (not the lookup table)
    }


# --8<-- [end:config]
