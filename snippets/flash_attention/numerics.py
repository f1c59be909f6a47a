"""The fp64 reference of attention and elementwise rounding-error bounds for the Triton kernels.

Every check compares a kernel's output, logsumexp and gradients with the same computation in fp64
on the same inputs: |computed - exact| <= bound, elementwise. The bounds follow the standard model
of floating-point arithmetic used by the triton-kernels post (snippets/triton_kernels/numerics.py:
U = 2^-24 for the kernels' fp32 arithmetic, gamma_n = n U / (1 - n U) for a sum of n terms, u_p
once per rounding to a storage dtype, eta_p for results among its subnormals). The forward follows
the derivation of the paged decode kernel's bound (snippets/kv_cache/paged_attention.py,
decode_bound): each query row is a decode query over the keys it sees. They are worst cases, not
fitted constants; tests/snippets/test_flash_attention.py checks that typical bugs fall outside.
"""

import math

import torch

from snippets.common.device import DEVICE
from snippets.flash_attention.attention import flash_attention
from snippets.triton_kernels.numerics import U, eta, gamma, unit_roundoff, within

LOG2E = 1.4426950408889634
MIN_BLOCK = 16  # the smallest key or query block of any configuration: most rescales and tiles
FTZ = 2.0**-126  # the GPU may flush a probability below the smallest fp32 normal to zero


# --8<-- [start:reference]
def visible(n: int, causal: bool, device) -> torch.Tensor:
    """[n, n] bool: key j is visible to query i (all, or j <= i)."""
    ones = torch.ones(n, n, dtype=torch.bool, device=device)
    return ones.tril() if causal else ones


