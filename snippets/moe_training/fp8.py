"""FP8 grouped GEMM with DeepSeek-V3's fine-grained scaling (arXiv:2412.19437 §3.3.2): each
activation row is scaled per 1x128 tile, each weight per 128x128 block, both to the e4m3 range;
the K loop runs in steps of 128, and each step's FP8 tensor-core product is multiplied by its two
scales and added into an fp32 accumulator (the paper's promotion to CUDA cores every 128
elements). Forward only."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from snippets.moe_training.grouped_gemm import INTERPRET, tile_schedule

E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
TILE = 128  # DeepSeek-V3's tile (1 x 128) and block (128 x 128) edge


# --8<-- [start:quantize]
def quantize_rows(x: torch.Tensor):
    """x [M, K] -> (e4m3 [M, K], fp32 scales [M, K / 128]): x ~= q * scale per 1x128 tile."""
    m, k = x.shape
    if k % TILE:
        raise ValueError(f"K = {k} is not a multiple of {TILE}")
    tiles = x.float().view(m, k // TILE, TILE)
    scale = tiles.abs().amax(-1).clamp(min=1e-12) / E4M3_MAX
    q = (tiles / scale[..., None]).to(torch.float8_e4m3fn).view(m, k)
    return q, scale


def quantize_blocks(w: torch.Tensor):
    """w [G, N, K] -> (e4m3 [G, N, K], fp32 scales [G, N / 128, K / 128]) per 128x128 block."""
    g, n, k = w.shape
    if n % TILE or k % TILE:
        raise ValueError(f"N = {n} and K = {k} must be multiples of {TILE}")
    blocks = w.float().view(g, n // TILE, TILE, k // TILE, TILE)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-12) / E4M3_MAX
    q = (blocks / scale[:, :, None, :, None]).to(torch.float8_e4m3fn).view(g, n, k)
    return q, scale


def dequantize(q_rows, s_rows, q_blocks, s_blocks):
    """The fp32 values the FP8 tensors stand for (the reference of the kernel)."""
    m, k = q_rows.shape
    x = (q_rows.float().view(m, -1, TILE) * s_rows[..., None]).view(m, k)
    g, n, _ = q_blocks.shape
    w = q_blocks.float().view(g, n // TILE, TILE, k // TILE, TILE) * s_blocks[:, :, None, :, None]
    return x, w.view(g, n, k)


# --8<-- [end:quantize]


# --8<-- [start:kernel]
@triton.jit
def grouped_mm_fp8_kernel(X, XS, W, WS, OUT, TILE_GROUP, TILE_ROW, OFFSETS, NUM_TILES, N,
                          stride_xm, stride_xsm, stride_wg, stride_wn, stride_wsg, stride_wsn,
                          stride_om, K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                          BK: tl.constexpr):  # fmt: skip
    pid_n = tl.program_id(0)
    tile = tl.program_id(1)
    if tile < tl.load(NUM_TILES):
        g = tl.load(TILE_GROUP + tile).to(tl.int64)
        row0 = tl.load(TILE_ROW + tile)
        end = tl.load(OFFSETS + g + 1)
        rows = row0 + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)  # BN == BK == 128: one weight scale per step
        ks = tl.arange(0, BK)
        live = rows < end
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for kb in range(0, K // BK):
            a = tl.load(X + rows[:, None].to(tl.int64) * stride_xm + kb * BK + ks[None, :],
                        mask=live[:, None], other=0.0)  # fmt: skip
            b = tl.load(W + g * stride_wg + cols[None, :].to(tl.int64) * stride_wn + kb * BK
                        + ks[:, None], mask=cols[None, :] < N, other=0.0)  # fmt: skip
            sa = tl.load(XS + rows.to(tl.int64) * stride_xsm + kb, mask=live, other=0.0)
            sb = tl.load(WS + g * stride_wsg + pid_n * stride_wsn + kb)
            acc += tl.dot(a, b) * (sa[:, None] * sb)  # promote: scale, add in fp32
        o_ptr = OUT + rows[:, None].to(tl.int64) * stride_om + cols[None, :]
        tl.store(o_ptr, acc.to(OUT.dtype.element_ty), mask=live[:, None] & (cols[None, :] < N))


# --8<-- [end:kernel]


def grouped_mm_fp8(xq, xs, wq, ws, offsets, out_dtype=torch.bfloat16):
    """xq [M, K] e4m3 rows sorted by group, xs [M, K/128]; wq [G, N, K], ws [G, N/128, K/128]."""
    m, k = xq.shape
    n = wq.shape[1]
    bm, bn, bk = (16, TILE, TILE) if INTERPRET else (128, TILE, TILE)
    out = torch.empty(m, n, device=xq.device, dtype=out_dtype)
    tile_group, tile_row, num = tile_schedule(offsets, m, bm)
    grouped_mm_fp8_kernel[(triton.cdiv(n, bn), len(tile_group))](
        xq, xs, wq, ws, out, tile_group, tile_row, offsets, num, n, xq.stride(0), xs.stride(0),
        wq.stride(0), wq.stride(1), ws.stride(0), ws.stride(1), out.stride(0), K=k, BM=bm,
        BN=bn, BK=bk, **({} if INTERPRET else {"num_warps": 8, "num_stages": 3}))  # fmt: skip
    return out
