"""Benchmark functions for the paged decode kernel: the byte model and the measurement of ours
(bf16 and FP8 caches) against scaled_dot_product_attention on a contiguous cache.

Functions only; bench_gpu.py runs them on the GPU with kernel_ms_each (snippets/common/bench.py),
which comes in as an argument: on the CPU they run at tiny shapes with a stand-in clock
(tests/snippets/test_kv_cache.py).
"""

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton

from snippets.common.bench import rate
from snippets.kv_cache.paged_attention import (
    launch_config,
    paged_decode,
    quantize_fp8,
    sm_count,
    split_plan,
)


# --8<-- [start:bytes]
@dataclass(frozen=True)
class Heads:
    q: int
    kv: int
    dim: int

    @classmethod
    def of(cls, cfg: dict) -> "Heads":
        """From a Hugging Face-style config (no num_key_value_heads: MHA; no head_dim:
        hidden_size / num_attention_heads)."""
        q = cfg["num_attention_heads"]
        dim = cfg.get("head_dim") or cfg["hidden_size"] // q
        return cls(q, cfg.get("num_key_value_heads", q), dim)


SCALE_BYTES = 4  # FP8 cache: one float32 scale per token and KV head, for K and for V


def decode_bytes(lens, heads: Heads, block_size=16, elem=2, kv_elem=2, scale_bytes=0, paged=True):
    """Bytes one decode-attention call must move: every cached K and V element of each sequence
    read once (kv_elem bytes, plus scale_bytes per token and KV head for each of K and V), q read
    and the output written once (elem bytes), and, for a paged cache, the block-table entries
    the lengths need and the lengths themselves (int32)."""
    tokens = sum(lens)
    kv = 2 * tokens * heads.kv * (heads.dim * kv_elem + scale_bytes)
    q_and_out = 2 * len(lens) * heads.q * heads.dim * elem
    table = 4 * (sum(triton.cdiv(n, block_size) for n in lens) + len(lens)) if paged else 0
    return kv + q_and_out + table


# --8<-- [end:bytes]


# --8<-- [start:measure]
def decode_case(batch, context, heads: Heads, block_size, device, dtype, gen):
    """One layer's inputs at equal lengths: q, a bf16 paged cache on a shuffled block table, the
    same cache in FP8 with its scales, and the same K/V as a contiguous [batch, kv, context, D]
    cache for SDPA. Returns three callables: ours (bf16), ours (FP8), SDPA."""
    pages = triton.cdiv(context, block_size)
    shape = (batch * pages, block_size, heads.kv, heads.dim)
    q = torch.randn(batch, heads.q, heads.dim, device=device, generator=gen, dtype=dtype)
    k, v = (torch.randn(shape, device=device, generator=gen, dtype=dtype) for _ in range(2))
    perm = torch.randperm(batch * pages, device=device, generator=gen)
    table = perm.view(batch, pages).to(torch.int32)  # blocks scattered, as after many requests
    lens = torch.full((batch,), context, device=device, dtype=torch.int32)
    fp8 = []
    for cache in (k, v):  # quantized in slices: a float32 copy of a large cache would not fit
        parts = [quantize_fp8(c) for c in cache.split(4096)]
        fp8 += [torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])]
    k8, ks, v8, vs = fp8

    def dense(cache):  # [batch, kv_heads, context, D], the same values in token order
        full = cache[table.long()].view(batch, pages * block_size, heads.kv, heads.dim)
        return full[:, :context].transpose(1, 2).contiguous()

    kd, vd, q4 = dense(k), dense(v), q[:, :, None, :]
    return (
        lambda: paged_decode(q, k, v, table, lens, context),
        lambda: paged_decode(q, k8, v8, table, lens, context, k_scale=ks, v_scale=vs),
        lambda: F.scaled_dot_product_attention(q4, kd, vd, enable_gqa=True),
    )


def cache_bytes(batch, context, heads: Heads, block_size=16, elem=2) -> int:
    """Memory of one case: the paged cache, its FP8 copy with scales, the contiguous copy."""
    tokens = batch * triton.cdiv(context, block_size) * block_size
    per_token = 2 * heads.kv * (heads.dim * (2 * elem + 1) + SCALE_BYTES)
    return tokens * per_token


def cycling(fns):
    """One callable that calls fns in turn: each call reads the next copy (the next layer)."""
    it = itertools.cycle(fns)
    return lambda: next(it)()


def measure(shapes, heads: Heads, device, dtype, kernel_times, copy_bytes_per_s, *,
            block_size=16, rotate_bytes=0, max_cache_bytes=40 * 2**30, seed=0):  # fmt: skip
    """One row per (batch, context) whose cache fits in max_cache_bytes: kernel time of ours on
    the bf16 and the FP8 cache and of SDPA on a contiguous cache (kernel_times: kernel_ms_each on
    the GPU, callables in, one Stat each out), each as a fraction of the copy bandwidth by its
    own byte model, the FP8 speed-up and ours relative to SDPA (sdpa_ms / ours_ms: >= 1 when
    ours is faster). A real decode step runs every layer's attention on that layer's own cache,
    so a layer's cache is not in L2 when it is read: calls cycle through enough copies of the
    inputs (separate layers) that together they hold at least rotate_bytes. Shapes are timed in
    groups that together fit in max_cache_bytes, one kernel_times call (one profiler session
    on the GPU) per group."""
    elem = torch.finfo(dtype).bits // 8
    gen = torch.Generator(device=device).manual_seed(seed)
    groups, used = [[]], 0
    for batch, context in shapes:
        lens = [context] * batch
        copies = max(1, math.ceil(rotate_bytes / decode_bytes(lens, heads, block_size, elem, elem)))
        need = copies * cache_bytes(batch, context, heads, block_size, elem)
        if need > max_cache_bytes:
            continue
        if used + need > max_cache_bytes:
            groups, used = [*groups, []], 0
        groups[-1].append((batch, context, copies))
        used += need
    rows = []
    for group in filter(None, groups):
        fns = []  # ours, FP8, SDPA of each shape
        for batch, context, copies in group:
            cases = [decode_case(batch, context, heads, block_size, device, dtype, gen)
                     for _ in range(copies)]  # fmt: skip
            fns += [cycling(f) for f in zip(*cases, strict=True)]
        times = iter(kernel_times(fns))
        del fns, cases  # this group's caches, before the next group's are made
        for batch, context, _ in group:
            lens = [context] * batch
            ours_bytes = decode_bytes(lens, heads, block_size, elem, elem)
            fp8_bytes = decode_bytes(lens, heads, block_size, elem, 1, SCALE_BYTES)
            sdpa_bytes = decode_bytes(lens, heads, block_size, elem, elem, paged=False)
            ours, fp8, sdpa = next(times), next(times), next(times)
            sms = sm_count(device)
            tile = launch_config(batch, heads.kv, False, sms)[0]
            rows.append({
                "batch": batch, "context": context,
                "splits": split_plan(batch, heads.kv, context, tile, sms)[1], "tile": tile,
                "fp8_tile": launch_config(batch, heads.kv, True, sms)[0],
                "ours_ms": ours, "ours_of_copy": rate(ours_bytes, ours) / copy_bytes_per_s,
                "fp8_ms": fp8, "fp8_of_copy": rate(fp8_bytes, fp8) / copy_bytes_per_s,
                "fp8_speedup": ours / fp8,
                "sdpa_ms": sdpa, "sdpa_of_copy": rate(sdpa_bytes, sdpa) / copy_bytes_per_s,
                "vs_sdpa": sdpa / ours,
            })  # fmt: skip
    return rows


# --8<-- [end:measure]
