"""Measure one Qwen3 layer: per-operator times, a profiler breakdown, and fusion headroom.

Functions only; bench_gpu.py runs them on the H200 at Qwen3-8B shapes. They also run on the
CPU at the TINY shapes (tests/snippets/test_qwen3_fusion.py), with a stand-in timer.
Every time is a Stat (median and range of repeats, snippets/common/results.py); derived
figures (rates, fractions) are Stat arithmetic and keep the range.
"""

import re

import torch
import torch.nn.functional as F

from snippets.common.bench import REPEATS, kernel_ms_by, rate
from snippets.common.models.qwen3 import (
    DecoderLayer,
    Kernels,
    RMSNorm,
    apply_rope,
    rope_tables,
    swiglu,
)
from snippets.common.results import Stat
from snippets.qwen3_fusion.accounting import BYTES, layer_ops


# --8<-- [start:runners]
def _leaf(*shape, device, dtype, scale=1.0):
    return (torch.randn(*shape, device=device, dtype=dtype) * scale).requires_grad_()


def op_runners(cfg, batch, seq, device, dtype):
    """{op name: (forward, backward)} callables for every operator of layer_ops, same shapes."""
    t, h, i = batch * seq, cfg.hidden_size, cfg.intermediate_size
    d, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    kw = {"device": device, "dtype": dtype}

    def pair(fn, *inputs):
        out = fn(*inputs)
        params = list(fn.parameters()) if isinstance(fn, torch.nn.Module) else []
        leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad] + params
        outs = out if isinstance(out, tuple) else (out,)
        grads = [torch.randn_like(o) for o in outs]
        return (lambda: fn(*inputs)), (
            lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True)
        )

    def linear(k, n):
        return pair(F.linear, _leaf(t, k, **kw), _leaf(n, k, scale=k**-0.5, **kw))

    def norm(rows, dim):  # backward: dx and dw
        return pair(RMSNorm(dim, cfg.rms_norm_eps).to(**kw), _leaf(rows, dim, **kw))

    cos, sin = (x.to(dtype) for x in rope_tables(cfg, seq, device))
    q, k = _leaf(batch, nq, seq, d, **kw), _leaf(batch, nkv, seq, d, **kw)
    v = _leaf(batch, nkv, seq, d, **kw)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    return {
        "input_layernorm": norm(t, h),
        "q_proj": linear(h, nq * d),
        "k_proj": linear(h, nkv * d),
        "v_proj": linear(h, nkv * d),
        "q_norm + k_norm": norm(t * (nq + nkv), d),
        "rope (q, k)": pair(lambda q, k: apply_rope(q, k, cos, sin), q, k),
        "attention": pair(sdpa, q, k, v),
        "o_proj": linear(nq * d, h),
        "residual add": pair(torch.add, _leaf(t, h, **kw), _leaf(t, h, **kw)),
        "post_attention_layernorm": norm(t, h),
        "gate_proj": linear(h, i),
        "up_proj": linear(h, i),
        "silu(gate) * up": pair(swiglu, _leaf(t, i, **kw), _leaf(t, i, **kw)),
        "down_proj": linear(i, h),
    }


# --8<-- [end:runners]


# --8<-- [start:per_op]
def op_key(name: str) -> str:
    """An operator's name as a results key: "q_norm + k_norm" -> q_norm_k_norm."""
    return re.sub(r"\W+", "_", name).strip("_")


FIRST = ("matmul", "attention")  # the kinds that draw the most power, timed first, in this order


def per_op_table(cfg, batch, seq, device, dtype, timer, ceilings):
    """One row per operator of layer_ops (the two identical residual adds once): timer(fns,
    kinds) -> one Stat per callable, of each forward and backward, against the accounting.
    The callables come grouped by kind: the matmuls first, then attention, then the memory-bound
    rest, so that the power-hungry ones run one after another. An identity
    backward launches no kernel of its own: its time and bandwidth are None."""
    runners = op_runners(cfg, batch, seq, device, dtype)
    copy = ceilings["copy_bytes_per_s"]
    ops, seen = [], set()
    for fwd_op, bwd_op in layer_ops(cfg, batch, seq):
        if op_key(fwd_op.name) not in seen:
            seen.add(op_key(fwd_op.name))
            ops.append((fwd_op, bwd_op))
    timed = [(runners[f.name][0], f) for f, _ in ops]
    timed += [(runners[f.name][1], b) for f, b in ops if b.bytes]
    timed.sort(key=lambda t: FIRST.index(t[1].kind) if t[1].kind in FIRST else len(FIRST))
    stats = timer([fn for fn, _ in timed], [op.kind for _, op in timed])
    stats = dict(zip((id(op) for _, op in timed), stats, strict=True))
    rows = []
    for fwd_op, bwd_op in ops:
        t_fwd, t_bwd = stats[id(fwd_op)], stats.get(id(bwd_op))
        rows.append(
            {
                "idx": len(rows) + 1,
                "op": op_key(fwd_op.name),
                "kind": fwd_op.kind,
                "intensity": fwd_op.intensity,
                "fwd_ms": t_fwd,
                "bwd_ms": t_bwd,
                "fwd_tflops": rate(fwd_op.flops, t_fwd) / 1e12,
                "fwd_of_copy": rate(fwd_op.bytes, t_fwd) / copy,
                "bwd_of_copy": rate(bwd_op.bytes, t_bwd) / copy if t_bwd is not None else None,
            }
        )
    return rows


