"""Unit tests for snippets/rl_training/: the losses against hand-computed values, the papers'
stated properties and an independently written reference (values and autograd gradients); the
off-policy weights; the pipeline simulation against its closed-form bounds."""

import copy
import math
import random
from dataclasses import replace

import pytest
import torch

from snippets.common.datafile import load_host_links
from snippets.common.device import ON_GPU
from snippets.common.train import init_weights
from snippets.rl_training.experiment import (
    CPU_BUDGET,
    VARIANTS,
    RolloutEngine,
    answer_logp,
    exact_match,
    mismatch,
    reinforce,
    rl_loss_fn,
    run_experiment,
    sft_loss_fn,
    summary,
    supervised,
)
from snippets.rl_training.losses import (
    BatchError,
    check_batch,
    clipped_surrogate,
    dapo_loss,
    dr_grpo_loss,
    group_advantages,
    grpo_loss,
    gspo_loss,
    informative_groups,
    k3,
    overlong_penalty,
    ppo_loss,
    sequence_ratio,
)
from snippets.rl_training.offpolicy import exact_gradients, ppo_loss_tis, tis_weights
from snippets.rl_training.pipeline import (
    ORDERS,
    Lengths,
    batches,
    fully_async,
    one_step_off,
    synchronous,
)
from snippets.rl_training.task import (
    EOS,
    SPLITS,
    AdditionTask,
    Problems,
    TaskError,
    digits,
    doctest,
    draw,
    split_of,
)
from snippets.rl_training.weight_sync import links, sync_seconds

F64 = torch.float64


