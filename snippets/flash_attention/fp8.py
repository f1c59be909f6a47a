"""An FP8 (e4m3) forward of attention, FlashAttention-3's way (arXiv:2407.08608 §3.3): Q, K and V
quantized per block of rows with one fp32 scale per block, Q and K first multiplied by the same
random orthogonal matrix (a random +-1 diagonal times a Hadamard matrix: QK^T unchanged, outliers
spread over the head dim), then attention_forward's tile loop with both matmuls on fp8 operands.

Non-causal, one KV head per query head, head dim 128. The probabilities P are rounded to e4m3 for
the PV matmul after a shift by 2^8 (FA3's Max_offset for FP8, hopper/flash_fwd_kernel_sm90.h):
P = exp2(s - m + 8) lies in [0, 256], so a weight 2^-14 below a row's running maximum is still a
normal e4m3 number; the row sum l adds the unrounded P, and the shift cancels in acc / l.

fp8_reference is the same computation in PyTorch (key blocks in the kernel's order, P rounded by
PyTorch's cast), fp8_bound the elementwise rounding-error bound of either against exact attention
on the dequantized inputs. In the CPU interpreter the kernel's fp32 -> e4m3 cast mis-rounds (no
carry into the exponent, ties away from zero), so there P is first rounded exactly in fp32
(_round_e4m3) and the cast then only converts; on the GPU the hardware cast rounds to nearest.
"""

import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from snippets.common.device import DEVICE, ON_GPU
from snippets.flash_attention.attention import LOG2E, interpreted
from snippets.triton_kernels.numerics import U, eta, gamma, unit_roundoff, within

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
U8 = 2.0**-4  # e4m3 unit roundoff: 3 mantissa bits
P_SHIFT = 8  # P = exp2(s - m + P_SHIFT): FA3's Max_offset
FP8_ACC_U = 2.0**-13  # Hopper's fp8 MMA keeps about 14 bits of its sums (DeepSeek-V3 §3.3.2)
FP8_HEAD_DIM = 128
BLOCK = 128  # GPU: rows per scale = the kernel's query and key tile
# GPU launch: attention_forward's tile and pipeline (8 warps, 3 stages), not tuned for fp8. V is
# stored keys-contiguous (quantize_qkv), so Triton 3.6 pipelines its loads into the K-major layout
# the fp8 WGMMA needs (asynchronous copies; ptxas -v: 255 registers, 48 bytes spilled). Stored
# [n, d] it spills nothing but is loaded synchronously and transposed on its way to shared
# memory (as pytorch/pytorch#153357 found for FlexAttention's fp8 path). Not timed against each
# other: that needs the GPU.
FP8_OPTIONS = {"num_warps": 8, "num_stages": 3}
CPU_BLOCK = 16  # interpreter: small tiles
_SHIFT = tl.constexpr(P_SHIFT)


# --8<-- [start:quantize]
def hadamard(d: int) -> torch.Tensor:
    """Sylvester's Hadamard matrix [d, d] of +-1 (d a power of two): H H^T = d I."""
    if d < 1 or d & (d - 1):
        raise ValueError(f"d must be a power of two, got {d}")
    h = torch.ones(1, 1)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def random_rotation(d: int, seed: int = 0, device=None) -> torch.Tensor:
    """M = D H / sqrt(d), D a random +-1 diagonal: orthogonal, so (Q M)(K M)^T = Q K^T (fp32)."""
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (d,), generator=gen) * 2.0 - 1.0
    return (signs[:, None] * hadamard(d) / math.sqrt(d)).to(device)


def quantize(x: torch.Tensor, block: int, per_tensor: bool = False):
    """(x8 e4m3 [b, h, n, d], scale fp32 [b, h, ceil(n / block)]): one scale per `block` rows of
    each head, amax / 448, so each block's largest |x| becomes 448 (per_tensor: the whole tensor's
    amax for every block). A block of zeros gets scale 1: no 0 / 0."""
    if not x.is_floating_point() or x.dim() != 4 or x.dtype in (torch.float64, E4M3):
        raise ValueError(f"x must be a float32, float16 or bfloat16 [batch, heads, n, head_dim] "
                         f"tensor; got {x.dtype} {tuple(x.shape)}")  # fmt: skip
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    b, h, n, d = x.shape
    blocks = -(-n // block)
    x = x.float()
    padded = torch.nn.functional.pad(x, (0, 0, 0, blocks * block - n))  # zeros: no effect on amax
    amax = padded.view(b, h, blocks, block * d).abs().amax(-1)
    if per_tensor:
        amax = amax.amax().expand(b, h, blocks)
    scale = torch.where(amax > 0, amax / E4M3_MAX, 1.0).contiguous()
    rows = scale.repeat_interleave(block, -1)[..., :n, None]
    x8 = (x / rows).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)  # clamp: x / scale may round past 448
    return x8, scale


