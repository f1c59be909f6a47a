"""The storage and compute account of distillation: what offline teacher logits cost to keep,
and what an MoE teacher's forward pass costs per token, counted from the models' configs.

Storage: one position's full distribution is V values; a top-k store keeps k values and k
token ids. Compute (FLOPs per token, the metrics post's convention: 2N for a forward pass, 6N
for training, N the weights a token is multiplied by): an MoE's N counts only the k experts a
token is routed to, so a teacher's forward cost follows its active parameters, while the memory
that holds it follows its total parameters.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

from snippets.common.models.qwen3 import Qwen3Config
from snippets.common.models.qwen3_moe import QWEN3_30B_A3B, Qwen3MoeConfig, count_parameters
from snippets.metrics.training import flops_per_token_6n


# --8<-- [start:storage]
def index_bytes(vocab: int) -> int:
    """The narrowest power-of-two integer (bytes) that holds every token id of the vocabulary:
    2 up to 65,536 tokens, else 4 (151,936 ids need 18 bits)."""
    if vocab < 1:
        raise ValueError(f"a vocabulary has at least one token, got {vocab}")
    return next(b for b in (1, 2, 4, 8) if vocab <= 2 ** (8 * b))


def bytes_per_token(vocab: int, k: int, value_bytes: float, id_bytes: float) -> dict:
    """Bytes one position costs offline: the full distribution (V values) or the top-k (k
    values and k ids). A top-k of raw logits is enough when the loss renormalizes over it."""
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, vocab = {vocab}], got {k}")
    full, topk = vocab * value_bytes, k * (value_bytes + id_bytes)
    return {"full": full, "topk": topk, "ratio": full / topk}


# --8<-- [end:storage]


# --8<-- [start:student]
def student_config(teacher: Qwen3MoeConfig) -> Qwen3Config:
    """A dense model with the teacher's attention, norms, vocabulary and depth, and one MLP as
    wide as the k experts a token goes through: the same active parameters (the router's
    E x H per layer aside), all of them used by every token."""
    fields = {f: getattr(teacher, f) for f in Qwen3Config.__dataclass_fields__}
    width = teacher.num_experts_per_tok * teacher.moe_intermediate_size
    return Qwen3Config(**(fields | {"intermediate_size": width}))


# --8<-- [end:student]


# --8<-- [start:counts]
def moe_counts(cfg: Qwen3MoeConfig) -> dict:
    """Total and active parameters of a Qwen3-MoE config (the shared model code counts them),
    and N: the active ones less the input embedding, a lookup (a tied head is the embedding,
    multiplied by every token: then nothing is subtracted)."""
    c = _counted(cfg)
    lookup = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size
    return {"total": c["total"], "active": c["active"], "n_matmul": c["active"] - lookup}


@functools.cache  # count_parameters builds the model on the meta device: once per config
def _counted(cfg: Qwen3MoeConfig) -> dict:
    return count_parameters(cfg)


# Qwen/Qwen3-235B-A22B: Qwen3 report Table 2 (94 layers, 64 / 4 heads, 128 experts, 8 active)
# with hidden 4096 and expert width 1536 of its config.json (as MaxText's qwen3-235b-a22b.yml
# copies it); everything else as Qwen3-30B-A3B.
QWEN3_235B_A22B = replace(QWEN3_30B_A3B, hidden_size=4096, num_hidden_layers=94,
                          num_attention_heads=64, moe_intermediate_size=1536)  # fmt: skip

# deepseek-ai/DeepSeek-V3, inference/configs/config_671B.json (DeepSeek-R1 has the same shape)
DEEPSEEK_V3 = {"vocab_size": 129280, "dim": 7168, "inter_dim": 18432, "moe_inter_dim": 2048,
               "n_layers": 61, "n_dense_layers": 3, "n_heads": 128, "n_routed_experts": 256,
               "n_shared_experts": 1, "n_activated_experts": 8, "q_lora_rank": 1536,
               "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128}  # fmt: skip


def deepseek_v3_counts(c: dict) -> dict:
    """DeepSeek-V3's parameters, tensor by tensor as its inference/model.py builds them: MLA
    (low-rank q and kv projections with their norms), 3 dense MLP layers then MoE layers with
    one shared expert, a gate with a bias per routed expert, untied embedding and head. The
    MTP module is not part of the 671B (the repository's README counts it apart)."""
    d, h = c["dim"], c["n_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    attention = (d * c["q_lora_rank"] + c["q_lora_rank"] + c["q_lora_rank"] * h * qk
                 + d * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) + c["kv_lora_rank"]
                 + c["kv_lora_rank"] * h * (c["qk_nope_head_dim"] + c["v_head_dim"])
                 + h * c["v_head_dim"] * d + 2 * d)  # + attn_norm, ffn_norm  # fmt: skip
    expert = 3 * d * c["moe_inter_dim"]
    gate = c["n_routed_experts"] * d + c["n_routed_experts"]
    dense = c["n_dense_layers"] * (attention + 3 * d * c["inter_dim"])
    moe_layers = c["n_layers"] - c["n_dense_layers"]
    routed, shared = c["n_routed_experts"], c["n_shared_experts"]
    lookup = head = c["vocab_size"] * d
    total = dense + moe_layers * (attention + (routed + shared) * expert + gate) + d + lookup + head
    idle = moe_layers * (routed - c["n_activated_experts"]) * expert
    return {"total": total, "active": total - idle, "n_matmul": total - idle - lookup}