def attention_reference(q, k, v, causal, scale=None, do=None, dlse=None):
    """fp64 attention on the same inputs: {"out", "lse"} and, given the output gradient do
    (and optionally a gradient of the logsumexp), {"dq", "dk", "dv"} by autograd. KV heads are
    repeated for their query heads (h // group), so dk and dv sum over each group."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.repeat_interleave(group, dim=1) for t in (k64, v64))
    s = scale * q64 @ kr.transpose(-1, -2)
    s = s.masked_fill(~visible(q.shape[2], causal, q.device), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ vr
    exact = {"out": out.detach(), "lse": lse.detach()}
    if do is not None:
        outputs, grads = [out], [do.double()]
        if dlse is not None:
            outputs.append(lse)
            grads.append(dlse.double())
        exact["dq"], exact["dk"], exact["dv"] = torch.autograd.grad(outputs, (q64, k64, v64),
                                                                    grads)  # fmt: skip
    return exact


# --8<-- [end:reference]


# --8<-- [start:bounds]
def attention_bounds(q, k, v, causal, exact, scale=None, do=None, dlse=None):
    """Elementwise bounds on |kernel - exact| for out, lse (and dq, dk, dv given do).

    q, k, v, do in the storage dtype p (fp32 on the CPU, bf16 or fp16 on the GPU); the kernels
    compute in fp32 and round P and dS to p before the matmuls that use them (u_dot = u_p, or 0
    for fp32). Per query row i and key j, with c = scale log2 e and S2 = c q.k (base 2):
    Scores: a d-term dot, times c (rounded once): |dS2_ij| <= gamma(2(d + 3)) c sum_t |q_it k_jt|
      (the 2: tensor-core accumulation may truncate).
    Forward (as decode_bound): every weight exp2(S2 - m) carries dS2, the rounding of its
      argument and of the running maxima (<= 8 U max|S2|), exp2 (4 U) and one rescale per tile
      (5 U each): relative error E. Weights off by E move the output by <= 2E/(1-E) sum_j
      P_ij |v_j|; the sums of n terms and their rescales add 2 gamma(n + 2 tiles + 8), P rounded
      for the matmul u_dot, the division U, the output's rounding u_out; a flushed or subnormal
      weight n (2^-126 + eta_dot) max|v|.
    Logsumexp: L = ln 2 (m + log2 l) is 1-Lipschitz in the scores, so it moves by the largest
      score error, plus log(1 + E')/..., E' = E + gamma(n + tiles + 2) for the sum l, and the
      roundings of log2 (4 U (1 + log2 n)), of m + log2 l and of the factor ln 2 (3 U |L|).
    Backward: P~ = exp2(S2~ - L2~) with L2 = L log2 e read back (its error from above, plus U
      |L2|) has relative error E_P = expm1(ln 2 dt)(1 + 4 U) + 4 U, dt = dS2 + dL2 + 2 U (|S2| +
      |L2|). dP = dO.v (d terms) and D_i = dO_i.O~_i - dlse_i read the forward's rounded O~,
      whose error is the output bound B_O: |dD| <= sum_t |dO| B_O + gamma(d + 3) (sum_t |dO|
      (|O| + B_O) + |dlse|). dS = P (dP - D), two roundings:
      |d dS| <= P (E_P |dP - D| + (1 + E_P)(|d dP| + |dD|)) + 2 U P (1 + E_P) (|dP - D| + ...).
      dV = sum_i P~ dO over the R = group x n rows that read the KV head; dQ = scale sum_j dS~ K
      and dK = scale sum_i dS~ Q: the perturbed terms, plus u_dot for P~ or dS~ rounded for the
      matmul, 2 gamma(R + 2) for the fp32 sum, 2 U for the scale, u_out for the result (plus its
      eta), and flushed or subnormal terms R (2^-126 + eta_dot) times the largest factor.
    """
    dtype = q.dtype
    d, n = q.shape[-1], q.shape[2]
    group = q.shape[1] // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    u_out, eta_out = unit_roundoff(dtype), eta(dtype)
    u_dot = 0.0 if dtype == torch.float32 else unit_roundoff(dtype)
    eta_dot = 0.0 if dtype == torch.float32 else eta(dtype)
    c = scale * LOG2E
    q64, k64, v64 = (t.detach().double() for t in (q, k, v))
    kr, vr = (t.repeat_interleave(group, dim=1) for t in (k64, v64))
    see = visible(n, causal, q.device)
    s2 = (c * q64 @ kr.transpose(-1, -2)).masked_fill(~see, 0.0)
    ds2 = gamma(2 * (d + 3)) * c * (q64.abs() @ kr.abs().transpose(-1, -2))
    p = torch.softmax((s2 / LOG2E).masked_fill(~see, float("-inf")), -1)
    keys = see.sum(-1).double()  # keys each row sees
    tiles = torch.ceil(keys / MIN_BLOCK)
    big = s2.abs().amax(-1)
    e = torch.expm1(math.log(2) * (ds2.masked_fill(~see, 0).amax(-1) + U * (8 * big + 8)))
    e = e + U * (5 * tiles + 8)
    rel = 2 * e / (1 - e) + 2 * gamma(keys + 2 * tiles + 8) + u_dot + U + u_out
    mag = p @ vr.abs()
    b_out = rel[..., None] * mag + (keys * (FTZ + eta_dot))[..., None] * vr.abs().amax(
        (-1, -2), keepdim=True) + eta_out  # fmt: skip
    lse = exact["lse"]
    e_sum = e + gamma(keys + tiles + 2)
    b_lse = (math.log(2) * ds2.masked_fill(~see, 0).amax(-1) + e_sum / (1 - e_sum)
             + math.log(2) * 4 * U * (1 + torch.log2(keys)) + 3 * U * lse.abs())  # fmt: skip
    bounds = {"out": b_out, "lse": b_lse}
    if do is None:
        return bounds

    do64 = do.detach().double()
    dlse64 = torch.zeros_like(lse) if dlse is None else dlse.detach().double()
    rows = group * n  # terms of dK, dV: every row of every query head of the group
    l2 = lse / math.log(2)
    dl2 = b_lse / math.log(2) + U * l2.abs()
    dt = ds2 + dl2[..., None] + 2 * U * (s2.abs() + l2.abs()[..., None])
    e_p = (torch.expm1(math.log(2) * dt) * (1 + 4 * U) + 4 * U).masked_fill(~see, 0.0)
    o = exact["out"]
    dp = do64 @ vr.transpose(-1, -2)
    d_dp = gamma(2 * (d + 2)) * (do64.abs() @ vr.abs().transpose(-1, -2))
    big_d = (do64 * o).sum(-1) - dlse64
    d_d = (do64.abs() * b_out).sum(-1) + gamma(d + 3) * (
        (do64.abs() * (o.abs() + b_out)).sum(-1) + dlse64.abs())  # fmt: skip
    gap = (dp - big_d[..., None]).abs()
    err_in = d_dp + d_d[..., None]
    d_ds = p * (e_p * gap + (1 + e_p) * err_in + 2 * U * (1 + e_p) * (gap + err_in))
    ds_mag = p * gap + d_ds  # bounds |dS~|
    r_sum = 2 * gamma(rows + 2) + u_dot + 2 * U
    flushed = rows * (FTZ * (gap + err_in).amax() + eta_dot)

    def per_kv_head(x):  # sum the query heads of each group: [b, kv, n, d]
        return x.unflatten(1, (k.shape[1], group)).sum(2)

    dv_terms = (e_p * p + r_sum * (1 + e_p) * p).transpose(-1, -2) @ do64.abs()
    b_dv = per_kv_head(dv_terms) + rows * (FTZ + eta_dot) * do64.abs().amax()
    dq_terms = scale * (d_ds @ kr.abs() + r_sum * ds_mag @ kr.abs()) + scale * flushed * kr.abs(
        ).amax()  # fmt: skip
    dk_terms = scale * (d_ds.transpose(-1, -2) @ q64.abs() + r_sum * ds_mag.transpose(-1, -2)
                        @ q64.abs())  # fmt: skip
    b_dk = per_kv_head(dk_terms) + scale * flushed * q64.abs().amax()
    for name, b in (("dq", dq_terms), ("dk", b_dk), ("dv", b_dv)):
        bounds[name] = b * (1 + u_out) + u_out * exact[name].abs() + eta_out
    return bounds


# --8<-- [end:bounds]


# --8<-- [start:check]
def check_attention(batch, q_heads, kv_heads, n, d, causal, dtype, seed=0, lse_grad=False):
    """Output, logsumexp and dQ, dK, dV of the kernels against fp64 attention on the same inputs,
    each element within its bound; lse_grad: the loss reads the logsumexp too."""
    g = torch.Generator().manual_seed(seed)

    def rand(heads):
        return torch.randn(batch, heads, n, d, generator=g).to(DEVICE, dtype).requires_grad_()

    q, k, v = rand(q_heads), rand(kv_heads), rand(kv_heads)
    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
    do = torch.randn(out.shape, generator=g).to(DEVICE, dtype)
    dlse = torch.randn(lse.shape, generator=g).to(DEVICE) if lse_grad else None
    outputs, grads = ((out, lse), (do, dlse)) if lse_grad else ((out,), (do,))
    dq, dk, dv = torch.autograd.grad(outputs, (q, k, v), grads)
    exact = attention_reference(q, k, v, causal, do=do, dlse=dlse)
    bound = attention_bounds(q, k, v, causal, exact, do=do, dlse=dlse)
    got = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    return within(got, exact, bound)


# --8<-- [end:check]
