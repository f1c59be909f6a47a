"""Section 3's demonstration: exact gradients of a one-token policy whose samples come from
logits rounded to fp16, or from an older policy."""

import torch

from snippets.rl_training.offpolicy import exact_gradients

# --8<-- [start:demo]
gen = torch.Generator().manual_seed(0)
logits = 2 * torch.randn(16, generator=gen, dtype=torch.float64)
adv = torch.randn(16, generator=gen, dtype=torch.float64)
stale = logits + 0.5 * torch.randn(16, generator=gen, dtype=torch.float64)  # an older policy
low = logits.to(torch.float16).double()  # the same weights, logits rounded to fp16


def rel_error(g: dict, name: str) -> float:
    return ((g[name] - g["truth"]).norm() / g["truth"].norm()).item()


for source, rollout in (("fp16 logits", low), ("stale policy", stale)):
    plain, tis = exact_gradients(logits, rollout, adv), exact_gradients(logits, rollout, adv, 2.0)
    off, exact = rel_error(plain, "uncorrected"), rel_error(plain, "corrected") < 1e-12
    print(source, f"{off:.1e}", exact, f"{rel_error(tis, 'corrected'):.2f}")
    #> fp16 logits 1.5e-04 True 0.00
    #> stale policy 7.3e-01 True 0.08
# --8<-- [end:demo]
