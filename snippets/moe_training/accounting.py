"""Parameters, FLOPs and activations of an MoE model, read from its config (data/moe_models.yaml).

Each family's layout is written out weight by weight (a Qwen3-MoE layer, a Mixtral layer, a
DeepSeek-V3 layer with MLA and shared experts); the counts are checked against the published
totals, and the Qwen3 layout against the shared model of snippets/common/models/qwen3_moe.py
built on the meta device (tests/snippets/test_moe_training.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from snippets.common.results import computed_result
from snippets.moe_training.configs import MoeModel, load_moe_models


# --8<-- [start:shape]
@dataclass(frozen=True)
class MoeShape:
    """What the accounting needs, whatever the family calls it."""

    hidden: int
    vocab: int
    layers: int  # all decoder layers
    dense_layers: int  # layers whose MLP is dense (DeepSeek-V3: the first 3)
    dense_inter: int  # their MLP width
    experts: int  # routed experts per MoE layer
    top_k: int
    expert_inter: int  # one routed expert's MLP width
    shared_inter: int  # the shared experts' total MLP width (0: none)
    router_bias: bool  # DeepSeek-V3's per-expert bias (e_score_correction_bias)
    attn_params: int  # one layer's attention weights and its q/k/latent norms
    heads: int
    qk_dim: int  # per head, for the attention scores
    v_dim: int
    tied: bool


def shape_of(model: MoeModel) -> MoeShape:
    c, h = model.config, model.config["hidden_size"]
    heads = c["num_attention_heads"]
    if model.family == "deepseek_v3":  # MLA: low-rank q, a shared KV latent plus a RoPE key
        qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
        attn = (h * c["q_lora_rank"] + c["q_lora_rank"]  # q_a_proj, q_a_layernorm
                + c["q_lora_rank"] * heads * qk  # q_b_proj
                + h * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]  # kv_a
                + c["kv_lora_rank"] * heads * (c["qk_nope_head_dim"] + c["v_head_dim"])  # kv_b
                + heads * c["v_head_dim"] * h)  # o_proj  # fmt: skip
        return MoeShape(h, c["vocab_size"], c["num_hidden_layers"], c["first_k_dense_replace"],
                        c["intermediate_size"], c["n_routed_experts"], c["num_experts_per_tok"],
                        c["moe_intermediate_size"],
                        c["n_shared_experts"] * c["moe_intermediate_size"], True, attn, heads,
                        qk, c["v_head_dim"], c["tie_word_embeddings"])  # fmt: skip
    d = c.get("head_dim", h // heads)
    kv = c["num_key_value_heads"]
    attn = 2 * h * heads * d + 2 * h * kv * d  # q, o; k, v
    if model.family == "qwen3_moe":
        attn += 2 * d  # q_norm, k_norm
        experts, inter = c["num_experts"], c["moe_intermediate_size"]
    else:  # mixtral: the experts are as wide as the dense MLP they replace
        experts, inter = c["num_local_experts"], c["intermediate_size"]
    return MoeShape(h, c["vocab_size"], c["num_hidden_layers"], 0, 0, experts,
                    c["num_experts_per_tok"], inter, 0, False, attn, heads, d, d,
                    c["tie_word_embeddings"])  # fmt: skip


# --8<-- [end:shape]


# --8<-- [start:params]
def parameters(s: MoeShape) -> dict[str, int]:
    """Stored parameters, and those one token is computed with. `active` counts the input
    embedding too (the published "activated" figures do); `active_matmul` leaves it out (a
    lookup, no multiply-add): it is the N of 6N."""
    expert = 3 * s.hidden * s.expert_inter  # gate, up, down (SwiGLU)
    router = s.experts * s.hidden + (s.experts if s.router_bias else 0)
    moe_layers = s.layers - s.dense_layers
    norms = 2 * s.hidden  # the two RMSNorms of every layer
    per_dense = s.attn_params + norms + 3 * s.hidden * s.dense_inter
    shared = 3 * s.hidden * s.shared_inter
    per_moe = s.attn_params + norms + router + shared + s.experts * expert
    embed = s.vocab * s.hidden
    head = 0 if s.tied else s.vocab * s.hidden
    total = s.dense_layers * per_dense + moe_layers * per_moe + embed + head + s.hidden
    idle = moe_layers * (s.experts - s.top_k) * expert  # routed experts a token skips
    return {"total": total, "active": total - idle, "active_matmul": total - idle - embed,
            "non_embedding": total - embed - head, "routed_experts": moe_layers * s.experts
            * expert}  # fmt: skip


# --8<-- [end:params]


# --8<-- [start:flops]
def flops_per_token(s: MoeShape, seq: int, training: bool = True) -> dict[str, float]:
    """FLOPs per token of a causal sequence of `seq` tokens: 2 per multiply-add of every
    weight the token is computed with, plus the attention scores and weighted sum (QK^T and PV:
    on average (seq + 1) / 2 keys per query). Training = forward + backward = 3x forward."""
    dense = 2 * parameters(s)["active_matmul"]
    attention = s.layers * 2 * s.heads * (s.qk_dim + s.v_dim) * (seq + 1) / 2
    factor = 3 if training else 1
    return {"matmul": factor * dense, "attention": factor * attention,
            "total": factor * (dense + attention)}  # fmt: skip


# --8<-- [end:flops]


# --8<-- [start:activations]
def moe_activation_elems(s: MoeShape) -> dict[str, int]:
    """Elements one token leaves saved for the backward in one MoE layer of the reference
    implementation (snippets/moe_training/layer.py), per expert it visits: the gathered copy
    of its input (H, for dW of gate/up), the gate/up output (2I, for SwiGLU's backward),
    silu(gate) and the SwiGLU output (I each: the product's backward and dW of down), the
    expert's output (H, for the gradient of its combine weight); the same 4I for the shared
    experts; the router's fp32 scores (E) and the k weights before and after normalising
    (2k + 1). The MLP's input is the attention block's output, counted there."""
    k, h, i = s.top_k, s.hidden, s.expert_inter
    routed = k * (2 * h + 4 * i)
    shared = 4 * s.shared_inter
    router = s.experts + 2 * k + 1  # fp32
    return {"routed": routed, "shared": shared, "router": router}


def moe_activation_bytes(s: MoeShape, act_bytes: int = 2) -> int:
    """Per token and MoE layer: activations in bf16 (2 bytes), the router's scores in fp32."""
    e = moe_activation_elems(s)
    return (e["routed"] + e["shared"]) * act_bytes + e["router"] * 4


# --8<-- [end:activations]


# --8<-- [start:published]
def reproduce(models: dict[str, MoeModel]) -> list[dict]:
    """One row per (model, published figure): ours, theirs, and whether they agree to the last
    printed digit. A printed "3.3B" may be rounded or truncated, so the two agree when they
    differ by less than one unit of that digit."""
    rows = []
    for name, model in models.items():
        ours = parameters(shape_of(model))
        for figure, pub in model.published.items():
            rows.append({"model": name, "figure": figure, "ours_b": ours[figure] / 1e9,
                         "published": pub.printed, "published_b": pub.value / 1e9,
                         "agrees": abs(ours[figure] - pub.value) < pub.unit})  # fmt: skip
    return rows


MODELS = load_moe_models()
rows = reproduce(MODELS)
for r in rows:
    line = (f"{r['model']:16} {r['figure']:13} {r['ours_b']:8.2f}B  {r['published']:>6}  "
            f"{r['agrees']}")  # fmt: skip
    print(line)
    #> qwen3-30b-a3b    total            30.53B   30.5B  True
    #> qwen3-30b-a3b    active            3.35B    3.3B  True
    #> qwen3-30b-a3b    non_embedding    29.91B   29.9B  True
    #> qwen3-235b-a22b  total           235.09B    235B  True
    #> qwen3-235b-a22b  active           22.19B     22B  True
    #> qwen3-235b-a22b  non_embedding   233.85B    234B  True
    #> mixtral-8x7b     total            46.70B   46.7B  True
    #> mixtral-8x7b     active           12.88B   12.9B  True
    #> deepseek-v3      total           671.03B    671B  True
    #> deepseek-v3      active           37.55B     37B  True
assert all(r["agrees"] for r in rows)
# --8<-- [end:published]

# --8<-- [start:per_token]
SEQ = 4096  # DeepSeek-V3's pre-training sequence length (arXiv:2412.19437 §4.2)
per_model = []
for name, model in MODELS.items():
    s = shape_of(model)
    p, f = parameters(s), flops_per_token(s, SEQ)
    act = moe_activation_bytes(s)
    per_model.append({"model": name, "total_b": p["total"] / 1e9, "active_b": p["active"] / 1e9,
                      "active_share": p["active"] / p["total"],
                      "train_gflops": f["total"] / 1e9, "six_n_gflops": 6 * p["active_matmul"]
                      / 1e9, "attention_share": f["attention"] / f["total"],
                      "moe_act_kib": act / 1024})  # fmt: skip
    line = (f"{name:16} {p['active'] / p['total']:6.1%} {f['total'] / 1e9:7.1f} GFLOP/token "
            f"{act / 1024:6.1f} KiB/token/layer")  # fmt: skip
    print(line)
    #> qwen3-30b-a3b     11.0%    23.1 GFLOP/token  112.6 KiB/token/layer
    #> qwen3-235b-a22b    9.4%   148.3 GFLOP/token  224.6 KiB/token/layer
    #> mixtral-8x7b      27.6%    79.7 GFLOP/token  256.1 KiB/token/layer
    #> deepseek-v3        5.6%   250.5 GFLOP/token  369.1 KiB/token/layer
# --8<-- [end:per_token]

computed_result("moe-training", "accounting", {
    "rows": rows, "models": per_model, "seq": SEQ,
    "figures": len(rows), "agreeing": sum(r["agrees"] for r in rows)})  # fmt: skip
