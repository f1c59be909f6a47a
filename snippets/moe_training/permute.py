"""Token permutation around the experts, in Triton: sort the (token, choice) slots by expert so
each expert reads one contiguous block of rows (permute), and put the expert outputs back,
weighted, into token order (unpermute, the "combine"). Both backwards are gathers too: every
output row is written by exactly one program, no atomics, so results are deterministic.

    routing map  order [S]: the kept slots sorted by expert (slot = token * k + choice);
                 pos [T, k]: where slot (t, q) sits in the sorted rows, -1 when dropped
    permute      xp[j] = x[order[j] // k]
                 backward: dx[t] = sum_q dxp[pos[t, q]]
    unpermute    out[t] = sum_q w[t, q] * y[pos[t, q]]
                 backward: dy[j] = w[slot j] * dout[token j], dw[t, q] = <dout[t], y[pos[t, q]]>
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

BLOCK_H = 256  # hidden columns per loop step
# The hidden size is a compile-time constant (one per model): the CPU interpreter with NumPy 2.4
# rejects a runtime loop bound (triton-lang/triton#9171).


# --8<-- [start:map]
@dataclass
class RoutingMap:
    order: torch.Tensor  # [S] kept slots, sorted by expert (stable: token order within one)
    pos: torch.Tensor  # [T, k] int32 row of each slot in the sorted rows, -1 if dropped
    counts: torch.Tensor  # [E] rows per expert (an expert may get 0)
    offsets: torch.Tensor  # [E + 1] int32 first row of each expert, then S
    top_k: int


def routing_map(experts: torch.Tensor, num_experts: int, kept: torch.Tensor | None = None):
    """The sort by expert, on the device (no host sync)."""
    t, k = experts.shape
    slots = experts.flatten()
    if kept is not None:  # dropped slots sort past every expert and are cut off below
        slots = torch.where(kept.flatten(), slots, num_experts)
    order = torch.argsort(slots, stable=True)
    counts = torch.bincount(slots, minlength=num_experts + 1)[:num_experts]
    offsets = torch.zeros(num_experts + 1, dtype=torch.int32, device=experts.device)
    offsets[1:] = counts.cumsum(0)
    n = int(offsets[-1]) if kept is not None else t * k  # kept rows (one sync if dropping)
    order = order[:n]
    pos = torch.full((t * k,), -1, dtype=torch.int32, device=experts.device)
    pos[order] = torch.arange(n, dtype=torch.int32, device=experts.device)
    return RoutingMap(order, pos.view(t, k), counts, offsets, k)


# --8<-- [end:map]


# --8<-- [start:kernels]
@triton.jit
def gather_rows_kernel(SRC, IDX, SCALE, OUT, stride_src, stride_out, k, N_COLS: tl.constexpr,
                       HAS_SCALE: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """OUT[j] = SRC[IDX[j] // k] (* SCALE[IDX[j]]): one program per output row."""
    j = tl.program_id(0).to(tl.int64)
    slot = tl.load(IDX + j).to(tl.int64)
    row = slot // k
    scale = tl.load(SCALE + slot).to(tl.float32) if HAS_SCALE else 1.0
    for start in range(0, N_COLS, BLOCK_H):
        c = start + tl.arange(0, BLOCK_H)
        m = c < N_COLS
        v = tl.load(SRC + row * stride_src + c, mask=m, other=0.0).to(tl.float32)
        tl.store(OUT + j * stride_out + c, (v * scale).to(OUT.dtype.element_ty), mask=m)


@triton.jit
def combine_rows_kernel(SRC, POS, W, OUT, stride_src, stride_out, N_COLS: tl.constexpr,
                        K: tl.constexpr,
                        HAS_W: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """OUT[t] = sum_q W[t, q] * SRC[POS[t, q]], skipping POS < 0; summed in fp32 in q order."""
    t = tl.program_id(0).to(tl.int64)
    for start in range(0, N_COLS, BLOCK_H):
        c = start + tl.arange(0, BLOCK_H)
        m = c < N_COLS
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for q in tl.static_range(K):
            p = tl.load(POS + t * K + q).to(tl.int64)
            w = tl.load(W + t * K + q).to(tl.float32) if HAS_W else 1.0
            v = tl.load(SRC + p * stride_src + c, mask=m & (p >= 0), other=0.0).to(tl.float32)
            acc += w * v
        tl.store(OUT + t * stride_out + c, acc.to(OUT.dtype.element_ty), mask=m)


@triton.jit
def slot_dots_kernel(A, B, POS, OUT, stride_a, stride_b, N_COLS: tl.constexpr, K: tl.constexpr,
                     BLOCK_H: tl.constexpr):  # fmt: skip
    """OUT[t, q] = <A[t], B[POS[t, q]]> in fp32 (0 for a dropped slot)."""
    t = tl.program_id(0).to(tl.int64)
    q = tl.program_id(1)
    p = tl.load(POS + t * K + q).to(tl.int64)
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for start in range(0, N_COLS, BLOCK_H):
        c = start + tl.arange(0, BLOCK_H)
        m = c < N_COLS
        a = tl.load(A + t * stride_a + c, mask=m, other=0.0).to(tl.float32)
        b = tl.load(B + p * stride_b + c, mask=m & (p >= 0), other=0.0).to(tl.float32)
        acc += a * b
    tl.store(OUT + t * K + q, tl.sum(acc, axis=0))


# --8<-- [end:kernels]


# --8<-- [start:launchers]
def gather_rows(src, order, k, scale=None):
    out = torch.empty(len(order), src.shape[1], device=src.device, dtype=src.dtype)
    if len(order):
        gather_rows_kernel[(len(order),)](
            src, order, scale if scale is not None else src, out, src.stride(0), out.stride(0), k,
            N_COLS=src.shape[1], HAS_SCALE=scale is not None, BLOCK_H=BLOCK_H)  # fmt: skip
    return out


def combine_rows(src, pos, weights=None, dtype=None):
    t, k = pos.shape
    out = torch.empty(t, src.shape[1], device=src.device, dtype=dtype or src.dtype)
    if t:
        combine_rows_kernel[(t,)](
            src, pos, weights if weights is not None else pos, out, src.stride(0), out.stride(0),
            N_COLS=src.shape[1], K=k, HAS_W=weights is not None, BLOCK_H=BLOCK_H)  # fmt: skip
    return out


def slot_dots(a, b, pos):
    t, k = pos.shape
    out = torch.empty(t, k, device=a.device, dtype=torch.float32)
    if t:
        slot_dots_kernel[(t, k)](a, b, pos, out, a.stride(0), b.stride(0), N_COLS=a.shape[1], K=k,
                                 BLOCK_H=BLOCK_H)  # fmt: skip
    return out


# --8<-- [end:launchers]


# --8<-- [start:autograd]
class Permute(torch.autograd.Function):
    """x [T, H] -> the rows of the kept slots, sorted by expert [S, H]."""

    @staticmethod
    def forward(ctx, x, rmap: RoutingMap):
        ctx.rmap = rmap
        return gather_rows(x.contiguous(), rmap.order, rmap.top_k)

    @staticmethod
    def backward(ctx, dxp):
        return combine_rows(dxp.contiguous(), ctx.rmap.pos), None


class Unpermute(torch.autograd.Function):
    """y [S, H] sorted by expert, weights [T, k] -> sum_q w[t, q] * y[pos[t, q]], [T, H]."""

    @staticmethod
    def forward(ctx, y, weights, rmap: RoutingMap):
        y, weights = y.contiguous(), weights.contiguous()
        ctx.save_for_backward(y, weights)
        ctx.rmap = rmap
        return combine_rows(y, rmap.pos, weights)

    @staticmethod
    def backward(ctx, dout):
        y, weights = ctx.saved_tensors
        rmap, dout = ctx.rmap, dout.contiguous()
        dy = gather_rows(dout, rmap.order, rmap.top_k, scale=weights.flatten())
        dw = slot_dots(dout, y, rmap.pos).to(weights.dtype)
        return dy, dw, None


def permute(x, rmap):
    return Permute.apply(x, rmap)


def unpermute(y, weights, rmap):
    return Unpermute.apply(y, weights, rmap)


# --8<-- [end:autograd]


# --8<-- [start:reference]
def permute_reference(x, experts, kept=None):
    """The same two steps in plain PyTorch, for the tests: index and index_add."""
    t, k = experts.shape
    slots = experts.flatten()
    live = torch.arange(t * k, device=x.device)
    if kept is not None:
        live = live[kept.flatten()]
    order = live[torch.argsort(slots[live], stable=True)]
    return x[order // k], order


def unpermute_reference(y, weights, order, t):
    k = weights.shape[1]
    out = torch.zeros(t, y.shape[1], dtype=torch.float32, device=y.device)
    out.index_add_(0, order // k, y.float() * weights.flatten()[order, None].float())
    return out.to(y.dtype)


# --8<-- [end:reference]
