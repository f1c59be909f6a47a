"""PPO, GRPO, Dr. GRPO, DAPO and GSPO as loss functions: the few lines in which they differ.

Shapes: one batch holds P prompts with a group of G responses each, padded to T tokens.
  logp, old_logp, ref_logp  (P, G, T)  log-probabilities of the sampled tokens under the policy
                                       being trained, the policy that sampled them, the reference
  mask                      (P, G, T)  1 for a response token, 0 for padding
  rewards                   (P, G)     one scalar reward per response (outcome reward)
Every loss returns a scalar to minimise: the negative of the paper's objective.
"""

from __future__ import annotations

import torch


# --8<-- [start:checks]
class BatchError(ValueError):
    """A batch the losses cannot use; the message says which tensor and which response."""


def check_batch(logp, old_logp, mask, rewards=None, ref_logp=None) -> None:
    """Same (P, G, T) shapes, a 0/1 mask, at least one token per response, groups of >= 2."""
    if logp.dim() != 3:
        raise BatchError(f"logp must be (prompts, group, tokens), got shape {tuple(logp.shape)}")
    for name, t in (("old_logp", old_logp), ("mask", mask), ("ref_logp", ref_logp)):
        if t is not None and t.shape != logp.shape:
            raise BatchError(f"{name} has shape {tuple(t.shape)}, logp {tuple(logp.shape)}")
    if not ((mask == 0) | (mask == 1)).all():
        raise BatchError("mask must hold only 0 and 1")
    empty = (mask.sum(-1) == 0).nonzero()
    if len(empty):
        p, g = empty[0].tolist()
        raise BatchError(f"response (prompt {p}, sample {g}) has no tokens: its mask is all zeros")
    if rewards is not None:
        if rewards.shape != logp.shape[:2]:
            want = tuple(logp.shape[:2])
            raise BatchError(f"rewards has shape {tuple(rewards.shape)}, want {want}")
        if rewards.shape[1] < 2:
            raise BatchError("a group needs at least 2 responses to have a baseline, got 1")


# --8<-- [end:checks]


# --8<-- [start:advantage]
def group_advantages(rewards: torch.Tensor, scale: bool = True, eps: float = 1e-6):
    """GRPO's outcome advantage (DeepSeekMath §4.1.2): (r - mean) / std within each group, the
    same value for every token of a response. std is the sample std (Bessel-corrected, as verl
    and TRL compute it); eps keeps an all-equal group at 0 instead of 0/0. scale=False is
    Dr. GRPO's r - mean (Understanding R1-Zero-Like Training §3.2)."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise BatchError(f"rewards must be (prompts, group >= 2), got {tuple(rewards.shape)}")
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not scale:
        return centred
    return centred / (rewards.std(dim=1, keepdim=True) + eps)


# --8<-- [end:advantage]


# --8<-- [start:kl]
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi_theta || pi_ref) per sampled token, DeepSeekMath
    Eq. (4): r - log r - 1 with r = pi_ref / pi_theta. Never negative (log r <= r - 1), and its
    mean over tokens drawn from pi_theta is the KL. Its gradient is another matter: see the
    k3 section of compare.py."""
    log_r = ref_logp - logp
    return torch.exp(log_r) - log_r - 1


# --8<-- [end:kl]


# --8<-- [start:clip]
def clipped_surrogate(ratio, adv, eps_low: float = 0.2, eps_high: float | None = None):
    """PPO's L^CLIP term (Schulman et al. 2017, Eq. (7)), elementwise:
    min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A). eps_high = eps_low is PPO;
    DAPO decouples them (clip-higher, Eq. (10))."""
    eps_high = eps_low if eps_high is None else eps_high
    return torch.minimum(ratio * adv, torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * adv)


def ppo_loss(logp, old_logp, adv, mask, eps: float = 0.2):
    """PPO with per-token advantages adv (P, G, T): the mean of L^CLIP over all tokens."""
    check_batch(logp, old_logp, mask)
    surrogate = clipped_surrogate(torch.exp(logp - old_logp), adv, eps)
    return -(surrogate * mask).sum() / mask.sum()


# --8<-- [end:clip]


# --8<-- [start:aggregate]
def sequence_mean(x, mask):
    """GRPO: each response's token mean, then the mean over responses (weight 1/(G |o_i|))."""
    return ((x * mask).sum(-1) / mask.sum(-1)).mean()


def token_mean(x, mask):
    """DAPO Eq. (12) as written: per prompt, the sum over all tokens of the group / sum_i |o_i|;
    then the mean over prompts (every token of a group weighs the same). verl's "token-mean"
    (the setting of its DAPO recipe, docs/algo/dapo.md) divides by the token count of the whole
    mini-batch instead, so there every token of the batch weighs the same."""
    return ((x * mask).sum((1, 2)) / mask.sum((1, 2))).mean()


def constant_mean(x, mask, max_tokens: int):
    """Dr. GRPO (Listing 1): each response's token sum / MAX_TOKENS (the generation budget, a
    constant), then the mean over responses: no length normalisation at all."""
    return ((x * mask).sum(-1) / max_tokens).mean()


# --8<-- [end:aggregate]


