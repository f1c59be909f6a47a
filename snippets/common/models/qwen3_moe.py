"""A Qwen3-MoE decoder: the dense model's attention, norms, RoPE and loss, a routed MLP.

Everything but the MLP is snippets/common/models/qwen3.py's code (Attention, the norms and
swap points of `Kernels`, rope_tables): a kernel swapped into the dense model is swapped in here
too. Every layer's MLP is a sparse block, as in the published Qwen3-MoE models
(decoder_sparse_step 1, no mlp_only_layers; `intermediate_size` is unused). Routing as Hugging
Face `transformers` (Qwen3MoeSparseMoeBlock) computes it: router logits in the hidden dtype,
softmax in fp32, the top k probabilities, renormalised to sum to 1 when norm_topk_prob, cast back
to the hidden dtype; the output is the weighted sum of the k experts' SwiGLU MLPs. With labels,
the loss adds router_aux_loss_coef times the Switch-Transformer load-balancing loss over all
layers' router logits, as transformers does with output_router_logits.

Parameter names follow transformers 5 (Qwen3MoeForCausalLM): `mlp.gate.weight` [E, H], the
experts as 3-D tensors `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj`
[E, H, I], so its state dict loads unchanged.
"""

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from snippets.common.models.qwen3 import Attention, Kernels, Qwen3Config, rope_tables


@dataclass(frozen=True)
class Qwen3MoeConfig(Qwen3Config):
    num_experts: int = 128
    num_experts_per_tok: int = 8
    moe_intermediate_size: int = 768
    norm_topk_prob: bool = True
    router_aux_loss_coef: float = 0.001


QWEN3_30B_A3B = Qwen3MoeConfig(  # values of Qwen/Qwen3-30B-A3B's config.json
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=48,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
)
TINY_MOE = replace(  # CPU-sized: GQA 4:2, 8 experts, top 2
    QWEN3_30B_A3B,
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=48,
)


def route(logits, top_k: int, norm_topk_prob: bool):
    """(weights [T, k] in the logits' dtype, expert ids [T, k]) from router logits [T, E]."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype), experts


def static_capacity(x) -> bool:
    """True while a CUDA graph is being captured: no host sync is allowed."""
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


class _Take(torch.autograd.Function):
    """rows = x[index], a zero row where index == len(x); backward: grad[back], likewise.
    For two index maps that invert each other on the rows they touch, the backward is a
    gather too: no scatter, no atomics, no host sync (deterministic, CUDA-graph capturable)."""

    @staticmethod
    def forward(ctx, x, index, back):
        ctx.save_for_backward(back)
        return torch.cat([x, x.new_zeros(1, x.shape[-1])])[index]

    @staticmethod
    def backward(ctx, grad):
        (back,) = ctx.saved_tensors
        return torch.cat([grad, grad.new_zeros(1, grad.shape[-1])])[back], None, None


class Experts(nn.Module):
    """E SwiGLU MLPs in two 3-D tensors. The (token, expert) slots are sorted by expert (a
    stable sort) and laid out as one [E, C, H] batch, C the most slots any expert got (zeros
    pad the rest): two batched matmuls run every expert at once, dropless. Padding rows are
    zero in and never read out, so they add nothing to outputs or gradients; an expert that
    receives no token gets a zero gradient. Slots move by gathers only (their backward is the
    inverse gather) and the k outputs of a token are summed in a fixed order. While a CUDA
    graph is being captured, C is the token count (no expert gets a token twice), the bound
    that needs no host sync; otherwise it is read once a layer. (A loop over the experts
    computes the same; on the GPU it launched ~6 kernels per expert per layer, and training
    was bound by the CPU.)"""

    def __init__(self, cfg: Qwen3MoeConfig, kernels: Kernels):
        super().__init__()
        e, h, i = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, h))
        self.down_proj = nn.Parameter(torch.empty(e, h, i))
        nn.init.normal_(self.gate_up_proj, std=0.02)
        nn.init.normal_(self.down_proj, std=0.02)
        self.act = kernels.mlp_act

    def forward(self, x, weights, experts):
        """x [T, H], weights and experts [T, k] -> [T, H]."""
        t, k = experts.shape
        n_experts, dev = self.gate_up_proj.shape[0], x.device
        flat = experts.flatten()  # slot j*k + r: token j's r-th expert
        order = torch.argsort(flat, stable=True)  # sorted position -> slot
        expert = flat[order]
        first = torch.searchsorted(expert, torch.arange(n_experts + 1, device=dev))
        row = torch.arange(t * k, device=dev) - first[expert]  # place within its expert
        cap = t if static_capacity(x) else int(first.diff().max())  # the layer's one sync
        # position e*cap + c of the batch <-> sorted slot first[e] + c (t*k: a zero row)
        c = torch.arange(cap, device=dev)
        src = first[:-1, None] + c
        src = torch.where(c < first.diff()[:, None], src, t * k).flatten()
        src = torch.where(src < t * k, order[src.clamp(max=t * k - 1)], t * k)
        dst = (expert * cap + row)[torch.argsort(order)]  # slot -> its position in the batch
        h = x.shape[-1]
        slots = x.unsqueeze(1).expand(t, k, h).reshape(t * k, h)
        batch = _Take.apply(slots, src, dst).view(n_experts, cap, h)
        gate, up = torch.bmm(batch, self.gate_up_proj.transpose(1, 2)).chunk(2, dim=-1)
        out = torch.bmm(self.act(gate, up), self.down_proj.transpose(1, 2))  # [E, C, H]
        by_slot = _Take.apply(out.view(-1, h), dst, src).view(t, k, h)
        return (by_slot * weights.unsqueeze(-1)).sum(dim=1)


class Router(nn.Module):
    def __init__(self, cfg: Qwen3MoeConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.num_experts, cfg.hidden_size))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        return F.linear(x, self.weight)


class SparseMoeBlock(nn.Module):
    def __init__(self, cfg: Qwen3MoeConfig, kernels: Kernels):
        super().__init__()
        self.top_k, self.norm_topk_prob = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.gate = Router(cfg)
        self.experts = Experts(cfg, kernels)

    def forward(self, x):
        """x [B, S, H] -> (out [B, S, H], router logits [B*S, E])."""
        flat = x.reshape(-1, x.shape[-1])
        logits = self.gate(flat)
        weights, experts = route(logits, self.top_k, self.norm_topk_prob)
        return self.experts(flat, weights, experts).view_as(x), logits


class MoeDecoderLayer(nn.Module):
    """The dense DecoderLayer's pre-norm residual block with the sparse MLP; it also returns
    the router logits."""

    def __init__(self, cfg: Qwen3MoeConfig, kernels: Kernels):
        super().__init__()
        self.input_layernorm = kernels.norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, kernels)
        self.post_attention_layernorm = kernels.norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = SparseMoeBlock(cfg, kernels)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        out, logits = self.mlp(self.post_attention_layernorm(x))
        return x + out, logits


def load_balancing_loss(router_logits: list, num_experts: int, top_k: int):
    """Switch Transformer's auxiliary loss E * sum_e f_e * P_e: f_e the top-k assignments to
    expert e per token, P_e its mean router probability, both over the tokens of all layers
    together, as transformers' load_balancing_loss_func (k when perfectly balanced)."""
    logits = torch.cat(router_logits).float()
    probs = F.softmax(logits, dim=-1)
    _, chosen = torch.topk(probs, top_k, dim=-1)
    share = F.one_hot(chosen, num_experts).sum(dim=1).float().mean(dim=0)
    return num_experts * (share * probs.mean(dim=0)).sum()


