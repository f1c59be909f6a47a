"""FlashAttention-2 in Triton: forward and backward, causal or not, GQA / MQA, any sequence length,
the logsumexp saved for the backward; registered as a torch custom op (autograd and fake
implementations), so it composes with torch.compile.

Layout (SDPA's): q [batch, q_heads, n, d], k and v [batch, kv_heads, n, d], any strides with a
contiguous last dimension; query head h reads KV head h // (q_heads / kv_heads). The softmax scale
is 1/sqrt(d) unless given. Algorithm: Dao, FlashAttention-2 (arXiv:2307.08691), Algorithms 1 and
2: one program per block of query rows in the forward; in the backward one program per block of
keys (dK, dV, summed over the query heads that share the KV head) and one per block of query rows
(dQ), so no atomics: S and P are recomputed in both (7 matmuls instead of FlashAttention-2's 5).

Loops: on the GPU a loop over key or query blocks has a runtime trip count (a causal program
visits only the blocks up to the diagonal, and one compile serves every length); the mask is a
runtime argument too (causal, 0 or 1: it moves loop bounds and adds a compare in the few masked
tiles), so one compile serves both masks. Triton 3.6's
interpreter with NumPy 2.4 rejects a runtime loop bound (triton-lang/triton#9171), so on the CPU
the launcher passes STATIC_N > 0 (the length, a compile-time constant) and each loop visits every
block, skipping those outside its range: the same tile code runs either way.

One story, top to bottom: forward kernel, backward kernels, launchers, custom op; the check is
check.py (numerics.py holds the fp64 reference and the bounds).
"""

import math
import os

import torch
import triton
import triton.language as tl
import triton.testing

LOG2E = 1.4426950408889634  # scores are kept in base 2: exp(x) = exp2(x log2 e)
LN2 = 0.6931471805599453
_LOG2E, _LN2 = tl.constexpr(LOG2E), tl.constexpr(LN2)  # the kernels see only constexpr globals
HEAD_DIMS = (16, 32, 64, 128)  # tl.arange needs a power of two; 128 is the widest tuned here


