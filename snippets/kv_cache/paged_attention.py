"""Paged decode attention in Triton: one query token per sequence reads its K and V through the
block table (PagedAttention: Kwon et al., SOSP 2023, arXiv:2309.06180, §4.1, kernel in §5.1),
with grouped-query heads, ragged lengths, long contexts split over several programs (Flash-Decoding,
Dao et al. 2023) and an FP8 (e4m3) cache with one float32 scale per (token, KV head).

Layout (the page's block table, snippets/kv_cache/paged.py): each cache is
[num_blocks, block_size, kv_heads, head_dim]; the block table is [batch, max_blocks] int32, row b
holding sequence b's physical blocks in logical order; seq_lens is [batch] int32 (every length
>= 1). q and the output are [batch, q_heads, head_dim]; q head h reads KV head h // (q_heads /
kv_heads).

One story, top to bottom: kernel, split combine, launcher, FP8 quantization, the dense
reference with its error bound, a check on block tables built by paged.py's BlockManager.
"""

import math

import torch
import triton
import triton.language as tl

from snippets.common.device import DEVICE, ON_GPU
from snippets.kv_cache.paged import BlockManager
from snippets.triton_kernels.numerics import U, eta, gamma, unit_roundoff, within

TILE = 64  # tokens per loop iteration (gathered from one or more blocks) when not chosen
MAX_SPLITS = 64  # most programs one sequence's context is split over
E4M3_MAX = 448.0  # largest finite float8_e4m3fn (Micikevicius et al. 2022, Table 1)