def dequantize(x8: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    rows = scale.double().repeat_interleave(block, -1)[..., : x8.shape[2], None]
    return x8.double() * rows  # exact: a 4-bit significand times an fp32 scale


class Fp8Qkv(NamedTuple):
    q8: torch.Tensor
    k8: torch.Tensor
    v8: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    block: int


def quantize_qkv(q, k, v, block: int, rotation=None, per_tensor: bool = False) -> Fp8Qkv:
    """Q and K times `rotation` (random_rotation, or None) in fp32, then all three quantized."""
    if not q.shape == k.shape == v.shape or q.dim() != 4:
        raise ValueError(f"q, k, v must share one shape [batch, heads, n, head_dim]; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")  # fmt: skip
    if q.shape[-1] != FP8_HEAD_DIM:
        raise ValueError(f"head_dim must be {FP8_HEAD_DIM}, got {q.shape[-1]}")
    if rotation is not None:
        q, k = q.float() @ rotation, k.float() @ rotation
    (q8, qs), (k8, ks), (v8, vs) = (quantize(t, block, per_tensor) for t in (q, k, v))
    b, h, n, d = v8.shape  # V stored [b, h, d, n_pad], keys contiguous: the P V matmul's fp8
    vt = torch.zeros(b, h, d, vs.shape[-1] * block, dtype=E4M3, device=v8.device)  # operand
    vt[..., :n] = v8.transpose(-1, -2)  # is then K-major, as Hopper's fp8 WGMMA requires
    return Fp8Qkv(q8, k8, vt[..., :n].transpose(-1, -2), qs, ks, vs, block)


# --8<-- [end:quantize]


# --8<-- [start:kernel]
@triton.jit
def _round_e4m3(p):
    """p in [0, 448) rounded to the nearest e4m3 value (ties to even), exactly, in fp32: for the
    interpreter, whose own cast mis-rounds. Normal (p >= 2^-6): keep 3 of the 23 mantissa bits,
    rounding on the integer bits (a carry moves the exponent); subnormal: a multiple of 2^-9, by
    adding and subtracting 1.5 * 2^14, whose fp32 spacing is 2^-9."""
    bits = p.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
    return tl.where(p < 0.015625, (p + 24576.0) - 24576.0, bits.to(tl.float32, bitcast=True))


@triton.jit
def _fp8_tile(acc, l_i, m_i, q, qk_scale, K, V, KS, VS, stride_kn, stride_vn, stride_vd, start_n,
              n_ctx, MASK: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
              ROUND: tl.constexpr):  # fmt: skip
    """_fwd_tile with fp8 operands: scores scaled by this key block's scale, P shifted by 2^8 and
    rounded to e4m3, P V scaled by this value block's scale before it joins the accumulator."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    k_ptrs = K + offs_n[:, None] * stride_kn + offs_d[None, :]
    v_ptrs = V + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
    k_scale = tl.load(KS + start_n // BLOCK_N)
    v_scale = tl.load(VS + start_n // BLOCK_N)
    if MASK:
        k = tl.load(k_ptrs, mask=offs_n[:, None] < n_ctx, other=0.0)
    else:
        k = tl.load(k_ptrs)
    s = tl.dot(q, tl.trans(k)) * (qk_scale * k_scale)  # fp8 x fp8, fp32 accumulator
    if MASK:
        s = tl.where(offs_n[None, :] < n_ctx, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # non-causal: every block has a key, m_new finite
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - (m_new - _SHIFT)[:, None])  # in [0, 2^8]
    l_i = l_i * alpha + tl.sum(p, 1)
    if ROUND:
        p = _round_e4m3(p)
    if MASK:
        v = tl.load(v_ptrs, mask=offs_n[:, None] < n_ctx, other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v) * v_scale
    return acc, l_i, m_new


@triton.jit
def _fp8_blocks(acc, l_i, m_i, q, qk_scale, K, V, KS, VS, stride_kn, stride_vn, stride_vd, lo, hi,
                n_ctx,
                MASK: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
                STATIC_N: tl.constexpr):  # fmt: skip
    """Key blocks starting in [lo, hi), as _fwd_blocks (a compile-time trip count on the CPU)."""
    if STATIC_N > 0:
        for start_n in range(0, STATIC_N, BLOCK_N):
            if (start_n >= lo) & (start_n < hi):
                acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, qk_scale, K, V, KS, VS, stride_kn,
                                          stride_vn, stride_vd, start_n, n_ctx, MASK, BLOCK_N,
                                          HEAD_DIM, True)  # fmt: skip
    else:
        for start_n in tl.range(lo, hi, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            acc, l_i, m_i = _fp8_tile(acc, l_i, m_i, q, qk_scale, K, V, KS, VS, stride_kn,
                                      stride_vn, stride_vd, start_n, n_ctx, MASK, BLOCK_N, HEAD_DIM,
                                      False)  # fmt: skip
    return acc, l_i, m_i


@triton.jit(do_not_specialize=["q_heads", "n_ctx", "n_blocks"])
def attn_fp8_fwd_kernel(
    Q, K, V, QS, KS, VS, O, sm_scale_log2,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_vd, stride_ob, stride_oh, stride_om,
    q_heads, n_ctx, n_blocks,
    HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, STATIC_N: tl.constexpr,
):  # fmt: skip
    """One program per (block of BLOCK query rows, batch x head); key blocks of BLOCK rows too,
    so each tile reads one scale of Q (here), K and V (scales: [batch x heads, n_blocks])."""
    pid_m, pid_bh = tl.program_id(0), tl.program_id(1)
    b, h = pid_bh // q_heads, pid_bh % q_heads
    Q += b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    K += b.to(tl.int64) * stride_kb + h.to(tl.int64) * stride_kh
    V += b.to(tl.int64) * stride_vb + h.to(tl.int64) * stride_vh
    O += b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    KS += pid_bh.to(tl.int64) * n_blocks
    VS += pid_bh.to(tl.int64) * n_blocks
    offs_m = pid_m * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m < n_ctx
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=rows[:, None], other=0.0)
    qk_scale = sm_scale_log2 * tl.load(QS + pid_bh.to(tl.int64) * n_blocks + pid_m)
    m_i = tl.full([BLOCK], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK], tl.float32)
    acc = tl.zeros([BLOCK, HEAD_DIM], tl.float32)
    full_end = (n_ctx // BLOCK) * BLOCK  # blocks before it need no bounds mask
    acc, l_i, m_i = _fp8_blocks(acc, l_i, m_i, q, qk_scale, K, V, KS, VS, stride_kn, stride_vn,
                                stride_vd, 0, full_end, n_ctx, False, BLOCK, HEAD_DIM,
                                STATIC_N)  # fmt: skip
    acc, l_i, m_i = _fp8_blocks(acc, l_i, m_i, q, qk_scale, K, V, KS, VS, stride_kn, stride_vn,
                                stride_vd, full_end, n_ctx, n_ctx, True, BLOCK, HEAD_DIM,
                                STATIC_N)  # fmt: skip
    out = acc / l_i[:, None]
    tl.store(O + offs_m[:, None] * stride_om + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=rows[:, None])  # fmt: skip


# --8<-- [end:kernel]


# --8<-- [start:launcher]
def fp8_forward(x: Fp8Qkv, scale: float | None = None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """softmax(q k^T * scale) v from quantize_qkv's output: [batch, heads, n, d] in out_dtype."""
    if x.q8.dtype != E4M3 or x.k8.dtype != E4M3 or x.v8.dtype != E4M3:
        raise ValueError(f"x must hold e4m3 tensors (quantize_qkv); got {x.q8.dtype}")
    batch, heads, n, d = x.q8.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = torch.empty(x.q8.shape, device=x.q8.device, dtype=out_dtype)
    n_blocks = x.q_scale.shape[-1]
    q8, k8, v8 = x.q8, x.k8, x.v8
    options = {} if interpreted() else FP8_OPTIONS
    attn_fp8_fwd_kernel[(n_blocks, batch * heads)](
        q8, k8, v8, x.q_scale, x.k_scale, x.v_scale, out, scale * LOG2E,
        *q8.stride()[:3], *k8.stride()[:3], *v8.stride(), *out.stride()[:3],
        heads, n, n_blocks, HEAD_DIM=d, BLOCK=x.block, STATIC_N=n if interpreted() else 0,
        **options,
    )  # fmt: skip
    return out


def fp8_block() -> int:
    return CPU_BLOCK if interpreted() else BLOCK


def fp8_attention(q, k, v, rotate: bool = True, per_tensor: bool = False, seed: int = 0,
                  block: int | None = None) -> torch.Tensor:  # fmt: skip
    """Quantize (rotating Q and K first unless rotate=False) and run the FP8 kernel; q's dtype."""
    block = block or fp8_block()
    rotation = random_rotation(q.shape[-1], seed, q.device) if rotate else None
    return fp8_forward(quantize_qkv(q, k, v, block, rotation, per_tensor), out_dtype=q.dtype)


# --8<-- [end:launcher]


# --8<-- [start:reference]
def fp8_reference(x: Fp8Qkv, scale: float | None = None, shift: int = P_SHIFT) -> torch.Tensor:
    """The kernel's computation in PyTorch fp32, key block by key block: the same scales, the
    running maximum, P = exp2(s - m + shift) rounded by PyTorch's e4m3 cast. shift=0: unshifted."""
    q8, k8, v8 = (t.float() for t in (x.q8, x.k8, x.v8))
    n, d = q8.shape[2], q8.shape[3]  # q may hold fewer rows than k (its first blocks)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    qk = (torch.tensor(scale * LOG2E) * x.q_scale).repeat_interleave(x.block, -1)[..., :n, None]
    m = torch.full(q8.shape[:3], -math.inf, device=q8.device)
    l = torch.zeros(q8.shape[:3], device=q8.device)
    acc = torch.zeros(q8.shape, device=q8.device)
    for j, start in enumerate(range(0, k8.shape[2], x.block)):
        keys = slice(start, start + x.block)
        s = (q8 @ k8[..., keys, :].transpose(-1, -2)) * (qk * x.k_scale[..., j, None, None])
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp2(m - m_new)
        p = torch.exp2(s - (m_new - shift)[..., None])
        l = l * alpha + p.sum(-1)
        pv = p.to(E4M3).float() @ v8[..., keys, :]
        acc = acc * alpha[..., None] + pv * x.v_scale[..., j, None, None]
        m = m_new
    return acc / l[..., None]


# --8<-- [end:reference]


# --8<-- [start:bound]
def exact_attention(q, k, v, scale: float | None = None) -> torch.Tensor:
    """fp64 softmax(q k^T * scale) v, no mask; q may hold fewer rows than k (rows independent)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q.double() @ k.double().transpose(-1, -2)
    return torch.softmax(s, -1) @ v.double()


def fp8_bound(x: Fp8Qkv, scale: float | None = None, u_acc: float = U, out_dtype=torch.float32):
    """(exact, bound): fp64 attention on the dequantized inputs and an elementwise bound on
    |kernel - exact| (or |fp8_reference - exact|). All error is rounding; the quantization of
    Q, K, V itself is in the inputs (its effect: fp8_errors).

    Row i, key j, c = scale log2 e, s2 = c q.k on the dequantized q, k (base 2), T key blocks.
    Scores: the fp8 products are exact, their sum of d terms is accumulated with unit roundoff
      u_acc (fp32 U here; fewer bits in Hopper's fp8 tensor cores: FP8_ACC_U), then three fp32
      products with the scales and c (rounded once): |ds2| <= sigma = gamma_acc(2(d + 3)) c sum_t
      |q_t k_t| (1 + gamma_4) + gamma_4 |s2| (the 2: accumulation may truncate).
    Weights: exp2(s2 - m_J + 8) times the later blocks' rescales exp2(m_J - m_J') telescopes to
      exp2(s2 - m + 8): the running maxima cancel up to the roundings of the arguments (<= U(8
      max|s2| + 16)), of exp2 (4 U) and one rescale per block (5 U): each weight is off by a
      relative B0 = (1 + expm1(ln 2 (max_j sigma + U(8 max|s2| + 16))))(1 + 4U + 5U T) - 1.
    l adds the unrounded weights (fp32, gamma(n + T + 2)): relative B. The numerator's weights
      are also rounded to e4m3: relative u8 = 2^-4 above 2^-6, absolute 2^-10 below (subnormals;
      and a flush below 2^-126), so A = (1 + B0)(1 + u8) - 1 and an absolute 2^-10 + 2^-126 per
      key; l >= 2^(8 - max sigma), the largest weight. With num. weights off by A, den. weights
      by B: |o~ - o| <= (A sum_j P_j |v_j| + B |o|) / (1 - B) (+ the absolute terms / l).
    P V: BLOCK-term sums (u_acc), times the block's scale and added to the rescaled accumulator
      (fp32): gamma_dot = gamma_acc(2(block + 3)) + gamma(T + 3) on sum_j |P8_j| |v_j|; then
      the division (U) and the output's rounding (u_out, eta_out).
    """
    q, k, v = (dequantize(t, s, x.block) for t, s in ((x.q8, x.q_scale), (x.k8, x.k_scale),
                                                      (x.v8, x.v_scale)))  # fmt: skip
    n, d = q.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    c = scale * LOG2E
    tiles = -(-n // x.block)

    def gamma_acc(m):
        return m * u_acc / (1 - m * u_acc)

    s2 = c * q @ k.transpose(-1, -2)
    sigma = gamma_acc(2 * (d + 3)) * c * (q.abs() @ k.abs().transpose(-1, -2)) * (1 + gamma(4))
    sig = (sigma + gamma(4) * s2.abs()).amax(-1)  # per row
    big = s2.abs().amax(-1)
    b0 = (1 + torch.expm1(math.log(2) * (sig + U * (8 * big + 16)))) * (1 + 4 * U + 5 * U * tiles)
    b0 = b0 - 1
    b = (1 + b0) * (1 + gamma(n + tiles + 2)) - 1
    a = (1 + b0) * (1 + U8) - 1
    p = torch.softmax(math.log(2) * s2, -1)
    exact = p @ v
    g_dot = gamma_acc(2 * (x.block + 3)) + gamma(tiles + 3)
    l_min = 2.0 ** (P_SHIFT - sig[..., None])  # the largest weight
    tiny = (2.0**-10 + 2.0**-126) * v.abs().sum(-2, keepdim=True) / l_min
    b, a = b[..., None], a[..., None]
    bound = ((a + g_dot * (1 + a)) * (p @ v.abs()) + b * exact.abs() + tiny * (1 + g_dot)) / (1 - b)
    u_out = unit_roundoff(out_dtype)
    return exact, bound * (1 + U) * (1 + u_out) + u_out * exact.abs() + eta(out_dtype)


def check_fp8(batch, heads, n, rotate, per_tensor, dtype, seed=0) -> bool:
    """The FP8 kernel's output, each element within fp8_bound of fp64 attention on its
    dequantized inputs (fp8 sums with FP8_ACC_U on the GPU)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, heads, n, FP8_HEAD_DIM, generator=g).to(DEVICE, dtype)
               for _ in range(3))  # fmt: skip
    rotation = random_rotation(FP8_HEAD_DIM, seed, DEVICE) if rotate else None
    x = quantize_qkv(q, k, v, fp8_block(), rotation, per_tensor)
    exact, bound = fp8_bound(x, u_acc=FP8_ACC_U if ON_GPU else U, out_dtype=dtype)
    return within({"out": fp8_forward(x, out_dtype=dtype)}, {"out": exact}, {"out": bound})


