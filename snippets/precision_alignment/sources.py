"""Sources of numerical difference that need no kernel: reduction order, accumulation dtype,
TF32, RoPE tables in low precision, epsilon placement, arrival order of atomic adds.

These demos run on the CPU on inputs made by integer arithmetic, and use only elementwise
+, -, * and roundings between IEEE 754 formats, which are correctly rounded everywhere, so the
numbers they print are the same on any machine (the GPU-only measurements are functions here,
called from gated code).
"""

import math
from contextlib import contextmanager

import torch

from snippets.common.models.qwen3 import QWEN3_8B, rope_tables
from snippets.precision_alignment.metrics import ulp_distance
from snippets.triton_kernels.numerics import U, gamma, unit_roundoff


# --8<-- [start:inputs]
def hashed_uniform(n: int, seed: int = 0) -> torch.Tensor:
    """n numbers in [-1, 1) from an integer hash: each is k / 2^23 with |k| < 2^23, exact in
    fp32, and the same on every machine and torch version (no RNG implementation involved)."""
    h = (torch.arange(n, dtype=torch.int64) + seed * 0x9E3779B9) & 0xFFFFFFFF
    for _ in range(2):
        h = ((h >> 16) ^ h) * 0x45D9F3B & 0xFFFFFFFF
    h = (h >> 16) ^ h
    return ((h & 0xFFFFFF) - 2**23).double() / 2**23


# --8<-- [end:inputs]


# --8<-- [start:order]
def sequential_sum(x):
    """Left to right: n - 1 additions, each rounded (Higham 2002, §4.2: error <= gamma_{n-1})."""
    acc = x[0].clone()
    for v in x[1:]:
        acc = acc + v
    return acc


def pairwise_sum(x):
    """A balanced tree: ceil(log2 n) levels of roundings (error <= gamma_{ceil(log2 n)})."""
    while x.numel() > 1:
        if x.numel() % 2:
            x = torch.cat([x, x.new_zeros(1)])  # + 0 is exact
        x = x[0::2] + x[1::2]
    return x[0]


def split_sum(x, blocks: int, order=None):
    """What a GPU reduction does: `blocks` programs each sum a contiguous chunk left to right,
    then the partial sums are added one by one in `order` (program order by default; with
    atomic adds, the order in which the programs happen to finish)."""
    parts = x.view(blocks, -1)
    acc = parts[:, 0].clone()
    for j in range(1, parts.shape[1]):
        acc = acc + parts[:, j]  # all programs at once, each left to right
    order = list(range(blocks)) if order is None else order
    total = acc[order[0]]
    for k in order[1:]:
        total = total + acc[k]
    return total


# --8<-- [end:order]


# --8<-- [start:order_demo]
n = 4096
terms = (hashed_uniform(n) ** 2).float()  # squares: the sum inside RMSNorm over H = 4096
exact = terms.double().sum()  # fp64 stands in for exact (its u is 2^-29 times fp32's)
scale = U * terms.double().abs().sum()  # errors in units of u * sum|x|
sums = {
    "sequential": sequential_sum(terms),
    "pairwise": pairwise_sum(terms),
    "64 blocks": split_sum(terms, 64),
}
bounds = {"sequential": n - 1, "pairwise": math.ceil(math.log2(n)), "64 blocks": 63 + 63}
for name, s in sums.items():
    err = ((s.double() - exact).abs() / scale).item()
    ulps = ulp_distance(s, sums["sequential"]).item()
    print(f"{name}: {err:.2f} u sum|x| (bound {bounds[name]}), {ulps} ULP from sequential")
    #> sequential: 31.26 u sum|x| (bound 4095), 0 ULP from sequential
    #> pairwise: 0.81 u sum|x| (bound 12), 20 ULP from sequential
    #> 64 blocks: 0.71 u sum|x| (bound 126), 21 ULP from sequential
# --8<-- [end:order_demo]


