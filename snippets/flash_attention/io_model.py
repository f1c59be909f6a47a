"""FLOPs and HBM traffic of attention as functions: standard attention (S and P through HBM),
FlashAttention-1's tiling (Theorem 2's Theta(N^2 d^2 / M)), the FlashAttention-2 loop order of this
post's kernels, and the floor of touching every input and output once; arithmetic intensity, where
each crosses the H200 roofline (data/hardware.yaml), and figures of the FlashAttention papers
reproduced from their own inputs.

Counts are per (batch, head) unless a function takes batch and heads; bytes are HBM reads plus
writes; `elem` is the bytes of one element of Q, K, V, O and their gradients, statistics (m, l,
logsumexp, D) are fp32.
"""

import math

from snippets.common.hardware import load_hardware, ridge_point
from snippets.common.results import computed_result


# --8<-- [start:flops]
def attention_flops(n: int, d: int, heads: int = 1, batch: int = 1, causal: bool = False,
                    backward: bool = False) -> float:  # fmt: skip
    """The FlashAttention papers' count (FA2 §4.1, FA3 §4.1): 4 n^2 d per head for the forward
    (QK^T and PV, 2 n^2 d each); half of it with a causal mask; the backward 2.5 times the
    forward (5 matmuls, one of them recomputing S, against 2)."""
    flops = 4 * n * n * d * heads * batch
    if causal:
        flops /= 2
    return flops * 2.5 if backward else flops


MATMULS = {  # n x n x d matrix products in each pass
    "forward": 2,  # S = Q K^T, O = P V
    "backward, standard": 4,  # dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q (P read back)
    "backward, FlashAttention-2": 5,  # the same 4 and S recomputed (dQ by atomic adds)
    "backward, this post": 7,  # the dK/dV and the dQ kernels each recompute S and dP
}


# --8<-- [end:flops]


# --8<-- [start:io]
def standard_bytes(n: int, d: int, elem: int = 2) -> dict:
    """HBM traffic of standard attention (FA1 Algorithm 0 forward, Algorithm 3 backward): S and P
    written and read back. Forward: read Q, K, write S; read S, write P; read P, V, write O:
    4 n d + 4 n^2 elements. Backward: P, dO -> dV; dO, V -> dP; P, dP -> dS; dS, K -> dQ;
    dS, Q -> dK: 8 n d + 7 n^2."""
    return {"forward": (4 * n * d + 4 * n * n) * elem, "backward": (8 * n * d + 7 * n * n) * elem}


def fa1_bytes(n: int, d: int, sram_bytes: int, elem: int = 2) -> dict:
    """FlashAttention-1 (Algorithms 1 and 4): blocks of B_c = ceil(M / 4d) keys (M, the SRAM, in
    elements) in the outer loop, each a pass over all of Q and O (and dO, dQ). Forward: K, V once;
    T_c = ceil(n / B_c) passes reading Q, O, l, m and writing O, l, m. Backward: K, V read and
    dK, dV written once; per pass Q, O, dO, dQ, l, m read and dQ written. Theta(n^2 d^2 / M)."""
    block_c = math.ceil(sram_bytes / elem / (4 * d))
    passes = math.ceil(n / block_c)
    forward = 2 * n * d * elem + passes * (3 * n * d * elem + 4 * n * 4)
    backward = 4 * n * d * elem + passes * (5 * n * d * elem + 2 * n * 4)
    return {"forward": forward, "backward": backward, "block_c": block_c, "passes": passes}


def tiled_bytes(n: int, d: int, block: int = 128, elem: int = 2) -> dict:
    """FlashAttention-2's loop order, as this post's kernels run it, if nothing but the current
    block stays on chip: each block of `block` query rows reads all of K and V (forward, dQ
    kernel); each block of keys reads all of Q and dO (dK/dV kernel). Forward: Q read, O and the
    logsumexp written once, K and V n / block times. Backward: D = rowsum(dO o O); the dK/dV
    kernel reads K, V once and Q, dO, lse, D per key block, writes dK, dV; the dQ kernel reads Q,
    dO, lse, D once and K, V per query block, writes dQ."""
    t = math.ceil(n / block)
    forward = 2 * n * d * elem + 4 * n + t * 2 * n * d * elem
    delta = 2 * n * d * elem + 3 * 4 * n  # O, dO read; dlse read, D written
    dkdv = 4 * n * d * elem + t * (2 * n * d * elem + 2 * 4 * n)
    dq = 3 * n * d * elem + 2 * 4 * n + t * 2 * n * d * elem
    return {"forward": forward, "backward": delta + dkdv + dq}


