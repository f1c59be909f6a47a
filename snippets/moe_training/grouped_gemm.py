"""Grouped GEMM in Triton: one launch multiplies every expert's block of rows by that expert's
weight, whatever the group sizes (0 included), forward and backward.

    forward   Y[rows of g] = X[rows of g] @ W[g]^T        X [M, K], W [G, N, K] (nn.Linear layout)
    dX        dX[rows of g] = dY[rows of g] @ W[g]         the same kernel, W read transposed
    dW        dW[g] = dY[rows of g]^T @ X[rows of g]       a reduction over the group's rows

The forward's work list is made on the device, without a host sync: group g has ceil(M_g / BM)
row tiles; the grid is sized for the most tiles any split of M rows into G groups can give
(ceil(M / BM) + G), and the programs past the real count return at once.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


# --8<-- [start:schedule]
def group_offsets(counts: torch.Tensor) -> torch.Tensor:
    """[G] rows per group -> [G + 1] int32 first row of each group, then M."""
    offsets = torch.zeros(len(counts) + 1, dtype=torch.int32, device=counts.device)
    offsets[1:] = counts.cumsum(0)
    return offsets


def tile_schedule(offsets: torch.Tensor, rows: int, block_m: int):
    """(group of each row tile, its first row, number of real tiles), all on the device."""
    counts = (offsets[1:] - offsets[:-1]).long()
    tiles = (counts + block_m - 1) // block_m
    last = tiles.cumsum(0)  # one past the last tile of each group
    bound = triton.cdiv(rows, block_m) + len(counts)
    i = torch.arange(bound, device=offsets.device)
    group = torch.searchsorted(last, i, right=True).clamp(max=len(counts) - 1)
    first_row = offsets[group].long() + (i - (last - tiles)[group]) * block_m
    return group.to(torch.int32), first_row.to(torch.int32), last[-1:].to(torch.int32)


# --8<-- [end:schedule]


def _configs(shapes):
    if INTERPRET:  # the CPU interpreter: small tiles run fastest
        return [triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1)]
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s in shapes]  # fmt: skip


# Hopper (H100/H200) bf16: the shapes Triton's matmul tutorial uses there; a short list, since
# every entry costs a compile in gpu_docs' cold start.
FWD_SHAPES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4)]
# dW: the fastest three of eleven tried on the H200 at the benchmark's shape (a probe with
# triton.testing.do_bench, balanced and Zipf groups); BM is the reduction's step over rows
DW_SHAPES = [(64, 128, 128, 8, 3), (32, 256, 128, 8, 4), (64, 128, 256, 8, 3)]


def _small_first(configs, named_args, **kwargs):
    """Autotuning only where it can matter: a problem with N or K below 512 (the tests' shapes)
    gets the config with the smallest output tile, not a compile and a timing of each."""
    args = {**named_args, **kwargs}
    if min(args["N"], args["K"]) >= 512:
        return configs
    return [min(configs, key=lambda c: c.kwargs["BN"] * c.kwargs["BK"])]


PRUNE = {"early_config_prune": _small_first}


# --8<-- [start:kernels]
@triton.autotune(configs=_configs(FWD_SHAPES), key=["N", "K"], prune_configs_by=PRUNE)
@triton.jit
def grouped_mm_kernel(X, W, OUT, TILE_GROUP, TILE_ROW, OFFSETS, NUM_TILES, N,
                      stride_xm, stride_wg, stride_wn, stride_wk, stride_om,
                      K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                      BK: tl.constexpr):  # fmt: skip
    pid_n = tl.program_id(0)  # N tiles vary fastest: neighbours share the same rows of X
    tile = tl.program_id(1)
    if tile < tl.load(NUM_TILES):
        g = tl.load(TILE_GROUP + tile).to(tl.int64)
        row0 = tl.load(TILE_ROW + tile)
        end = tl.load(OFFSETS + g + 1)
        rows = row0 + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        ks = tl.arange(0, BK)
        x_ptr = X + rows[:, None].to(tl.int64) * stride_xm + ks[None, :]
        w_ptr = W + g * stride_wg + cols[None, :].to(tl.int64) * stride_wn + ks[:, None] * stride_wk
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k0 in range(0, K, BK):
            kmask = k0 + ks < K
            a = tl.load(x_ptr, mask=(rows[:, None] < end) & kmask[None, :], other=0.0)
            b = tl.load(w_ptr, mask=kmask[:, None] & (cols[None, :] < N), other=0.0)
            acc = tl.dot(a, b, acc)
            x_ptr += BK
            w_ptr += BK * stride_wk
        o_ptr = OUT + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
        live = (rows[:, None] < end) & (cols[None, :] < N)
        tl.store(o_ptr, acc.to(OUT.dtype.element_ty), mask=live)


@triton.autotune(configs=_configs(DW_SHAPES), key=["N", "K"], prune_configs_by=PRUNE)
@triton.jit
def grouped_mm_dw_kernel(DY, X, DW, OFFSETS, N, K, stride_dym, stride_xm, stride_dwg,
                         stride_dwn, STATIC_M: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                         BK: tl.constexpr):  # fmt: skip
    g = tl.program_id(1)  # the output tiles of one group run next to each other: they share
    tiles_k = tl.cdiv(K, BK)  # the group's rows of dY and X, which then stay in L2
    pid_n, pid_k = tl.program_id(0) // tiles_k, tl.program_id(0) % tiles_k
    start, end = tl.load(OFFSETS + g), tl.load(OFFSETS + g + 1)
    cols_n = pid_n * BN + tl.arange(0, BN)
    cols_k = pid_k * BK + tl.arange(0, BK)
    ms = tl.arange(0, BM)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    if STATIC_M > 0:  # the CPU interpreter: a compile-time trip count (module docstring)
        for m0 in range(0, STATIC_M, BM):
            rows = m0 + ms
            live = (rows >= start) & (rows < end)
            dy = tl.load(DY + rows[None, :].to(tl.int64) * stride_dym + cols_n[:, None],
                         mask=live[None, :] & (cols_n[:, None] < N), other=0.0)  # fmt: skip
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + cols_k[None, :],
                        mask=live[:, None] & (cols_k[None, :] < K), other=0.0)  # fmt: skip
            acc = tl.dot(dy, x, acc)
    else:
        for m0 in tl.range(start, end, BM):
            rows = m0 + ms
            live = rows < end
            dy = tl.load(DY + rows[None, :].to(tl.int64) * stride_dym + cols_n[:, None],
                         mask=live[None, :] & (cols_n[:, None] < N), other=0.0)  # fmt: skip
            x = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + cols_k[None, :],
                        mask=live[:, None] & (cols_k[None, :] < K), other=0.0)  # fmt: skip
            acc = tl.dot(dy, x, acc)
    out = (DW + g.to(tl.int64) * stride_dwg + cols_n[:, None].to(tl.int64) * stride_dwn
           + cols_k[None, :])  # fmt: skip
    tl.store(out, acc.to(DW.dtype.element_ty), mask=(cols_n[:, None] < N) & (cols_k[None, :] < K))


# --8<-- [end:kernels]


# --8<-- [start:launchers]
def grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x [M, K] rows sorted by group, w [G, N, K] (any strides), offsets [G + 1] -> [M, N]."""
    m, k = x.shape
    g, n, k2 = w.shape
    if k != k2 or len(offsets) != g + 1:
        raise ValueError(f"x {tuple(x.shape)}, w {tuple(w.shape)} and {len(offsets)} offsets "
                         "do not fit: need x [M, K], w [G, N, K], offsets [G + 1]")  # fmt: skip
    x = x if x.stride(-1) == 1 else x.contiguous()
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if m == 0:
        return out
    _launch_fwd(x, w, out, offsets)
    return out


def _launch_fwd(x, w, out, offsets):
    n, k = w.shape[1], w.shape[2]
    kernel = grouped_mm_kernel
    # Autotuning needs one argument list for every config; the schedule differs with BM, so
    # the configs share BM (FWD_SHAPES all use 128; the interpreter's one config 16).
    bms = {c.kwargs["BM"] for c in kernel.configs}
    if len(bms) != 1:
        raise ValueError(f"grouped_mm_kernel configs must share BM, got {sorted(bms)}")
    tile_group, tile_row, num = tile_schedule(offsets, x.shape[0], bms.pop())
    kernel[lambda meta: (triton.cdiv(n, meta["BN"]), len(tile_group))](
        x, w, out, tile_group, tile_row, offsets, num, n, x.stride(0), w.stride(0), w.stride(1),
        w.stride(2), out.stride(0), K=k)  # fmt: skip


def grouped_mm_dw(dy: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """dy [M, N], x [M, K], offsets [G + 1] -> dW [G, N, K]; a group with no rows gets zeros."""
    m, n = dy.shape
    k = x.shape[1]
    g = len(offsets) - 1
    dw = torch.empty(g, n, k, device=x.device, dtype=x.dtype)
    dy = dy if dy.stride(-1) == 1 else dy.contiguous()
    x = x if x.stride(-1) == 1 else x.contiguous()
    static_m = m if INTERPRET else 0
    grouped_mm_dw_kernel[lambda meta: (triton.cdiv(n, meta["BN"]) * triton.cdiv(k, meta["BK"]), g)](
        dy, x, dw, offsets, n, k, dy.stride(0), x.stride(0), dw.stride(0), dw.stride(1),
        STATIC_M=static_m)  # fmt: skip
    return dw


# --8<-- [end:launchers]


# --8<-- [start:autograd]
class GroupedMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, offsets):
        ctx.save_for_backward(x, w, offsets)
        return grouped_mm(x, w, offsets)

    @staticmethod
    def backward(ctx, dy):
        x, w, offsets = ctx.saved_tensors
        dy = dy.contiguous()
        dx = grouped_mm(dy, w.transpose(1, 2), offsets) if ctx.needs_input_grad[0] else None
        dw = grouped_mm_dw(dy, x, offsets) if ctx.needs_input_grad[1] else None
        return dx, dw, None


def grouped_linear(x, w, offsets):
    """nn.Linear per group: x [M, K] sorted by group, w [G, N, K] -> [M, N], differentiable."""
    return GroupedMM.apply(x, w, offsets)


# --8<-- [end:autograd]


# --8<-- [start:reference]
def grouped_mm_loop(x, w, counts: list[int]):
    """One torch.matmul per group: the baseline (and the reference)."""
    # unbind, not w[g]: the backward of w[g] writes a zero tensor the size of all of w per group
    return torch.cat([xg @ wg.t() for xg, wg in zip(x.split(counts), w.unbind(0), strict=True)])


# --8<-- [end:reference]