# --8<-- [start:accumulate]
def accumulate(terms, dtype):
    """Left-to-right sum whose running total is stored in `dtype` after every addition
    (terms are rounded to `dtype` first, as a kernel with a `dtype` accumulator does)."""
    acc = torch.zeros((), dtype=dtype)
    for t in terms.to(dtype):
        acc = acc + t
    return acc


ones = torch.ones(4096)
print([accumulate(ones, dt).item() for dt in (torch.bfloat16, torch.float16, torch.float32)])
#> [256.0, 2048.0, 4096.0]
grads = (0.25 + 0.5 * hashed_uniform(4096, seed=1)).float()  # dW terms with a common sign
exact = grads.double().sum()
for dt in (torch.bfloat16, torch.float16, torch.float32):
    rel = ((accumulate(grads, dt).double() - exact).abs() / exact).item()
    print(f"{str(dt)[6:]}: relative error {rel:.1e}, {rel / unit_roundoff(dt):.0f} u")
    #> bfloat16: relative error 7.5e-01, 192 u
    #> float16: relative error 1.2e-02, 24 u
    #> float32: relative error 1.1e-07, 2 u
# --8<-- [end:accumulate]


# --8<-- [start:tf32]
def tf32_inputs(x):
    """What a TF32 Tensor Core reads of an fp32 number: the top 10 of its 23 stored mantissa
    bits (PyTorch's numerical-accuracy note). Dropping the other 13 is a relative change of
    at most 2^-10, so the bound below also covers hardware that rounds instead."""
    return (x.float().view(torch.int32) & ~0x1FFF).view(torch.float32)


def matmul_bound(a, b, u_in):
    """|C~ - C| <= (2 u_in + u_in^2 + gamma_K) |A||B|: each input off by u_in relative, each
    product exact, a K-term sum in fp32 (Higham 2002, §3.5)."""
    k = a.shape[1]
    return (2 * u_in + u_in**2 + gamma(k)) * (a.double().abs() @ b.double().abs())


@contextmanager
def fp32_matmul(precision: str):
    """Run a block with CUDA fp32 matmuls in "ieee" or "tf32" (the PyTorch >= 2.9 setting),
    restoring the previous value; the old and new TF32 APIs must not be mixed."""
    cfg = torch.backends.cuda.matmul
    old, cfg.fp32_precision = cfg.fp32_precision, precision
    try:
        yield
    finally:
        cfg.fp32_precision = old


def matmul_errors(device, m=256, k=4096, n=256) -> dict:
    """Max error / (|A||B|) of an fp32 matmul computed with 'ieee' and with 'tf32'."""
    a = hashed_uniform(m * k, seed=2).view(m, k).float().to(device)
    b = hashed_uniform(k * n, seed=3).view(k, n).float().to(device)
    exact = a.double() @ b.double()
    mag = a.double().abs() @ b.double().abs()
    out = {}
    for precision in ("ieee", "tf32"):
        with fp32_matmul(precision):
            out[precision] = ((a @ b).double() - exact).abs().div(mag).max().item()
    return out


# --8<-- [end:tf32]


# --8<-- [start:tf32_demo]
print(torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32)
#> highest False
a = hashed_uniform(64 * 512, seed=2).view(64, 512).float()
b = hashed_uniform(512 * 64, seed=3).view(512, 64).float()
exact = a.double() @ b.double()
emulated = (tf32_inputs(a).double() @ tf32_inputs(b).double()).float()  # one rounding at the end
fp32 = a @ b  # the CPU computes fp32 matmuls in fp32
print(
    bool(((emulated.double() - exact).abs() <= matmul_bound(a, b, 2.0**-10)).all()),
    bool(((fp32.double() - exact).abs() <= matmul_bound(a, b, 0.0)).all()),
    bool((emulated.double() - exact).abs().max() > 100 * (fp32.double() - exact).abs().max()),
)
#> True True True
# --8<-- [end:tf32_demo]