# --8<-- [start:forward]
@triton.jit
def _fwd_tile(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, start_n, offs_m, n_ctx, qk_scale,
              MASK: tl.constexpr, causal, BLOCK_N: tl.constexpr,
              HEAD_DIM: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    """One block of keys: scores, the running max m and sum l (base 2), the rescaled output."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_ptrs = K + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :]
    if MASK:  # the last block may run past the sequence: masked loads, -inf scores
        k = tl.load(k_ptrs, mask=offs_n[:, None] < n_ctx, other=0.0)
    else:
        k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k), input_precision=DOT) * qk_scale  # log2(e) / sqrt(d) folded in
    if MASK:
        keep = (offs_n[None, :] < n_ctx) & ((offs_m[:, None] >= offs_n[None, :]) | (causal == 0))
        s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = m_new
    if MASK:  # a row that has seen only masked keys keeps m = -inf: shift by 0, not by -inf
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)  # rescales what was summed under the old maximum
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASK:
        v = tl.load(v_ptrs, mask=offs_n[:, None] < n_ctx, other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT)
    return acc, l_i, m_new


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, lo, hi, offs_m, n_ctx, qk_scale,
                MASK: tl.constexpr, causal, BLOCK_N: tl.constexpr,
                HEAD_DIM: tl.constexpr, DOT: tl.constexpr, STATIC_N: tl.constexpr):  # fmt: skip
    """Key blocks starting in [lo, hi), lo a multiple of BLOCK_N."""
    if STATIC_N > 0:  # the CPU interpreter: a compile-time trip count (module docstring)
        for start_n in range(0, STATIC_N, BLOCK_N):
            if (start_n >= lo) & (start_n < hi):
                acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, start_n,
                                          offs_m, n_ctx, qk_scale, MASK, causal, BLOCK_N,
                                          HEAD_DIM, DOT)  # fmt: skip
    else:
        for start_n in tl.range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, start_n,
                                      offs_m, n_ctx, qk_scale, MASK, causal, BLOCK_N, HEAD_DIM,
                                      DOT)  # fmt: skip
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["n_ctx", "group", "q_heads", "causal"])
def attn_fwd_kernel(
    Q, K, V, O, LSE, qk_scale,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    q_heads, group, n_ctx, causal,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    STATIC_N: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One program per (block of BLOCK_M query rows, batch x query head). causal (0 or 1) is a
    runtime argument, not a constexpr: one compiled kernel serves both masks."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    if causal:  # the last rows see the most keys: launch them first, the short ones fill the tail
        pid_m = tl.num_programs(0) - 1 - pid_m
    b, h = pid_bh // q_heads, pid_bh % q_heads
    kv = h // group  # GQA / MQA: the KV head this query head reads
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + kv.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + kv.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < n_ctx
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=rows[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if causal:  # keys left of this block are visible to all its rows; the diagonal is masked
        full_end = start_m
        end = tl.minimum(start_m + BLOCK_M, n_ctx)
    else:  # every key is visible; only a last partial block needs the bounds mask
        full_end = (n_ctx // BLOCK_N) * BLOCK_N
        end = n_ctx
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, 0, full_end,
                                offs_m, n_ctx, qk_scale, False, causal, BLOCK_N, HEAD_DIM, DOT,
                                STATIC_N)  # fmt: skip
    acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, full_end, end,
                                offs_m, n_ctx, qk_scale, True, causal, BLOCK_N, HEAD_DIM, DOT,
                                STATIC_N)  # fmt: skip
    empty = l_i == 0.0  # a row with no visible key: output 0, logsumexp -inf (as FlexAttention)
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(l_safe)) * _LN2)  # natural log
    tl.store(O + offs_m[:, None] * stride_om + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None])  # fmt: skip
    tl.store(LSE + pid_bh.to(tl.int64) * n_ctx + offs_m, lse, mask=rows)


# --8<-- [end:forward]


# --8<-- [start:backward]
@triton.jit(do_not_specialize=["n_ctx", "q_heads"])
def attn_bwd_delta_kernel(O, DO, DLSE, DELTA, stride_ob, stride_oh, stride_om, stride_db,
                          stride_dh, stride_dm, q_heads, n_ctx, HEAD_DIM: tl.constexpr,
                          BLOCK_M: tl.constexpr):  # fmt: skip
    """D_i = rowsum(dO_i o O_i) - dlse_i: dS = P o (dP - D). A gradient reaching the logsumexp
    (dlse) enters here: d lse_i / d S_ij = P_ij."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // q_heads, pid_bh % q_heads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < n_ctx
    o_ptrs = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    do_ptrs = DO + b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
    o = tl.load(o_ptrs + offs_m[:, None] * stride_om + offs_d[None, :], mask=rows[:, None],
                other=0.0).to(tl.float32)  # fmt: skip
    do = tl.load(do_ptrs + offs_m[:, None] * stride_dm + offs_d[None, :], mask=rows[:, None],
                 other=0.0).to(tl.float32)  # fmt: skip
    at = pid_bh.to(tl.int64) * n_ctx + offs_m
    delta = tl.sum(o * do, 1) - tl.load(DLSE + at, mask=rows, other=0.0)
    tl.store(DELTA + at, delta, mask=rows)


@triton.jit
def _dkdv_tile(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm, start_m, offs_n, n_ctx,
               qk_scale, MASK: tl.constexpr, causal, BLOCK_M: tl.constexpr,
               HEAD_DIM: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    """One block of query rows against this program's keys, transposed ([keys, rows]):
    P^T recomputed from the saved logsumexp, dV += P^T dO, dK += dS^T Q (scaled at the end)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    qt_ptrs = Q + offs_m[None, :] * stride_qm + offs_d[:, None]
    do_ptrs = DO + offs_m[:, None] * stride_dm + offs_d[None, :]
    if MASK:  # rows past the sequence: q, dO zero, lse +inf (P = 0)
        rows = offs_m < n_ctx
        qt = tl.load(qt_ptrs, mask=rows[None, :], other=0.0)
        lse2 = tl.load(LSE + offs_m, mask=rows, other=float("inf")) * _LOG2E
    else:
        qt = tl.load(qt_ptrs)
        lse2 = tl.load(LSE + offs_m) * _LOG2E
    pt = tl.exp2(tl.dot(k, qt, input_precision=DOT) * qk_scale - lse2[None, :])
    if MASK:
        keep = (offs_m[None, :] < n_ctx) & ((offs_m[None, :] >= offs_n[:, None]) | (causal == 0))
        pt = tl.where(keep, pt, 0.0)
        do = tl.load(do_ptrs, mask=rows[:, None], other=0.0)
        delta = tl.load(DELTA + offs_m, mask=rows, other=0.0)
    else:
        do = tl.load(do_ptrs)
        delta = tl.load(DELTA + offs_m)
    dv = tl.dot(pt.to(do.dtype), do, dv, input_precision=DOT)
    dpt = tl.dot(v, tl.trans(do), input_precision=DOT)
    dst = pt * (dpt - delta[None, :])
    dk = tl.dot(dst.to(qt.dtype), tl.trans(qt), dk, input_precision=DOT)
    return dk, dv


@triton.jit
def _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm, lo, hi, offs_n, n_ctx,
                 qk_scale, MASK: tl.constexpr, causal, BLOCK_M: tl.constexpr,
                 HEAD_DIM: tl.constexpr, DOT: tl.constexpr, STATIC_N: tl.constexpr):  # fmt: skip
    """Query blocks starting in [lo, hi), lo a multiple of BLOCK_M."""
    if STATIC_N > 0:
        for start_m in range(0, STATIC_N, BLOCK_M):
            if (start_m >= lo) & (start_m < hi):
                dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm,
                                    start_m, offs_n, n_ctx, qk_scale, MASK, causal, BLOCK_M,
                                    HEAD_DIM, DOT)  # fmt: skip
    else:
        for start_m in tl.range(lo, hi, BLOCK_M):
            start_m = tl.multiple_of(start_m, BLOCK_M)
            dk, dv = _dkdv_tile(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm, start_m,
                                offs_n, n_ctx, qk_scale, MASK, causal, BLOCK_M, HEAD_DIM,
                                DOT)  # fmt: skip
    return dk, dv


@triton.jit
def _dkdv_head(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm, start_n, offs_n, n_ctx,
               qk_scale, causal, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, DOT: tl.constexpr, STATIC_N: tl.constexpr):  # fmt: skip
    """All query rows of one head that see these keys: causal, the diagonal block (masked) and
    the rows below it; always, a last partial block of rows (masked). Without the mask the
    diagonal's range [start_n, 0) is empty and the body starts at row 0."""
    body_lo = causal * (start_n + BLOCK_N)
    dk, dv = _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm, start_n,
                          body_lo, offs_n, n_ctx, qk_scale, True, causal, BLOCK_M, HEAD_DIM, DOT,
                          STATIC_N)  # fmt: skip
    body_hi = (n_ctx // BLOCK_M) * BLOCK_M
    dk, dv = _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm, body_lo,
                          body_hi, offs_n, n_ctx, qk_scale, False, causal, BLOCK_M, HEAD_DIM, DOT,
                          STATIC_N)  # fmt: skip
    dk, dv = _dkdv_blocks(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qm, stride_dm,
                          tl.maximum(body_lo, body_hi), n_ctx, offs_n, n_ctx, qk_scale, True,
                          causal, BLOCK_M, HEAD_DIM, DOT, STATIC_N)  # fmt: skip
    return dk, dv


@triton.jit(do_not_specialize=["n_ctx", "group", "q_heads", "kv_heads", "causal"])
def attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_db, stride_dh, stride_dm,
    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    q_heads, kv_heads, group, n_ctx, causal,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    STATIC_N: tl.constexpr, STATIC_GROUP: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One program per (block of BLOCK_N keys, batch x KV head); dK and dV sum over the `group`
    query heads that read this KV head, inside the program: no atomics."""
    tl.static_assert(BLOCK_N % BLOCK_M == 0)
    pid_n, pid_bkv = tl.program_id(0), tl.program_id(1)
    b, kv = pid_bkv // kv_heads, pid_bkv % kv_heads
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    keys = offs_n < n_ctx
    K += b.to(tl.int64) * stride_kb + kv.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + kv.to(tl.int64) * stride_vh
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=keys[:, None], other=0.0)
    v = tl.load(V + offs_n[:, None] * stride_vn + offs_d[None, :], mask=keys[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    Q += b.to(tl.int64) * stride_qb
    DO += b.to(tl.int64) * stride_db
    if STATIC_N > 0:  # the CPU interpreter: the group size as a compile-time trip count
        for g in range(STATIC_GROUP):
            h = kv * group + g
            at = (b * q_heads + h).to(tl.int64) * n_ctx
            dk, dv = _dkdv_head(dk, dv, k, v, Q + h.to(tl.int64) * stride_qh,
                                DO + h.to(tl.int64) * stride_dh, LSE + at, DELTA + at, stride_qm,
                                stride_dm, start_n, offs_n, n_ctx, qk_scale, causal, BLOCK_M,
                                BLOCK_N, HEAD_DIM, DOT, STATIC_N)  # fmt: skip
    else:
        for g in tl.range(0, group):
            h = kv * group + g
            at = (b * q_heads + h).to(tl.int64) * n_ctx
            dk, dv = _dkdv_head(dk, dv, k, v, Q + h.to(tl.int64) * stride_qh,
                                DO + h.to(tl.int64) * stride_dh, LSE + at, DELTA + at, stride_qm,
                                stride_dm, start_n, offs_n, n_ctx, qk_scale, causal, BLOCK_M,
                                BLOCK_N, HEAD_DIM, DOT, STATIC_N)  # fmt: skip
    DK += b.to(tl.int64) * stride_dkb + kv.to(tl.int64) * stride_dkh
    DV += b.to(tl.int64) * stride_dvb + kv.to(tl.int64) * stride_dvh
    tl.store(DK + offs_n[:, None] * stride_dkn + offs_d[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=keys[:, None])  # fmt: skip
    tl.store(DV + offs_n[:, None] * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty),
             mask=keys[:, None])  # fmt: skip


@triton.jit
def _dq_tile(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, start_n, offs_m, n_ctx,
             qk_scale, MASK: tl.constexpr, causal, BLOCK_N: tl.constexpr,
             HEAD_DIM: tl.constexpr, DOT: tl.constexpr):  # fmt: skip
    """One block of keys against this program's query rows: dQ += dS K (scaled at the end)."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    kt_ptrs = K + offs_n[None, :] * stride_kn + offs_d[:, None]
    vt_ptrs = V + offs_n[None, :] * stride_vn + offs_d[:, None]
    if MASK:
        kt = tl.load(kt_ptrs, mask=offs_n[None, :] < n_ctx, other=0.0)
        vt = tl.load(vt_ptrs, mask=offs_n[None, :] < n_ctx, other=0.0)
    else:
        kt = tl.load(kt_ptrs)
        vt = tl.load(vt_ptrs)
    p = tl.exp2(tl.dot(q, kt, input_precision=DOT) * qk_scale - lse2[:, None])
    if MASK:
        keep = (offs_n[None, :] < n_ctx) & ((offs_m[:, None] >= offs_n[None, :]) | (causal == 0))
        p = tl.where(keep, p, 0.0)
    dp = tl.dot(do, vt, input_precision=DOT)
    ds = p * (dp - delta[:, None])
    return tl.dot(ds.to(kt.dtype), tl.trans(kt), dq, input_precision=DOT)


@triton.jit
def _dq_blocks(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, lo, hi, offs_m, n_ctx,
               qk_scale, MASK: tl.constexpr, causal, BLOCK_N: tl.constexpr,
               HEAD_DIM: tl.constexpr, DOT: tl.constexpr, STATIC_N: tl.constexpr):  # fmt: skip
    if STATIC_N > 0:
        for start_n in range(0, STATIC_N, BLOCK_N):
            if (start_n >= lo) & (start_n < hi):
                dq = _dq_tile(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, start_n,
                              offs_m, n_ctx, qk_scale, MASK, causal, BLOCK_N, HEAD_DIM,
                              DOT)  # fmt: skip
    else:
        for start_n in tl.range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            dq = _dq_tile(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, start_n, offs_m,
                          n_ctx, qk_scale, MASK, causal, BLOCK_N, HEAD_DIM, DOT)  # fmt: skip
    return dq


@triton.jit(do_not_specialize=["n_ctx", "group", "q_heads", "causal"])
def attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, qk_scale, sm_scale,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_db, stride_dh, stride_dm,
    stride_dqb, stride_dqh, stride_dqm,
    q_heads, group, n_ctx, causal,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    STATIC_N: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """One program per (block of BLOCK_M query rows, batch x query head): the key blocks in the
    forward's order (left of the diagonal unmasked, the diagonal or a partial last block masked)."""
    tl.static_assert(BLOCK_M % BLOCK_N == 0)
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    if causal:  # the longest rows first, as in the forward
        pid_m = tl.num_programs(0) - 1 - pid_m
    b, h = pid_bh // q_heads, pid_bh % q_heads
    kv = h // group
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < n_ctx
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    DO += b.to(tl.int64) * stride_db + h.to(tl.int64) * stride_dh
    K += b.to(tl.int64) * stride_kb + kv.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + kv.to(tl.int64) * stride_vh
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=rows[:, None], other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_dm + offs_d[None, :], mask=rows[:, None], other=0.0)
    at = pid_bh.to(tl.int64) * n_ctx + offs_m
    lse2 = tl.load(LSE + at, mask=rows, other=float("inf")) * _LOG2E  # rows past the end: P = 0
    delta = tl.load(DELTA + at, mask=rows, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    if causal:
        full_end = start_m
        end = tl.minimum(start_m + BLOCK_M, n_ctx)
    else:
        full_end = (n_ctx // BLOCK_N) * BLOCK_N
        end = n_ctx
    dq = _dq_blocks(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, 0, full_end, offs_m,
                    n_ctx, qk_scale, False, causal, BLOCK_N, HEAD_DIM, DOT, STATIC_N)  # fmt: skip
    dq = _dq_blocks(dq, q, do, lse2, delta, K, V, stride_kn, stride_vn, full_end, end, offs_m,
                    n_ctx, qk_scale, True, causal, BLOCK_N, HEAD_DIM, DOT, STATIC_N)  # fmt: skip
    DQ += b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    tl.store(DQ + offs_m[:, None] * stride_dqm + offs_d[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=rows[:, None])  # fmt: skip


# --8<-- [end:backward]


# --8<-- [start:launchers]
def _config(block_m, block_n, warps, stages):
    return triton.Config({"BLOCK_M": block_m, "BLOCK_N": block_n}, num_warps=warps,
                         num_stages=stages)  # fmt: skip


# GPU (sm_90, head_dim 128, bf16): one configuration per kernel, so that the first run compiles
# each kernel once (the mask is a runtime argument) and autotuning, with one candidate, times
# nothing (the post's 60 s budget). Forward 128 x 128, 8 warps: FlashAttention-3's tile at
# head_dim 128 (two warpgroups of 64 query rows; 128 keys causal, 176 otherwise) and the only
# 8-warp tile Triton's fused-attention tutorial keeps on Hopper; 3 stages, the fastest of ten
# forward configs in a do_bench probe on the H200 (16 K, 2 x 16 heads: 500 TFLOP/s against 471
# with 2 stages; 4 warps 211; 4 stages do not fit shared memory). dQ
# 128 x 64: as many scores as FA3's backward tile (64 x 128). dK/dV 32 x 128, the tutorial's
# backward tile: FA3's 64 x 128 gives its MMA warpgroups 240 registers each (setmaxnreg);
# compiled by Triton 3.6 both tiles use all 255 and 64 x 128 spills more (ptxas -v: 1060 bytes
# of spill stores against 228). Forward and dQ spill nothing.
FWD_CONFIGS = [_config(128, 128, 8, 3)]
DKDV_CONFIGS = [_config(32, 128, 8, 3)]
DQ_CONFIGS = [_config(128, 64, 8, 2)]
TUNE_KEY = ["n_ctx", "HEAD_DIM", "causal"]  # and, always, the dtypes of the tensor arguments


def _tune_bench(kernel_call, quantiles):
    """Only with two or more candidates in a list: a few milliseconds per candidate, where
    triton.testing.do_bench's defaults spend about 0.125 s on each (lengths x masks x kernels)."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _tuned(configs, kernel):
    return triton.autotune(configs, key=TUNE_KEY, do_bench=_tune_bench)(kernel)


attn_fwd_tuned = _tuned(FWD_CONFIGS, attn_fwd_kernel)
attn_bwd_dkdv_tuned = _tuned(DKDV_CONFIGS, attn_bwd_dkdv_kernel)
attn_bwd_dq_tuned = _tuned(DQ_CONFIGS, attn_bwd_dq_kernel)
CPU_BLOCKS = {"fwd": (16, 16), "dkdv": (16, 32), "dq": (32, 16)}  # interpreter: small tiles


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _last_dim_contiguous(x):
    return x if x.stride(-1) == 1 else x.contiguous()


def _check(q, k, v):
    """Shapes, dtypes and devices the kernels rely on; each problem named."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [batch, heads, n, head_dim]; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")  # fmt: skip
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    (batch, q_heads, n, d), kv_heads = q.shape, k.shape[1]
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, n, d):
        raise ValueError(f"k and v must match q's batch, length and head_dim "
                         f"({batch}, {n}, {d}); got {tuple(k.shape)}")  # fmt: skip
    if q_heads % kv_heads:
        raise ValueError(f"q_heads ({q_heads}) must be a multiple of kv_heads ({kv_heads})")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    if n < 1:
        raise ValueError("the sequence length must be at least 1")
    if not q.dtype == k.dtype == v.dtype or q.dtype not in (torch.float16, torch.bfloat16,
                                                            torch.float32):  # fmt: skip
        raise ValueError(f"q, k, v must share one of float16, bfloat16, float32; got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")  # fmt: skip
    if not q.device == k.device == v.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")


def _dot(dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"  # fp32 inputs: true fp32 products


def _launch(kernel, tuned, grid, args, blocks, n, **constexprs):
    """On the GPU the autotuned kernel (runtime loop bounds); in the interpreter the plain one
    with small tiles (or `blocks`) and compile-time trip counts."""
    if interpreted() or blocks is not None:
        block_m, block_n = blocks
        static = n if interpreted() else 0
        kernel[grid(block_m, block_n)](*args, BLOCK_M=block_m, BLOCK_N=block_n, STATIC_N=static,
                                       **constexprs)  # fmt: skip
    else:
        tuned[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, STATIC_N=0,
                                                                   **constexprs)  # fmt: skip


def attention_forward(q, k, v, causal: bool, scale: float, blocks=None):
    """(out [batch, q_heads, n, d] in q's dtype, logsumexp [batch, q_heads, n] float32)."""
    _check(q, k, v)
    q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
    batch, q_heads, n, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(batch, q_heads, n, device=q.device, dtype=torch.float32)
    blocks = blocks or (CPU_BLOCKS["fwd"] if interpreted() else None)
    args = (q, k, v, out, lse, scale * LOG2E, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *out.stride()[:3], q_heads, q_heads // k.shape[1], n, int(causal))  # fmt: skip
    _launch(attn_fwd_kernel, attn_fwd_tuned, lambda bm, bn: (triton.cdiv(n, bm), batch * q_heads),
            args, blocks, n, HEAD_DIM=d, DOT=_dot(q.dtype))  # fmt: skip
    return out, lse


def attention_backward(do, q, k, v, out, lse, dlse, causal: bool, scale: float, blocks=None):
    """(dq, dk, dv): D = rowsum(dO o O) - dlse, then the dK/dV and the dQ kernels."""
    _check(q, k, v)
    do, q, k, v, out = (_last_dim_contiguous(t) for t in (do, q, k, v, out))
    batch, q_heads, n, d = q.shape
    kv_heads, group = k.shape[1], q_heads // k.shape[1]
    delta = torch.empty_like(lse)
    dlse = torch.zeros_like(lse) if dlse is None else dlse.float().contiguous()
    attn_bwd_delta_kernel[(triton.cdiv(n, 64), batch * q_heads)](
        out, do, dlse, delta, *out.stride()[:3], *do.stride()[:3], q_heads, n, HEAD_DIM=d,
        BLOCK_M=64,
    )  # fmt: skip
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    common = (q, k, v, do, lse, delta)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    interp = interpreted()
    blocks = blocks or ({"dkdv": CPU_BLOCKS["dkdv"], "dq": CPU_BLOCKS["dq"]} if interp else None)
    _launch(attn_bwd_dkdv_kernel, attn_bwd_dkdv_tuned,
            lambda bm, bn: (triton.cdiv(n, bn), batch * kv_heads),
            (*common, dk, dv, scale * LOG2E, scale, *strides, *dk.stride()[:3], *dv.stride()[:3],
             q_heads, kv_heads, group, n, int(causal)), blocks and blocks["dkdv"], n, HEAD_DIM=d,
            STATIC_GROUP=group if interp else 0, DOT=_dot(q.dtype))  # fmt: skip
    _launch(attn_bwd_dq_kernel, attn_bwd_dq_tuned,
            lambda bm, bn: (triton.cdiv(n, bm), batch * q_heads),
            (*common, dq, scale * LOG2E, scale, *strides, *dq.stride()[:3], q_heads, group, n,
             int(causal)), blocks and blocks["dq"], n, HEAD_DIM=d, DOT=_dot(q.dtype))  # fmt: skip
    return dq, dk, dv


# --8<-- [end:launchers]


# --8<-- [start:op]
@torch.library.custom_op("handbook::flash_attention", mutates_args=())
def flash_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Opaque to torch.compile: it calls the Triton launchers; (out, logsumexp)."""
    return attention_forward(q, k, v, causal, scale)


@flash_attention_op.register_fake
def _(q, k, v, causal, scale):  # shapes, dtypes and strides only, for tracing
    _check(q, k, v)
    out = torch.empty_like(_last_dim_contiguous(q))
    return out, q.new_empty(q.shape[:3], dtype=torch.float32)


Grads = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.custom_op("handbook::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                                v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                                dlse: torch.Tensor, causal: bool,
                                scale: float) -> Grads:  # fmt: skip
    """dq, dk, dv; dlse: the gradient reaching the logsumexp (zeros when the loss ignores it)."""
    return attention_backward(do, q, k, v, out, lse, dlse, causal, scale)


@flash_attention_backward_op.register_fake
def _(do, q, k, v, out, lse, dlse, causal, scale):
    return tuple(torch.empty_like(_last_dim_contiguous(t)) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.causal, ctx.scale = causal, scale


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else dout
    dlse = torch.zeros_like(lse) if dlse is None else dlse
    dq, dk, dv = flash_attention_backward_op(dout, q, k, v, out, lse, dlse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


flash_attention_op.register_autograd(_backward, setup_context=_setup_context)


def flash_attention(q, k, v, causal=False, scale=None, return_lse=False):
    """softmax(q k^T * scale (+ causal mask)) v with GQA/MQA head mapping; differentiable."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    out, lse = flash_attention_op(q, k, v, bool(causal), scale)
    return (out, lse) if return_lse else out


# --8<-- [end:op]
