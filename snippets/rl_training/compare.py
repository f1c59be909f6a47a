"""The losses side by side on hand-sized inputs: what each one does to the same group."""

import torch

from snippets.rl_training.losses import (
    dapo_loss,
    dr_grpo_loss,
    group_advantages,
    grpo_loss,
    gspo_loss,
    informative_groups,
    k3,
    overlong_penalty,
    sequence_ratio,
)

F64 = torch.float64

# --8<-- [start:advantage]
rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], dtype=F64)
print(group_advantages(rewards).numpy().round(3).tolist())  # GRPO, DAPO, GSPO: / std
#> [[0.866, -0.866, -0.866, 0.866], [0.0, 0.0, 0.0, 0.0]]
print(group_advantages(rewards, scale=False).numpy().round(3).tolist())  # Dr. GRPO
#> [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0]]
print(informative_groups(rewards).tolist())  # DAPO's dynamic sampling keeps prompt 0 only
#> [True, False]
# --8<-- [end:advantage]


# --8<-- [start:weights]
def token_weights(loss_fn, lengths, rewards, **kw):
    """d loss / d logp per token at logp = old_logp (every ratio 1, nothing clipped): the
    weight a loss gives each token, times -A. Response i has lengths[i] tokens."""
    t = max(lengths)
    mask = torch.tensor([[[1.0] * n + [0.0] * (t - n) for n in lengths]], dtype=F64)
    logp = torch.full_like(mask, -1.0, requires_grad=True)
    loss_fn(logp, logp.detach(), mask, torch.tensor([rewards], dtype=F64), **kw).backward()
    return [round(logp.grad[0, i, 0].item(), 4) for i in range(len(lengths))]


lengths, r = [2, 6], [0.0, 1.0]  # a short wrong answer and a long right one
grpo = lambda lp, old, m, rw: grpo_loss(lp, old, old, m, rw)  # noqa: E731 (ref = old: KL 0)
print("GRPO    ", token_weights(grpo, lengths, r))  # 1 / (G |o_i|): the short one weighs 3x
#> GRPO     [0.1768, -0.0589]
print("DAPO    ", token_weights(dapo_loss, lengths, r))  # 1 / sum |o_i|: equal per token
#> DAPO     [0.0884, -0.0884]
print("Dr. GRPO", token_weights(dr_grpo_loss, lengths, r, max_tokens=8))  # 1 / (G * 8)
#> Dr. GRPO [0.0312, -0.0312]
# --8<-- [end:weights]

# --8<-- [start:gspo]
token_ratios = torch.tensor([[[1.1, 0.9, 1.2]]], dtype=F64)
old = torch.zeros_like(token_ratios)
s = sequence_ratio(token_ratios.log(), old, torch.ones_like(old))
print(round(s.item(), 4), round(token_ratios.prod().item() ** (1 / 3), 4))  # geometric mean
#> 1.0591 1.0591
# GSPO clips the whole response: s is far outside [1 - 3e-4, 1 + 4e-4], so with A > 0 the
# clipped branch is taken and this response gives no gradient at all.
lp = token_ratios.log().expand(1, 2, 3).clone().requires_grad_(True)
gspo_loss(lp, torch.zeros(1, 2, 3, dtype=F64), torch.ones(1, 2, 3, dtype=F64),
          torch.tensor([[1.0, 0.0]], dtype=F64)).backward()  # fmt: skip
print(lp.grad[0, 0].abs().max().item(), lp.grad[0, 1].abs().max().item() > 0)
#> 0.0 True
# --8<-- [end:gspo]

# --8<-- [start:cliphigher]
# DAPO §3.1: with eps = 0.2, tokens at pi_old = 0.01 and 0.9 can rise at most to 0.012 and 1.08
# before the clip stops their gradient; eps_high = 0.28 leaves the rare token more room.
pi_old = torch.tensor([0.01, 0.9], dtype=F64)
ceiling = {eps: [round(x, 4) for x in (pi_old * (1 + eps)).tolist()] for eps in (0.2, 0.28)}
print(ceiling[0.2], ceiling[0.28])
#> [0.012, 1.08] [0.0128, 1.152]
# --8<-- [end:cliphigher]

# --8<-- [start:overlong]
print(overlong_penalty([16000, 16384, 18432, 20480]).tolist())  # DAPO defaults: 20480 - 4096
#> [0.0, 0.0, -0.5, -1.0]
# Eq. (11) counts correct answers, not rewards: all four right, one in the penalty zone, gives
# unequal shaped rewards, and dynamic sampling still drops the group.
correct = torch.tensor([[1.0, 1.0, 1.0, 1.0]], dtype=F64)
shaped = correct + overlong_penalty([3000, 5000, 9000, 18432])
print(shaped.tolist(), informative_groups(correct).tolist())
#> [[1.0, 1.0, 1.0, 0.5]] [False]
# --8<-- [end:overlong]

# --8<-- [start:k3]
# k3 on a distribution small enough to sum exactly: E_{x~pi}[k3] = KL(pi || ref), and k3 >= 0.
pi = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
ref = torch.tensor([0.2, 0.5, 0.3], dtype=F64)
per_sample = k3(pi.log(), ref.log())
exact_kl = (pi * (pi / ref).log()).sum()
mean_k3 = (pi * per_sample).sum().item()
print(bool((per_sample >= 0).all()), round(mean_k3, 6), round(exact_kl.item(), 6))
#> True 0.223805 0.223805
# Its gradient is another matter. Used as a loss on tokens drawn from pi (their weights pi are
# samples, not differentiated), k3's expected gradient on the logits is pi - ref: the gradient
# of KL(ref || pi), the other direction, not of KL(pi || ref).
logits = pi.log().requires_grad_(True)
logp = torch.log_softmax(logits, 0)
(g_k3,) = torch.autograd.grad((pi * k3(logp, ref.log())).sum(), logits, retain_graph=True)
(g_kl,) = torch.autograd.grad((logp.exp() * (logp - ref.log())).sum(), logits)
print(torch.allclose(g_k3, pi - ref), torch.allclose(g_k3, g_kl))
#> True False
# --8<-- [end:k3]