# --8<-- [start:kernel]
@triton.jit
def paged_decode_kernel(
    Q, K, V, K_SCALE, V_SCALE, BLOCK_TABLE, SEQ_LENS, OUT, LSE,
    stride_qb, stride_qh,  # q [batch, q_heads, D]
    stride_cb, stride_cs, stride_ch,  # K, V caches [blocks, block_size, kv_heads, D]
    stride_sb, stride_ss,  # FP8 scales [blocks, block_size, kv_heads]
    stride_bt,  # block table [batch, max_blocks]
    stride_ob, stride_oh, stride_os,  # out [batch, q_heads, (splits,) D]
    stride_lb, stride_lh,  # lse [batch, q_heads, splits] (SPLIT only)
    qk_scale,  # log2(e) / sqrt(D): scores in base 2, for exp2
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    TILE: tl.constexpr, TILES_PER_SPLIT: tl.constexpr, FP8: tl.constexpr, SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):  # fmt: skip
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq_len = tl.load(SEQ_LENS + seq)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    heads = kv_head * GROUP + g  # GQA: the GROUP query heads that share this KV head
    q = tl.load(Q + seq * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=(g < GROUP)[:, None], other=0.0)  # fmt: skip
    m = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max of the scores
    l = tl.zeros([GROUP_PAD], tl.float32)  # running sum of exp2(score - m)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)  # running sum of exp2(score - m) * v
    start = split * (TILES_PER_SPLIT * TILE)
    if start < seq_len:  # a split past this sequence's end reads nothing
        for i in range(TILES_PER_SPLIT):  # a compile-time trip count: the CPU interpreter runs it
            t = start + i * TILE + tl.arange(0, TILE)  # token positions of this tile
            live = t < seq_len
            # the indirection: logical block t // BLOCK_SIZE -> physical block, slot t % BLOCK_SIZE
            block = tl.load(BLOCK_TABLE + seq * stride_bt + t // BLOCK_SIZE, mask=live, other=0)
            block = block.to(tl.int64)  # caches of more than 2^31 elements
            row = block * stride_cb + (t % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
            k = tl.load(K + row[:, None] + d[None, :], mask=live[:, None], other=0.0)
            v = tl.load(V + row[:, None] + d[None, :], mask=live[:, None], other=0.0)
            # e4m3 values are exact in fp16, bf16 and fp32: dequantizing is the scale alone,
            # applied per token to the scores (K) and to the probabilities (V)
            s = tl.dot(q, tl.trans(k.to(q.dtype)), input_precision=DOT_PRECISION)
            if FP8:
                srow = block * stride_sb + (t % BLOCK_SIZE) * stride_ss + kv_head
                s = s * tl.load(K_SCALE + srow, mask=live, other=0.0)[None, :]
            s = tl.where(live[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))  # finite: the split's first tile is live
            alpha = tl.exp2(m - m_new)  # rescales what was summed under the old max
            p = tl.exp2(s - m_new[:, None])
            l = l * alpha + tl.sum(p, axis=1)
            if FP8:
                p = p * tl.load(V_SCALE + srow, mask=live, other=0.0)[None, :]
            acc = acc * alpha[:, None] + tl.dot(p.to(q.dtype), v.to(q.dtype),
                                                input_precision=DOT_PRECISION)  # fmt: skip
            m = m_new
    l_safe = tl.where(l > 0, l, 1.0)
    out = acc / l_safe[:, None]
    o_ptr = OUT + seq * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if SPLIT:  # this split's normalized output and its log-sum-exp (base 2); -inf when empty
        tl.store(o_ptr + split * stride_os, out, mask=(g < GROUP)[:, None])
        lse = tl.where(l > 0, m + tl.log2(l_safe), float("-inf"))
        tl.store(LSE + seq * stride_lb + heads * stride_lh + split, lse, mask=g < GROUP)
    else:
        tl.store(o_ptr, out.to(OUT.dtype.element_ty), mask=(g < GROUP)[:, None])


# --8<-- [end:kernel]


# --8<-- [start:combine]
@triton.jit
def combine_splits_kernel(
    PARTIAL, LSE, OUT, n_splits,
    stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, stride_ob, stride_oh,
    D: tl.constexpr, SPLITS_PAD: tl.constexpr,
):  # fmt: skip
    """out = sum_s w_s o_s / sum_s w_s, w_s = 2^(lse_s - max lse): each split's softmax
    normalizer, rescaled to a common maximum (an empty split has lse = -inf, weight 0)."""
    seq, head = tl.program_id(0), tl.program_id(1)
    s, d = tl.arange(0, SPLITS_PAD), tl.arange(0, D)
    lse = tl.load(LSE + seq * stride_lb + head * stride_lh + s, mask=s < n_splits,
                  other=float("-inf"))  # fmt: skip
    w = tl.exp2(lse - tl.max(lse, axis=0))
    part = tl.load(PARTIAL + seq * stride_pb + head * stride_ph + s[:, None] * stride_ps
                   + d[None, :], mask=(s < n_splits)[:, None], other=0.0)  # fmt: skip
    out = tl.sum(w[:, None] * part, axis=0) / tl.sum(w, axis=0)
    tl.store(OUT + seq * stride_ob + head * stride_oh + d, out.to(OUT.dtype.element_ty))


# --8<-- [end:combine]


# --8<-- [start:launcher]
def split_plan(batch: int, kv_heads: int, max_len: int, tile: int, sms: int, splits=None):
    """(tiles per split, splits). One program per (sequence, KV head) leaves most of the GPU
    idle when batch x kv_heads is small (Qwen3-8B at batch 1: 8 programs on 132 SMs), so the
    context is split until there are about two programs per SM; each split writes its output
    and log-sum-exp in fp32 and a second kernel combines them (Flash-Decoding). That costs
    (D + 1) x 4 bytes per query head and split, written once and read once: with 4 query heads
    per KV head and D = 128, 4128 bytes against 32 KiB of bf16 K and V per 64-token tile, 3 %
    at 4 tiles per split and under 1 % from 16. Tiles per split are a power of two: a
    compile-time constant that takes few values as lengths grow."""
    tiles = max(1, triton.cdiv(max_len, tile))
    if splits is None:
        splits = min(MAX_SPLITS, max(1, triton.cdiv(2 * sms, batch * kv_heads)))
    per = triton.next_power_of_2(triton.cdiv(tiles, min(splits, MAX_SPLITS)))
    return per, triton.cdiv(tiles, per)


def launch_config(batch: int, kv_heads: int, fp8: bool, sms: int) -> tuple[int, int, int]:
    """(tile, warps, stages) of the decode kernel, from a sweep on the H200 at Qwen3-8B's heads
    (tile 64 / 128, 4 / 8 warps, 2-4 stages; batch 16 x 1K, 4 x 32K, 64 x 32K). When the
    context is split (fewer (sequence, KV head) pairs than SMs) a split holds few tiles and
    128-token tiles halve the loop's fixed work per token; with a program per pair and many
    pairs, 64-token tiles keep more programs resident. The FP8 cache: 128-token tiles, two
    stages, at every shape swept."""
    if fp8:
        return 128, 4, 2
    if batch * kv_heads < sms:
        return 128, 4, 3
    return TILE, 4, 2


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; 1 elsewhere (no split unless asked)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale):
    """Shapes and dtypes the kernel relies on; each problem named (no host sync here)."""
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(f"q must be [batch, q_heads, D] and the caches [blocks, block_size, "
                         f"kv_heads, D]; got {tuple(q.shape)}, {tuple(k_cache.shape)}")  # fmt: skip
    batch, q_heads, d = q.shape
    kv_heads = k_cache.shape[2]
    if v_cache.shape != k_cache.shape or k_cache.shape[3] != d:
        raise ValueError(f"K {tuple(k_cache.shape)} and V {tuple(v_cache.shape)} must match, "
                         f"with head_dim {d} of q")  # fmt: skip
    if q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be int32 [batch={batch}, max_blocks], got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")  # fmt: skip
    if seq_lens.dtype != torch.int32 or tuple(seq_lens.shape) != (batch,):
        raise ValueError(f"seq_lens must be int32 [{batch}], got {seq_lens.dtype} "
                         f"{tuple(seq_lens.shape)}")  # fmt: skip
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    if {fp8} != {k_scale is not None, v_scale is not None} or v_cache.dtype != k_cache.dtype:
        raise ValueError("an FP8 cache (float8_e4m3fn) needs k_scale and v_scale, and only it")
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)) if fp8 else ():
        if s.dtype != torch.float32 or s.shape != k_cache.shape[:3] or not s.is_contiguous():
            raise ValueError(f"{name} must be contiguous float32 {tuple(k_cache.shape[:3])} (one "
                             f"per token and KV head), got {s.dtype} {tuple(s.shape)}")  # fmt: skip
    if any(t.stride(-1) != 1 for t in (q, k_cache, v_cache)):
        raise ValueError("q and the caches need a contiguous last dimension")


