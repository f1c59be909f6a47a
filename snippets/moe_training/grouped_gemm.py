"""Grouped GEMM in Triton: one launch multiplies every expert's block of rows by that expert's
weight, whatever the group sizes (0 included), forward and backward.

    forward   Y[rows of g] = X[rows of g] @ W[g]^T        X [M, K], W [G, N, K] (nn.Linear layout)
    dX        dX[rows of g] = dY[rows of g] @ W[g]         the same kernel, W read untransposed
    dW        dW[g] = dY[rows of g]^T @ X[rows of g]       a reduction over the group's rows

The forward's work list is made on the device, without a host sync: group g has ceil(M_g / BM)
row tiles, and their real count stays on the device. The forward kernel is persistent: one
program per SM, each looping over (row tile, N tile) pairs up to that count; it reads X and W
through host-side TMA tensor descriptors (X [M, K], W [G, N, K]), which need a unit last
stride and 16-byte aligned base and strides. W's descriptor is 3-D so that a tile reaching past
one expert's N or K is zero-filled at that expert's edge: read as [G*N, K], dX's last step would
take the next expert's first rows, and a NaN or inf there (times the zero columns of dY) would
reach this expert's dX. Where they do not hold (bf16: K or N not a multiple
of 8), and for fp32 (tiles of the configs' size overflow shared memory), a pointer kernel runs
instead: one program per (N tile, row tile) on a grid sized for the most tiles any split of M
rows into G groups can give (ceil(M / BM) + G), those past the real count returning at once.

Triton 3.6's interpreter with NumPy 2.4 rejects a loop bound read at run time
(triton-lang/triton#9171), so on the CPU the launchers pass a compile-time bound instead
(STATIC_TILES, STATIC_M > 0) and the loops skip the steps past the real one.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

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


def _configs(shapes, pre_hook=None):
    if INTERPRET:  # the CPU interpreter: small tiles run fastest
        return [triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1, pre_hook=pre_hook)]
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk}, num_warps=w, num_stages=s,
                          pre_hook=pre_hook)
            for bm, bn, bk, w, s in shapes]  # fmt: skip


def _tma_configs(shapes):
    """The persistent kernel's configs, each with its epilogue (EPI: 0 masked store, 2 TMA
    stores of two halves where the whole tile is the group's)."""
    if INTERPRET:  # one config (more would be timed): the TMA store where OUT can be described
        return [triton.Config({"BM": 16, "BN": 16, "BK": 16, "EPI": 2}, num_warps=1,
                              pre_hook=_set_blocks)]  # fmt: skip
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "EPI": e}, num_warps=w, num_stages=s,
                          pre_hook=_set_blocks)
            for bm, bn, bk, w, s, e in shapes]  # fmt: skip


def _dw_configs(shapes):
    """dW's configs, each with its read path (TMA: device-side descriptors, or pointers)."""
    if INTERPRET:  # one config (more would be timed): TMA where CAN_TMA, else pointers
        return [triton.Config({"BM": 16, "BN": 16, "BK": 16, "TMA": True}, num_warps=1)]
    return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "TMA": t}, num_warps=w, num_stages=s)
            for bm, bn, bk, w, s, t in shapes]  # fmt: skip