def batch(p=2, g=4, t=7, seed=0, spread=0.3, dtype=F64):
    """Random log-probs with ratios on both sides of the clip range, ragged masks, 0/1 rewards
    with both values in every group."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(p, g, t, generator=gen, dtype=F64) * 3
    logp = old + spread * torch.randn(p, g, t, generator=gen, dtype=F64)
    ref = old + 0.2 * torch.randn(p, g, t, generator=gen, dtype=F64)
    lengths = torch.randint(1, t + 1, (p, g), generator=gen)
    mask = (torch.arange(t) < lengths[..., None]).to(F64)
    rewards = torch.randint(0, 2, (p, g), generator=gen).to(F64)
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0
    return [x.to(dtype) for x in (logp, old, ref, mask, rewards)]


# ------------------------------------------------------------------ independent reference
# Written from the papers' formulas with Python loops and PPO's case analysis of the clip
# (Schulman et al. 2017, Figure 1): for A >= 0 the ratio is capped at 1 + eps, for A < 0 at
# 1 - eps from below. No code is shared with snippets/rl_training/losses.py.


def ref_clip(ratio, a, lo, hi):
    return torch.minimum(ratio, torch.tensor(1 + hi, dtype=ratio.dtype)) * a if a >= 0 else \
        torch.maximum(ratio, torch.tensor(1 - lo, dtype=ratio.dtype)) * a  # fmt: skip


def ref_advantages(rewards, scale):
    out = []
    for row in rewards.tolist():
        mean = sum(row) / len(row)
        std = math.sqrt(sum((r - mean) ** 2 for r in row) / (len(row) - 1))
        out.append([(r - mean) / (std + 1e-6) if scale else r - mean for r in row])
    return out


def ref_objective(kind, logp, old, ref, mask, rewards, max_tokens=None, weights=None):
    """The paper's objective (to maximise), summed term by term; `weights` multiply each
    token's clipped term, not the KL (verl's rollout_is_weights)."""
    p_n, g_n, _ = logp.shape
    adv = ref_advantages(rewards, scale=kind != "dr_grpo")
    total = 0.0
    for p in range(p_n):
        group_tokens = int(mask[p].sum().item())
        for i in range(g_n):
            n = int(mask[p, i].sum().item())
            a = adv[p][i]
            if kind == "gspo":  # Eq. (5), (7): the product of token ratios to the power 1/|y|
                prod = 1.0
                for t in range(n):
                    prod = prod * torch.exp(logp[p, i, t] - old[p, i, t])
                total = total + ref_clip(prod ** (1 / n), a, 3e-4, 4e-4) / g_n
                continue
            for t in range(n):
                ratio = torch.exp(logp[p, i, t] - old[p, i, t])
                w = 1.0 if weights is None else weights[p, i, t]
                if kind == "grpo":  # DeepSeekMath Eq. (3) with Eq. (4)
                    r = torch.exp(ref[p, i, t] - logp[p, i, t])
                    term = w * ref_clip(ratio, a, 0.2, 0.2) - 0.04 * (r - torch.log(r) - 1)
                    total = total + term / (g_n * n)
                elif kind == "dapo":  # DAPO Eq. (8)
                    total = total + w * ref_clip(ratio, a, 0.2, 0.28) / group_tokens
                elif kind == "dr_grpo":  # Dr. GRPO §3.2, Listing 1
                    total = total + w * ref_clip(ratio, a, 0.2, 0.2) / (g_n * max_tokens)
    return total / p_n


LOSSES = {
    "grpo": lambda lp, old, ref, m, r: grpo_loss(lp, old, ref, m, r),
    "dapo": lambda lp, old, ref, m, r: dapo_loss(lp, old, m, r),
    "dr_grpo": lambda lp, old, ref, m, r: dr_grpo_loss(lp, old, m, r, max_tokens=9),
    "gspo": lambda lp, old, ref, m, r: gspo_loss(lp, old, m, r),
}


@pytest.mark.parametrize("kind", sorted(LOSSES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_and_gradient_match_the_reference(kind, seed):
    logp, old, ref, mask, rewards = batch(seed=seed, spread=0.3 if kind != "gspo" else 1e-3)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ours = LOSSES[kind](a, old, ref, mask, rewards)
    theirs = -ref_objective(kind, b, old, ref, mask, rewards, max_tokens=9)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    assert torch.allclose(a.grad, b.grad, rtol=1e-10, atol=1e-14)
    assert (a.grad * (1 - mask)).abs().max() == 0  # padding gets no gradient


WEIGHTED = {
    "grpo": lambda lp, old, ref, m, r, w: grpo_loss(lp, old, ref, m, r, is_weights=w),
    "dapo": lambda lp, old, ref, m, r, w: dapo_loss(lp, old, m, r, is_weights=w),
    "dr_grpo": lambda lp, old, ref, m, r, w: dr_grpo_loss(lp, old, m, r, 9, is_weights=w),
}


@pytest.mark.parametrize("kind", sorted(WEIGHTED))
def test_importance_weights_multiply_each_tokens_clipped_term(kind):
    """With rollout-correction weights, each token's clipped term is multiplied by its weight
    (the KL term is not), values and gradients against the reference; all-one weights change
    nothing; the weights get no gradient."""
    logp, old, ref, mask, rewards = batch(seed=11)
    gen = torch.Generator().manual_seed(11)
    w = tis_weights(old, old + 0.3 * torch.randn(old.shape, generator=gen, dtype=F64), mask)
    a = logp.clone().requires_grad_(True)
    b = logp.clone().requires_grad_(True)
    ww = w.clone().requires_grad_(True)
    ours = WEIGHTED[kind](a, old, ref, mask, rewards, ww)
    theirs = -ref_objective(kind, b, old, ref, mask, rewards, max_tokens=9, weights=w)
    ours.backward()
    theirs.backward()
    assert torch.allclose(ours, theirs, rtol=1e-12, atol=1e-14)
    assert torch.allclose(a.grad, b.grad, rtol=1e-10, atol=1e-14)
    assert ww.grad is None
    ones = WEIGHTED[kind](logp, old, ref, mask, rewards, mask.clone())
    assert torch.allclose(ones, LOSSES[kind](logp, old, ref, mask, rewards), rtol=1e-14)
    with pytest.raises(BatchError, match="is_weights has shape"):
        WEIGHTED[kind](logp, old, ref, mask, rewards, w[..., :-1])


def test_the_reference_batches_cross_the_clip_boundaries():
    """The comparison above would prove little if no ratio were ever clipped."""
    logp, old, _, mask, _ = batch(seed=0)
    ratio = torch.exp(logp - old)[mask.bool()]
    assert (ratio > 1.28).any() and (ratio < 0.8).any() and ((ratio > 0.8) & (ratio < 1.2)).any()
    s = sequence_ratio(*batch(seed=0, spread=1e-3)[:2], mask)
    assert (s > 1 + 4e-4).any() and (s < 1 - 3e-4).any()


# ------------------------------------------------------------------ hand-computed cases


def test_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0]], dtype=F64)  # mean 1/2, sample std sqrt(1/3)
    want = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(
        group_advantages(r), torch.tensor([[want, -want, -want, want]], dtype=F64)
    )
    assert group_advantages(r, scale=False).tolist() == [[0.5, -0.5, -0.5, 0.5]]


@pytest.mark.parametrize("value", [0.0, 1.0, -1.0, 0.37])
def test_all_equal_rewards_give_zero_advantage(value):
    """DAPO §3.2: a group whose outputs all get the same reward has zero advantage, so no
    gradient, under every loss built on group advantages."""
    r = torch.full((1, 5), value, dtype=F64)
    assert group_advantages(r).abs().max() == 0
    assert group_advantages(r, scale=False).abs().max() == 0
    logp, old, _, mask, _ = batch(p=1, g=5, seed=3)
    for loss in (lambda lp: grpo_loss(lp, old, lp.detach(), mask, r),  # KL 0 at ref = logp
                 lambda lp: dr_grpo_loss(lp, old, mask, r, max_tokens=7),
                 lambda lp: gspo_loss(lp, old, mask, r)):  # fmt: skip
        lp = logp.clone().requires_grad_(True)
        loss(lp).backward()
        assert lp.grad.abs().max() == 0


@pytest.mark.parametrize(
    ("ratio", "adv", "lo", "hi", "want"),
    [
        (1.5, 1.0, 0.2, 0.2, 1.2),  # pushed up too far: capped at 1 + eps
        (0.5, 1.0, 0.2, 0.2, 0.5),  # below 1 with A > 0: not clipped (pessimistic min)
        (0.5, -1.0, 0.2, 0.2, -0.8),  # pushed down too far with A < 0: capped at 1 - eps
        (1.5, -1.0, 0.2, 0.2, -1.5),  # above 1 with A < 0: not clipped
        (1.25, 1.0, 0.2, 0.28, 1.25),  # clip-higher leaves room up to 1.28 (DAPO §3.1)
        (1.25, 1.0, 0.2, 0.2, 1.2),
    ],
)
def test_clipped_surrogate_by_hand(ratio, adv, lo, hi, want):
    out = clipped_surrogate(torch.tensor(ratio, dtype=F64), torch.tensor(adv, dtype=F64), lo, hi)
    assert math.isclose(out.item(), want, rel_tol=1e-12)


def test_ppo_loss_is_the_token_mean_of_l_clip():
    logp, old, _, mask, _ = batch(seed=4)
    adv = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    per_token = clipped_surrogate(torch.exp(logp - old), adv)
    assert torch.isclose(ppo_loss(logp, old, adv, mask), -(per_token * mask).sum() / mask.sum())


def test_clip_higher_keeps_the_gradient_of_a_low_probability_token_longer():
    """DAPO §3.1: with eps_high = 0.28 a token whose ratio is 1.25 still gets a gradient."""
    for ratio, expect in ((1.25, True), (1.3, False)):
        lp = torch.zeros(1, 2, 1, dtype=F64)
        lp[0, 0, 0] = math.log(ratio)
        lp.requires_grad_(True)
        dapo_loss(lp, torch.zeros(1, 2, 1, dtype=F64), torch.ones(1, 2, 1, dtype=F64),
                  torch.tensor([[1.0, 0.0]], dtype=F64)).backward()  # fmt: skip
        assert (lp.grad[0, 0, 0] != 0).item() is expect


# ------------------------------------------------------------------ the papers' properties


def weights(loss, lengths, rewards):
    """|d loss / d logp| of the first token of each response, on-policy (ratios 1)."""
    t = max(lengths)
    mask = torch.tensor([[[1.0] * n + [0.0] * (t - n) for n in lengths]], dtype=F64)
    lp = torch.full_like(mask, -1.0, requires_grad=True)
    loss(lp, lp.detach(), mask, torch.tensor([rewards], dtype=F64)).backward()
    return [abs(lp.grad[0, i, 0].item()) for i in range(len(lengths))]


def test_token_level_loss_weighs_every_token_alike():
    """DAPO §3.3: with the token-level loss a long response weighs in proportion to its length
    (each token the same); GRPO's sample-level loss gives each response the same total."""
    lengths, rewards = [3, 12, 6], [1.0, 0.0, 1.0]
    adv = group_advantages(torch.tensor([rewards], dtype=F64))[0].abs().tolist()
    dapo = [w / a for w, a in zip(weights(dapo_loss, lengths, rewards), adv, strict=True)]
    assert all(math.isclose(w, 1 / sum(lengths), rel_tol=1e-12) for w in dapo)
    grpo = weights(lambda lp, o, m, r: grpo_loss(lp, o, o, m, r), lengths, rewards)
    totals = [w / a * n for w, a, n in zip(grpo, adv, lengths, strict=True)]
    assert all(math.isclose(x, 1 / len(lengths), rel_tol=1e-12) for x in totals)


