"""Accumulating k micro-batches with loss / k gives the gradient of one k-times-larger batch."""

import torch

from snippets.common.device import DEVICE


# --8<-- [start:loops]
def large_batch_grad(model, x, y):
    model.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()  # mean over N samples
    return [p.grad.clone() for p in model.parameters()]


def accumulated_grad(model, x, y, k, divide=True):
    model.zero_grad(set_to_none=True)
    for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):  # k equal micro-batches
        loss = torch.nn.functional.mse_loss(model(xb), yb)  # mean over N / k samples
        (loss / k if divide else loss).backward()  # .grad accumulates: sum of k terms
    return [p.grad.clone() for p in model.parameters()]


# --8<-- [end:loops]


# --8<-- [start:bound]
def summation_bound(model, x, y, unit_roundoff):
    """Worst-case rounding error of either loop, elementwise (Higham 2002, §3.1 and §4.2).

    With mean-squared error over N x OUT outputs, dL/dW = c * sum_i r_i x_i^T, c = 2 / (N * OUT),
    residual r_i = W x_i + b - y_i. Computing r_i costs d + 2 roundings and each product term
    a length-N sum plus the scalings (4 more), in any summation order, so
    |computed - exact| <= gamma(d + N + 6) * c * sum_i (|W||x_i| + |b| + |y_i| + |r_i|) |x_i|^T,
    with gamma(n) = n u / (1 - n u).
    """
    n, d = x.shape
    steps = d + n + 6
    gamma = steps * unit_roundoff / (1 - steps * unit_roundoff)
    w, b = (p.detach().double() for p in model.parameters())
    x, y = x.double(), y.double()
    r = x @ w.T + b - y
    size = x.abs() @ w.abs().T + b.abs() + y.abs() + r.abs()
    c = 2 / y.numel()
    return [gamma * c * size.T @ x.abs(), gamma * c * size.sum(0)]


# --8<-- [end:bound]


# --8<-- [start:demo]
torch.manual_seed(0)
N, D, OUT, K = 64, 32, 4, 8
x = torch.randn(N, D, dtype=torch.float64).to(DEVICE)
y = torch.randn(N, OUT, dtype=torch.float64).to(DEVICE)
model64 = torch.nn.Linear(D, OUT).to(DEVICE, torch.float64)
model32 = torch.nn.Linear(D, OUT).to(DEVICE, torch.float32)
model32.load_state_dict(model64.state_dict())

exact = large_batch_grad(model64, x, y)  # fp64 stands in for exact arithmetic
big = large_batch_grad(model32, x.float(), y.float())
acc = accumulated_grad(model32, x.float(), y.float(), K)
bound = summation_bound(model64, x, y, unit_roundoff=2.0**-24)  # fp32: u = 2^-24


def within(grads, ref, tol):
    return all(((g.double() - r).abs() <= t).all() for g, r, t in zip(grads, ref, tol, strict=True))


print(within(big, exact, bound), within(acc, exact, bound))
#> True True
forgot = accumulated_grad(model32, x.float(), y.float(), K, divide=False)
print(round((forgot[0].norm() / big[0].norm()).item(), 3))  # forgetting "/ k": k times too big
#> 8.0
# --8<-- [end:demo]
