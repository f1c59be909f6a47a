"""Speculative sampling: accept a drafted token x ~ q with probability min(1, p(x) / q(x)); at
the first rejection, sample from the residual norm(max(0, p - q)); when every draft is
accepted, sample one more token from the target (Leviathan et al. 2023, Algorithm 1; Chen et
al. 2023, Algorithm 2, whose p and q are swapped). Batched: every row has its own drafts and
may accept a different number of them. Nothing here reads a value back to the host, so a
decoding round that calls it can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


# --8<-- [start:sample]
def sample(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of `weights` [..., V] (non-negative, not necessarily normalized),
    drawn with probability weights_i / sum(weights): the exponential race argmax_i w_i / E_i
    with E_i ~ Exp(1) i.i.d. (E_i / w_i is exponential with rate w_i, and the smallest of
    independent exponentials is i with probability w_i / sum w). No normalization, no host
    sync; a weight of 0 never wins unless the whole row is 0."""
    e = torch.empty_like(weights).exponential_(generator=generator)
    return (weights / e.clamp_min_(torch.finfo(e.dtype).tiny)).argmax(-1)


# --8<-- [end:sample]


# --8<-- [start:rule]
def accept_probability(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x) / q(x)) for a draft x ~ q (so q(x) > 0)."""
    return (p_x / q_x).clamp(max=1.0)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) over the last dimension. Its mass, 1 - sum min(p, q), is the
    probability of a rejection: where it is 0 (p == q) a rejection cannot happen, and p is
    returned so that the result stays a distribution."""
    r = (p - q).clamp_min(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(torch.finfo(r.dtype).tiny), p)


# --8<-- [end:rule]


# --8<-- [start:verify]
class Verdict(NamedTuple):
    accepted: torch.Tensor  # [b] number of drafts accepted, 0..gamma
    token: torch.Tensor  # [b] the token the target adds: a correction, or the bonus token


def verify(draft: torch.Tensor, q: torch.Tensor | None, p: torch.Tensor, *, greedy: bool = False,
           generator: torch.Generator | None = None) -> Verdict:  # fmt: skip
    """One verification for a batch. draft [b, gamma]: the drafted tokens; q [b, gamma, V]:
    the distributions they were drawn from (None: deterministic drafts, a one-hot q, as from
    n-gram lookup); p [b, gamma + 1, V]: the target's distributions at the gamma + 1
    positions, the last one after every draft. greedy: temperature 0, i.e. p and q one-hot at
    their argmax (Leviathan §2.2); a draft is accepted iff it is the target's argmax."""
    b, gamma = draft.shape
    if p.shape[:2] != (b, gamma + 1):
        raise ValueError(f"p must be [{b}, {gamma + 1}, V] for {gamma} drafts, "
                         f"got {tuple(p.shape)}")  # fmt: skip
    if greedy:
        best = p.argmax(-1)  # [b, gamma + 1]
        n = (draft == best[:, :gamma]).long().cumprod(-1).sum(-1)
        return Verdict(n, best.gather(1, n[:, None])[:, 0])
    if gamma == 0:
        none = torch.zeros(b, dtype=torch.long, device=p.device)
        return Verdict(none, sample(p[:, 0], generator))
    p_x = p[:, :gamma].gather(-1, draft[..., None])[..., 0]
    q_x = torch.ones_like(p_x) if q is None else q.gather(-1, draft[..., None])[..., 0]
    u = torch.rand(p_x.shape, generator=generator, device=p.device, dtype=p.dtype)
    ok = u < accept_probability(p_x, q_x)  # accepted with probability min(1, p/q)
    n = ok.long().cumprod(-1).sum(-1)  # drafts before the first rejection
    at = n[:, None, None].expand(b, 1, p.shape[-1])
    p_next = p.gather(1, at)[:, 0]  # p_{n+1}
    first = n.clamp(max=gamma - 1)[:, None]  # the rejected draft (unused where n == gamma)
    if q is None:
        q_next = torch.zeros_like(p_next).scatter_(1, draft.gather(1, first), 1.0)
    else:
        q_next = q.gather(1, first[..., None].expand(b, 1, q.shape[-1]))[:, 0]
    dist = torch.where((n < gamma)[:, None], residual(p_next, q_next), p_next)
    return Verdict(n, sample(dist, generator))


def emitted(draft: torch.Tensor, verdict: Verdict) -> torch.Tensor:
    """[b, gamma + 1]: the accepted drafts, then the target's token; row i holds
    verdict.accepted[i] + 1 tokens, the slots after them are left as drafts (unused)."""
    out = torch.cat([draft, verdict.token[:, None]], 1)
    at = verdict.accepted[:, None]
    return out.scatter(1, at, verdict.token[:, None])


# --8<-- [end:verify]
