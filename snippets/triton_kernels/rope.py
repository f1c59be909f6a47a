"""Rotate-half RoPE for q and k in Triton, forward and backward (the backward rotates by -theta).

q: [batch, q_heads, seq, head_dim], k: [batch, kv_heads, seq, head_dim], any strides with
contiguous head_dim (the model's q and k are transposed views); cos, sin: [seq, head_dim].
One program per (batch, position): it loads that position's cos and sin once and rotates all
heads of q and of k. The entry point, apply_rope, calls the custom operator (rope_op) where
torch.compile traces and RoPEFunction, which launches the same kernel, in eager.
"""

from dataclasses import replace

import torch
import triton
import triton.language as tl

from snippets.common.device import DEVICE
from snippets.common.models.qwen3 import TINY, rope_tables
from snippets.triton_kernels.numerics import CHECK_DTYPES, rope_exact, within

BLOCK_HEADS = 16


# --8<-- [start:kernel]
@triton.jit
def _rotate_heads(X, O, x_off, o_off, sx_h, so_h, n_heads, c1, c2, s1, s2, d, dmask,
                  HALF: tl.constexpr, BLOCK_H: tl.constexpr, N_HB: tl.constexpr):  # fmt: skip
    for i in range(N_HB):  # blocks of heads: a [BLOCK_H, HALF] tile per half
        heads = i * BLOCK_H + tl.arange(0, BLOCK_H)
        mask = (heads[:, None] < n_heads) & dmask[None, :]
        xp = X + x_off + heads[:, None] * sx_h + d[None, :]
        x1 = tl.load(xp, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(xp + HALF, mask=mask, other=0.0).to(tl.float32)
        op = O + o_off + heads[:, None] * so_h + d[None, :]
        tl.store(op, (x1 * c1 - x2 * s1).to(O.dtype.element_ty), mask=mask)
        tl.store(op + HALF, (x2 * c2 + x1 * s2).to(O.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(
    Q, K, QO, KO, COS, SIN,
    sq_b, sq_h, sq_s, sk_b, sk_h, sk_s, sqo_b, sqo_h, sqo_s, sko_b, sko_h, sko_s, s_cos,
    seq, n_qh, n_kh,
    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_H: tl.constexpr,
    N_QB: tl.constexpr, N_KB: tl.constexpr, BACKWARD: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0).to(tl.int64)
    b, s = pid // seq, pid % seq
    d = tl.arange(0, BLOCK_D)
    dmask = d < HALF
    c1 = tl.load(COS + s * s_cos + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(COS + s * s_cos + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(SIN + s * s_cos + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(SIN + s * s_cos + HALF + d, mask=dmask, other=0.0).to(tl.float32)[None, :]
    if BACKWARD:  # the transpose of the rotation: rotate by -theta (sin halves swap, negate)
        s1, s2 = -s2, -s1
    _rotate_heads(Q, QO, b * sq_b + s * sq_s, b * sqo_b + s * sqo_s, sq_h, sqo_h, n_qh,
                  c1, c2, s1, s2, d, dmask, HALF, BLOCK_H, N_QB)  # fmt: skip
    _rotate_heads(K, KO, b * sk_b + s * sk_s, b * sko_b + s * sko_s, sk_h, sko_h, n_kh,
                  c1, c2, s1, s2, d, dmask, HALF, BLOCK_H, N_KB)  # fmt: skip


# --8<-- [end:kernel]


# --8<-- [start:autograd]
def _last_dim_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def check_shapes(q, k, cos, sin):
    """q [batch, q_heads, seq, dim], k [batch, kv_heads, seq, dim]; cos, sin [seq, dim]."""
    if q.dim() != 4 or k.dim() != 4 or q.shape[::2] != k.shape[::2] or q.shape[-1] % 2:
        raise ValueError(f"q, k: [batch, heads, seq, even head_dim], got {q.shape}, {k.shape}")
    if not cos.shape == sin.shape == q.shape[2:]:
        raise ValueError(f"cos, sin: [seq, head_dim] = {tuple(q.shape[2:])}, got {cos.shape}")


def rope_launch(q, k, cos, sin, backward=False, block_heads=None):
    """Rotated copies of q and k (same layouts as the inputs)."""
    check_shapes(q, k, cos, sin)
    q, k = _last_dim_contiguous(q), _last_dim_contiguous(k)
    cos, sin = cos.contiguous(), sin.contiguous()
    batch, n_qh, seq, dim = q.shape
    n_kh = k.shape[1]
    qo, ko = torch.empty_like(q), torch.empty_like(k)  # empty_like keeps a transposed layout
    bh = block_heads or min(triton.next_power_of_2(max(n_qh, n_kh)), BLOCK_HEADS)
    half = dim // 2
    rope_kernel[(batch * seq,)](
        q, k, qo, ko, cos, sin,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        qo.stride(0), qo.stride(1), qo.stride(2), ko.stride(0), ko.stride(1), ko.stride(2),
        cos.stride(0), seq, n_qh, n_kh,
        HALF=half, BLOCK_D=triton.next_power_of_2(half), BLOCK_H=bh,
        N_QB=triton.cdiv(n_qh, bh), N_KB=triton.cdiv(n_kh, bh), BACKWARD=backward,
    )  # fmt: skip
    return qo, ko


class RoPEFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, cos, sin, block_heads=None):
        ctx.save_for_backward(cos, sin)
        ctx.block_heads = block_heads
        return rope_launch(q, k, cos, sin, block_heads=block_heads)

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = rope_launch(dq, dk, cos, sin, backward=True, block_heads=ctx.block_heads)
        return dq, dk, None, None, None  # cos and sin are tables: no gradient


# --8<-- [end:autograd]


# --8<-- [start:op]
Pair = tuple[torch.Tensor, torch.Tensor]


@torch.library.custom_op("handbook::rope", mutates_args=())
def rope_op(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            block_heads: int | None = None) -> Pair:  # fmt: skip
    return rope_launch(q, k, cos, sin, block_heads=block_heads)


@torch.library.custom_op("handbook::rope_backward", mutates_args=())
def rope_backward_op(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     block_heads: int | None) -> Pair:  # fmt: skip
    """The transpose of the rotation: the same kernel, rotating by -theta."""
    return rope_launch(dq, dk, cos, sin, backward=True, block_heads=block_heads)


@rope_op.register_fake
@rope_backward_op.register_fake
def _(q, k, cos, sin, block_heads=None):  # the launcher's layouts (empty_like keeps strides)
    check_shapes(q, k, cos, sin)
    return torch.empty_like(_last_dim_contiguous(q)), torch.empty_like(_last_dim_contiguous(k))


def _setup_context(ctx, inputs, output):
    *_, cos, sin, ctx.block_heads = inputs
    ctx.save_for_backward(cos, sin)
    ctx.outputs = [(o.shape, o.dtype) for o in output]


def _backward(ctx, dq, dk):
    cos, sin = ctx.saved_tensors
    (q_shape, q_dtype), (k_shape, k_dtype) = ctx.outputs
    dq = cos.new_zeros(q_shape, dtype=q_dtype) if dq is None else dq  # an output nobody used
    dk = cos.new_zeros(k_shape, dtype=k_dtype) if dk is None else dk
    return *rope_backward_op(dq, dk, cos, sin, ctx.block_heads), None, None, None


rope_op.register_autograd(_backward, setup_context=_setup_context)


def apply_rope(q, k, cos, sin, block_heads=None):
    """Drop-in for the model's `rope` swap point: (q, k, cos, sin) -> (q, k); the op where
    torch.compile traces, the Function in eager (as rmsnorm.rms_norm)."""
    if torch.compiler.is_compiling():
        return rope_op(q, k, cos, sin, block_heads)
    return RoPEFunction.apply(q, k, cos, sin, block_heads)


# --8<-- [end:op]


# --8<-- [start:check]
def check_rope(batch, n_qh, n_kh, seq, dim, dtype, block_heads=None, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def heads(n):  # the model's layout: [batch, seq, heads, dim] viewed as [batch, heads, seq, dim]
        x = torch.randn(batch, seq, n, dim, generator=gen).to(DEVICE, dtype).transpose(1, 2)
        return x.requires_grad_()

    q, k, dq, dk = heads(n_qh), heads(n_kh), heads(n_qh).detach(), heads(n_kh).detach()
    cos, sin = (t.to(dtype) for t in rope_tables(replace(TINY, head_dim=dim), seq, DEVICE))
    qo, ko = apply_rope(q, k, cos, sin, block_heads)
    torch.autograd.backward((qo, ko), (dq, dk))
    exact, bound = rope_exact(q, k, cos, sin, dq, dk)
    return within({"q": qo, "k": ko, "dq": q.grad, "dk": k.grad}, exact, bound)


print(all(check_rope(2, 4, 2, 5, 16, dtype, 2) for dtype in CHECK_DTYPES))
#> True
# --8<-- [end:check]