def paged_decode(q, k_cache, v_cache, block_table, seq_lens, max_seq_len=None, *, k_scale=None,
                 v_scale=None, tile=None, splits=None, num_warps=None,
                 num_stages=None):  # fmt: skip
    """Attention of one query token per sequence over its cached tokens, read through the block
    table; softmax scale 1/sqrt(D). max_seq_len: the longest length in the batch (the scheduler
    knows it; when None it is read from seq_lens, a host sync). splits: the most programs a
    sequence's context is split over (None: about two programs per SM on the GPU, one on CPU).
    tile, num_warps, num_stages: None takes launch_config's choice."""
    _check(q, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale)
    fp8 = k_scale is not None
    sms = sm_count(q.device)
    given = (tile, num_warps, num_stages)
    chosen = launch_config(q.shape[0], k_cache.shape[2], fp8, sms)
    picked = (c if g is None else g for g, c in zip(given, chosen, strict=True))
    tile, num_warps, num_stages = picked
    if tile < 16 or tile & (tile - 1):
        raise ValueError(f"tile must be a power of two >= 16 (tl.dot's smallest), got {tile}")
    batch, q_heads, d = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q_heads // kv_heads
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    if max_seq_len > block_table.shape[1] * block_size:
        raise ValueError(f"max_seq_len {max_seq_len} exceeds the block table's "
                         f"{block_table.shape[1]} blocks of {block_size}")  # fmt: skip
    per, n_splits = split_plan(batch, kv_heads, max_seq_len, tile, sms, splits)
    out = torch.empty_like(q)
    if n_splits > 1:  # per split: fp32 output and log-sum-exp, combined below
        o = torch.empty(batch, q_heads, n_splits, d, device=q.device, dtype=torch.float32)
        lse = torch.empty(batch, q_heads, n_splits, device=q.device, dtype=torch.float32)
        o_strides, l_strides = o.stride()[:3], lse.stride()[:2]
    else:
        o, lse = out, out  # lse: a placeholder pointer, never written
        o_strides, l_strides = (*out.stride()[:2], 0), (0, 0)
    scale_b, scale_s = k_scale.stride()[:2] if fp8 else (0, 0)
    paged_decode_kernel[(batch, kv_heads, n_splits)](
        q, k_cache, v_cache, k_scale if fp8 else q, v_scale if fp8 else q, block_table, seq_lens,
        o, lse, q.stride(0), q.stride(1), *k_cache.stride()[:3], scale_b, scale_s,
        block_table.stride(0), *o_strides, *l_strides, math.log2(math.e) / math.sqrt(d),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=d,
        BLOCK_SIZE=block_size, TILE=tile, TILES_PER_SPLIT=per, FP8=fp8, SPLIT=n_splits > 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", num_warps=num_warps,
        num_stages=num_stages,
    )  # fmt: skip
    if n_splits > 1:
        combine_splits_kernel[(batch, q_heads)](
            o, lse, out, n_splits, *o.stride()[:3], *lse.stride()[:2], *out.stride()[:2],
            D=d, SPLITS_PAD=triton.next_power_of_2(n_splits),
        )  # fmt: skip
    return out


