"""Measure one Qwen3 layer: per-operator times, a profiler breakdown, and fusion headroom.

Functions only; bench_gpu.py runs them on the H200 at Qwen3-8B shapes. They also run on the
CPU at the TINY shapes (tests/snippets/test_qwen3_fusion.py), with a stand-in timer.
"""

import torch
import torch.nn.functional as F
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from snippets.qwen3_fusion.accounting import BYTES, layer_ops
from snippets.qwen3_fusion.model import (
    DecoderLayer,
    Kernels,
    RMSNorm,
    apply_rope,
    rope_tables,
    swiglu,
)


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
def per_op_table(cfg, batch, seq, device, dtype, timer, ceilings):
    """One row per operator: measured forward/backward time against the accounting."""
    runners = op_runners(cfg, batch, seq, device, dtype)
    rows = []
    for idx, (fwd_op, bwd_op) in enumerate(layer_ops(cfg, batch, seq), 1):
        fwd, bwd = runners[fwd_op.name]
        t_fwd, t_bwd = timer(fwd)["median"], timer(bwd)["median"]
        rows.append(
            {
                "idx": idx,
                "op": fwd_op.name,
                "kind": fwd_op.kind,
                "intensity": fwd_op.intensity,
                "fwd_ms": t_fwd,
                "bwd_ms": t_bwd,
                "fwd_tflops": fwd_op.flops / t_fwd / 1e9,
                "fwd_tb_s": fwd_op.bytes / t_fwd / 1e9,
                "fwd_of_copy": fwd_op.bytes / t_fwd * 1e3 / ceilings["copy_bytes_per_s"],
                "bwd_of_copy": (bwd_op.bytes / t_bwd * 1e3 / ceilings["copy_bytes_per_s"])
                if bwd_op.bytes
                else None,  # an identity backward moves no bytes of its own
            }
        )
    return rows


# --8<-- [end:per_op]


# --8<-- [start:profile]
def kernel_class(name: str) -> str:
    n = name.lower()
    if any(s in n for s in ("flash", "fmha", "attention", "sdpa", "attn")):
        return "attention"
    if any(s in n for s in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "sm90")):
        return "matmul"
    return "memory-bound"


def profile_step(step, steps=3, activities=(ProfilerActivity.CUDA,)):
    """Kernels per step and time per kernel class (ms per step) from torch.profiler."""
    step()  # warm-up; compiles when step is compiled
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    with profile(activities=list(activities)) as prof:
        for _ in range(steps):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    by_class = {"matmul": 0.0, "attention": 0.0, "memory-bound": 0.0}
    for e in kernels:
        by_class[kernel_class(e.name)] += e.time_range.elapsed_us() / 1e3 / steps
    return {"kernels": len(kernels) / steps, **{f"{k}_ms": v for k, v in by_class.items()}}


def layer_step(cfg, batch, seq, device, dtype, compiled=False):
    torch.manual_seed(0)
    layer = DecoderLayer(cfg, Kernels()).to(device, dtype)
    x = _leaf(batch, seq, cfg.hidden_size, device=device, dtype=dtype)
    cos, sin = rope_tables(cfg, seq, device)
    dy = torch.randn_like(x)
    forward = torch.compile(layer) if compiled else layer

    def step():
        forward(x, cos, sin).backward(dy)

    return step


# --8<-- [end:profile]


# --8<-- [start:candidates]
def fusion_candidates(cfg, batch, seq, ops: dict, copy_bytes_per_s: float):
    """Rank fusions by their ceiling: measured eager time of the fused group minus the time the
    fused kernel needs at copy bandwidth to read its inputs and write its outputs once."""
    t, h, i = batch * seq, cfg.hidden_size, cfg.intermediate_size
    qk = t * (cfg.num_attention_heads + cfg.num_key_value_heads) * cfg.head_dim

    def ms(*names):
        return sum(ops[n]["fwd_ms"] + ops[n]["bwd_ms"] for n in names)

    groups = [
        # (name, eager group, times per layer, fused bytes fwd + bwd)
        ("RMSNorm（单 kernel）", ["input_layernorm"], 2, BYTES * (2 * t * h + 3 * t * h)),
        (
            "残差加 + RMSNorm",
            ["residual add", "input_layernorm"],
            2,
            BYTES * (4 * t * h + 4 * t * h),  # fwd: x, r in; sum, y out. bwd: dy, ds, s in; ds out
        ),
        ("QK-Norm + RoPE", ["q_norm + k_norm", "rope (q, k)"], 1, BYTES * (2 * qk + 3 * qk)),
        ("SiLU(gate) ⊙ up", ["silu(gate) * up"], 1, BYTES * (3 * t * i + 5 * t * i)),
    ]
    rows = []
    for name, members, per_layer, fused_bytes in groups:
        eager = per_layer * ms(*members)
        floor = per_layer * fused_bytes / copy_bytes_per_s * 1e3
        rows.append(
            {"fusion": name, "eager_ms": eager, "floor_ms": floor, "saving_ms": eager - floor}
        )
    return sorted(rows, key=lambda r: -r["saving_ms"])


# --8<-- [end:candidates]