def floor_bytes(n: int, d: int, elem: int = 2) -> dict:
    """Every input and output once. Forward: Q, K, V read, O and the logsumexp written.
    Backward: Q, K, V, O, dO read, dQ, dK, dV written, the logsumexp read and D written."""
    return {"forward": 4 * n * d * elem + 4 * n, "backward": 8 * n * d * elem + 8 * n}


# --8<-- [end:io]


# --8<-- [start:roofline]
def intensity(n, d, bytes_fn, pass_="forward", **kw) -> float:
    """FLOP per HBM byte of one (batch, head), non-causal, FLOPs by the papers' count."""
    flops = attention_flops(n, d, backward=pass_ == "backward")
    return flops / bytes_fn(n, d, **kw)[pass_]


def crossing(d, ridge, bytes_fn, pass_="forward", n_max=2**24, **kw):
    """The smallest sequence length whose intensity reaches `ridge` FLOP/B, or None when it stays
    below up to n_max (every count here rises with n towards a limit)."""
    if intensity(n_max, d, bytes_fn, pass_, **kw) < ridge:
        return None
    lo, hi = 1, n_max
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if intensity(mid, d, bytes_fn, pass_, **kw) >= ridge else (mid + 1, hi)
    return lo


# --8<-- [end:roofline]

# --8<-- [start:h200]
h200 = load_hardware()["h200-sxm"]
ridge = ridge_point(h200)  # FLOP per byte where bf16 peak meets HBM bandwidth
d, block = 128, 128  # head dim; query (and key) block of this post's kernels on the GPU
models = {"standard": (standard_bytes, {}), "tiled": (tiled_bytes, {"block": block}),
          "floor": (floor_bytes, {})}  # fmt: skip
rows = []
for n in (512, 1024, 2048, 4096, 8192, 16384):
    for model, (fn, kw) in models.items():
        for pass_ in ("forward", "backward"):
            i = intensity(n, d, fn, pass_, **kw)
            roof = min(h200.bf16_dense_tflops, i * h200.hbm_tb_per_s)  # TFLOP/s: TB/s x FLOP/B
            rows.append({"n": n, "model": model, "pass": pass_, "intensity": i,
                         "attainable_tflops": roof})  # fmt: skip
cross = {f"{model}_{pass_}": crossing(d, ridge, fn, pass_, **kw)
         for model, (fn, kw) in models.items() for pass_ in ("forward", "backward")}  # fmt: skip
print(f"ridge {ridge:.0f} FLOP/B")
#> ridge 206 FLOP/B
# the limits as n grows, 2-byte elements: forward d / 2 and 2 block / 2; backward (the papers'
# 2.5x FLOPs) 10 d / (7 x 2) over the 7 n^2 reads and writes of P, dP, dS, and about 2.5 block / 2
limits = {f"{m}_{p}": round(intensity(2**24, d, models[m][0], p, **models[m][1]))
          for m in ("standard", "tiled") for p in ("forward", "backward")}  # fmt: skip
print(limits)
#> {'standard_forward': 64, 'standard_backward': 91, 'tiled_forward': 128, 'tiled_backward': 159}
print([name for name, n in cross.items() if n is None])  # never reach the ridge
#> ['standard_forward', 'standard_backward', 'tiled_forward', 'tiled_backward']
print(cross["floor_forward"], cross["floor_backward"])  # shortest lengths that do
#> 414 332
# --8<-- [end:h200]

