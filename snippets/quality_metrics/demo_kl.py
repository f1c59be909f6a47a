"""KL in both directions, its estimators, top-k truncation and JS, on small exact examples."""

import math

import torch

from snippets.common.results import computed_result
from snippets.quality_metrics.divergence import (
    forward_kl,
    gaussian_moments,
    js,
    k1,
    k2,
    k3,
    kl,
    renormalized_topk_kl,
    reverse_kl,
    topk_kl,
)
from snippets.quality_metrics.synthetic import hashed_logits

# --8<-- [start:directions]
# a reference with two modes, and two candidates: one covers both thinly, one sits on one mode
ref = torch.tensor([0.45, 0.45, 0.02, 0.02, 0.02, 0.02, 0.02], dtype=torch.float64).log()
wide = torch.full((7,), 1 / 7, dtype=torch.float64).log()
one_mode = torch.tensor([0.9, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01], dtype=torch.float64).log()
for name, test in (("wide", wide), ("one mode", one_mode)):
    print(f"{name:8} forward {forward_kl(ref, test):.3f}  reverse {reverse_kl(ref, test):.3f}")
    #> wide     forward 0.836  reverse 1.077
    #> one mode forward 1.117  reverse 0.548
# --8<-- [end:directions]

# --8<-- [start:estimators]
# Schulman's two examples: P = N(0, 1), Q = N(mu, 1), x ~ P; bias and std relative to the KL
schulman = {mu: gaussian_moments(mu) for mu in (0.1, 1.0)}
for mu, est in schulman.items():
    table = "  ".join(f"{k} {v['bias']:.4f} {v['std']:.2f}" for k, v in est.items())
    print(f"mu={mu}: KL={mu**2 / 2:g}", table)
    #> mu=0.1: KL=0.005 k1 0.0000 20.00  k2 0.0025 1.42  k3 0.0000 1.42
    #> mu=1.0: KL=0.5 k1 0.0000 2.00  k2 0.2500 1.73  k3 0.0000 1.70

# the estimators on samples agree with the closed forms (within 4 standard errors)
gen = torch.Generator().manual_seed(0)
for mu, est in schulman.items():
    x = torch.randn(100_000, generator=gen, dtype=torch.float64)
    log_r = -0.5 * (x - mu) ** 2 + 0.5 * x**2  # log q(x) - log p(x)
    for name, f in (("k1", k1), ("k2", k2), ("k3", k3)):
        s, true = f(log_r), mu**2 / 2
        assert abs(s.mean() / true - 1 - est[name]["bias"]) < 4 * est[name]["std"] / len(x) ** 0.5
        assert math.isclose(s.std() / true, est[name]["std"], rel_tol=0.05)
# --8<-- [end:estimators]

# --8<-- [start:topk]
# LM-like logits: token i's logit -2 ln(1 + i) plus noise, Qwen3's vocabulary; the accelerated
# path is the same logits rounded to bf16. The reference keeps only its top-k log-probs.
V = 151_936
zipf = -2 * torch.arange(V, dtype=torch.float64).log1p() + hashed_logits(8, V, seed=5, scale=1.0)
ref_logp = zipf.log_softmax(-1)
test_logp = zipf.float().bfloat16().double().log_softmax(-1)
exact = kl(ref_logp, test_logp).mean().item()
topk = []
for k in (1, 4, 16, 64, 256, 1024, 4096):
    values, idx = ref_logp.topk(k, dim=-1)
    low, high = topk_kl(values, idx, test_logp)
    renormalized = renormalized_topk_kl(values, idx, test_logp).mean().item()
    topk.append({"k": k, "tail": (1 - values.exp().sum(-1)).mean().item(),
                 "low": low.mean().item(), "exact": exact, "high": high.mean().item(),
                 "renormalized": renormalized})  # fmt: skip
    row = topk[-1]
    print(f"k={k:<4} tail {row['tail']:.1e}  {row['low']:.2e} <= {exact:.2e} <= {row['high']:.1e}")
    #> k=1    tail 4.6e-01  4.86e-07 <= 6.25e-06 <= 1.2e+01
    #> k=4    tail 1.7e-01  1.12e-06 <= 6.25e-06 <= 4.3e+00
    #> k=16   tail 4.4e-02  3.15e-06 <= 6.25e-06 <= 9.8e-01
    #> k=64   tail 1.1e-02  4.57e-06 <= 6.25e-06 <= 2.1e-01
    #> k=256  tail 2.6e-03  5.73e-06 <= 6.25e-06 <= 4.2e-02
    #> k=1024 tail 6.6e-04  6.05e-06 <= 6.25e-06 <= 8.3e-03
    #> k=4096 tail 1.6e-04  6.14e-06 <= 6.25e-06 <= 1.5e-03
# --8<-- [end:topk]

# --8<-- [start:js]
p = torch.tensor([0.5, 0.5, 0.0, 0.0], dtype=torch.float64).log()
q = torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=torch.float64).log()
print(kl(p, q).item(), js(p, q).item() == math.log(2), js(p, q).item() == js(q, p).item())
#> inf True True
# --8<-- [end:js]

computed_result(
    "quality-metrics",
    "divergence",
    {"schulman": [{"mu": mu, "kl": mu**2 / 2, "estimator": k, **v}
                  for mu, est in schulman.items() for k, v in est.items()],
     "topk": topk},
)  # fmt: skip
