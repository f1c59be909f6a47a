"""Exact references and rounding-error bounds for the kernels of this post.

Every check (on the page and in tests/snippets/test_triton_kernels.py) compares a kernel's
output with the same computation in fp64 on the same inputs, elementwise:
|computed - exact| <= bound. The bounds follow the standard model of floating-point arithmetic
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002, §2.2 and §3.1):
fl(a op b) = (a op b)(1 + d), |d| <= u, and a sum of n terms in any order is off by at most
gamma_n * sum|terms|, gamma_n = n u / (1 - n u). Two unit roundoffs appear:

- U = 2^-24 for the fp32 arithmetic inside the kernels (gamma_n below uses it);
- u_p of the storage dtype (fp32 2^-24, fp16 2^-11, bf16 2^-8), once per rounding to it,
  plus, for results that land among the subnormals, an absolute eta_p: half the smallest
  subnormal (Higham's fl(x) = x(1 + d) + e, |e| <= eta; fp16 2^-25, bf16 2^-134, fp32 2^-150).

The bounds are worst cases, not fitted constants: a wrong formula, a missed cast or a lost
block is off by orders of magnitude more.
"""

import math

import torch

from snippets.common.device import ON_GPU

U = 2.0**-24  # fp32, the kernels' arithmetic


# --8<-- [start:basics]
def unit_roundoff(dtype: torch.dtype) -> float:
    return {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.float16: 2.0**-11,
            torch.bfloat16: 2.0**-8}[dtype]  # fmt: skip


def eta(dtype: torch.dtype) -> float:
    """Half the smallest subnormal: the absolute error of rounding a tiny result to dtype."""
    return torch.finfo(dtype).smallest_normal * torch.finfo(dtype).eps / 2


def gamma(n: float) -> float:
    """gamma_n = n U / (1 - n U): the relative error of n fp32 roundings (Higham, Lemma 3.1)."""
    return n * U / (1 - n * U)


def within(got: dict, exact: dict, bound: dict) -> bool:
    """Every tensor of `got` lies within its elementwise bound of the exact value."""
    return all(bool(((got[k].double() - exact[k]).abs() <= bound[k]).all()) for k in got)


# The checks below run fp32 and fp16 in the CPU's Triton interpreter (it mangles bf16), and
# bf16 only on the GPU: there the fp32 and fp16 arithmetic adds nothing the CPU has not
# checked, only another compile of every kernel.
CHECK_DTYPES = (torch.bfloat16,) if ON_GPU else (torch.float32, torch.float16)
# --8<-- [end:basics]


