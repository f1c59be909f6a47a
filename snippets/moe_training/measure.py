"""Benchmark functions for the grouped GEMM (ours against a loop of matmuls, torch._grouped_mm
and one dense GEMM of the same FLOPs; bf16, forward and backward; FP8 with DeepSeek-V3's
block scaling) and the load-balancing experiment on the shared MoE's shape.

Functions only: bench_gpu.py runs them on the H200 with the clocks of snippets/common/bench.py,
which come in as arguments; the tests run them on the CPU at tiny shapes with stand-ins.
"""

from __future__ import annotations

from functools import partial

import torch

from snippets.common.bench import rate
from snippets.moe_training.fp8 import grouped_mm_fp8, quantize_blocks, quantize_rows
from snippets.moe_training.grouped_gemm import (
    group_offsets,
    grouped_linear,
    grouped_mm,
    grouped_mm_dw,
    grouped_mm_loop,
)


# --8<-- [start:skew]
def zipf_counts(rows: int, groups: int, s: float) -> list[int]:
    """Rows per expert when the r-th busiest expert gets a share proportional to 1 / r^s
    (s = 0: balanced); whole rows by largest remainder, so they sum to `rows` exactly."""
    weights = [1 / (r + 1) ** s for r in range(groups)]
    exact = [rows * w / sum(weights) for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(groups), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[: rows - sum(counts)]:
        counts[i] += 1
    return counts


# --8<-- [end:skew]


# --8<-- [start:cases]
IMPLS = ("ours", "loop", "torch_grouped_mm", "dense")
PASSES = ("forward", "backward")
PARTS = ("dw",)  # parts of the backward also timed alone (ours and torch._grouped_mm)


def grouped_mm_available(device) -> str | None:
    """Why torch._grouped_mm cannot run here, or None."""
    if not hasattr(torch, "_grouped_mm"):
        return "this torch has no torch._grouped_mm"
    try:
        x = torch.randn(32, 64, device=device, dtype=torch.bfloat16)
        w = torch.randn(2, 64, 32, device=device, dtype=torch.bfloat16)
        torch._grouped_mm(x, w, offs=torch.tensor([16, 32], device=device, dtype=torch.int32))
    except (RuntimeError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return None


def cases(counts: list[int], k: int, n: int, device, dtype, seed=0):
    """(forward, backward, parts) callables on one problem: x [M, K] sorted by expert, w
    [G, N, K]; the dense GEMM multiplies [M, K] by one [K, N] (the same FLOPs). parts: the dW
    alone, as each grouped implementation's backward computes it (torch's autograd calls
    torch._grouped_mm(dY^T, X, offs)); the backward minus it is the dX."""
    gen = torch.Generator(device=device).manual_seed(seed)
    m, g = sum(counts), len(counts)
    x = torch.randn(m, k, device=device, dtype=dtype, generator=gen).requires_grad_()
    w = (torch.randn(g, n, k, device=device, dtype=dtype, generator=gen) * k**-0.5).requires_grad_()
    dy = torch.randn(m, n, device=device, dtype=dtype, generator=gen)
    offsets = group_offsets(torch.tensor(counts, device=device))
    offs = offsets[1:].contiguous()  # torch._grouped_mm: the end of each group
    dense_w = w[0].detach().clone().requires_grad_()
    fwd = {
        "ours": lambda: grouped_mm(x, w, offsets),
        "loop": lambda: grouped_mm_loop(x, w, counts),
        "torch_grouped_mm": lambda: torch._grouped_mm(x, w.transpose(1, 2), offs=offs),
        "dense": lambda: x @ dense_w.t(),
    }
    out = {"ours": lambda: grouped_linear(x, w, offsets), **{k_: fwd[k_] for k_ in IMPLS[1:]}}

    def backward(name):
        y = out[name]()
        params = [x, dense_w] if name == "dense" else [x, w]
        return lambda: torch.autograd.grad(y, params, dy, retain_graph=True)

    xd = x.detach()
    parts = {
        "dw": {
            "ours": lambda: grouped_mm_dw(dy, xd, offsets),
            "torch_grouped_mm": lambda: torch._grouped_mm(dy.t(), xd, offs=offs),
        }
    }
    return fwd, {name: backward(name) for name in IMPLS}, parts


# --8<-- [end:cases]


# --8<-- [start:measure]
def grouped_jobs(skews, rows, experts, k, n, device, dtype, skip=()):
    """(callables, finish): finish(one Stat per callable) -> (rows, parts): one row per (skew,
    implementation, pass) with TFLOP/s, forward 2 M N K, backward (dX and dW) 4 M N K; parts
    the same for the dW alone (2 M N K), at the first skew only. Split so that the GPU run times
    these and the FP8 ones in one profiler session (it settles once)."""
    impls = [i for i in IMPLS if i not in skip]
    fns, keys = [], []
    for j, (name, s) in enumerate(skews.items()):
        counts = zipf_counts(rows, experts, s)
        fwd, bwd, parts = cases(counts, k, n, device, dtype)
        for pas, table, flops in (("forward", fwd, 2), ("backward", bwd, 4)):
            for impl in impls:
                if impl == "dense" and j > 0:  # one [M, K] x [K, N]: no groups, no skew
                    continue
                fns.append(table[impl])
                keys.append((name, s, impl, pas, flops * rows * n * k, counts))
        for pas in PARTS if j == 0 else ():
            for impl in (i for i in impls if i in parts[pas]):
                fns.append(parts[pas][impl])
                keys.append((name, s, impl, pas, 2 * rows * n * k, counts))

    def finish(stats):
        out = []
        for (name, s, impl, pas, flops, counts), stat in zip(keys, stats, strict=True):
            out.append({"skew": name, "zipf_s": s, "impl": impl, "pass": pas, "ms": stat,
                        "tflops": rate(flops, stat) / 1e12, "max_rows": max(counts),
                        "min_rows": min(counts)})  # fmt: skip
        return ([r for r in out if r["pass"] in PASSES], [r for r in out if r["pass"] in PARTS])

    return fns, finish


def measure_grouped(skews, rows, experts, k, n, device, dtype, times, skip=()):
    """grouped_jobs timed by `times` (callables in, one Stat each out: kernel_ms_each) ->
    (rows, parts)."""
    fns, finish = grouped_jobs(skews, rows, experts, k, n, device, dtype, skip)
    return finish(times(fns))


def ratios(rows):
    """Per (skew, pass): ours over each baseline (a Stat: interval arithmetic); the dense GEMM,
    measured at the first skew only, serves every skew."""
    at = {(r["skew"], r["pass"], r["impl"]): r["tflops"] for r in rows}
    dense = {pas: t for (_, pas, impl), t in at.items() if impl == "dense"}
    out = []
    for skew, pas, impl in list(at):
        if impl == "ours":
            row = {"skew": skew, "pass": pas}
            for base in IMPLS[1:]:
                have = at.get((skew, pas, base), dense.get(pas) if base == "dense" else None)
                if have is not None:
                    row[f"of_{base}"] = at[skew, pas, "ours"] / have
            out.append(row)
    return out


# --8<-- [end:measure]


# --8<-- [start:fp8]
def fp8_jobs(skews, rows, experts, k, n, device, base=torch.bfloat16):
    """(callables, finish) of FP8 (e4m3, 1x128 activation and 128x128 weight scales) against
    `base` (bf16; fp32 in the CPU interpreter, which mangles bf16), forward: TFLOP/s and the
    relative error (Frobenius) of each against the fp32 product of the base-precision inputs."""
    fns, keys = [], []
    for name, s in skews.items():
        counts = zipf_counts(rows, experts, s)
        gen = torch.Generator(device=device).manual_seed(1)
        x = torch.randn(rows, k, device=device, generator=gen).to(base)
        w = (torch.randn(experts, n, k, device=device, generator=gen) * k**-0.5).to(base)
        offsets = group_offsets(torch.tensor(counts, device=device))
        xq, xs = quantize_rows(x)
        wq, ws = quantize_blocks(w)
        exact = grouped_mm_loop(x.float(), w.float(), counts)
        for fmt, y in (("fp8", grouped_mm_fp8(xq, xs, wq, ws, offsets)),
                       ("base", grouped_mm(x, w, offsets))):  # fmt: skip
            keys.append((name, fmt, ((y.float() - exact).norm() / exact.norm()).item()))
        fns += [partial(grouped_mm_fp8, xq, xs, wq, ws, offsets),
                partial(grouped_mm, x, w, offsets)]  # fmt: skip

    def finish(stats):
        return [{"skew": name, "format": fmt, "ms": stat,
                 "tflops": rate(2 * rows * n * k, stat) / 1e12, "rel_error": err}
                for (name, fmt, err), stat in zip(keys, stats, strict=True)]  # fmt: skip

    return fns, finish


def measure_fp8(skews, rows, experts, k, n, device, times, base=torch.bfloat16):
    """fp8_jobs timed by `times`."""
    fns, finish = fp8_jobs(skews, rows, experts, k, n, device, base)
    return finish(times(fns))


# --8<-- [end:fp8]


def autotuned_configs(kernel, name: str, smallest: int = 512) -> list[dict]:
    """The config a Triton autotuner picked for each key (N, K, ...) it has tuned, for a
    record; keys with N or K under `smallest` (the tests' shapes: a fixed config) left out."""
    return [{"kernel": name, "n_k": f"{key[0]} × {key[1]}",
             "config": f"BM {c.kwargs['BM']}, BN {c.kwargs['BN']}, BK {c.kwargs['BK']}, "
                       f"{c.num_warps} warps, {c.num_stages} stages"
                       + {True: ", TMA", False: ", pointers"}.get(c.kwargs.get("TMA"), "")
                       + {2: ", TMA store", 0: ", masked store"}.get(c.kwargs.get("EPI"), "")}
            for key, c in sorted(kernel.cache.items(), key=str)
            if min(key[:2]) >= smallest]  # fmt: skip
