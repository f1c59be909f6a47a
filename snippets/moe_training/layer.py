"""A reference MoE layer: routing (softmax top-k as Qwen3-MoE / Mixtral, sigmoid with
normalisation and group-limited selection as DeepSeek-V3), a capacity factor with token dropping
or none (dropless), routed and shared SwiGLU experts.

Written for reading and for checking the fast paths against: each expert runs on its own slice
of the tokens sorted by expert (`expert_mlp` can be swapped for the grouped GEMM of
grouped_gemm.py). The weights are laid out as Hugging Face transformers 5 lays out
Qwen3MoeSparseMoeBlock (`gate.weight` [E, H], `experts.gate_up_proj` [E, 2I, H],
`experts.down_proj` [E, H, I]), so the shared model's block loads into it unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


# --8<-- [start:config]
@dataclass(frozen=True)
class MoeConfig:
    hidden: int
    experts: int  # routed experts
    top_k: int
    inter: int  # one routed expert's MLP width
    scoring: str = "softmax"  # "softmax" (Qwen3-MoE, Mixtral) or "sigmoid" (DeepSeek-V3)
    norm_topk_prob: bool = True  # renormalise the k selected weights to sum to 1
    routed_scaling: float = 1.0  # DeepSeek-V3: 2.5, applied after the normalisation
    n_group: int = 1  # DeepSeek-V3: experts in 8 groups (one per node), a token uses <= 4
    topk_group: int = 1
    shared_inter: int = 0  # the shared experts' total width (DeepSeek-V3: 1 x 2048); 0: none
    capacity_factor: float | None = None  # None: dropless

    def __post_init__(self):
        if self.scoring not in ("softmax", "sigmoid"):
            raise ValueError(f"scoring must be 'softmax' or 'sigmoid', got {self.scoring!r}")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k} must be in 1..experts={self.experts}")
        if self.experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(f"n_group={self.n_group} must divide experts={self.experts} and "
                             f"1 <= topk_group={self.topk_group} <= n_group")  # fmt: skip
        if self.topk_group * (self.experts // self.n_group) < self.top_k:
            raise ValueError("the allowed groups hold fewer experts than top_k")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor must be positive, got {self.capacity_factor}")


# --8<-- [end:config]


# --8<-- [start:route]
@dataclass
class Routing:
    weights: torch.Tensor  # [T, k] combine weights, the input's dtype
    experts: torch.Tensor  # [T, k] expert ids
    scores: torch.Tensor  # [T, E] fp32: softmax probabilities or sigmoid affinities
    logits: torch.Tensor  # [T, E] the router's output


def route(logits: torch.Tensor, cfg: MoeConfig, bias: torch.Tensor | None = None) -> Routing:
    """Pick k experts per token. `bias` [E] (DeepSeek-V3's auxiliary-loss-free balancing) is
    added to the scores for the choice only: the weights come from the scores without it."""
    t, e = logits.shape
    if e != cfg.experts:
        raise ValueError(f"router logits have {e} experts, config says {cfg.experts}")
    if cfg.scoring == "softmax":
        scores = F.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
    choice = scores if bias is None else scores + bias.float()
    if cfg.n_group > 1:  # group-limited: keep the topk_group groups with the best top-2 sums
        grouped = choice.view(t, cfg.n_group, -1)
        group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(-1)
        keep = group_score.topk(cfg.topk_group, dim=-1).indices
        allowed = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, keep, True)
        choice = grouped.masked_fill(~allowed.unsqueeze(-1), -math.inf).view(t, e)
    experts = choice.topk(cfg.top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    weights = weights * cfg.routed_scaling
    return Routing(weights.to(logits.dtype), experts, scores, logits)


# --8<-- [end:route]


# --8<-- [start:capacity]
def capacity(tokens: int, cfg: MoeConfig) -> int | None:
    """Slots per expert: ceil(capacity_factor * tokens * k / E) (GShard, Switch); None: no limit."""
    if cfg.capacity_factor is None:
        return None
    return math.ceil(cfg.capacity_factor * tokens * cfg.top_k / cfg.experts)


def keep_mask(experts: torch.Tensor, cap: int | None) -> torch.Tensor:
    """[T, k] bool: which assignments fit in their expert's capacity. First choices are served
    before second choices, and within one rank earlier tokens first (GShard's order); the rest
    are dropped: that slot contributes nothing, the token's residual carries it."""
    if cap is None:
        return torch.ones_like(experts, dtype=torch.bool)
    t, k = experts.shape
    by_rank = experts.t().reshape(-1)  # rank 0 of every token, then rank 1, ...
    onehot = F.one_hot(by_rank, int(experts.max()) + 1)
    position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # place in its expert's queue
    return (position < cap).view(k, t).t()


# --8<-- [end:capacity]


# --8<-- [start:experts]
def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def expert_mlp(x_sorted, counts: list[int], gate_up_proj, down_proj):
    """Each expert's SwiGLU MLP on its contiguous slice of the sorted rows; an expert with no
    rows runs on an empty slice (its weights get a zero gradient)."""
    outs = []
    for e, piece in enumerate(x_sorted.split(counts)):
        outs.append(F.linear(swiglu(F.linear(piece, gate_up_proj[e])), down_proj[e]))
    return torch.cat(outs)


# --8<-- [end:experts]


# --8<-- [start:layer]
class MoeLayer(nn.Module):
    def __init__(self, cfg: MoeConfig, mlp=expert_mlp):
        super().__init__()
        self.cfg, self.mlp = cfg, mlp
        e, h, i = cfg.experts, cfg.hidden, cfg.inter
        self.gate = nn.Linear(h, e, bias=False)
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, h) * 0.02)
        self.down_proj = nn.Parameter(torch.randn(e, h, i) * 0.02)
        self.register_buffer("bias", torch.zeros(e))  # aux-loss-free balancing; not trained
        if cfg.shared_inter:
            self.shared_gate_up = nn.Linear(h, 2 * cfg.shared_inter, bias=False)
            self.shared_down = nn.Linear(cfg.shared_inter, h, bias=False)

    def forward(self, x):
        """x [..., H] -> (out [..., H], Routing, kept [T, k])."""
        cfg, flat = self.cfg, x.reshape(-1, x.shape[-1])
        t = flat.shape[0]
        r = route(self.gate(flat), cfg, self.bias if self.bias.any() else None)
        kept = keep_mask(r.experts, capacity(t, cfg))
        slots = r.experts.flatten()  # slot j*k + q: token j's q-th expert
        live = kept.flatten().nonzero().squeeze(-1)  # dropped slots go nowhere
        order = live[torch.argsort(slots[live], stable=True)]
        counts = torch.bincount(slots[live], minlength=cfg.experts).tolist()
        y_sorted = self.mlp(flat[order // cfg.top_k], counts, self.gate_up_proj, self.down_proj)
        # slot -> its row of y_sorted, or the zero row appended for dropped slots (a gather
        # keeps only the index for the backward; index_copy would also keep y_sorted)
        where = torch.full_like(slots, len(order)).index_copy(0, order, torch.arange(
            len(order), device=slots.device))  # fmt: skip
        y = torch.cat([y_sorted, y_sorted.new_zeros(1, y_sorted.shape[-1])])[where]
        out = (y.view(t, cfg.top_k, -1) * r.weights.unsqueeze(-1)).sum(dim=1)
        if cfg.shared_inter:
            out = out + self.shared_down(swiglu(self.shared_gate_up(flat)))
        return out.view_as(x), r, kept


# --8<-- [end:layer]


def expert_load(experts: torch.Tensor, num_experts: int, kept: torch.Tensor | None = None):
    """[E] assignments per expert (only the kept ones, when a mask is given)."""
    flat = experts.flatten() if kept is None else experts[kept]
    return torch.bincount(flat, minlength=num_experts)
