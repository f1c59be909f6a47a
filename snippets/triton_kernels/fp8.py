"""FP8 (e4m3) quantization in Triton with DeepSeek-V3's fine-grained scales (arXiv:2412.19437
§3.3.2): one scale per 1 x 128 tile of an activation, one per 128 x 128 block of a weight, each
the tile's largest magnitude over 448 (e4m3's largest finite value). The kernel writes the scales
in the layouts torch._scaled_mm reads for its blockwise recipe, so its output goes straight into
the GEMM; fp8_operands prepares the other recipes measured in bench_gpu.py (one scale per
tensor, one per row)."""

import torch
import triton
import triton.language as tl

from snippets.common.device import DEVICE
from snippets.triton_kernels.numerics import CHECK_DTYPES

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
TILE = 128  # DeepSeek-V3's tile width, and the height of a weight's block
TINY = 1e-12  # an all-zero tile still gets a finite scale (its q is 0)
# (rows a program, tiles a program, warps) of the activations' kernel: the fastest of the sweep
# in the H200 run of a938a39 (0.0272 ms at [8192, 4096]; the former default (32, 2, 4) 0.0322)
QUANT_CONFIG = (8, 4, 4)
QUANT_CONFIGS = ((8, 4, 4), (16, 2, 4), (32, 2, 4), (32, 4, 8), (64, 2, 8))  # bench_gpu.py sweeps