# --8<-- [start:grpo]
def weighted(surrogate, is_weights, mask):
    """The surrogate of each token times its importance weight (rollout correction, section 3:
    verl multiplies its per-token policy losses by `rollout_is_weights` before aggregating,
    the KL term untouched). The weights are data: no gradient flows through them."""
    if is_weights is None:
        return surrogate
    if is_weights.shape != mask.shape:
        got, want = tuple(is_weights.shape), tuple(mask.shape)
        raise BatchError(f"is_weights has shape {got}, mask {want}")
    return surrogate * is_weights.detach()


def grpo_loss(logp, old_logp, ref_logp, mask, rewards, eps: float = 0.2, beta: float = 0.04,
              is_weights=None):  # fmt: skip
    """DeepSeekMath Eq. (3): std-normalised group advantage, clipped ratio per token, minus
    beta * k3 per token, averaged per response (1/|o_i|) and over the group (1/G).
    beta = 0.04 is DeepSeekMath §4.2's KL coefficient."""
    check_batch(logp, old_logp, mask, rewards, ref_logp)
    adv = group_advantages(rewards)[..., None]
    surrogate = weighted(clipped_surrogate(torch.exp(logp - old_logp), adv, eps), is_weights, mask)
    return -sequence_mean(surrogate - beta * k3(logp, ref_logp), mask)


def dr_grpo_loss(logp, old_logp, mask, rewards, max_tokens: int, eps: float = 0.2,
                 is_weights=None):  # fmt: skip
    """Dr. GRPO (§3.2): GRPO without the 1/|o_i| and without the division by std(R), no KL."""
    check_batch(logp, old_logp, mask, rewards)
    if mask.shape[-1] > max_tokens:
        raise BatchError(f"responses are padded to {mask.shape[-1]} > max_tokens {max_tokens}")
    adv = group_advantages(rewards, scale=False)[..., None]
    per_token = weighted(clipped_surrogate(torch.exp(logp - old_logp), adv, eps), is_weights, mask)
    return -constant_mean(per_token, mask, max_tokens)


# --8<-- [end:grpo]


# --8<-- [start:dapo]
def informative_groups(correct: torch.Tensor) -> torch.Tensor:
    """DAPO's dynamic sampling (Eq. (11)): keep a prompt only if 0 < #correct < G. Pass the
    correctness of each response (is_equivalent, or verl's filter_groups metric "acc"), not the
    shaped reward: with the overlong penalty added, an all-correct group can have unequal rewards
    and is still dropped. With a pure correctness reward, a dropped group is exactly one whose
    advantages are all zero."""
    return (correct != correct[:, :1]).any(dim=1)


def overlong_penalty(lengths, max_len: int = 20480, cache: int = 4096):
    """DAPO's soft overlong punishment, Eq. (13), added to the correctness reward: 0 up to
    max_len - cache, then a linear ramp to -1 at max_len, -1 beyond. Defaults: §4.1 (16,384
    expected tokens + a 4,096-token cache = 20,480 generated at most)."""
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    if not 0 < cache <= max_len:
        raise ValueError(f"need 0 < cache <= max_len, got cache={cache}, max_len={max_len}")
    ramp = ((max_len - cache) - lengths) / cache
    return torch.where(lengths <= max_len - cache, 0.0, torch.where(lengths <= max_len, ramp, -1.0))


def dapo_loss(logp, old_logp, mask, rewards, eps_low: float = 0.2, eps_high: float = 0.28,
              is_weights=None):  # fmt: skip
    """DAPO Eq. (8): clip-higher, token-level mean over the group, no KL term. The groups must
    already be informative (filter with informative_groups first), as Eq. (8)'s constraint says.
    eps_low / eps_high: §4.1."""
    check_batch(logp, old_logp, mask, rewards)
    if not informative_groups(rewards).all():
        bad = (~informative_groups(rewards)).nonzero()[0].item()
        raise BatchError(f"prompt {bad}: all rewards equal; drop it with informative_groups()")
    adv = group_advantages(rewards)[..., None]
    per_token = clipped_surrogate(torch.exp(logp - old_logp), adv, eps_low, eps_high)
    return -token_mean(weighted(per_token, is_weights, mask), mask)


# --8<-- [end:dapo]


# --8<-- [start:gspo]
def sequence_ratio(logp, old_logp, mask):
    """GSPO Eq. (7): s_i = (pi_theta(y_i|x) / pi_old(y_i|x))^(1/|y_i|), the geometric mean of
    the token ratios, computed as exp(mean over the response of log-ratios)."""
    return torch.exp(((logp - old_logp) * mask).sum(-1) / mask.sum(-1))


def gspo_loss(logp, old_logp, mask, rewards, eps_low: float = 3e-4, eps_high: float = 4e-4):
    """GSPO Eq. (5): one ratio and one clip decision per response, the group-normalised
    advantage of Eq. (6), the mean over the group. Clip ranges: §5.1 (3e-4 and 4e-4)."""
    check_batch(logp, old_logp, mask, rewards)
    adv = group_advantages(rewards)
    return -clipped_surrogate(sequence_ratio(logp, old_logp, mask), adv, eps_low, eps_high).mean()


# --8<-- [end:gspo]
