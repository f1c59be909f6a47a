"""Truncated importance sampling (TIS) between the rollout engine's and the trainer's
probabilities of the same sampled tokens."""

from __future__ import annotations

import torch

from snippets.rl_training.losses import BatchError, check_batch, clipped_surrogate


# --8<-- [start:weights]
def tis_weights(trainer_logp, rollout_logp, mask, cap: float = 2.0, level: str = "token"):
    """w = min(pi_trainer / pi_rollout, cap), no gradient, 0 on padding. level="token": one
    ratio per token; "sequence": the product over the response, the same w on all its tokens
    (verl's rollout correction, docs/algo/rollout_corr_math.md §3.3)."""
    check_batch(trainer_logp, rollout_logp, mask)
    if not cap > 0:
        raise ValueError(f"the truncation cap must be positive, got {cap}")
    log_rho = (trainer_logp - rollout_logp).detach() * mask
    if level == "sequence":
        log_rho = log_rho.sum(-1, keepdim=True).expand_as(mask)
    elif level != "token":
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    return torch.exp(log_rho).clamp(max=cap) * mask


def ppo_loss_tis(logp, old_logp, rollout_logp, mask, adv, cap: float = 2.0, eps: float = 0.2):
    """PPO's clipped surrogate against the trainer's recomputed old_logp, each token weighted by
    the truncated ratio old / rollout (the "decoupled" mode): the mean over all tokens."""
    if adv.shape != mask.shape:
        raise BatchError(f"adv has shape {tuple(adv.shape)}, mask {tuple(mask.shape)}")
    w = tis_weights(old_logp, rollout_logp, mask, cap)
    surrogate = clipped_surrogate(torch.exp(logp - old_logp), adv, eps)
    return -(w * surrogate * mask).sum() / mask.sum()


# --8<-- [end:weights]


# --8<-- [start:exact]
def exact_gradients(logits, rollout_logits, adv, cap=None):
    """Gradient of the expected advantage for a one-token policy softmax(logits), summed exactly
    over the vocabulary: on-policy (the truth), from rollout samples without correction, and
    with min(rho, cap) weights (cap=None: plain importance sampling)."""
    theta = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(theta, -1)
    p, q = logp.exp().detach(), torch.softmax(rollout_logits, -1)
    rho = p / q
    w = rho if cap is None else rho.clamp(max=cap)
    grads = {}
    for name, weight in (("truth", p), ("uncorrected", q), ("corrected", q * w)):
        (g,) = torch.autograd.grad((weight * adv * logp).sum(), theta, retain_graph=True)
        grads[name] = g
    return grads


# --8<-- [end:exact]