# --8<-- [end:bound]


# --8<-- [start:errors]
def outlier_qkv(batch, heads, n, d, device, dtype, gen, frac=0.001, big=10.0):
    """FA3 §4.3's inputs: each entry N(0, 1), plus N(0, big^2) with probability frac (0.1 %, 10)."""

    def one():
        x = torch.randn(batch, heads, n, d, device=device, generator=gen)
        hit = torch.rand(x.shape, device=device, generator=gen) < frac
        return (x + hit * big * torch.randn(x.shape, device=device, generator=gen)).to(dtype)

    return one(), one(), one()


def relative_error(out, exact) -> float:
    """||out - exact|| / ||exact||, Frobenius over every element, in fp64."""
    return ((out.double() - exact).norm() / exact.norm()).item()


def fp8_errors(q, k, v, rows: int, block: int, rotation, bf16_forward) -> list[dict]:
    """Relative error of each forward against fp64 attention on the same (bf16) inputs, over the
    first `rows` query rows of every head (rows are independent without a mask): bf16_forward
    (the bf16 kernel), and the FP8 kernel with one scale per tensor, one per block, one per
    block after the rotation."""
    exact = exact_attention(q[:, :, :rows], k, v)
    variants = {
        "bf16": lambda: bf16_forward(q, k, v),
        "fp8_tensor": lambda: fp8_forward(quantize_qkv(q, k, v, block, None, True), None, q.dtype),
        "fp8_block": lambda: fp8_forward(quantize_qkv(q, k, v, block), None, q.dtype),
        "fp8_block_hadamard": lambda: fp8_forward(quantize_qkv(q, k, v, block, rotation), None,
                                                  q.dtype),
    }  # fmt: skip
    return [{"variant": name, "rel_error": relative_error(run()[:, :, :rows], exact)}
            for name, run in variants.items()]  # fmt: skip


# --8<-- [end:errors]