# --8<-- [start:rope]
def rope_table_low_precision(seq: int, dim: int, theta: float, dtype):
    """The bug: positions, inverse frequencies and their product all in `dtype`."""
    inv_freq = (1.0 / theta ** (torch.arange(0, dim, 2).float() / dim)).to(dtype)
    angles = torch.outer(torch.arange(seq).to(dtype), inv_freq)  # rounded to dtype
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def rope_exact(seq: int, dim: int, theta: float):
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    emb = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((emb, emb), dim=-1)
    return emb.cos(), emb


# --8<-- [end:rope]


# --8<-- [start:rope_demo]
seq, dim, theta = 4096, QWEN3_8B.head_dim, QWEN3_8B.rope_theta
cos_exact, angles = rope_exact(seq, dim, theta)
cos32, _ = rope_tables(QWEN3_8B, seq)  # the model: fp32 table (cast to bf16 by the attention)
cos_bf16_bug, _ = rope_table_low_precision(seq, dim, theta, torch.bfloat16)
# fp32: pow, division and the product each off by <= u in the angle, cos/sin add <= 2u
bound32 = 4 * U * angles + 2 * U
err32 = (cos32.double() - cos_exact).abs()
err_cast = (cos32.to(torch.bfloat16).double() - cos_exact).abs()
err_bug = (cos_bf16_bug.double() - cos_exact).abs()
print(bool((err32 <= bound32).all()), bool((err_cast <= bound32 + 2.0**-8).all()))
#> True True
print(err_bug.max().item() > 1, int((err_bug > 0.01).any(-1).nonzero()[0]))  # first bad position
#> True 6
# --8<-- [end:rope_demo]


# --8<-- [start:eps]
def rms_scale(x, eps, inside=True):
    """1 / rms(x) with eps inside the root (Qwen3, Llama) or added to the rms outside it."""
    ms = x.pow(2).mean(-1)
    return torch.rsqrt(ms + eps) if inside else 1 / (ms.sqrt() + eps)


for rms in (1.0, 1e-3):
    x = torch.full((128,), rms, dtype=torch.float64)
    ref = rms_scale(x, 1e-6)
    other_eps = (rms_scale(x, 1e-5) / ref - 1).abs().item()  # another model's eps value
    outside = (rms_scale(x, 1e-6, inside=False) / ref - 1).abs().item()
    print(f"rms {rms:g}: eps 1e-5 not 1e-6 {other_eps:.1e}, eps outside the root {outside:.1e}")
    #> rms 1: eps 1e-5 not 1e-6 4.5e-06, eps outside the root 5.0e-07
    #> rms 0.001: eps 1e-5 not 1e-6 5.7e-01, eps outside the root 4.1e-01
# --8<-- [end:eps]


# --8<-- [start:atomics]
partials_order = [hashed_uniform(64, seed=s).argsort().tolist() for s in range(16)]
totals = [split_sum(terms, 64, order) for order in partials_order]  # 16 arrival orders
distinct = {t.item() for t in totals}
exact = terms.double().sum()
worst = max((t.double() - exact).abs().item() for t in totals)
print(len(distinct) > 1, worst <= gamma(126) * terms.double().abs().sum().item())
#> True True


def index_add_distinct(device, deterministic: bool, runs: int = 8, n: int = 1 << 20) -> int:
    """How many different results `runs` identical index_add_ calls give (n values into 64
    bins); CUDA implements it with atomic adds unless deterministic algorithms are on."""
    src = hashed_uniform(n, seed=4).float().to(device)
    index = torch.arange(n, device=device) % 64
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        outs = [torch.zeros(64, device=device).index_add_(0, index, src) for _ in range(runs)]
    finally:
        torch.use_deterministic_algorithms(before)
    return len({o.cpu().numpy().tobytes() for o in outs})


# --8<-- [end:atomics]