def test_dr_grpo_removes_the_length_bias():
    """Dr. GRPO §3.1: under GRPO a long wrong answer is penalised less per token than a short
    wrong one; without 1/|o_i| every token weighs 1 / (G * MAX_TOKENS)."""
    lengths, rewards = [2, 10, 5], [0.0, 0.0, 1.0]
    grpo = weights(lambda lp, o, m, r: grpo_loss(lp, o, o, m, r), lengths, rewards)
    assert grpo[1] < grpo[0]  # the longer wrong answer gets the smaller push down
    dr = weights(lambda lp, o, m, r: dr_grpo_loss(lp, o, m, r, max_tokens=16), lengths, rewards)
    adv = [abs(a) for a in group_advantages(torch.tensor([rewards]), scale=False)[0].tolist()]
    assert all(
        math.isclose(w / a, 1 / (3 * 16), rel_tol=1e-6) for w, a in zip(dr, adv, strict=True)
    )


def test_dr_grpo_drops_the_std_difficulty_weight():
    """Dr. GRPO §3.1: dividing by std(R) gives each question a weight 1 / std, larger for an
    easy (3 of 4 right, std 1/2) question than for a balanced one (std sqrt(1/3)); r - mean
    gives every question the weight 1."""
    r = torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]], dtype=F64)
    plain = group_advantages(r, scale=False)
    weight = group_advantages(r) / plain  # per response: the question's weight
    assert torch.allclose(weight, weight[:, :1].expand_as(weight), rtol=1e-12)  # one per question
    want = [1 / (math.sqrt(1 / 3) + 1e-6), 1 / (0.5 + 1e-6)]
    assert torch.allclose(weight[:, 0], torch.tensor(want, dtype=F64), rtol=1e-12)
    assert weight[1, 0] > weight[0, 0]  # the easy question weighs more under GRPO
    assert plain.tolist() == [[0.5, -0.5, 0.5, -0.5], [0.25, 0.25, 0.25, -0.75]]


def test_gspo_ratio_is_the_length_normalised_sequence_likelihood_ratio():
    """GSPO Eq. (7): s_i = (pi(y|x) / pi_old(y|x))^(1/|y|) = exp(mean log-ratio) = geometric
    mean of the token ratios; padding does not enter."""
    logp, old, _, mask, _ = batch(seed=5)
    s = sequence_ratio(logp, old, mask)
    seq_logp, seq_old = (logp * mask).sum(-1), (old * mask).sum(-1)
    n = mask.sum(-1)
    assert torch.allclose(s, (torch.exp(seq_logp) / torch.exp(seq_old)) ** (1 / n), rtol=1e-12)
    ratios = torch.where(mask.bool(), torch.exp(logp - old), torch.ones_like(logp))
    assert torch.allclose(s, ratios.prod(-1) ** (1 / n), rtol=1e-12)
    garbage = logp + 100 * (1 - mask)
    assert torch.equal(sequence_ratio(garbage, old, mask), s)


def test_gspo_gradient_is_equation_10():
    """Unclipped, GSPO weighs every token of response i by s_i A_i / |y_i| (GSPO Eq. (10))."""
    logp, old, _, mask, rewards = batch(seed=6, spread=1e-5)
    lp = logp.clone().requires_grad_(True)
    gspo_loss(lp, old, mask, rewards, eps_low=1.0, eps_high=1.0).backward()
    p, g = rewards.shape
    want = sequence_ratio(logp, old, mask) * group_advantages(rewards) / mask.sum(-1)
    assert torch.allclose(lp.grad, -(want[..., None] * mask) / (p * g), rtol=1e-10)


def test_grpo_gradient_is_equation_11():
    """Unclipped and without KL, GRPO weighs token t of response i by w_it A_i / |y_i| (GSPO
    Eq. (11)): each token by its own ratio."""
    logp, old, _, mask, rewards = batch(seed=7)
    lp = logp.clone().requires_grad_(True)
    grpo_loss(lp, old, old, mask, rewards, eps=10.0, beta=0.0).backward()
    p, g = rewards.shape
    w = torch.exp(logp - old)
    want = w * (group_advantages(rewards) / mask.sum(-1))[..., None] * mask
    assert torch.allclose(lp.grad, -want / (p * g), rtol=1e-10)


