"""Data parallel + accumulation: a token mean needs the global token count, and x W under DDP."""

import torch

from .ddp_tokens import WIDTH, launch, micro_batch, reference
from .equivalence import within

# --8<-- [start:demo]
gen = torch.Generator().manual_seed(0)
windows = [  # 2 ranks x 2 micro-batches: rank 0 holds 28 real tokens, rank 1 only 6
    [micro_batch(gen, [8, 8]), micro_batch(gen, [8, 4])],
    [micro_batch(gen, [3, 1]), micro_batch(gen, [2, 0])],
]
torch.manual_seed(0)
model = torch.nn.Linear(WIDTH, 1)
ranks = launch(windows, model)
single, exact, bound = reference(windows, model)

print(within(single, exact, bound))  # one process, all 34 tokens at once, fp32
#> True
print({name: within(g, exact, bound) for name, g in ranks[0].items()})
#> {'per_rank_mean': False, 'global_only': False, 'global_times_w': True}
fixed = [r["global_times_w"] for r in ranks]
print(all(torch.equal(a, b) for a, b in zip(*fixed, strict=True)))  # every rank, the same grad
#> True
print(ranks[0]["global_only"][0].norm().item() / ranks[0]["global_times_w"][0].norm().item())
#> 0.5
# per-rank means weight a rank-1 token 1/(2*6) and a rank-0 token 1/(2*28); the batch: 1/34
print(round(34 / (2 * 6), 2), round(34 / (2 * 28), 2))
#> 2.83 0.61
# --8<-- [end:demo]
