"""The losses on small exact examples: gradients checked, Hinton's high-temperature limit, GKD's
and DistiLLM's end points, and what a top-k store costs in bytes and in bias."""

import math

import torch

from snippets.common.results import computed_result
from snippets.moe_distillation.account import bytes_per_token, index_bytes
from snippets.moe_distillation.losses import (
    closed_form_grad,
    forward_kl_loss,
    jsd_loss,
    reverse_kl_loss,
    sequence_kd_loss,
    skew_kl_loss,
    teacher_topk,
    topk_kl_loss,
)
from snippets.quality_metrics.synthetic import hashed_logits

# --8<-- [start:gradcheck]
# 5 positions (one not scored) over 11 tokens, fp64; every loss against torch.autograd.gradcheck
# (finite differences) and against its closed-form gradient
s = hashed_logits(5, 11, seed=1).requires_grad_()
t = hashed_logits(5, 11, seed=2)
mask = torch.tensor([True, True, False, True, True])
targets = t.argmax(-1)  # sequence-level KD: the teacher's own (greedy) tokens
cases = {
    "forward_kl": (lambda x: forward_kl_loss(x, t, mask, temperature=2.0), {"temperature": 2.0}),
    "reverse_kl": (lambda x: reverse_kl_loss(x, t, mask), {}),
    "jsd": (lambda x: jsd_loss(x, t, mask, beta=0.9), {"beta": 0.9}),
    "skew_kl": (lambda x: skew_kl_loss(x, t, mask, alpha=0.1), {"alpha": 0.1}),
    "skew_rkl": (lambda x: skew_kl_loss(x, t, mask, alpha=0.1, reverse=True), {"alpha": 0.1}),
    "topk_kl": (lambda x: topk_kl_loss(x, *teacher_topk(t, 4, torch.float64), mask),
                {"k": 4}),
    "sequence_kd": (lambda x: sequence_kd_loss(x, targets, mask), {"targets": targets}),
}  # fmt: skip
for name, (loss, kw) in cases.items():
    (grad,) = torch.autograd.grad(loss(s), s)
    closed = closed_form_grad(name, s.detach(), t, mask, **kw)
    ok = torch.autograd.gradcheck(loss, (s,)) and torch.allclose(grad, closed, rtol=0, atol=1e-15)
    print(f"{name:12} gradcheck and closed form: {ok}")
    #> forward_kl   gradcheck and closed form: True
    #> reverse_kl   gradcheck and closed form: True
    #> jsd          gradcheck and closed form: True
    #> skew_kl      gradcheck and closed form: True
    #> skew_rkl     gradcheck and closed form: True
    #> topk_kl      gradcheck and closed form: True
    #> sequence_kd  gradcheck and closed form: True
# --8<-- [end:gradcheck]

# --8<-- [start:hinton]
# Hinton et al. 2015, Eq. (4): with zero-mean logits and T large against them, the gradient
# of the T^2-scaled soft loss tends to (z - v) / N, matching logits; without the T^2 it
# shrinks as 1 / T^2
z, v = hashed_logits(1, 10, seed=3), hashed_logits(1, 10, seed=4)
z, v = z - z.mean(), v - v.mean()  # zero-meaned per case, as Eq. (4) assumes
matching = (z - v) / z.shape[-1]
hinton = []
for temp in (1.0, 10.0, 100.0, 1000.0):
    zg = z.clone().requires_grad_()
    (grad,) = torch.autograd.grad(forward_kl_loss(zg, v, temperature=temp), zg)
    rel, unscaled = ((grad - matching).norm() / matching.norm()).item(), grad / temp**2
    hinton.append({"T": temp, "rel_to_matching": rel, "unscaled_norm": unscaled.norm().item()})
    print(f"T={temp:<6g} |grad - (z-v)/N| / |(z-v)/N| = {hinton[-1]['rel_to_matching']:.1e}")
    #> T=1      |grad - (z-v)/N| / |(z-v)/N| = 8.7e-01
    #> T=10     |grad - (z-v)/N| / |(z-v)/N| = 1.9e-01
    #> T=100    |grad - (z-v)/N| / |(z-v)/N| = 1.9e-02
    #> T=1000   |grad - (z-v)/N| / |(z-v)/N| = 1.9e-03
# --8<-- [end:hinton]

# --8<-- [start:limits]
# GKD's JSD(beta) goes to 0 at both ends; divided by beta (by 1 - beta) it tends to the forward
# (reverse) KL. DistiLLM's skew losses are the plain KLs at alpha = 0.
fkl, rkl = forward_kl_loss(s, t).item(), reverse_kl_loss(s, t).item()
limits = {"fkl": fkl, "rkl": rkl,
          "jsd_small_beta": jsd_loss(s, t, beta=1e-6).item() / 1e-6,
          "jsd_large_beta": jsd_loss(s, t, beta=1 - 1e-6).item() / 1e-6,
          "skew_kl_0": skew_kl_loss(s, t, alpha=0.0).item(),
          "skew_rkl_0": skew_kl_loss(s, t, alpha=0.0, reverse=True).item()}  # fmt: skip
print(f"forward KL {fkl:.6f}  JSD(1e-6)/1e-6 {limits['jsd_small_beta']:.6f}")
#> forward KL 4.279085  JSD(1e-6)/1e-6 4.278611
print(f"reverse KL {rkl:.6f}  JSD(1-1e-6)/1e-6 {limits['jsd_large_beta']:.6f}")
#> reverse KL 4.131534  JSD(1-1e-6)/1e-6 4.131369
print(limits["skew_kl_0"] == fkl, limits["skew_rkl_0"] == rkl)
#> True True
# --8<-- [end:limits]

# --8<-- [start:topk]
# An LM-like teacher over Qwen3's 151,936 tokens (the quality-metrics post's synthetic logits);
# what storing its top-k costs, the mass it drops, and the top-k loss of a student that IS the
# teacher: KL(p~ || p) = -ln(1 - m), not 0 (its gradient pushes the tail mass m to zero)
V = 151_936
teacher = -2 * torch.arange(V, dtype=torch.float64).log1p() + hashed_logits(8, V, seed=5, scale=1.0)
topk_rows = []
for k in (8, 32, 64, 256, 1024):
    values, idx = teacher_topk(teacher, k, torch.float64)
    tail = 1 - teacher.softmax(-1).gather(-1, idx.long()).sum(-1)
    at_teacher = topk_kl_loss(teacher, values, idx).item()  # the student equals the teacher
    assert math.isclose(at_teacher, (-(-tail).log1p()).mean().item(), rel_tol=1e-9)
    store = bytes_per_token(V, k, value_bytes=2, id_bytes=index_bytes(V))  # bf16 + int32
    topk_rows.append({"k": k, "bytes": store["topk"], "of_full": store["topk"] / store["full"],
                      "tail": tail.mean().item(), "loss_at_teacher": at_teacher})  # fmt: skip
    print(f"k={k:<5} {store['topk']:>5} B/token  tail {tail.mean():.3f}  loss {at_teacher:.3f}")
    #> k=8        48 B/token  tail 0.090  loss 0.096
    #> k=32      192 B/token  tail 0.022  loss 0.022
    #> k=64      384 B/token  tail 0.011  loss 0.011
    #> k=256    1536 B/token  tail 0.003  loss 0.003
    #> k=1024   6144 B/token  tail 0.001  loss 0.001
# --8<-- [end:topk]

computed_result("moe-distillation", "losses",
                {"hinton": hinton, "limits": limits, "topk": topk_rows})  # fmt: skip