def test_k3_is_non_negative_and_unbiased():
    """Schulman's k3: E_{x~pi}[r - 1 - log r] = KL(pi || ref) exactly, and every sample >= 0."""
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        pi = torch.softmax(torch.randn(11, generator=gen, dtype=F64), 0)
        ref = torch.softmax(torch.randn(11, generator=gen, dtype=F64), 0)
        per_sample = k3(pi.log(), ref.log())
        assert (per_sample >= 0).all()
        assert torch.isclose((pi * per_sample).sum(), (pi * (pi / ref).log()).sum(), rtol=1e-12)
    assert k3(torch.tensor(-2.0), torch.tensor(-2.0)).item() == 0


def test_k3_as_a_loss_has_the_gradient_of_the_other_kl():
    """Differentiating k3 on samples from pi (their weights held fixed) gives, in expectation,
    pi - ref on the logits: the gradient of KL(ref || pi), not of KL(pi || ref) (Tang & Munos,
    arXiv:2506.09477, on differentiating KL estimates)."""
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        logits = torch.randn(9, generator=gen, dtype=F64).requires_grad_(True)
        ref = torch.softmax(torch.randn(9, generator=gen, dtype=F64), 0)
        logp = torch.log_softmax(logits, 0)
        pi = logp.exp().detach()
        (g,) = torch.autograd.grad((pi * k3(logp, ref.log())).sum(), logits, retain_graph=True)
        assert torch.allclose(g, pi - ref, rtol=1e-12, atol=1e-15)
        forward = (ref * (ref.log() - logp)).sum()  # KL(ref || pi)
        (g_forward,) = torch.autograd.grad(forward, logits, retain_graph=True)
        assert torch.allclose(g, g_forward, rtol=1e-12, atol=1e-15)
        (g_reverse,) = torch.autograd.grad((logp.exp() * (logp - ref.log())).sum(), logits)
        assert not torch.allclose(g, g_reverse, rtol=1e-3)


def test_overlong_penalty_follows_equation_13():
    assert overlong_penalty([1, 16384, 16385, 18432, 20480, 30000]).tolist() == [
        0.0, 0.0, -1 / 4096, -0.5, -1.0, -1.0]  # fmt: skip
    assert overlong_penalty([90, 95, 100], max_len=100, cache=10).tolist() == [0.0, -0.5, -1.0]
    with pytest.raises(ValueError, match="cache"):
        overlong_penalty([1], max_len=100, cache=0)


def test_dynamic_sampling_keeps_informative_groups_only():
    r = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [-1.0, 1.0, 1.0]])
    assert informative_groups(r).tolist() == [True, False, False, True]


def test_dynamic_sampling_counts_correct_answers_not_shaped_rewards():
    """DAPO Eq. (11) constrains the number of correct answers: an all-right (or all-wrong) group
    is dropped even when the overlong penalty makes its rewards unequal."""
    correct = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 1.0]], dtype=F64)
    shaped = correct + overlong_penalty([[4000, 17408, 20480], [100, 19456, 9000], [1, 1, 1]])
    assert informative_groups(shaped).tolist() == [True, True, True]  # rewards: all unequal
    assert informative_groups(correct).tolist() == [False, False, True]


def test_fp32_agrees_with_fp64():
    for kind, fn in LOSSES.items():
        b64 = batch(seed=8)
        b32 = [x.float() for x in b64]
        assert math.isclose(fn(*b32).item(), fn(*b64).item(), rel_tol=1e-5, abs_tol=1e-6), kind


# ------------------------------------------------------------------ bad input


def test_bad_batches_get_clear_errors():
    logp, old, ref, mask, rewards = batch()
    empty = mask.clone()
    empty[1, 2] = 0
    with pytest.raises(BatchError, match=r"prompt 1, sample 2\) has no tokens"):
        grpo_loss(logp, old, ref, empty, rewards)
    with pytest.raises(BatchError, match="old_logp has shape"):
        dapo_loss(logp, old[..., :-1], mask, rewards)
    with pytest.raises(BatchError, match="ref_logp has shape"):
        grpo_loss(logp, old, ref[:, :-1], mask, rewards)
    with pytest.raises(BatchError, match="rewards has shape"):
        gspo_loss(logp, old, mask, rewards[:, :-1])
    with pytest.raises(BatchError, match="at least 2 responses"):
        grpo_loss(logp[:, :1], old[:, :1], ref[:, :1], mask[:, :1], rewards[:, :1])
    with pytest.raises(BatchError, match=r"at least 2 responses|group >= 2"):
        group_advantages(rewards[:, :1])
    with pytest.raises(BatchError, match="only 0 and 1"):
        check_batch(logp, old, mask * 0.5)
    with pytest.raises(BatchError, match="prompts, group, tokens"):
        check_batch(logp[0], old[0], mask[0])
    with pytest.raises(BatchError, match="max_tokens"):
        dr_grpo_loss(logp, old, mask, rewards, max_tokens=3)
    same = rewards.clone()
    same[1] = 1.0
    with pytest.raises(BatchError, match="prompt 1: all rewards equal"):
        dapo_loss(logp, old, mask, same)


# ------------------------------------------------------------------ off-policy correction


