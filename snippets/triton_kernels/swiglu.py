"""SwiGLU's activation h = silu(gate) * up in Triton, forward and backward.

Elementwise: the forward reads gate and up and writes h (3 tensors of [T, I]); the backward
reads dh, gate and up and writes dgate and dup (5 tensors). Computed in fp32 and rounded once.
The entry point, swiglu, calls the custom operator (swiglu_op) where torch.compile traces and
SwiGLUFunction, which launches the same kernels, in eager.
"""

import torch
import triton
import triton.language as tl

from snippets.common.device import DEVICE
from snippets.triton_kernels.numerics import CHECK_DTYPES, swiglu_exact, within

BLOCK = 1024  # columns per program (rows with gaps: a row a program row)
FLAT_BLOCK, FLAT_WARPS = 2048, 8  # contiguous tensors: elements per program, warps


# --8<-- [start:kernels]
@triton.jit
def _where(FLAT: tl.constexpr, BLOCK: tl.constexpr):
    """(row, columns) of this program, int64: FLAT treats contiguous tensors as one long row."""
    pid = tl.program_id(0).to(tl.int64)
    if FLAT:
        row = pid * 0  # both branches give the same types (Triton checks them)
        c = pid * BLOCK + tl.arange(0, BLOCK)
    else:
        row = pid
        c = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return row, c


@triton.jit
def swiglu_fwd_kernel(G, U, H, stride_g, stride_u, stride_h, n_cols, FLAT: tl.constexpr,
                      BLOCK: tl.constexpr):  # fmt: skip
    row, c = _where(FLAT, BLOCK)  # grid: (rows, column blocks), or (blocks,) when FLAT
    mask = c < n_cols
    g = tl.load(G + row * stride_g + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + c, mask=mask, other=0.0).to(tl.float32)
    h = g * tl.sigmoid(g) * u
    tl.store(H + row * stride_h + c, h.to(H.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd_kernel(DH, G, U, DG, DU, stride_dh, stride_g, stride_u, stride_dg, stride_du,
                      n_cols, FLAT: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row, c = _where(FLAT, BLOCK)
    mask = c < n_cols
    dh = tl.load(DH + row * stride_dh + c, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + row * stride_g + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(U + row * stride_u + c, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(g)
    du = dh * g * s  # d/du: silu(g)
    dg = dh * u * s * (1 + g * (1 - s))  # d silu/dg = s + g s (1 - s)
    tl.store(DG + row * stride_dg + c, dg.to(DG.dtype.element_ty), mask=mask)
    tl.store(DU + row * stride_du + c, du.to(DU.dtype.element_ty), mask=mask)


# --8<-- [end:kernels]


# --8<-- [start:autograd]
def _rows(t):  # [..., I] -> [rows, I] with contiguous rows (a view for chunks of a fused matmul)
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _launch(kernel, tensors, block):
    """tensors: [rows, I] with contiguous rows. All contiguous: one flat 1-D grid of FLAT_BLOCK
    elements a program (no row index, no per-row tail); else a program per (row, BLOCK columns).
    block, when given, sets the elements a program in both."""
    rows, cols = tensors[0].shape
    strides = [t.stride(0) for t in tensors]
    if all(t.is_contiguous() for t in tensors):
        n, b = rows * cols, block or FLAT_BLOCK
        kernel[(triton.cdiv(n, b),)](*tensors, *strides, n, FLAT=True, BLOCK=b,
                                     num_warps=FLAT_WARPS if block is None else 4)  # fmt: skip
    else:
        b = block or BLOCK
        kernel[(rows, triton.cdiv(cols, b))](*tensors, *strides, cols, FLAT=False, BLOCK=b)


def swiglu_forward(gate, up, block=None):
    g, u = _rows(gate), _rows(up)
    h = torch.empty(g.shape, device=g.device, dtype=g.dtype)
    _launch(swiglu_fwd_kernel, (g, u, h), block)
    return h.view(gate.shape)


def swiglu_backward(dh, gate, up, block=None):
    g, u, dh2 = _rows(gate), _rows(up), _rows(dh)
    dg, du = torch.empty_like(g), torch.empty_like(u)
    _launch(swiglu_bwd_kernel, (dh2, g, u, dg, du), block)
    return dg.view(gate.shape), du.view(up.shape)


class SwiGLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, block=None):
        ctx.save_for_backward(gate, up)
        ctx.block = block
        return swiglu_forward(gate, up, block)

    @staticmethod
    def backward(ctx, dh):
        gate, up = ctx.saved_tensors
        return *swiglu_backward(dh, gate, up, ctx.block), None


# --8<-- [end:autograd]


# --8<-- [start:op]
@torch.library.custom_op("handbook::swiglu", mutates_args=())
def swiglu_op(gate: torch.Tensor, up: torch.Tensor, block: int | None = None) -> torch.Tensor:
    return swiglu_forward(gate, up, block)


@swiglu_op.register_fake
def _(gate, up, block=None):  # shapes, dtypes, strides only
    return gate.new_empty(gate.shape)


@torch.library.custom_op("handbook::swiglu_backward", mutates_args=())
def swiglu_backward_op(dh: torch.Tensor, gate: torch.Tensor, up: torch.Tensor,
                       block: int | None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return swiglu_backward(dh, gate, up, block)


@swiglu_backward_op.register_fake
def _(dh, gate, up, block):
    return gate.new_empty(gate.shape), up.new_empty(up.shape)


def _setup_context(ctx, inputs, output):
    gate, up, ctx.block = inputs
    ctx.save_for_backward(gate, up)


def _backward(ctx, dh):
    gate, up = ctx.saved_tensors
    return *swiglu_backward_op(dh, gate, up, ctx.block), None


swiglu_op.register_autograd(_backward, setup_context=_setup_context)


def swiglu(gate, up, block=None):
    """Drop-in for the model's `mlp_act` swap point: the op where torch.compile traces, the
    Function in eager (as rmsnorm.rms_norm)."""
    if torch.compiler.is_compiling():
        return swiglu_op(gate, up, block)
    return SwiGLUFunction.apply(gate, up, block)


# --8<-- [end:op]


# --8<-- [start:check]
def check_swiglu(rows, cols, dtype, block=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gate, up, dh = (torch.randn(rows, cols, generator=gen).to(DEVICE, dtype) for _ in range(3))
    gate.requires_grad_(), up.requires_grad_()
    h = swiglu(gate, up, block)
    h.backward(dh)
    exact, bound = swiglu_exact(gate, up, dh)
    return within({"h": h, "dg": gate.grad, "du": up.grad}, exact, bound)


print(all(check_swiglu(5, 300, dtype, block=128) for dtype in CHECK_DTYPES))
#> True
# --8<-- [end:check]