# --8<-- [start:fa1]
# FA1 Fig. 2 (left): GPT-2 medium, n 1024, d 64, 16 heads, batch 64, A100; fp16. M: the A100's
# 192 KB of SRAM per SM (FA1 §2.1). Traffic of all 1024 heads, forward + backward, in GB.
heads = 16 * 64
std = standard_bytes(1024, 64)
fa1 = fa1_bytes(1024, 64, 192 * 1024)
std_gb = heads * (std["forward"] + std["backward"]) / 1e9
fa1_gb = heads * (fa1["forward"] + fa1["backward"]) / 1e9
passes = f"B_c = {fa1['block_c']}, {fa1['passes']} passes"
print(f"{passes}: standard {std_gb:.1f} GB, FA1 {fa1_gb:.1f} GB")
#> B_c = 384, 3 passes: standard 25.2 GB, FA1 4.1 GB
# Theorem 2: traffic ~ 1 / M once n d^2 / M dominates; at n = 16384 doubling M nearly halves it
traffic = [fa1_bytes(16384, 64, m * 1024)["forward"] for m in (96, 192, 384)]
print([round(traffic[i] / traffic[i + 1], 2) for i in range(2)])
#> [1.99, 1.93]
matmul_gflops = heads * 12 * 1024**2 * 64 / 1e9  # 2 forward + 4 backward matmuls of 2 n^2 d
print(f"{matmul_gflops:.0f} GFLOP of matmuls for the caption's workload")
#> 825 GFLOP of matmuls for the caption's workload
# --8<-- [end:fa1]

# --8<-- [start:papers]
a100, h100 = load_hardware()["a100-sxm-80gb"], load_hardware()["h100-sxm"]
# FA2 §3.1: 312 TFLOP/s of bf16 matmul against 19.5 of non-matmul fp32 on the A100
print(f"non-matmul FLOP costs {a100.bf16_dense_tflops / a100.fp32_tflops:.0f}x a matmul FLOP")
#> non-matmul FLOP costs 16x a matmul FLOP
# FA3 §3.1 and its footnote 5: 16 special-function ops per SM per clock, 132 SMs, 1830 MHz
sfu_tflops = 16 * h100.sms * 1.83e9 / 1e12
matmul_per_exp = 4 * 128  # head dim 128: QK^T and PV are 2 d FLOP each per score, one exp
exp_share = (1 / sfu_tflops) / (matmul_per_exp / h100.bf16_dense_tflops)
peak_ratio = h100.bf16_dense_tflops / sfu_tflops
print(f"{sfu_tflops:.1f} TFLOPS exp; {matmul_per_exp}x the FLOPs, {peak_ratio:.0f}x the rate")
#> 3.9 TFLOPS exp; 512x the FLOPs, 256x the rate
print(f"exp takes {exp_share:.0%} of the matmuls' time")
#> exp takes 50% of the matmuls' time
# FA3 Table 2: batch 4, seqlen 8448, 16 heads, head dim 128, non-causal, forward; times in ms
flops = attention_flops(8448, 128, heads=16, batch=4)
table2 = {"FlashAttention-3": 3.538, "no pipelining, warp-specialized": 4.021,
          "pipelining, no warp specialization": 4.105}  # fmt: skip
print([round(flops / (ms * 1e-3) / 1e12) for ms in table2.values()])
#> [661, 582, 570]
# utilization: FA2's 225 TFLOP/s per A100 training GPT models end to end (abstract, Table 1:
# model FLOPs, attention and the rest), FA3's 740 of its forward kernel on the H100 (abstract)
print(f"{225 / a100.bf16_dense_tflops:.0%} {740 / h100.bf16_dense_tflops:.0%}")
#> 72% 75%
# --8<-- [end:papers]

computed_result(
    "flash-attention",
    "io",
    {
        "ridge_flop_per_byte": ridge,
        "hbm_tb_s": h200.hbm_tb_per_s,
        "bf16_tflops": h200.bf16_dense_tflops,
        "head_dim": d,
        "block": block,
        "floor_forward_cross": cross["floor_forward"],
        "floor_backward_cross": cross["floor_backward"],
        "rows": rows,
        "fa1_gpt2": {"standard_gb": std_gb, "fa1_gb": fa1_gb, "block_c": fa1["block_c"]},
        "fa3_exp_share": exp_share,
    },
)