def test_tis_weights():
    logp, old, _, mask, _ = batch(seed=9, spread=1.0)
    w = tis_weights(logp, old, mask, cap=2.0)
    assert w.max() <= 2.0 and (w * (1 - mask)).abs().max() == 0
    ratio = torch.exp(logp - old)
    assert torch.allclose(w, torch.minimum(ratio, torch.tensor(2.0, dtype=F64)) * mask)
    assert torch.equal(tis_weights(old, old, mask), mask)  # same policy: weight 1
    seq = tis_weights(logp, old, mask, cap=1e9, level="sequence")
    prod = torch.where(mask.bool(), ratio, torch.ones_like(ratio)).prod(-1, keepdim=True)
    assert torch.allclose(seq, prod * mask, rtol=1e-12)
    lp = logp.clone().requires_grad_(True)
    assert not tis_weights(lp, old, mask).requires_grad  # a weight, not a path for gradients
    with pytest.raises(ValueError, match="level"):
        tis_weights(logp, old, mask, level="batch")
    with pytest.raises(ValueError, match="cap"):
        tis_weights(logp, old, mask, cap=0)


def test_tis_reduces_to_ppo_when_rollout_equals_trainer():
    logp, old, _, mask, rewards = batch(seed=10)
    adv = group_advantages(rewards)[..., None].expand_as(mask)
    assert torch.isclose(ppo_loss_tis(logp, old, old, mask, adv), ppo_loss(logp, old, adv, mask))


@pytest.mark.parametrize("scale", [0.2, 1.0, 3.0])
def test_truncation_bias_is_bounded(scale):
    """E_q[min(rho, C) f] - E_p[f] = -E_q[(rho - C)_+ f] with f = A * grad log p: the truncated
    gradient's bias is exactly that, so its norm is at most max|A| * max||grad log p|| (<= sqrt 2
    for a softmax) times the truncated mass E_q[(rho - C)_+]; plain importance sampling is
    exact."""
    gen = torch.Generator().manual_seed(int(scale * 10))
    logits = torch.randn(20, generator=gen, dtype=F64)
    rollout = logits + scale * torch.randn(20, generator=gen, dtype=F64)
    adv = torch.randn(20, generator=gen, dtype=F64)
    exact = exact_gradients(logits, rollout, adv)
    assert torch.allclose(exact["corrected"], exact["truth"], rtol=1e-10, atol=1e-14)
    cap = 2.0
    truncated = exact_gradients(logits, rollout, adv, cap)
    p, q = torch.softmax(logits, 0), torch.softmax(rollout, 0)
    excess = (p / q - cap).clamp(min=0)
    score = torch.eye(20, dtype=F64) - p  # row x: d log p(x) / d logits
    bias = truncated["corrected"] - truncated["truth"]
    assert torch.allclose(bias, -((q * excess * adv)[:, None] * score).sum(0), atol=1e-14)
    mass = (q * excess).sum()
    assert bias.norm() <= adv.abs().max() * math.sqrt(2) * mass + 1e-15
    assert (mass > 0) == (scale > 0.2)  # the two larger shifts do truncate


# ------------------------------------------------------------------ pipeline simulation


def test_closed_forms_of_the_length_distribution():
    w = Lengths(median=100, sigma=0.8, cap=600)
    draws = w.draw(200_000, seed=3)
    m = sum(draws) / len(draws)
    se = math.sqrt(sum((x - m) ** 2 for x in draws) / (len(draws) - 1) / len(draws))
    assert abs(m - w.mean()) < 4 * se
    assert math.isclose(w.mean_max(1), w.mean(), rel_tol=1e-6)  # the integral, checked
    assert math.isclose(w.mean_max(8), w.mean_max(8, points=20001), rel_tol=1e-6)
    maxima = [max(draws[i : i + 8]) for i in range(0, len(draws), 8)]
    mm = sum(maxima) / len(maxima)
    se = math.sqrt(sum((x - mm) ** 2 for x in maxima) / (len(maxima) - 1) / len(maxima))
    assert abs(mm - w.mean_max(8)) < 4 * se
    assert w.mean() < w.mean_max(2) < w.mean_max(8) < w.cap


def test_synchronous_utilization_is_mean_over_max():
    lengths = [3.0, 1.0, 2.0, 2.0, 5.0, 5.0]
    run = synchronous(lengths, batch=2, train=0.0)
    assert math.isclose(run.utilization, (4 + 4 + 10) / (2 * (3 + 2 + 5)))
    assert synchronous([7.0] * 8, batch=4, train=0.0).utilization == 1.0  # no tail, no waiting


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("seed", [0, 1])
def test_async_with_eta_zero_is_synchronous(seed, order):
    lengths = Lengths(50, 1.0, 400).draw(16 * 20, seed=seed)
    a = fully_async(lengths, 16, 16, train=30.0, eta=0, sync=4.0, order=order)
    s = synchronous(lengths, 16, train=30.0, sync=4.0)
    assert math.isclose(a.wall, s.wall, rel_tol=1e-12) and a.staleness == s.staleness


@pytest.mark.parametrize("eta", [1, 2, 3])
@pytest.mark.parametrize("slots", [8, 16, 40])
def test_staleness_bound_in_start_order(eta, slots):
    """Trained in start order, no sample is more than eta versions old: the admission rule is a
    staleness bound when the trainer waits for the oldest samples to finish."""
    lengths = Lengths(50, 1.2, 800).draw(16 * 25, seed=eta)
    run = fully_async(lengths, 16, slots, train=20.0, eta=eta, sync=2.0, order="start")
    assert max(run.staleness) <= eta and min(run.staleness) >= 0
    assert run.throughput <= slots / (sum(lengths) / len(lengths)) * (1 + 1e-12)
    assert run.throughput <= 16 / 22.0 * (1 + 1e-12)


def test_a_response_in_flight_can_exceed_eta():
    """The admission rule bounds how far generation runs ahead, not each sample's age: unless the
    trainer waits for it (start order), a long response overtaken by short ones is trained on
    more than eta versions after its first token, even when the trainer takes the oldest
    finished samples first (AReaL)."""
    lengths = [100.0] + [1.0] * 19
    for order in ("oldest", "completion"):
        run = fully_async(lengths, batch=1, slots=2, train=1.0, eta=1, order=order)
        assert max(run.staleness) > 1, order
        assert run.staleness[run.trained.index(0)] == max(run.staleness)  # the long one
    assert max(fully_async(lengths, 1, 2, 1.0, 1, order="start").staleness) <= 1


