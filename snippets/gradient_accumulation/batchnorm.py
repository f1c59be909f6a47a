"""The BatchNorm exception: batch statistics are per micro-batch, so accumulation changes them."""

import torch

from snippets.common.device import DEVICE

from .equivalence import accumulated_grad, large_batch_grad

# --8<-- [start:setup]
torch.manual_seed(0)
N, D, K = 64, 8, 4
# Micro-batches drawn in order from a drifting stream (e.g. a sorted or bucketed dataset):
# chunk j has mean j. Independent, identically shuffled batches shrink the gap but keep it.
drift = torch.arange(K).repeat_interleave(N // K)[:, None]
x = (torch.randn(N, D, dtype=torch.float64) + drift).to(DEVICE)  # drawn on the CPU: same data
y = torch.randn(N, 1, dtype=torch.float64).to(DEVICE)  # on every device


def net(norm):
    torch.manual_seed(1)
    layers = [torch.nn.Linear(D, D), norm(D), torch.nn.ReLU(), torch.nn.Linear(D, 1)]
    return torch.nn.Sequential(*layers).to(DEVICE, torch.float64)


# --8<-- [end:setup]


# --8<-- [start:stats]
bn = net(torch.nn.BatchNorm1d)
h = bn[0](x).detach()[:, 0]  # the first feature BatchNorm normalises
print([round(c.mean().item(), 2) for c in h.chunk(K)], round(h.mean().item(), 2))
#> [-0.08, -0.15, 0.31, 0.11] 0.05
# --8<-- [end:stats]


# --8<-- [start:grads]
def rel_diff(a, b):
    return max(((p - q).norm() / q.norm()).item() for p, q in zip(a, b, strict=True))


for norm in (torch.nn.BatchNorm1d, torch.nn.LayerNorm):
    model = net(norm)
    gap = rel_diff(accumulated_grad(model, x, y, K), large_batch_grad(model, x, y))
    print(norm.__name__, gap > 0.1, gap < 1e-12)
    #> BatchNorm1d True False
    #> LayerNorm False True
# --8<-- [end:grads]


# --8<-- [start:running]
bn_big, bn_acc = net(torch.nn.BatchNorm1d), net(torch.nn.BatchNorm1d)
bn_big(x)  # one update of the running mean (momentum 0.1)
for xb in x.chunk(K):
    bn_acc(xb)  # K updates, each from a quarter of the data
print(round(bn_big[1].running_mean[0].item(), 3), round(bn_acc[1].running_mean[0].item(), 3))
#> 0.005 0.022
# --8<-- [end:running]