# --8<-- [start:kernel]
@triton.jit
def quantize_kernel(X, Q, S, n_rows, stride_x, stride_q, stride_sr, stride_st,
                    ROWS: tl.constexpr, TILES: tl.constexpr, BLOCKWISE: tl.constexpr):  # fmt: skip
    """A [ROWS, TILES * 128] piece of X -> e4m3 in Q and its scales in S. BLOCKWISE: ROWS is
    128 and the rows share a scale per tile (128 x 128 blocks); else one scale per row per tile."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    tiles = tl.program_id(1) * TILES + tl.arange(0, TILES)
    cols = tl.program_id(1) * TILES * 128 + tl.arange(0, TILES * 128)
    inside = rows[:, None] < n_rows
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=inside, other=0.0)
    x = tl.reshape(x.to(tl.float32), (ROWS, TILES, 128))
    amax = tl.max(tl.abs(x), axis=2)  # [ROWS, TILES]: one per 1 x 128 tile
    if BLOCKWISE:
        amax = tl.max(amax, axis=0)  # [TILES]: one per 128 x 128 block
        scale = tl.maximum(amax, 1e-12) * (1.0 / 448.0)
        q = tl.div_rn(x, scale[None, :, None])  # IEEE division: `/` would be approximate
        tl.store(S + tl.program_id(0) * stride_sr + tiles * stride_st, scale)
    else:
        scale = tl.maximum(amax, 1e-12) * (1.0 / 448.0)
        q = tl.div_rn(x, scale[:, :, None])
        tl.store(S + rows[:, None] * stride_sr + tiles[None, :] * stride_st, scale, mask=inside)
    q = tl.reshape(q, (ROWS, TILES * 128)).to(tl.float8e4nv)  # round to nearest even
    tl.store(Q + rows[:, None] * stride_q + cols[None, :], q, mask=inside)


# --8<-- [end:kernel]


# --8<-- [start:launch]
def quantize(x: torch.Tensor, blockwise: bool = False, config=None):
    """x [M, K] (K a multiple of 128, rows contiguous) -> (e4m3 [M, K], fp32 scales), x ~ q * s.
    Tiles (blockwise=False): scales [M, K / 128], column-major, as _scaled_mm's scale_a.
    Blocks (blockwise=True): scales [ceil(M / 128), K / 128], row-major; .t() is its scale_b."""
    m, k = x.shape
    if k % TILE or x.stride(1) != 1:
        raise ValueError(f"quantize: K = {k} must be a multiple of {TILE}, rows contiguous")
    rows, tiles, warps = (TILE, 1, 8) if blockwise else (config or QUANT_CONFIG)
    while (k // TILE) % tiles:  # a program's tiles divide the row's
        tiles //= 2
    q = torch.empty(m, k, dtype=E4M3, device=x.device)
    if blockwise:
        s = torch.empty(triton.cdiv(m, TILE), k // TILE, dtype=torch.float32, device=x.device)
    else:
        s = torch.empty(k // TILE, m, dtype=torch.float32, device=x.device).t()
    grid = (triton.cdiv(m, rows), k // TILE // tiles)
    quantize_kernel[grid](x, q, s, m, x.stride(0), q.stride(0), s.stride(0), s.stride(1),
                          ROWS=rows, TILES=tiles, BLOCKWISE=blockwise, num_warps=warps)  # fmt: skip
    return q, s


# --8<-- [end:launch]


# --8<-- [start:reference]
def quantize_reference(x: torch.Tensor, blockwise: bool = False):
    """The same arithmetic in PyTorch: fp32, the same operations in the same order -- a multiply
    by fl(1/448) (what PyTorch on CUDA makes of dividing by a Python number) and an IEEE division
    by the scale (Triton's `/` is not one: div.full.f32; the kernel uses tl.div_rn)."""
    m, k = x.shape
    rows = TILE if blockwise else 1
    t = x.float()
    if m % rows:  # a last block of fewer rows: zeros do not change its largest magnitude
        t = torch.cat([t, t.new_zeros(rows - m % rows, k)])
    t = t.view(-1, rows, k // TILE, TILE)
    scale = t.abs().amax(dim=(1, 3)).clamp(min=TINY) * (1 / E4M3_MAX)  # [M / rows, K / 128]
    q = (t / scale[:, None, :, None]).to(E4M3).view(-1, k)[:m]
    return q, (scale if blockwise else scale.t().contiguous().t())


def dequantize(q: torch.Tensor, s: torch.Tensor, blockwise: bool = False, dtype=torch.float64):
    """The values q * s stands for."""
    rows = TILE if blockwise else 1
    per_element = s.to(dtype).repeat_interleave(rows, 0)[: q.shape[0]].repeat_interleave(TILE, 1)
    return q.to(dtype) * per_element


# --8<-- [end:reference]


# --8<-- [start:recipes]
RECIPES = ("bf16", "tensor", "row", "row_fast", "block")  # data keys; the page names them


def _scaled(t: torch.Tensor, dim=None):
    """One scale per tensor (dim None) or per row (dim 1): amax / 448."""
    t = t.float()
    amax = t.abs().amax() if dim is None else t.abs().amax(dim, keepdim=True)
    scale = amax.clamp(min=TINY) / E4M3_MAX
    return (t / scale).to(E4M3), scale


def operands(recipe: str, x: torch.Tensor, w: torch.Tensor):
    """y = x @ w.T as torch._scaled_mm's arguments (a, b, scale_a, scale_b): a [M, K] and b
    [K, N] in e4m3 (b column-major: w's rows), x ~ a * scale_a and w.T ~ b * scale_b."""
    if recipe == "tensor":
        (a, sa), (b, sb) = _scaled(x), _scaled(w)
    elif recipe in ("row", "row_fast"):
        (a, sa), (b, sb) = _scaled(x, 1), _scaled(w, 1)  # [M, 1] and [N, 1]
    elif recipe == "block":
        if x.shape[1] % (4 * TILE):  # cuBLASLt pads nothing here (pytorch/pytorch#166752)
            raise ValueError(f"block recipe: K = {x.shape[1]} must be a multiple of {4 * TILE}")
        (a, sa), (b, sb) = quantize(x), quantize(w, blockwise=True)  # [M, K/128], [N/128, K/128]
    else:
        raise ValueError(f"unknown FP8 recipe {recipe!r}; one of {RECIPES[1:]}")
    return a, b.t(), sa, sb.t()  # scale_b: [1, N] per row, [K/128, N/128] per block


def fp8_matmul(recipe: str, ops) -> torch.Tensor:
    """bf16 result of the FP8 GEMM; row_fast: without promoting partial sums to fp32."""
    a, b, sa, sb = ops
    return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                            use_fast_accum=recipe == "row_fast")  # fmt: skip


def exact_product(recipe: str, ops) -> torch.Tensor:
    """fp64 product of the values the FP8 operands stand for: what the GEMM should return
    before its own accumulation and the rounding of its output to bf16."""
    a, b, sa, sb = ops
    if recipe == "block":
        x, w = dequantize(a, sa), dequantize(b.t(), sb.t(), blockwise=True)
    else:
        x, w = a.double() * sa.double(), b.t().double() * sb.t().double()
    return x @ w.t()


# --8<-- [end:recipes]


# --8<-- [start:check]
def check_quantize(m, k, dtype, blockwise=False, seed=0):
    """The kernel's bytes and scales equal PyTorch's same arithmetic, and every value is
    within e4m3's rounding of x: 2^-4 relative for normal values (3 mantissa bits), half the
    subnormal step (2^-10) below 2^-6, times the scale; 2^-23 more for the fp32 quotient x / s."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, k)).to(DEVICE, dtype)
    q, s = quantize(x, blockwise)
    q_ref, s_ref = quantize_reference(x, blockwise)
    same = torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    error = (dequantize(q, s, blockwise) - x.double()).abs()
    step = torch.finfo(E4M3).smallest_normal * 2.0**-3 / 2  # half the subnormal step, 2^-10
    scales = dequantize(torch.ones_like(q), s, blockwise)  # each element's scale
    bound = (2.0**-4 + 2.0**-23) * x.double().abs() + step * scales
    return same and bool((error <= bound).all())


CASES = [(1, False), (70, False), (130, True)]  # (rows, blockwise): one row, odd, a partial block
print(all(check_quantize(m, 384, dtype, b) for dtype in CHECK_DTYPES for m, b in CASES))
#> True
# --8<-- [end:check]
