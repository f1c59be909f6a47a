"""Online softmax (Milakov & Gimelshein 2018, arXiv:1805.02867): the running maximum and running
sum of one pass over blocks equal the two passes of the safe softmax; carried with an output, the
same recurrence is FlashAttention's inner loop (arXiv:2205.14135 §3.1, 2307.08691 Algorithm 1).

Pure PyTorch, for reading and for checking: inputs whose rows are large, masked with -inf or masked
entirely. A row with no finite entry gets probabilities 0 and logsumexp -inf (FlexAttention's
convention), where torch.softmax returns NaN.
"""

import math

import torch

NEG_INF = -math.inf


# --8<-- [start:recurrence]
def online_stats(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise running max m and running sum l over the last dim, `block` columns at a time:
    m_j = max(m_{j-1}, max x_block), l_j = l_{j-1} e^(m_{j-1} - m_j) + sum e^(x_block - m_j)."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    m = torch.full(x.shape[:-1], NEG_INF, dtype=x.dtype)
    l = torch.zeros(x.shape[:-1], dtype=x.dtype)
    for start in range(0, x.shape[-1], block):
        xb = x[..., start : start + block]
        m_new = torch.maximum(m, xb.amax(-1))
        # a row that has seen only -inf keeps m = -inf: shift by 0 (e^-inf = 0), never -inf - -inf
        ref = torch.where(m_new == NEG_INF, 0.0, m_new)
        l = l * torch.exp(m - ref) + torch.exp(xb - ref[..., None]).sum(-1)
        m = m_new
    return m, l


def online_softmax(x: torch.Tensor, block: int) -> torch.Tensor:
    """softmax(x) over the last dim from the one-pass statistics; all-masked rows give zeros."""
    m, l = online_stats(x, block)
    ref = torch.where(m == NEG_INF, 0.0, m)
    return torch.exp(x - ref[..., None]) / torch.where(l > 0, l, 1.0)[..., None]


def logsumexp(m: torch.Tensor, l: torch.Tensor) -> torch.Tensor:
    """log sum e^x = m + log l; -inf for a row with nothing in it."""
    return torch.where(l > 0, m + torch.log(torch.where(l > 0, l, 1.0)), NEG_INF)


# --8<-- [end:recurrence]


# --8<-- [start:attention]
def online_attention(q, k, v, block: int, mask=None):
    """softmax(q k^T / sqrt(d) + mask) v, visiting `block` keys at a time: the output accumulator
    is rescaled by e^(m_old - m_new) with l, and divided by l once at the end (FlashAttention-2).
    q [n, d], k and v [n_k, d], mask [n, n_k] bool (True: visible) or None."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    m = torch.full(q.shape[:1], NEG_INF, dtype=q.dtype)
    l = torch.zeros(q.shape[:1], dtype=q.dtype)
    acc = torch.zeros(q.shape[0], v.shape[-1], dtype=q.dtype)
    for start in range(0, k.shape[0], block):
        s = scale * q @ k[start : start + block].T
        if mask is not None:
            s = s.masked_fill(~mask[:, start : start + block], NEG_INF)
        m_new = torch.maximum(m, s.amax(-1))
        ref = torch.where(m_new == NEG_INF, 0.0, m_new)
        alpha, p = torch.exp(m - ref), torch.exp(s - ref[:, None])
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[:, None] + p @ v[start : start + block]
        m = m_new
    return acc / torch.where(l > 0, l, 1.0)[:, None], logsumexp(m, l)


# --8<-- [end:attention]

# --8<-- [start:check]
g = torch.Generator().manual_seed(0)
x = torch.randn(4, 50, generator=g, dtype=torch.float64)
for block in (1, 7, 16, 50):  # blocks that divide the row, and ones that do not
    assert torch.allclose(online_softmax(x, block), torch.softmax(x, -1), rtol=1e-14, atol=0)

big = 100 * torch.randn(3, 40, generator=g) + 1e4  # fp32 logits around 1e4
print(torch.exp(big).sum(-1).isinf().all().item())  # without subtracting the max: e^1e4 overflows
#> True
print(torch.allclose(online_softmax(big, 16), torch.softmax(big, -1), atol=1e-6))
#> True

masked = x.clone()
masked[0, ::3] = NEG_INF  # a causal- or padding-style -inf mask
masked[1, :] = NEG_INF  # a row with nothing visible
masked[2, :20] = NEG_INF  # the first blocks of a row all masked, the later ones not
ours = online_softmax(masked, 16)
print(torch.softmax(masked, -1)[1].isnan().all().item(), ours[1].eq(0).all().item())
#> True True
print(torch.allclose(ours[[0, 2, 3]], torch.softmax(masked[[0, 2, 3]], -1), rtol=1e-14, atol=0))
#> True
lse = logsumexp(*online_stats(masked, 16))
print(lse[1].item(), torch.allclose(lse[[0, 2, 3]], torch.logsumexp(masked[[0, 2, 3]], -1)))
#> -inf True

q, k, v = (torch.randn(30, 8, generator=g, dtype=torch.float64) for _ in range(3))
causal = torch.ones(30, 30, dtype=torch.bool).tril()
reference = torch.softmax((q @ k.T / math.sqrt(8)).masked_fill(~causal, NEG_INF), -1) @ v
out, lse = online_attention(q, k, v, block=8, mask=causal)
exact_lse = torch.logsumexp((q @ k.T / math.sqrt(8)).masked_fill(~causal, NEG_INF), -1)
print(torch.allclose(out, reference, rtol=0, atol=1e-13), torch.allclose(lse, exact_lse))
#> True True
# --8<-- [end:check]