# --8<-- [end:counts]


# --8<-- [start:compute]
def distill_flops_per_token(teacher_n: float, student_n: float) -> dict:
    """Per training token: the teacher's forward pass (2 N_T) and the student's training step
    (6 N_S); online distillation pays both on every epoch, offline pays the teacher once."""
    teacher, student = 2 * teacher_n, flops_per_token_6n(student_n)
    return {"teacher_forward": teacher, "student_train": student,
            "teacher_share": teacher / (teacher + student)}  # fmt: skip


def gpus_to_hold(total_params: float, bytes_per_param: float, memory_gb: float) -> int:
    """GPUs whose memory the teacher's weights alone fill (no KV cache, no activations)."""
    return math.ceil(total_params * bytes_per_param / (memory_gb * 1e9))


# --8<-- [end:compute]


# --8<-- [start:serving]
def experts_touched(num_experts: int, top_k: int, batch: int) -> float:
    """Expected distinct experts one MoE layer runs for a decode step of `batch` tokens, each
    routed to top_k distinct experts uniformly and independently (a model: real routers are
    skewed, load balancing pushes them towards uniform): E (1 - (1 - k / E)^B)."""
    if not 1 <= top_k <= num_experts or batch < 0:
        raise ValueError(f"need 1 <= top_k <= num_experts and batch >= 0, got {top_k}, "
                         f"{num_experts}, {batch}")  # fmt: skip
    return num_experts * (1 - (1 - top_k / num_experts) ** batch)


def moe_step_params(cfg: Qwen3MoeConfig, batch: int) -> float:
    """Weights one decode step of `batch` tokens reads from a Qwen3-MoE (of the embedding
    table only a row per token, left out): attention, norms, routers and head once, and per
    layer the experts the batch touches. At batch 1 that is N; a dense model reads its N at
    every batch size."""
    if batch < 1:
        raise ValueError(f"a decode step has at least one token, got batch {batch}")
    layers, per_expert = cfg.num_hidden_layers, 3 * cfg.hidden_size * cfg.moe_intermediate_size
    rest = moe_counts(cfg)["n_matmul"] - layers * cfg.num_experts_per_tok * per_expert
    touched = experts_touched(cfg.num_experts, cfg.num_experts_per_tok, batch)
    return rest + layers * touched * per_expert


# --8<-- [end:serving]