# Hopper (H100/H200) bf16: the shapes Triton's matmul tutorial uses there; a short list, since
# every entry costs a compile in gpu_docs' cold start. The persistent TMA kernel with either
# beat the pointer kernel in a probe on the H200 (.whl/ggprobe.py, balanced and Zipf groups).
FWD_SHAPES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4)]
# The persistent TMA kernel: 4 stages (autotuning's pick in the H200 runs of 11a4529, 4c6fea6
# and a95a4c3) with the masked store (0), or with a tile wholly inside its group written by
# TMA stores in two [BM, BN/2] halves (2), as Triton's tutorial 09 writes its epilogue; a whole
# [BM, BN] store at 4 stages needs 262,176 bytes of shared memory, over the 232,448 a block may
# have (compiled for sm_90 on the CPU), a half 229,376
TMA_SHAPES = [(128, 256, 64, 8, 4, 0), (128, 256, 64, 8, 4, 2)]
# dW (the last field: read through TMA descriptors, else pointers): the TMA path at the pointer
# kernel's tile and at its transpose, and the pointer kernel's config autotuning picked in the
# H200 run of a95a4c3 (the fastest of eleven in an earlier probe). BM is the reduction's step
# over rows. fp32 (4-byte elements: these tiles overflow shared memory) takes DW_FP32
DW_SHAPES = [(64, 128, 256, 8, 3, True), (64, 256, 128, 8, 3, True), (64, 128, 256, 8, 3, False)]
DW_FP32 = (64, 128, 128, 8, 3, False)


def _small_first(configs, named_args, **kwargs):
    """Autotuning only where it can matter: a problem with N or K below 512 (the tests' shapes)
    gets the config with the smallest output tile, not a compile and a timing of each."""
    args = {**named_args, **kwargs}
    if min(args["N"], args["K"]) >= 512:
        return configs
    return [min(configs, key=lambda c: c.kwargs["BN"] * c.kwargs["BK"])]


PRUNE = {"early_config_prune": _small_first}


def _dw_prune(configs, named_args, **kwargs):
    """The TMA configs only where dY and X can be described (CAN_TMA), then _small_first
    (a small problem: the first smallest tile, TMA where allowed); fp32: DW_FP32 alone."""
    args = {**named_args, **kwargs}
    dy = args.get("DY")
    if dy is not None and dy.element_size() > 2:
        bm, bn, bk, w, s, _ = DW_FP32
        return [triton.Config({"BM": bm, "BN": bn, "BK": bk, "TMA": False}, num_warps=w,
                              num_stages=s)]  # fmt: skip
    configs = [c for c in configs if args["CAN_TMA"] or not c.kwargs["TMA"]]
    return _small_first(configs, named_args, **kwargs)