def test_the_trainer_picks_by_start_or_by_finish():
    """Responses 0-5 start on 2 slots; response 0 finishes first and is trained alone; while it
    trains, 2 (length 1) finishes before 1 (length 3). "oldest" (AReaL) takes 1 next, a FIFO
    queue ("completion") takes 2."""
    lengths = [1.0, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    oldest = fully_async(lengths, batch=1, slots=2, train=10.0, eta=5, order="oldest")
    fifo = fully_async(lengths, batch=1, slots=2, train=10.0, eta=5, order="completion")
    assert oldest.trained[:3] == [0, 1, 2]
    assert fifo.trained[:3] == [0, 2, 1]
    assert sorted(oldest.trained) == sorted(fifo.trained) == list(range(8))


def test_one_step_off_policy():
    lengths = [4.0, 1.0, 2.0, 2.0, 6.0, 1.0]
    run = one_step_off(lengths, batch=2, train=3.0, sync=1.0)
    assert run.staleness == [0, 0, 1, 1, 1, 1]
    assert run.wall == 4 + (max(3, 2) + 1) + (max(3, 6) + 1) + (3 + 1)
    gen_bound = sum(lengths) / (2 * (4 + 2 + 6))  # the generator still waits for each batch's max
    assert run.utilization <= gen_bound


def test_pipeline_bad_input():
    with pytest.raises(ValueError, match="at least one batch"):
        batches([1.0, 2.0], 3)
    with pytest.raises(ValueError, match="order"):
        fully_async([1.0] * 4, 2, 2, 1.0, 1, order="random")
    with pytest.raises(ValueError, match="eta"):
        fully_async([1.0] * 4, 2, 2, 1.0, -1)


def test_random_configurations_respect_both_rate_bounds():
    rng = random.Random(0)
    for _ in range(10):
        b, slots, eta = rng.choice([4, 8]), rng.choice([2, 8, 20]), rng.choice([0, 1, 3])
        lengths = Lengths(30, rng.uniform(0.2, 1.5), 300).draw(b * 12, seed=rng.randrange(99))
        train, sync = rng.uniform(1, 50), rng.choice([0.0, 3.0])
        for order in ORDERS:
            run = fully_async(lengths, b, slots, train, eta, sync, order)
            assert run.throughput <= slots / (sum(lengths) / len(lengths)) * (1 + 1e-12)
            assert run.throughput <= b / (train + sync) * (1 + 1e-12)
            assert len(run.staleness) == len(lengths)


# ------------------------------------------------------------------ weight sync


def test_weight_sync_reads_the_hardware_file():
    assert {k: v for k, v in links.items() if k in load_host_links()} == {
        k: v["total_gb_per_s"] / 2 for k, v in load_host_links().items()}  # fmt: skip
    assert sync_seconds(1e9, 100) == 0.02  # 2 GB at 100 GB/s
    with pytest.raises(ValueError, match="positive"):
        sync_seconds(1e9, 0)


# ------------------------------------------------------------------ the task (section 6)


@pytest.fixture(scope="module")
def task():
    from snippets.common.corpus import load_tokenizer

    return AdditionTask(load_tokenizer())


def test_rows_are_the_tokenizers_encoding_of_the_doctest_lines(task):
    gen = torch.Generator().manual_seed(5)
    p = draw(200, "test", gen)
    rows = task.rows(p, answers=True)
    texts = ["".join(doctest(a, b)) for a, b in zip(p.a.tolist(), p.b.tolist(), strict=True)]
    for row, enc in zip(rows.tolist(), task.tokenizer.encode_batch(texts), strict=True):
        assert [t for t in row if t != EOS] == enc.ids
    prompts = task.rows(p)
    assert torch.equal(prompts, rows[:, : task.prompt_len])
    assert (prompts[:, -1] == task.nl[0]).all()  # right-aligned: every prompt ends the line
    assert (prompts[:, 0] == EOS).any()  # and the shorter ones are padded on the left
    assert task.score(p, rows[:, task.prompt_len :]).min() == 1


def test_splits_are_disjoint_and_the_digit_counts_uniform():
    every = torch.arange(1000)
    a, b = every.repeat_interleave(1000), every.repeat(1000)
    share = torch.bincount(split_of(a, b), minlength=3) / len(a)
    # test and dev: 1/16 of the pairs each by construction of the hash, up to its unevenness
    assert abs(share[2] - 1 / 16) < 0.005 and abs(share[1] - 1 / 16) < 0.005
    gen = torch.Generator().manual_seed(6)
    for split in SPLITS:
        p = draw(3000, split, gen)
        assert (split_of(p.a, p.b) == SPLITS.index(split)).all()
        digits = torch.tensor([len(str(x)) for x in p.a.tolist()])
        counts = torch.bincount(digits, minlength=4)[1:].double()
        # 3000 draws, 1/3 each: binomial sd sqrt(3000 * 2/9) = 26; 5 sd is 129
        assert (counts - 1000).abs().max() < 129, counts
    assert (p.a <= 999).all() and (p.b >= 0).all()


def test_digit_lists_by_hand():
    assert digits(482) == "[2, 8, 4]" and digits(0) == "[0]" and digits(1998) == "[8, 9, 9, 1]"
    assert doctest(482, 379) == (">>> add([2, 8, 4], [9, 7, 3])\n", "[1, 6, 8]\n")
    with pytest.raises(TaskError, match="non-negative"):
        digits(-1)


def test_score_and_mask_by_hand(task):
    p = Problems(torch.tensor([482, 5, 0, 7, 999]), torch.tensor([379, 5, 0, 3, 999]))
    tok = task.tokenizer

    def ids(text):
        return tok.encode(text).ids

    answers = [ids("[1, 6, 8]\n"), ids("[0,1]\n"), ids("[0, 0]\n"), ids("[0, 1"),
               [*ids("[8, 9, 9, 1]"), EOS]]  # fmt: skip
    width = task.max_new
    tokens = torch.tensor([(x + [EOS] * width)[:width] for x in answers])
    tokens[3, len(answers[3]) :] = ids(",")[0]  # "[0, 1" then commas, never a newline
    got = task.score(p, tokens)
    # right; other spacing; a leading zero; no end within max_new; ended by end-of-text
    assert got.tolist() == [1.0, 0.0, 0.0, 0.0, 1.0]
    indent = tok.token_to_id("\u010a\u0120\u0120\u0120\u0120")  # "\n" and 4 spaces: one token
    assert tok.decode([indent]) == "\n    " and task.is_end[indent]
    tokens[0, len(answers[0]) - 1] = indent  # ends the response as well as "\n" does
    assert task.score(p, tokens)[0] == 1
    mask = task.response_mask(tokens)
    lengths = [len(answers[0]), len(answers[1]), len(answers[2]), width, len(answers[4])]
    assert mask.sum(1).tolist() == lengths
    with pytest.raises(TaskError, match=r"tokens must be \[5, T\]"):
        task.score(p, tokens[:2])
    with pytest.raises(TaskError, match=r"task\.to"):
        task.response_mask(tokens.to("meta"))


def test_task_bad_input(task):
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(TaskError, match="split must be one of"):
        draw(3, "valid", gen)
    with pytest.raises(TaskError, match="n >= 1"):
        draw(0, "train", gen)

    class Enc:
        def __init__(self, ids):
            self.ids = ids

    class Merging:  # a tokenizer whose BPE merged across the words of the check's texts
        def __init__(self, real):
            self.real = real

        def encode_batch(self, texts):
            out = [Enc(list(e.ids)) for e in self.real.encode_batch(texts)]
            if len(texts) == 64:  # the constructor's check: whole doctest lines
                for e in out:
                    e.ids[:2] = [e.ids[0] + 1]
            return out

        def __getattr__(self, name):
            return getattr(self.real, name)

    with pytest.raises(TaskError, match="per-word concatenation"):
        AdditionTask(Merging(task.tokenizer))


# ------------------------------------------------------------------ the run (section 6)


def test_answer_logp_is_the_full_forwards(task):
    from snippets.common.models.qwen3 import TINY, Qwen3ForCausalLM

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(TINY).eval()
    ids = torch.randint(0, TINY.vocab_size, (3, 9))
    full = model(ids).log_softmax(-1)[:, 3:-1].gather(-1, ids[:, 4:, None])[..., 0]
    assert torch.allclose(answer_logp(model, ids, 4), full, atol=1e-6)


def test_the_warm_up_loss_counts_the_answer_and_its_newline_only(task):
    from snippets.common.models.qwen3 import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      vocab_size=task.tokenizer.get_vocab_size())  # fmt: skip
    torch.manual_seed(1)
    model = Qwen3ForCausalLM(cfg).eval()
    rows = task.rows(draw(4, "train", torch.Generator().manual_seed(2)), answers=True)
    loss, _ = sft_loss_fn(model, task)(rows)
    p = task.prompt_len
    logp = model(rows).log_softmax(-1)
    want = []
    for r in range(len(rows)):
        t = p
        while True:  # through the first end token
            want.append(logp[r, t - 1, rows[r, t]])
            if task.is_end[rows[r, t]]:
                break
            t += 1
    assert torch.allclose(loss, -torch.stack(want).mean(), atol=1e-6)
    after = rows.clone()
    after[:, -1] = 7  # a token after every answer's newline: not trained on, changes nothing
    assert torch.equal(sft_loss_fn(model, task)(after)[0], loss)