class Qwen3MoeModel(nn.Module):
    def __init__(self, cfg: Qwen3MoeConfig, kernels: Kernels):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        n = cfg.num_hidden_layers
        self.layers = nn.ModuleList(MoeDecoderLayer(cfg, kernels) for _ in range(n))
        self.norm = kernels.norm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, cfg: Qwen3MoeConfig, kernels: Kernels | None = None):
        super().__init__()
        kernels = kernels or Kernels()
        self.config, self.kernels = cfg, kernels
        self.model = Qwen3MoeModel(cfg, kernels)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def hidden_states(self, input_ids):
        """(final hidden states, each layer's router logits)."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_tables(self.config, input_ids.shape[1], input_ids.device)
        router_logits = []
        for layer in self.model.layers:
            x, logits = layer(x, cos, sin)
            router_logits.append(logits)
        return self.model.norm(x), router_logits

    def losses(self, input_ids, labels):
        """(next-token loss, load-balancing loss), unweighted."""
        h, router_logits = self.hidden_states(input_ids)
        lm = self.kernels.loss(h[:, :-1], self.lm_head.weight, labels[:, 1:])
        cfg = self.config
        return lm, load_balancing_loss(router_logits, cfg.num_experts, cfg.num_experts_per_tok)

    def forward(self, input_ids, labels=None):
        """Logits; or, with labels, next-token loss + router_aux_loss_coef * balancing loss."""
        if labels is None:
            return self.lm_head(self.hidden_states(input_ids)[0])
        lm, aux = self.losses(input_ids, labels)
        return lm + self.config.router_aux_loss_coef * aux


def count_parameters(cfg: Qwen3MoeConfig) -> dict:
    """Total parameters, and the active ones: those one token is computed with (its k experts,
    not all E; the embedding and head counted once when tied)."""
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(cfg)
    total = sum(p.numel() for p in model.parameters())
    per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
    idle = cfg.num_hidden_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
    return {"total": total, "active": total - idle}