# --8<-- [end:per_op]


# --8<-- [start:profile]
CLASSES = ("matmul", "attention", "memory")  # memory: elementwise, reductions, casts, copies


def kernel_class(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa", "attn")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "sm90")):
        return "matmul"
    return "memory"


def profile_step(step, repeats=REPEATS, calls=4, settle_ms=1000.0):
    """Per kernel class: kernels launched per step, and their time per step as a Stat over
    `repeats` repeats of `calls` steps (kernel_ms_by: kernel durations summed by class; one
    step a repeat left the attention kernels' sum ±9.5 %), with its share of the step's time.
    settle_ms: untimed steps in the profiler session first (unsettled, at 733fb02, the
    attention kernels' sum spread ±5.2 %: 1.875-2.014 ms; the profiler's start idles the GPU,
    and a matmul's first repeats after it ran about 10 % fast: kernel_ms_each)."""
    by = kernel_ms_by(step, kernel_class, repeats=repeats, calls=calls, settle_ms=settle_ms)
    none = {"ms": Stat.of([0.0] * repeats, "gpu-kernels"), "kernels": 0}
    times = {c: by.get(c, none) for c in CLASSES}
    total = sum(t["ms"] for t in times.values())
    return [
        {"class": c, "kernels": int(times[c]["kernels"]), "ms": times[c]["ms"],
         "share": times[c]["ms"] / total}
        for c in CLASSES
    ]  # fmt: skip


def layer_step(cfg, batch, seq, device, dtype):
    """One forward and backward of a decoder layer (eager), on random data."""
    torch.manual_seed(0)
    layer = DecoderLayer(cfg, Kernels()).to(device, dtype)
    x = _leaf(batch, seq, cfg.hidden_size, device=device, dtype=dtype)
    cos, sin = rope_tables(cfg, seq, device)
    dy = torch.randn_like(x)

    def step():
        layer(x, cos, sin).backward(dy)

    return step


# --8<-- [end:profile]


# --8<-- [start:candidates]
def fusion_candidates(cfg, batch, seq, ops: dict, copy_bytes_per_s, layer_ms):
    """Per fusion: the measured eager time of the group it replaces (forward + backward, per
    layer), the time the fused kernel needs at copy bandwidth to read its inputs and write its
    outputs once (its floor), the floor as a fraction of eager, and eager as a fraction of the
    layer's kernel time. Ranked by the most a fusion can save, eager minus floor."""
    t, h, i = batch * seq, cfg.hidden_size, cfg.intermediate_size
    qk = t * (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim

    def ms(*names):  # an identity backward (the residual add) has no time of its own
        return sum(ops[n]["fwd_ms"] + (ops[n]["bwd_ms"] or 0) for n in names)

    groups = [
        # (key, eager group, times per layer, fused bytes fwd + bwd)
        ("rmsnorm", ["input_layernorm"], 2, BYTES * (2 * t * h + 3 * t * h)),
        (
            "add_rmsnorm",
            ["residual_add", "input_layernorm"],
            2,
            BYTES * (4 * t * h + 4 * t * h),  # fwd: x, r in; sum, y out. bwd: dy, ds, s in; ds out
        ),
        ("qk_norm_rope", ["q_norm_k_norm", "rope_q_k"], 1, BYTES * (2 * qk + 3 * qk)),
        ("swiglu", ["silu_gate_up"], 1, BYTES * (3 * t * i + 5 * t * i)),
    ]
    rows = []
    for key, members, per_layer, fused_bytes in groups:
        eager = per_layer * ms(*members)
        floor = per_layer * fused_bytes / copy_bytes_per_s * 1e3
        rows.append(
            {
                "fusion": key,
                "eager_ms": eager,
                "floor_ms": floor,
                "floor_of_eager": floor / eager,
                "eager_of_layer": eager / layer_ms,
            }
        )
    saving = {r["fusion"]: r["eager_ms"] - r["floor_ms"] for r in rows}  # ranks; not stored
    return sorted(rows, key=lambda r: -getattr(saving[r["fusion"]], "median", saving[r["fusion"]]))


# --8<-- [end:candidates]
