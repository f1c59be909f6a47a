"""KL divergence (both directions), its estimators from samples and from top-k log-probs with a
two-sided bound on what truncation leaves out, Jensen-Shannon divergence, and top-1 agreement.

Every function takes log-probabilities over the last dimension and returns one value per row
(a position). Work in fp32 at least, fp64 for references: see numerics.py for what bf16 does.
"""

from __future__ import annotations

import math

import torch


# --8<-- [start:kl]
def _checked(logp: torch.Tensor, name: str) -> torch.Tensor:
    if logp.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"{name}: compute divergences from fp32 or fp64 log-probs, got "
                        f"{logp.dtype} (upcast the logits before log_softmax)")  # fmt: skip
    return logp


def kl(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """KL(P || Q) = sum_i p_i (log p_i - log q_i) per row; terms with p_i = 0 are 0, and a
    token that P allows and Q rules out (q_i = 0) makes it infinite."""
    logp, logq = _checked(logp, "logp"), _checked(logq, "logq")
    if logp.shape != logq.shape:
        raise ValueError(f"P {tuple(logp.shape)} and Q {tuple(logq.shape)} differ in shape")
    p = logp.exp()
    return torch.where(p > 0, p * (logp - logq), 0.0).sum(-1)


def forward_kl(ref_logp, test_logp):
    """KL(reference || test): expectation under the reference; large where the test model
    misses tokens the reference likes (mass-covering)."""
    return kl(ref_logp, test_logp)


def reverse_kl(ref_logp, test_logp):
    """KL(test || reference): expectation under the test model; large where it puts mass
    the reference does not (mode-seeking)."""
    return kl(test_logp, ref_logp)


def js(logp, logq):
    """Jensen-Shannon divergence: KL to the mixture M = (P + Q) / 2, averaged both ways.
    Symmetric, finite, at most ln 2 (Lin 1991)."""
    logm = torch.logaddexp(logp, logq) - math.log(2)
    return 0.5 * kl(logp, logm) + 0.5 * kl(logq, logm)


# --8<-- [end:kl]


# --8<-- [start:estimators]
def k1(log_ratio):
    """-log r, r = q(x) / p(x), x ~ P: unbiased for KL(P || Q); negative for half the samples."""
    return -log_ratio


def k2(log_ratio):
    """(log r)^2 / 2: biased, low variance; a second-order approximation near r = 1."""
    return 0.5 * log_ratio**2


def k3(log_ratio):
    """(r - 1) - log r: unbiased (E_P[r] = 1), never negative, low variance (Schulman 2020)."""
    return torch.expm1(log_ratio) - log_ratio


def gaussian_moments(mu: float) -> dict[str, dict[str, float]]:
    """Closed forms for P = N(0, 1), Q = N(mu, 1), x ~ P: log r = mu x - mu^2 / 2 is
    N(-mu^2/2, mu^2), and KL(P || Q) = mu^2 / 2. Bias and standard deviation of each
    estimator, relative to the true KL."""
    true = mu**2 / 2
    var = {
        "k1": mu**2,  # k1 = -log r
        "k2": (2 * mu**4 + mu**6) / 4,  # Var(y^2 / 2) with y ~ N(m, s^2): (2s^4 + 4m^2 s^2) / 4
        "k3": math.expm1(mu**2) - mu**2,
    }  # Var(r) + Var(log r) - 2 Cov(r, log r)
    bias = {"k1": 0.0, "k2": mu**4 / 8, "k3": 0.0}  # E[y^2 / 2] - true = m^2 / 2
    return {k: {"bias": bias[k] / true, "std": math.sqrt(var[k]) / true} for k in var}


# --8<-- [end:estimators]


# --8<-- [start:topk]
def topk_kl(ref_top_logp, ref_top_idx, test_logp):
    """KL(reference || test) from the reference's top-k log-probs only (what one stores
    offline) and the test model's full log-probs. Returns (low, high) per row with
    low <= KL <= high:

    low   = sum_top p (log p - log q) + m log(m / m_q): the tail merged into one bucket
            (m and m_q: the tail mass of each); merging never increases KL (log-sum inequality);
    high  = the same, with the bucket replaced by the largest tail term any reference could
            have: tail probabilities at most min(p_k, m) each (p_k: the smallest kept one),
            piled on the test model's least likely tokens (a convex function's maximum over
            that polytope sits at a vertex, and the greedy vertex is the largest)."""
    ref_top_logp = _checked(ref_top_logp, "ref_top_logp")
    test_logp = _checked(test_logp, "test_logp")
    acc = test_logp.dtype
    p_top = ref_top_logp.to(acc).exp()
    logq_top = test_logp.gather(-1, ref_top_idx)
    head = (p_top * (ref_top_logp.to(acc) - logq_top)).sum(-1)
    m = 1 - p_top.sum(-1)  # the tail mass, known to about k rounding errors: below that, none
    m = torch.where(m > p_top.shape[-1] * torch.finfo(acc).eps, m, 0.0)
    in_top = torch.zeros_like(test_logp, dtype=torch.bool).scatter(-1, ref_top_idx, True)
    q_tail = torch.where(in_top, 0.0, test_logp.exp())
    m_q = q_tail.sum(-1)
    bucket = torch.where(m > 0, m * (m.log() - m_q.log()), 0.0)
    cap = torch.minimum(p_top.min(-1).values, m)  # no tail token beats the last kept one
    if bool(((m > 0) & (cap <= 0)).any()):
        raise ValueError("the reference's top-k has a zero probability but leaves tail mass: "
                         "pass its k most likely tokens")  # fmt: skip
    steps = torch.where(m > 0, m / cap, 0.0).ceil().max().item()  # tokens the greedy fills
    fill = min(int(steps) + 1, test_logp.shape[-1])
    q_small = torch.where(in_top, math.inf, test_logp).topk(fill, largest=False).values.exp()
    filled = (cap[:, None] * torch.arange(1, fill + 1, dtype=acc)).clamp(max=m[:, None])
    mass = torch.diff(filled, dim=-1, prepend=torch.zeros_like(filled[:, :1]))  # greedy vertex
    worst = torch.where(mass > 0, mass * (mass.log() - q_small.log()), 0.0).sum(-1)
    return head + bucket, head + torch.maximum(worst, bucket)


def renormalized_topk_kl(ref_top_logp, ref_top_idx, test_logp):
    """A common shortcut: renormalize both models over the reference's top-k and take KL
    there. Neither a lower nor an upper bound of the full KL."""
    logp = ref_top_logp.to(test_logp.dtype).log_softmax(-1)
    return kl(logp, test_logp.gather(-1, ref_top_idx).log_softmax(-1))


# --8<-- [end:topk]


# --8<-- [start:agreement]
def top1_agreement(ref_logits, test_logits, scored=None) -> float:
    """The fraction of scored positions where both models' most likely token is the same
    (torch.argmax takes the first index among equal maxima, on both sides)."""
    same = ref_logits.argmax(-1) == test_logits.argmax(-1)
    if scored is None:
        scored = torch.ones_like(same)
    if not scored.any():
        raise ValueError("no scored position: agreement over zero positions is undefined")
    return same[scored].double().mean().item()


def top2_margin(logits) -> torch.Tensor:
    """Per position, how far the most likely token's logit is ahead of the runner-up's."""
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


# --8<-- [end:agreement]
