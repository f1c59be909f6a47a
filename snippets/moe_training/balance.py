"""Load balancing: the auxiliary losses (Switch / GShard, DeepSeek-V3's sequence-wise loss, the
router z-loss of ST-MoE) and DeepSeek-V3's auxiliary-loss-free bias update, plus the load
statistics the experiment records."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _wide(x: torch.Tensor) -> torch.Tensor:
    """At least fp32 (fp64 stays fp64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# --8<-- [start:switch]
def switch_aux_loss(scores: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Switch Transformer eq. (4)-(6) with top-k: E * sum_i f_i * P_i, where f_i is the share of
    the T*k assignments that went to expert i and P_i the mean router probability of expert i.
    1 when the load and the probabilities are uniform; its gradient reaches the router through
    P_i only (f_i comes from a top-k, which has none)."""
    e = scores.shape[1]
    p = _wide(scores).mean(dim=0)
    f = torch.bincount(experts.flatten(), minlength=e).to(p.dtype) / experts.numel()
    return e * (f * p).sum()


# --8<-- [end:switch]


# --8<-- [start:sequence]
def sequence_aux_loss(scores: torch.Tensor, experts: torch.Tensor, seq_len: int) -> torch.Tensor:
    """DeepSeek-V3's complementary sequence-wise balance loss (eq. 17-20), before its factor
    alpha: per sequence, sum_i f_i * P_i with f_i = E / (k T) * (tokens choosing i) and P_i the
    mean of the affinities normalised over all experts (s_i / sum_j s_j); averaged over the
    sequences of the batch. 1 when balanced."""
    t, e = scores.shape
    if t % seq_len:
        raise ValueError(f"{t} tokens are not a whole number of sequences of {seq_len}")
    k = experts.shape[1]
    s = _wide(scores).view(-1, seq_len, e)
    normed = s / s.sum(dim=-1, keepdim=True)
    chosen = F.one_hot(experts.view(-1, seq_len, k), e).sum(dim=2).to(s.dtype)  # [B, T, E]
    f = chosen.sum(dim=1) * e / (k * seq_len)
    p = normed.mean(dim=1)
    return (f * p).sum(dim=-1).mean()


# --8<-- [end:sequence]


# --8<-- [start:zloss]
def router_z_loss(logits: torch.Tensor) -> torch.Tensor:
    """ST-MoE eq. (5): the mean over tokens of (log sum_j exp x_j)^2; keeps the logits small."""
    return torch.logsumexp(_wide(logits), dim=-1).pow(2).mean()


# --8<-- [end:zloss]


# --8<-- [start:bias]
@torch.no_grad()
def update_bias(bias: torch.Tensor, load: torch.Tensor, gamma: float) -> torch.Tensor:
    """DeepSeek-V3 §2.1.2: after each step, lower the bias of every overloaded expert by gamma
    and raise that of every underloaded one by gamma (b_i += gamma * sign(mean load - load_i),
    as in Wang et al., arXiv:2408.15664). In place; returns the bias."""
    load = load.float()
    return bias.add_(gamma * torch.sign(load.mean() - load))


# --8<-- [end:bias]


# --8<-- [start:stats]
def max_over_mean(load: torch.Tensor) -> float:
    """The busiest expert's load over the mean load: 1 is perfect balance. With experts spread
    over GPUs, the step waits for the busiest one, so this is the slowdown of the expert part."""
    load = load.float()
    return (load.max() / load.mean()).item()


# --8<-- [end:stats]