# --8<-- [end:launcher]


# --8<-- [start:fp8]
def quantize_fp8(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., D] -> (float8_e4m3fn [..., D], float32 scale [...]): one scale per (token, KV head),
    the vector's largest magnitude mapped to e4m3's largest finite value, 448. A token is
    quantized once, when it is written, and never again."""
    x = cache.float()
    scale = x.abs().amax(-1).clamp(min=torch.finfo(torch.float32).tiny) / E4M3_MAX
    q8 = (x / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q8, scale


def dequantize_fp8(q8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q8.double() * scale.double()[..., None]


def fp8_error_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """|dequantize(quantize(x)) - x| elementwise, from the e4m3 format (Micikevicius et al. 2022,
    arXiv:2209.05433, Table 1). 3 mantissa bits: between 2^e and 2^(e+1) the spacing is
    2^(e-3), so rounding to nearest is off by at most half of it, 2^-4 relative. Below the
    smallest normal, 2^-6, the spacing is the smallest subnormal, 2^-9: at most 2^-10 absolute,
    in units of the scale. x / scale (and its clamp at 448) adds up to 2 fp32 roundings U."""
    return (2.0**-4 + 2 * U) * x.double().abs() + 2.0**-10 * scale.double()[..., None]


# --8<-- [end:fp8]


# --8<-- [start:reference]
def gather_dense(cache, table_row, length: int):
    """One sequence's [length, ...] slice of a paged cache: its blocks in table order."""
    blocks = table_row[: triton.cdiv(length, cache.shape[1])].long()
    return cache[blocks].flatten(0, 1)[:length]


def decode_reference(q, k_cache, v_cache, block_table, seq_lens, k_scale=None, v_scale=None):
    """Pure PyTorch in fp64: gather each sequence's blocks into dense K and V (dequantized for an
    FP8 cache), repeat each KV head for its query heads, softmax(q k^T / sqrt(D)) v.
    Returns the output and, for the error bound, per sequence: the softmax weights [q_heads, n],
    the base-2 scores, sum_d |q_d| |k_td| and |v| repeated per query head."""
    group = q.shape[1] // k_cache.shape[2]
    outs, parts = [], []
    for b, n in enumerate(seq_lens.tolist()):
        if n < 1:
            raise ValueError(f"sequence {b} has length {n}: decode needs at least one token")
        k, v = (gather_dense(c, block_table[b], n).double() for c in (k_cache, v_cache))
        if k_scale is not None:
            k = k * gather_dense(k_scale, block_table[b], n).double()[..., None]
            v = v * gather_dense(v_scale, block_table[b], n).double()[..., None]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # h // group
        qb = q[b].double()
        scores = torch.einsum("hd,nhd->hn", qb, k) / math.sqrt(q.shape[-1])
        w = torch.softmax(scores, dim=-1)
        outs.append(torch.einsum("hn,nhd->hd", w, v))
        qk_abs = torch.einsum("hd,nhd->hn", qb.abs(), k.abs())
        parts.append((w, scores * math.log2(math.e), qk_abs, v.abs()))
    return torch.stack(outs), parts