def test_the_engine_samples_in_its_own_precision_and_follows_sync():
    """The engine's log-probabilities are its model's own (teacher-forced on what it sampled);
    sync rounds the trainer's weights into it, tied head included."""
    from snippets.common.models.qwen3 import TINY, Qwen3ForCausalLM

    torch.manual_seed(3)
    policy = Qwen3ForCausalLM(replace(TINY, tie_word_embeddings=True)).eval()
    prompts = torch.randint(0, TINY.vocab_size, (6, 4))
    for dtype, atol in ((torch.float32, 1e-5), (torch.bfloat16, None)):
        engine = RolloutEngine(policy, 6, 9, dtype)
        gen = torch.Generator().manual_seed(0)
        tokens, logp = engine.sample(prompts, 5, gen)
        assert tokens.shape == logp.shape == (6, 5) and (logp <= 0).all()
        if atol:  # the decode step over the KV cache = the full forward, to fp32 rounding
            ids = torch.cat([prompts, tokens], 1)
            assert torch.allclose(logp, answer_logp(policy, ids, 4), atol=atol)
    assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    engine.sync(policy)
    for a, b in zip(engine.model.parameters(), policy.parameters(), strict=True):
        assert a.dtype == torch.bfloat16 and torch.equal(a, b.to(torch.bfloat16))


class Pick3:
    """A task a tiny model learns in a few steps: the prompt is fixed, the reward is 1 when the
    first token is 3 (about 1 in 16 under a fresh model of 16 tokens), token 0 ends."""

    prompt_len, max_new = 2, 3
    is_end = torch.arange(16) == 0
    response_mask = AdditionTask.response_mask

    def rows(self, problems, answers=False):
        row = [5, 6] + ([3, 0, 0] if answers else [])
        return torch.tensor(row).repeat(len(problems), 1)

    def score(self, problems, tokens):
        return (tokens[:, 0] == 3).float()


