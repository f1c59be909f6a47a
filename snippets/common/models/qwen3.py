"""A Qwen3 decoder in plain PyTorch, with explicit swap points for fused kernels.

Parameter names follow Hugging Face `transformers` (Qwen3ForCausalLM), so its state dict
loads unchanged. The series' kernel, precision, checkpointing and CUDA Graph posts import
this model and swap kernels in through `Kernels`, without editing it.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn


# --8<-- [start:config]
@dataclass(frozen=True)
class Qwen3Config:
    vocab_size: int = 151_936
    hidden_size: int = 4096
    intermediate_size: int = 12_288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False


QWEN3_8B = Qwen3Config()  # values of Qwen/Qwen3-8B's config.json
TINY = replace(  # same structure, CPU-sized: GQA 4:2, non-power-of-two MLP width
    QWEN3_8B,
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
# --8<-- [end:config]


# --8<-- [start:kernels]
class RMSNorm(nn.Module):
    """y = w * (x / sqrt(mean(x^2) + eps)), statistics in fp32, cast back before the weight."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, k, cos, sin):
    """Rotate-half RoPE on [batch, heads, seq, head_dim]; cos/sin are [seq, head_dim]."""
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def swiglu(gate, up):
    return F.silu(gate) * up


def lm_loss(hidden, weight, labels):
    """Mean cross-entropy over labels != -100; logits upcast to at least fp32."""
    logits = hidden @ weight.T
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


@dataclass(frozen=True)
class Kernels:
    """The swap points. Later posts pass fused versions with the same signatures."""

    norm: Callable[[int, float], nn.Module] = RMSNorm  # (dim, eps) -> module
    rope: Callable = apply_rope  # (q, k, cos, sin) -> (q, k)
    mlp_act: Callable = swiglu  # (gate, up) -> hidden
    loss: Callable = lm_loss  # (hidden, lm_head_weight, labels) -> scalar


# --8<-- [end:kernels]


# --8<-- [start:blocks]
def rope_tables(cfg: Qwen3Config, seq_len: int, device=None):
    """cos, sin of shape [seq, head_dim], computed in fp32 (theta = rope_theta)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, cfg: Qwen3Config, kernels: Kernels):
        super().__init__()
        h, d = cfg.hidden_size, cfg.head_dim
        self.n_q, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.n_q * d, bias=False)
        self.k_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.n_kv * d, bias=False)
        self.o_proj = nn.Linear(self.n_q * d, h, bias=False)
        self.q_norm = kernels.norm(d, cfg.rms_norm_eps)  # per head, before RoPE
        self.k_norm = kernels.norm(d, cfg.rms_norm_eps)
        self.rope = kernels.rope

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, s, self.n_q, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.n_kv, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, k, cos.to(q.dtype), sin.to(q.dtype))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: Qwen3Config, kernels: Kernels):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.act = kernels.mlp_act

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Qwen3Config, kernels: Kernels):
        super().__init__()
        self.input_layernorm = kernels.norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, kernels)
        self.post_attention_layernorm = kernels.norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg, kernels)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)  # pre-norm residual
        return x + self.mlp(self.post_attention_layernorm(x))


# --8<-- [end:blocks]


# --8<-- [start:model]
class Qwen3Model(nn.Module):
    def __init__(self, cfg: Qwen3Config, kernels: Kernels):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        n = cfg.num_hidden_layers
        self.layers = nn.ModuleList(DecoderLayer(cfg, kernels) for _ in range(n))
        self.norm = kernels.norm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3ForCausalLM(nn.Module):
    def __init__(self, cfg: Qwen3Config, kernels: Kernels | None = None):
        super().__init__()
        kernels = kernels or Kernels()
        self.config, self.kernels = cfg, kernels
        self.model = Qwen3Model(cfg, kernels)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:  # Qwen3-0.6B/1.7B/4B: the head IS the input embedding
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden_states(self, input_ids):
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_tables(self.config, input_ids.shape[1], input_ids.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.model.norm(x)

    def forward(self, input_ids, labels=None):
        """Logits; or, with labels, the next-token loss (position t predicts labels[t + 1])."""
        h = self.hidden_states(input_ids)
        if labels is None:
            return self.lm_head(h)
        return self.kernels.loss(h[:, :-1], self.lm_head.weight, labels[:, 1:])


# --8<-- [end:model]


def count_parameters(cfg: Qwen3Config) -> dict:
    """Total and non-embedding (no input embedding, no LM head) parameter counts. A tied head
    shares the embedding's tensor: parameters() yields it once, and it is subtracted once."""
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    matrices = {id(m.weight): m.weight.numel() for m in (model.model.embed_tokens, model.lm_head)}
    return {"total": total, "non_embedding": total - sum(matrices.values())}