# --8<-- [start:rmsnorm]
def rmsnorm_exact(x, w, dy, eps, residual=None, ds=None):
    """fp64 outputs and gradients of y = w * s * rsqrt(mean(s^2) + eps), s = x (+ residual),
    with elementwise error bounds for the kernels, which round like Hugging Face.

    T rows of H; u_x, u_w, u_y the unit roundoffs of x, w and y = promote(x, w).
    Forward: n = s * rstd rounded to x's dtype (u_x), times w rounded to y's dtype (u_y); in fp32
      the sum of H squares (gamma_H), the division, eps, rsqrt (<= 3 U on the GPU) and two
      products: |y~ - y| <= (u_x + u_y + gamma(H + 8)) |y|.
    dx = rstd (g - n m), g = dy w rounded to y's dtype (u_y), m = mean(g n): rstd and n carry
      gamma(H + 8) each, m a sum of H products of them, dx is rounded to x's dtype (u_x):
      |dx~ - dx| <= (u_x + u_y + gamma(4H + 32)) rstd (|g| + |n| mean(|g||n|)) (+ |ds|).
    dw = sum over T rows of dy n~ with n~ = n rounded to x's dtype, summed in fp32 (any order,
      per-program partial sums included), rounded to w's dtype:
      |dw~ - dw| <= (u_x + u_w + gamma(T + H + 16)) sum |dy||n|.
    With a residual, s is rounded to x's dtype before the norm (as the eager add does), which
    moves each s_j and rms(s) by at most u_x + U: 2(u_x + U) more in every bound.
    """
    ux, uw = unit_roundoff(x.dtype), unit_roundoff(w.dtype)
    uy = unit_roundoff(torch.promote_types(x.dtype, w.dtype))
    x64, w64, dy64 = (t.detach().double().requires_grad_() for t in (x, w, dy))
    r64 = residual.detach().double().requires_grad_() if residual is not None else None
    s = x64 + r64 if r64 is not None else x64
    h = s.shape[-1]
    rstd = (s.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    y = w64 * (s * rstd)
    outputs, grads = [y], [dy64]
    if r64 is not None and ds is not None:
        outputs.append(s)
        grads.append(ds.double())
    inputs = [x64, w64] + ([r64] if r64 is not None else [])
    dxs = torch.autograd.grad(outputs, inputs, grads)
    exact = {"y": y.detach(), "dx": dxs[0], "dw": dxs[1]}

    extra = 2 * (ux + U) if residual is not None else 0.0
    n, g = (s * rstd).detach().abs(), (dy64 * w64).detach().abs()
    scale = (g * n).mean(-1, keepdim=True)
    dx_mag = rstd.detach() * (g + n * scale) + (ds.double().abs() if ds is not None else 0)
    rows = n.numel() // h
    dw_mag = (dy64.detach().abs() * n).reshape(-1, h).sum(0)
    tiny = eta(x.dtype) + eta(torch.promote_types(x.dtype, w.dtype)) + eta(w.dtype)
    bound = {
        "y": (ux + uy + extra + gamma(h + 8)) * exact["y"].abs() + tiny,
        "dx": (ux + uy + extra + gamma(4 * h + 32)) * dx_mag + tiny,
        "dw": (ux + uw + extra + gamma(rows + h + 16)) * dw_mag + tiny,
    }
    if residual is not None:
        exact["s"], bound["s"] = s.detach(), (ux + U) * s.detach().abs() + eta(x.dtype)
        exact["dr"], bound["dr"] = dxs[2], bound["dx"]
    return exact, bound


# --8<-- [end:rmsnorm]


# --8<-- [start:swiglu]
def swiglu_exact(gate, up, dh):
    """fp64 h = silu(gate) * up and its gradients, with elementwise bounds (u_p: the tensors'
    dtype). In fp32, exp(-g) is off by (|g| + 3) U (the argument's rounding is scaled by |g|;
    the GPU's ex2.approx adds < 3 U), the sigmoid by (|g| + 6) U (1 + e, an approximate
    division), each product by U; one rounding to the dtype at the end, with 2 U to spare:
      |h~ - h| <= (u_p + (|g| + 10) U) |h|,  |du~ - du| <= (u_p + (|g| + 10) U) |du|;
    dg = dh up s (1 + g (1 - s)), s = sigmoid(g), has a sum that can cancel, so its bound
    carries the magnitudes: u_p |dg| + U |dh up| s ((|g| + 10)(1 + |g|(1 - s)) + |g| s (|g| + 6)).
    """
    up_, tiny = unit_roundoff(gate.dtype), eta(gate.dtype)
    g, u, d = gate.double(), up.double(), dh.double()
    s = torch.sigmoid(g)
    exact = {"h": g * s * u, "dg": d * u * s * (1 + g * (1 - s)), "du": d * g * s}
    a = g.abs()
    bound = {
        "h": (up_ + (a + 10) * U) * exact["h"].abs() + tiny,
        "du": (up_ + (a + 10) * U) * exact["du"].abs() + tiny,
        "dg": up_ * exact["dg"].abs()
        + U * (d * u).abs() * s * ((a + 10) * (1 + a * (1 - s)) + a * s * (a + 6))
        + tiny,
    }
    return exact, bound


# --8<-- [end:swiglu]


# --8<-- [start:rope]
def rope_exact(q, k, cos, sin, dq_out, dk_out):
    """fp64 rotate-half RoPE of q and k and the gradients of their inputs, with bounds.

    Each output element is a*c -/+ b*s: two products and a sum in fp32 (gamma_3 of the
    magnitudes |a||c| + |b||s|), rounded once to the dtype (u_p). The backward is the same
    rotation by -theta, with the same bound.
    """
    up = unit_roundoff(q.dtype)
    c, s = cos.double(), sin.double()

    def rot(x, sign=1.0):  # x*cos + rotate_half(x)*sin, and its magnitude for the bound
        x1, x2 = x.double().chunk(2, dim=-1)
        c1, c2 = c.chunk(2, dim=-1)
        s1, s2 = (sign * s).chunk(2, dim=-1)
        if sign < 0:  # the transpose of the rotation: sin halves swap places
            s1, s2 = s2, s1
        out = torch.cat((x1 * c1 - x2 * s1, x2 * c2 + x1 * s2), dim=-1)
        mag = torch.cat((x1.abs() * c1.abs() + x2.abs() * s1.abs(),
                         x2.abs() * c2.abs() + x1.abs() * s2.abs()), dim=-1)  # fmt: skip
        return out, (up + gamma(3)) * mag + eta(q.dtype)

    exact, bound = {}, {}
    for name, x, sign in (("q", q, 1.0), ("k", k, 1.0), ("dq", dq_out, -1.0), ("dk", dk_out, -1.0)):
        exact[name], bound[name] = rot(x, sign)
    return exact, bound


# --8<-- [end:rope]


# --8<-- [start:cross_entropy]
def cross_entropy_exact(hidden, weight, labels, ignore_index=-100, dw_roundings=1):
    """fp64 mean cross-entropy of hidden @ weight.T over labels != ignore_index, and its
    gradients, with bounds for the chunked kernel (N rows, H hidden, V vocabulary).

    Logits come from a matmul with fp32 accumulation, rounded to the dtype: each is off by
    at most D_i = (u_p + gamma_H) max_j (|h_i| @ |W_j|). lse is 1-Lipschitz in the largest logit
    error, so a row's loss moves by 2 D_i; evaluating lse - l_y in fp32 (V exponentials and their
    sum, two roundings per block for the online rescaling, the log) adds
    E_i = gamma(2V + 8)(1 + R_i + |lse_i| + |loss_i|), R_i the logits' range; the mean (a sum of
    N terms, times 1 / n_valid rounded to fp32) adds gamma(N + 2).
    Probabilities p = exp(l - lse) are then off by the relative
      rho_i = 2 D_i + E_i + (R_i + ln V + 8) U;
    dlogits = (p - onehot) * fl(1 / n_valid), rounded to the dtype: |error| <= (rho + u_p + 3U) P,
    P = (p + onehot) / n_valid. dh = dlogits @ W (fp32 accumulation over V, rounded):
      (rho_i + 2 u_p + gamma(V + 3)) (P @ |W|);
    dW = dlogits^T @ h summed over all rows in fp32, rounded to W's dtype `dw_roundings` times
    (1 with an fp32 accumulator; the number of chunks when accumulating in W's dtype):
      ((rho + u_p + 3U) P)^T @ |h| + (dw_roundings u_W + gamma_N) P^T @ |h|.
    """
    up, uw = unit_roundoff(hidden.dtype), unit_roundoff(weight.dtype)
    h = hidden.detach().double().reshape(-1, hidden.shape[-1]).requires_grad_()
    w = weight.detach().double().requires_grad_()
    y = labels.reshape(-1)
    n, hid = h.shape
    vocab = w.shape[0]
    logits = h @ w.T
    loss = torch.nn.functional.cross_entropy(logits, y, ignore_index=ignore_index)
    dh, dw = torch.autograd.grad(loss, (h, w))
    exact = {"loss": loss.detach(), "dh": dh.reshape(hidden.shape), "dw": dw}

    valid = (y != ignore_index).double()
    n_valid = valid.sum()
    l = logits.detach()
    lse = torch.logsumexp(l, -1)
    onehot = torch.zeros_like(l)
    onehot[valid.bool(), y[valid.bool()]] = 1.0
    loss_i = (lse - (l * onehot).sum(-1)) * valid
    spread = l.amax(-1) - l.amin(-1)
    h_abs, w_abs = h.detach().abs(), w.detach().abs()
    d_logit = (up + gamma(hid)) * (h_abs @ w_abs.T).amax(-1) + eta(hidden.dtype)
    e_ce = gamma(2 * vocab + 8) * (1 + spread + lse.abs() + loss_i.abs())
    rho = (2 * d_logit + e_ce + (spread + math.log(vocab) + 8) * U) * valid
    p_mag = (torch.softmax(l, -1) + onehot) * (valid / n_valid)[:, None]
    dh_bound = (rho + 2 * up + gamma(vocab + 3))[:, None] * (p_mag @ w_abs)
    dw_rounding = dw_roundings * uw + gamma(n)  # one per rounding of dW, and the sum over N rows
    dw_bound = ((rho + up + 3 * U)[:, None] * p_mag).T @ h_abs + dw_rounding * (p_mag.T @ h_abs)
    loss_bound = ((2 * d_logit + e_ce) * valid).sum() + gamma(n + 2) * loss_i.sum()
    bound = {
        "loss": loss_bound / n_valid,
        "dh": dh_bound.reshape(hidden.shape) + 2 * eta(hidden.dtype),
        "dw": dw_bound + (dw_roundings + 1) * eta(weight.dtype),
    }
    return exact, bound


# --8<-- [end:cross_entropy]