def tiny16(seed=0):
    from snippets.common.models.qwen3 import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=16,
                      tie_word_embeddings=True)  # fmt: skip
    model = Qwen3ForCausalLM(cfg).eval()
    init_weights(model, 0.02, seed)  # the shared models' init: a near-uniform first token
    return model


@pytest.mark.parametrize("variant", VARIANTS)
def test_rl_raises_the_reward_of_a_learnable_task(variant):
    """The whole loop -- engine, reward, advantage, update, sync -- on Pick3: the sampled reward
    of the last steps is far above the first steps' (a sign error would drive it to 0)."""
    task = Pick3()
    budget = replace(CPU_BUDGET, prompts=8, group=8, rl_steps=12, rl_lr=1e-2, curve_window=4)
    policy = tiny16()
    ref = tiny16().requires_grad_(False)
    engine = RolloutEngine(policy, 64, 5)
    log = reinforce(policy, ref, engine, task, budget, variant, seed=0)
    first = sum(s["reward"] for s in log[:3]) / 3
    last = sum(s["reward"] for s in log[-3:]) / 3
    assert first < 0.2 and last > 0.6, [round(s["reward"], 2) for s in log]
    # fp32 trainer, bf16 engine: a small mismatch, never near the cap
    assert all(0 < s["log_ratio_abs"] < 0.05 and s["truncated"] == 0 for s in log)


def test_the_warm_up_stops_at_its_target():
    task = Pick3()
    budget = replace(CPU_BUDGET, sft_max_steps=40, sft_check_every=5, sft_target=0.9,
                     sft_lr=1e-2, dev=16)  # fmt: skip
    policy = tiny16(1)
    dev = Problems(torch.zeros(16, dtype=torch.long), torch.zeros(16, dtype=torch.long))
    before = exact_match(policy, task, dev, task.rows(dev))
    out = supervised(policy, task, budget, 0, dev, task.rows(dev))
    assert before == 0 and out["dev_sampled"] >= 0.9 and out["steps"] < 40
    assert out["steps"] % 5 == 0 and exact_match(policy, task, dev, task.rows(dev)) == 1


def test_dapo_skips_a_batch_without_an_informative_group():
    task = Pick3()
    task.score = lambda problems, tokens: torch.zeros(len(tokens))  # nobody is ever right
    budget = replace(CPU_BUDGET, prompts=2, group=4, rl_steps=2, curve_window=1)
    policy = tiny16()
    before = copy.deepcopy(policy.state_dict())
    log = reinforce(policy, policy, RolloutEngine(policy, 8, 5), task, budget, "dapo", 0)
    assert [set(s) for s in log] == [{"reward", "informative"}] * 2
    for name, value in policy.state_dict().items():  # no step taken: no weight decay either
        assert torch.equal(value, before[name]), name
    assert mismatch(log) == {"log_ratio_abs": 0.0, "truncated": 0.0, "informative": 0.0}


def test_budget_bad_input():
    with pytest.raises(ValueError, match="group must be >= 2"):
        replace(CPU_BUDGET, group=1)
    with pytest.raises(ValueError, match=">= 1"):
        replace(CPU_BUDGET, rl_steps=0)
    with pytest.raises(ValueError, match="must divide rl_steps"):
        replace(CPU_BUDGET, curve_window=3)
    with pytest.raises(ValueError, match="variant must be one of"):
        rl_loss_fn(None, None, Pick3(), CPU_BUDGET, "ppo", {})


@pytest.mark.skipif(ON_GPU, reason="on CUDA, bench_gpu.py runs the experiment at full size")
def test_experiment_runs_end_to_end_on_the_cpu_stand_in():
    from snippets.common.train import trained

    draft = trained("draft")  # the CPU stand-in, trained in seconds
    out = run_experiment(draft.model, draft.tokenizer, CPU_BUDGET)
    assert set(out) == {"base", "warmup", "runs", "variants", "curve"}  # all shown on the page
    seeds = range(1, CPU_BUDGET.seeds + 1)  # seed 0 is the warm-up's
    assert [(r["variant"], r["seed"]) for r in out["runs"]] == [
        (v, s) for s in seeds for v in VARIANTS]  # fmt: skip
    window = CPU_BUDGET.curve_window
    steps = list(range(window, CPU_BUDGET.rl_steps + 1, window))
    assert [(c["variant"], c["step"]) for c in out["curve"]] == [
        (v, s) for v in VARIANTS for s in steps]  # fmt: skip
    warm = out["warmup"]
    assert warm["steps"] == CPU_BUDGET.sft_check_every  # target 0: the first check stops it
    for r in out["runs"]:
        for key in ("after_greedy", "after_sampled", "truncated", "informative"):
            assert 0 <= r[key] <= 1, key
        assert r["gain_sampled"] == r["after_sampled"] - warm["sampled"]
        assert r["gain_greedy"] == r["after_greedy"] - warm["greedy"]
        updated = r["variant"] == "grpo" or r["informative"] > 0  # DAPO skips the rest
        assert (r["log_ratio_abs"] > 0) == updated  # fp32 trainer against the bf16 engine
    assert set(out["base"]) == {"greedy", "sampled"} <= set(warm)
    for v in out["variants"]:
        xs = [r["after_sampled"] for r in out["runs"] if r["variant"] == v["variant"]]
        assert min(xs) <= v["after_sampled"] <= max(xs)
        assert v["spread_sampled"] == max(xs) - min(xs)


def test_variant_summary_by_hand():
    runs = [{"variant": "grpo", "after_greedy": g, "after_sampled": s}
            for g, s in ((0.5, 0.3), (0.7, 0.2), (0.6, 0.6))]  # fmt: skip
    got = summary(runs, "grpo")
    assert got["after_greedy"] == 0.6 and got["after_sampled"] == 0.3
    assert got["spread_greedy"] == pytest.approx(0.2)
    assert got["spread_sampled"] == pytest.approx(0.4)