def decode_bound(parts, d, out_dtype, dot_dtype, tile, splits):
    """Elementwise bound on |kernel - reference| for the same K/V values (arithmetic only).

    Scores (base 2): a D-term fp32 dot, the K scale and qk_scale (a constant rounded to fp32):
      |ds_t| <= gamma(2(D + 3)) qk_scale sum_d |q_d||k_td| (2: tensor-core accumulators may
      truncate). Each weight 2^(s_t - m) then carries the score error, the rounding of its
      argument and of the running maxima (<= 8 U S, S = max |s|; 2 U log2(n) more for the split
      log-sum-exp), each exp2 (4 U: a few ulps) and each rescale by alpha (5 U per tile and per
      split): relative error E. Weights off by E move the output by <= 2E/(1 - E) sum_t w_t |v_t|
      (w the exact softmax). The sums of p and of p v over n tokens, their rescalings and the
      combine of the splits add gamma(n + 2 tiles + 2 splits + 8) each; p rounded to the dot's
      dtype (bf16: 2^-8; fp32: 0) and p times the V scale (U) perturb the numerator only; the
      output is rounded once to its dtype (u_out, plus half its smallest subnormal). A weight
      below 2^-126 may be flushed to zero (GPU), and one among the dot dtype's subnormals is off
      by half its smallest subnormal (fp16: 2^-25): n (2^-126 + that) max|v| more, over a sum of
      weights >= 1 (the largest weight is 1)."""
    qk_scale = math.log2(math.e) / math.sqrt(d)
    u_dot = 0.0 if dot_dtype == torch.float32 else unit_roundoff(dot_dtype)
    eta_dot = 0.0 if dot_dtype == torch.float32 else eta(dot_dtype)
    bounds = []
    for w, s2, qk_abs, v_abs in parts:
        n = w.shape[-1]
        tiles = triton.cdiv(n, tile)
        ds = gamma(2 * (d + 3)) * qk_scale * qk_abs.amax(-1)  # per query head
        big = s2.abs().amax(-1)
        e = torch.expm1(math.log(2) * (ds + U * (8 * big + 2 * math.log2(n) + 8)))
        e = e + U * (5 * tiles + 5 * splits + 8)
        arith = gamma(n + 2 * tiles + 2 * splits + 8)
        rel = 2 * e / (1 - e) + 2 * arith + u_dot + U + unit_roundoff(out_dtype)
        mag = torch.einsum("hn,hnd->hd", w, v_abs.transpose(0, 1))
        bounds.append(rel[:, None] * mag + n * (2.0**-126 + eta_dot) * v_abs.amax())
    return torch.stack(bounds) + eta(out_dtype)


# --8<-- [end:reference]


# --8<-- [start:check]
def paged_cache(manager: BlockManager, kv_heads, d, dtype, seed=0):
    """Random K/V caches for every physical block, and the manager's tables as tensors."""
    g = torch.Generator().manual_seed(seed)
    shape = (len(manager.allocator.refs), manager.block_size, kv_heads, d)
    k, v = (torch.randn(shape, generator=g).to(DEVICE, dtype) for _ in range(2))
    seqs = sorted(manager.tables)
    width = max(len(manager.tables[s]) for s in seqs)
    table = torch.zeros(len(seqs), width, dtype=torch.int32)
    for i, s in enumerate(seqs):
        table[i, : len(manager.tables[s])] = torch.tensor(manager.tables[s])
    lens = torch.tensor([manager.lengths[s] for s in seqs], dtype=torch.int32)
    return k, v, table.to(DEVICE), lens.to(DEVICE)


def check_paged_decode(q, k, v, table, lens, tile, splits, fp8=False):
    """The kernel against the fp64 reference on the same (dequantized) K/V values; tile None:
    launch_config's."""
    tile = tile or launch_config(len(lens), k.shape[2], fp8, sm_count(q.device))[0]
    scales = {}
    if fp8:
        (k, scales["k_scale"]), (v, scales["v_scale"]) = quantize_fp8(k), quantize_fp8(v)
    out = paged_decode(q, k, v, table, lens, tile=tile, splits=splits, **scales)
    exact, parts = decode_reference(q, k, v, table, lens, *scales.values())
    used = split_plan(len(lens), k.shape[2], int(lens.max()), tile, sm_count(q.device), splits)[1]
    bound = decode_bound(parts, q.shape[-1], out.dtype, q.dtype, tile, used)
    return within({"out": out}, {"out": exact}, {"out": bound})


dtype = torch.bfloat16 if ON_GPU else torch.float32  # the CPU interpreter mangles bf16
m = BlockManager(num_blocks=8, block_size=16)
m.add(0, prompt_tokens=40)  # 3 blocks, the last one half full
m.add(1, prompt_tokens=1)  # a single token
m.fork(0, 2)  # shares sequence 0's blocks
for _ in range(10):
    m.append(2)  # copy-on-write of the shared last block, then one new block
print(m.tables, m.lengths)
#> {0: [0, 1, 2], 1: [3], 2: [0, 1, 4, 5]} {0: 40, 1: 1, 2: 50}
# random contents: this checks what the kernel reads, not what copy-on-write copies
k, v, table, lens = paged_cache(m, kv_heads=2, d=64, dtype=dtype)
q = torch.randn(3, 8, 64, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
# 4 query heads per KV head, tiles of 16 tokens: one program per (sequence, KV head), or the
# context split over up to 4 programs; the bf16 (here fp32) cache, then the FP8 one
cases = [(splits, fp8) for fp8 in (False, True) for splits in (1, 4)]
print([check_paged_decode(q, k, v, table, lens, 16, splits, fp8) for splits, fp8 in cases])
#> [True, True, True, True]
# --8<-- [end:check]