def _set_blocks(nargs):
    """A descriptor's block is the config's tile: set it before each launch (autotuning too)."""
    bm, bn, bk = nargs["BM"], nargs["BN"], nargs["BK"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["w_desc"].block_shape = [1, bk, bn] if nargs["W_KN"] else [1, bn, bk]
    if nargs["o_desc"] is not None:
        nargs["o_desc"].block_shape = [bm, bn // 2]


def _tma_prune(configs, named_args, **kwargs):
    """The TMA-store configs only where OUT can be described (O_OK), then _small_first."""
    args = {**named_args, **kwargs}
    configs = [c for c in configs if args["O_OK"] or not c.kwargs["EPI"]]
    return _small_first(configs, named_args, **kwargs)


# --8<-- [start:kernels]
@triton.jit
def _tma_tile(a_desc, w_desc, o_desc, OUT, TILE_GROUP, TILE_ROW, OFFSETS, tile, pid_n, N,
              stride_om, K: tl.constexpr, W_KN: tl.constexpr, EPI: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """One [BM, BN] output tile: row tile `tile` of the schedule, N tile pid_n; A [M, K] times
    W[g] read through W's [G, rows, cols] descriptor: forward, N rows of K (used transposed); dX
    (W_KN), K rows of N (W's own layout: the sum runs over W's N). Past either edge of W[g] the
    descriptor gives zeros, never the next expert's values. EPI 2: a tile wholly inside its
    group and inside N is written by two TMA stores of [BM, BN/2]; the others by a masked
    store, since a TMA store clips only at OUT's edge and would write the next group's rows."""
    g = tl.load(TILE_GROUP + tile)
    row0 = tl.load(TILE_ROW + tile)
    end = tl.load(OFFSETS + g + 1)
    n0 = pid_n * BN
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k0 in range(0, K, BK):
        a = a_desc.load([row0, k0])  # [BM, BK]; columns past K: zeros (the descriptor's bound)
        if W_KN:  # dX
            b = w_desc.load([g, k0, n0]).reshape(BK, BN)
            acc = tl.dot(a, b, acc)
        else:  # forward
            b = w_desc.load([g, n0, k0]).reshape(BN, BK)
            acc = tl.dot(a, b.T, acc)
    out = acc.to(OUT.dtype.element_ty)
    if EPI == 2 and (row0 + BM <= end) and (n0 + BN <= N):
        halves = tl.permute(tl.reshape(out, (BM, 2, BN // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        o_desc.store([row0, n0], left)
        o_desc.store([row0, n0 + BN // 2], right)
    else:
        rows = row0 + tl.arange(0, BM)  # rows past the group's end: the next group's, masked
        cols = n0 + tl.arange(0, BN)
        o_ptr = OUT + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
        tl.store(o_ptr, out, mask=(rows[:, None] < end) & (cols[None, :] < N))


@triton.autotune(
    configs=_tma_configs(TMA_SHAPES),
    key=["N", "K", "O_OK"],
    prune_configs_by={"early_config_prune": _tma_prune},
)
@triton.jit
def grouped_mm_kernel(a_desc, w_desc, o_desc, OUT, TILE_GROUP, TILE_ROW, OFFSETS, NUM_TILES, N,
                      stride_om, K: tl.constexpr, W_KN: tl.constexpr, O_OK: tl.constexpr,
                      NUM_SMS: tl.constexpr, STATIC_TILES: tl.constexpr, BM: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr, EPI: tl.constexpr):  # fmt: skip
    """Persistent: program p takes pairs p, p + NUM_SMS, ... of (row tile, N tile), N tiles
    fastest (neighbours share the same rows of A), up to the real count read on the device."""
    tiles_n = tl.cdiv(N, BN)
    total = tl.load(NUM_TILES) * tiles_n
    if STATIC_TILES > 0:  # the CPU interpreter: a compile-time trip count (module docstring)
        for t0 in range(0, STATIC_TILES, NUM_SMS):
            t = t0 + tl.program_id(0)
            if t < total:
                _tma_tile(a_desc, w_desc, o_desc, OUT, TILE_GROUP, TILE_ROW, OFFSETS,
                          t // tiles_n, t % tiles_n, N, stride_om, K, W_KN, EPI * O_OK, BM, BN,
                          BK)  # fmt: skip
    else:
        for t in tl.range(tl.program_id(0), total, NUM_SMS):
            _tma_tile(a_desc, w_desc, o_desc, OUT, TILE_GROUP, TILE_ROW, OFFSETS, t // tiles_n,
                      t % tiles_n, N, stride_om, K, W_KN, EPI * O_OK, BM, BN, BK)  # fmt: skip


@triton.autotune(configs=_configs(FWD_SHAPES), key=["N", "K"], prune_configs_by=PRUNE)
@triton.jit
def grouped_mm_ptr_kernel(X, W, OUT, TILE_GROUP, TILE_ROW, OFFSETS, NUM_TILES, N,
                          stride_xm, stride_wg, stride_wn, stride_wk, stride_om,
                          K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr):  # fmt: skip
    """The fallback for tensors a descriptor cannot describe: pointers and masks, any strides."""
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


@triton.autotune(
    configs=_dw_configs(DW_SHAPES),
    key=["N", "K", "CAN_TMA"],
    prune_configs_by={"early_config_prune": _dw_prune},
)
@triton.jit
def grouped_mm_dw_kernel(DY, X, DW, OFFSETS, N, K, stride_dym, stride_xm, stride_dwg,
                         stride_dwn, CAN_TMA: tl.constexpr, STATIC_M: tl.constexpr,
                         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         TMA: tl.constexpr):  # fmt: skip
    """dW[g] tile [BN, BK] = sum over the group's rows of dY^T X. TMA: each program builds its
    two descriptors on the device, their row count the group's end, so rows past it read as
    zeros (never the next group's rows: its NaN or inf stay its own) and no mask is needed.
    The TMA path runs where the config asks for it and the tensors allow it (CAN_TMA)."""
    g = tl.program_id(1)  # the output tiles of one group run next to each other: they share
    tiles_k = tl.cdiv(K, BK)  # the group's rows of dY and X, which then stay in L2
    pid_n, pid_k = tl.program_id(0) // tiles_k, tl.program_id(0) % tiles_k
    start, end = tl.load(OFFSETS + g), tl.load(OFFSETS + g + 1)
    cols_n = pid_n * BN + tl.arange(0, BN)
    cols_k = pid_k * BK + tl.arange(0, BK)
    ms = tl.arange(0, BM)
    acc = tl.zeros([BN, BK], dtype=tl.float32)
    if TMA and CAN_TMA:
        rows_bound = tl.maximum(end, 1)  # a descriptor has no empty dimension
        dy_desc = tl.make_tensor_descriptor(DY, shape=[rows_bound, N], strides=[stride_dym, 1],
                                            block_shape=[BM, BN])  # fmt: skip
        x_desc = tl.make_tensor_descriptor(X, shape=[rows_bound, K], strides=[stride_xm, 1],
                                           block_shape=[BM, BK])  # fmt: skip
        if STATIC_M > 0:  # the CPU interpreter: a compile-time trip count (module docstring)
            for i in range(0, STATIC_M // BM + 1):
                if start + i * BM < end:
                    dy = dy_desc.load([start + i * BM, pid_n * BN])
                    acc = tl.dot(dy.T, x_desc.load([start + i * BM, pid_k * BK]), acc)
        else:
            for m0 in tl.range(start, end, BM):
                dy = dy_desc.load([m0, pid_n * BN])  # [BM, BN]
                acc = tl.dot(dy.T, x_desc.load([m0, pid_k * BK]), acc)
    elif STATIC_M > 0:  # the CPU interpreter: a compile-time trip count (module docstring)
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
    """x [M, K] rows sorted by group, w [G, N, K], offsets [G + 1] -> [M, N]. Any strides; on
    the TMA path a w whose strides a descriptor cannot take (last not 1, others not 16-byte
    multiples) is copied contiguous first."""
    return _grouped(x, w, offsets, w_kn=False)


def grouped_mm_dx(dy: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """dy [M, N] rows sorted by group, w [G, N, K] -> dX [M, K]: dY[rows of g] @ W[g]. W is
    read untransposed (a descriptor needs a unit last stride), copied as in grouped_mm."""
    return _grouped(dy, w, offsets, w_kn=True)


def _grouped(a, w, offsets, w_kn):
    m, k = a.shape
    g, n, k2 = w.shape
    if k != (n if w_kn else k2) or len(offsets) != g + 1:
        raise ValueError(f"x {tuple(a.shape)}, w {tuple(w.shape)} and {len(offsets)} offsets "
                         "do not fit: need x [M, K], w [G, N, K], offsets [G + 1]")  # fmt: skip
    a = a if a.stride(-1) == 1 else a.contiguous()
    out = torch.empty(m, k2 if w_kn else n, device=a.device, dtype=a.dtype)
    if m == 0:
        return out
    if _describable(a) and (w_tma := _describable_w(w)) is not None:
        _launch_tma(a, w_tma, out, offsets, w_kn)
    else:
        _launch_ptr(a, w.transpose(1, 2) if w_kn else w, out, offsets)
    return out


def _describable(t):
    """Whether the TMA kernel can read t: a descriptor needs a 16-byte aligned base and strides
    but the last, unit last stride, no empty dimension; and 2-byte elements (bf16, fp16), for
    which FWD_SHAPES are sized: fp32 tiles that size overflow shared memory (fp32 takes the
    pointer kernel)."""
    return (t.element_size() == 2 and t.stride(-1) == 1 and t.data_ptr() % 16 == 0
            and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
            and min(t.shape) > 0)  # fmt: skip


def _describable_w(w):
    """W [G, N, K] as the descriptor reads it (itself, or a contiguous copy where its strides do
    not do), or None where none can be described."""
    if w.element_size() != 2 or w.shape[2] * 2 % 16:  # a copy would not do either
        return None
    return w if _describable(w) else (w.contiguous() if min(w.shape) > 0 else None)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if INTERPRET:  # a few programs, each looping, as on the GPU
        return 3
    return torch.cuda.get_device_properties(device).multi_processor_count


def _shared_bm(kernel):
    # Autotuning needs one argument list for every config; the schedule differs with BM, so
    # the configs share BM (FWD_SHAPES all use 128; the interpreter's one config 16).
    bms = {c.kwargs["BM"] for c in kernel.configs}
    if len(bms) != 1:
        raise ValueError(f"{kernel.base_fn.__name__} configs must share BM, got {sorted(bms)}")
    return bms.pop()


def _launch_tma(a, w, out, offsets, w_kn):
    kernel = grouped_mm_kernel
    m, k = a.shape
    n = out.shape[1]
    tile_group, tile_row, num = tile_schedule(offsets, m, _shared_bm(kernel))
    # placeholder blocks: _set_blocks sets each config's before its launch
    a_desc = TensorDescriptor.from_tensor(a, [16, 16])
    w_desc = TensorDescriptor.from_tensor(w, [1, 16, 16])
    o_ok = _describable(out)
    o_desc = TensorDescriptor.from_tensor(out, [16, 8]) if o_ok else None
    num_sms = _num_sms(a.device)
    # the interpreter's loop bound: pairs of any config (the smallest BN gives the most)
    min_bn = min(c.kwargs["BN"] for c in kernel.configs)
    static = len(tile_group) * triton.cdiv(n, min_bn) if INTERPRET else 0
    kernel[(num_sms,)](a_desc, w_desc, o_desc, out, tile_group, tile_row, offsets, num, n,
                       out.stride(0), K=k, W_KN=w_kn, O_OK=o_ok, NUM_SMS=num_sms,
                       STATIC_TILES=static)  # fmt: skip


def _launch_ptr(a, w, out, offsets):
    """w [G, N, K] any strides (dX: W transposed, [G, K, N])."""
    kernel = grouped_mm_ptr_kernel
    n, k = w.shape[1], w.shape[2]
    tile_group, tile_row, num = tile_schedule(offsets, a.shape[0], _shared_bm(kernel))
    kernel[lambda meta: (triton.cdiv(n, meta["BN"]), len(tile_group))](
        a, w, out, tile_group, tile_row, offsets, num, n, a.stride(0), w.stride(0), w.stride(1),
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
    can_tma = _describable(dy) and _describable(x)
    if can_tma:
        _device_descriptors_allocator()
    grouped_mm_dw_kernel[lambda meta: (triton.cdiv(n, meta["BN"]) * triton.cdiv(k, meta["BK"]), g)](
        dy, x, dw, offsets, n, k, dy.stride(0), x.stride(0), dw.stride(0), dw.stride(1),
        CAN_TMA=can_tma, STATIC_M=static_m)  # fmt: skip
    return dw


def _device_descriptors_allocator():
    """A descriptor built on the device is written to global scratch memory, which Triton
    asks of the allocator set by triton.set_allocator; set one where none is."""
    from triton.runtime import _allocation

    if isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
        triton.set_allocator(_scratch)


def _scratch(size: int, alignment: int, stream):
    return torch.empty(size, dtype=torch.int8, device="cpu" if INTERPRET else "cuda")


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
        dx = grouped_mm_dx(dy, w, offsets) if ctx.needs_input_grad[0] else None
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
