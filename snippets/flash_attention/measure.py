"""The benchmark's shapes and functions: TFLOP/s of this post's kernels against
scaled_dot_product_attention with each backend and FlexAttention, where the time of ours goes
(kernel by kernel), and peak memory against naive attention.

bench_gpu.py runs the functions on the GPU at these shapes with the clocks of
snippets/common/bench.py (kernel_ms_each, kernel_ms_by) and triton-kernels' peak_bytes_cuda,
which come in as arguments; warm.py compiles ahead at the same shapes. On the CPU the functions
run at tiny shapes with stand-ins (tests/snippets/test_flash_attention.py).
"""

import math
import warnings

import torch
import torch.nn.functional as F

from snippets.common.bench import rate
from snippets.flash_attention.attention import flash_attention
from snippets.flash_attention.fp8 import (
    fp8_block,
    fp8_errors,
    fp8_forward,
    outlier_qkv,
    quantize_qkv,
    random_rotation,
)
from snippets.flash_attention.io_model import attention_flops

# --8<-- [start:shapes]
TOKENS, HEADS, HEAD_DIM, DTYPE = 32768, 16, 128, torch.bfloat16  # 16 heads x 128 = hidden 2048
LENGTHS = (1024, 2048, 4096, 8192, 16384)  # batch = TOKENS / length: 32, 16, 8, 4, 2 sequences
# --8<-- [end:shapes]


# --8<-- [start:implementations]
SDPA = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
IMPLS = ("ours", *SDPA, "flex")  # data keys; the page maps them to names


def ours(q, k, v, causal):
    return flash_attention(q, k, v, causal=causal)


def sdpa(backend: str):
    """scaled_dot_product_attention restricted to one backend (torch.nn.attention.sdpa_kernel);
    the backward runs the same backend's kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = getattr(SDPBackend, SDPA[backend])

    def run(q, k, v, causal):
        with sdpa_kernel(chosen):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                  enable_gqa=q.shape[1] != k.shape[1])  # fmt: skip

    return run


def prefix_mask(visible: torch.Tensor):
    """mask_mod of a prefix-LM mask: every query sees the first `visible` keys (a 0-dim tensor)
    and, after them, the keys up to itself. visible = 0 is the causal mask, visible = n no mask
    at all (every block full: the kernel never calls the mask_mod there). One function for both
    masks, its tensor an input of the compiled graph, so torch.compile traces one graph."""

    def mask(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) | (kv_idx < visible)

    return mask


def flex(compiled: bool):
    """FlexAttention with a block mask per length and mask, made once (prefix_mask).
    compiled: torch.compile(flex_attention), the fused kernel, one graph for both masks and
    every length; otherwise the eager reference, which materializes the scores (what runs on
    the CPU). The batch is marked dynamic: dynamo gives equal sizes one symbol, and a batch
    equal to another size would compile a graph of its own."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    fn = torch.compile(flex_attention, dynamic=True) if compiled else flex_attention
    masks = {}

    def run(q, k, v, causal):
        n = q.shape[2]
        if (n, causal, q.device) not in masks:
            visible = torch.tensor(0 if causal else n, device=q.device)
            masks[n, causal, q.device] = create_block_mask(prefix_mask(visible), None, None, n, n,
                                                           device=q.device)  # fmt: skip
        mask = masks[n, causal, q.device]
        if compiled:
            for t in (q, k, v):
                torch._dynamo.maybe_mark_dynamic(t, 0)
        with warnings.catch_warnings():  # eager flex warns that it is unfused: that is the point
            warnings.simplefilter("ignore", UserWarning)
            return fn(q, k, v, block_mask=mask, enable_gqa=q.shape[1] != k.shape[1])

    return run


def naive(q, k, v, causal):
    """Eager PyTorch as Hugging Face's "eager" attention: S and P materialized, softmax in fp32."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    if causal:
        n = q.shape[2]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), -math.inf)
    return torch.softmax(s, -1, dtype=torch.float32).to(q.dtype) @ v


def implementations(names, device, probe=(1, 2, 64, 64)):
    """({name: fn(q, k, v, causal)}, {name: why it cannot run here}). Each SDPA backend is tried
    once, causal forward and backward on inputs of shape `probe`: it raises when it cannot run
    on this device or dtype, and the reason is recorded instead of a row. On the GPU the probe
    takes a benchmarked shape: PyTorch's cuDNN backend builds and caches a graph and plan per
    shape and mask, forward and backward (aten/src/ATen/native/cudnn/MHA.cpp; 0.4-0.55 s each
    as reported in sgl-project/sglang#4650 and modelscope/FunASR#3704), and the probe's then
    serve the benchmark."""
    found, missing = {}, {}
    cuda = torch.device(device).type == "cuda"
    for name in names:
        try:
            if name == "ours":
                fn = ours
            elif name == "naive":
                fn = naive
            elif name == "flex":
                fn = flex(compiled=cuda)
            else:
                fn = sdpa(name)
                gen = torch.Generator(device=device).manual_seed(0)
                q, k, v = qkv(probe[0], probe[1], probe[2], probe[3], device,
                              torch.bfloat16 if cuda else torch.float32, gen)  # fmt: skip
                runners(fn, q, k, v, True, torch.randn_like(q))[1]()
            found[name] = fn
        except (ImportError, RuntimeError, AttributeError) as exc:
            missing[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return found, missing


# --8<-- [end:implementations]


# --8<-- [start:measure]
def qkv(batch, heads, n, d, device, dtype, gen, kv_heads=None):
    shape = (batch, heads, n, d)
    kv_shape = (batch, kv_heads or heads, n, d)
    return [torch.randn(s, device=device, dtype=dtype, generator=gen).requires_grad_()
            for s in (shape, kv_shape, kv_shape)]  # fmt: skip


def runners(fn, q, k, v, causal, do):
    """(forward, forward + backward) callables on fixed inputs."""

    def forward():
        return fn(q, k, v, causal)

    def both():
        return torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)

    return forward, both


def measure_tflops(lengths, tokens, heads, d, device, dtype, kernel_times, peak_tflops, impls,
                   masks=("none", "causal"), seed=0):  # fmt: skip
    """One row per (length, mask, implementation): the kernels' time of the forward and of the
    forward + backward, TFLOP/s by the FlashAttention papers' count (forward 4 n^2 d per head,
    halved by the causal mask; forward + backward 3.5 times that) and as a fraction of the dense
    peak. A batch of tokens / n sequences, so every length runs the same number of tokens. Also
    one wide row per (length, mask) with each implementation's two rates, for the comparison
    tables. kernel_times(fns, kinds): kernel_ms_each on the GPU, one Stat per callable; the
    callables come one implementation after another (kinds: the implementation of each), its
    forwards first, then its forwards + backwards, so the caller can settle per group."""
    gen = torch.Generator(device=device).manual_seed(seed)
    cases = {}  # (n, mask, name) -> (forward, both)
    for mask in masks:
        causal = mask == "causal"
        for n in lengths:
            q, k, v = qkv(tokens // n, heads, n, d, device, dtype, gen)
            do = torch.randn(q.shape, device=device, dtype=dtype, generator=gen)
            for name, fn in impls.items():
                cases[n, mask, name] = runners(fn, q, k, v, causal, do)
    order = [(n, mask, name, p) for name in impls for p in (0, 1) for n in lengths
             for mask in masks]  # fmt: skip
    stats = kernel_times([cases[n, mask, name][p] for n, mask, name, p in order],
                         [name for _, _, name, _ in order])  # fmt: skip
    times = dict(zip(order, stats, strict=True))
    rows, wide = [], {}
    for n, mask, name in cases:
        fwd_ms, both_ms = times[n, mask, name, 0], times[n, mask, name, 1]
        flops = attention_flops(n, d, heads, tokens // n, causal=mask == "causal")
        fwd_tflops = rate(flops, fwd_ms) / 1e12
        both_tflops = rate(3.5 * flops, both_ms) / 1e12
        rows.append({"n": n, "mask": mask, "impl": name, "fwd_ms": fwd_ms, "fwdbwd_ms": both_ms,
                     "fwd_tflops": fwd_tflops, "fwdbwd_tflops": both_tflops,
                     "fwd_of_peak": fwd_tflops / peak_tflops,
                     "fwdbwd_of_peak": both_tflops / peak_tflops})  # fmt: skip
        row = wide.setdefault((n, mask), {"n": n, "mask": mask})
        row[f"{name}_fwd"], row[f"{name}_fwdbwd"] = fwd_tflops, both_tflops
    return rows, list(wide.values())


def settles(kinds) -> list[float]:
    """Settling before each callable's repeats, in ms (bench._settle: at least this long, then
    until three 50 ms chunks agree within ±2 %), for callables timed one implementation after
    another (kinds: the implementation of each): the first 0.9 s (under bench.POWER_MIN_S, so
    no wait on NVML's power state: attention drew 98 % of the limit uncapped and that wait gave
    up after 6 s), the first of each other implementation 0.1 s, the rest none; cuDNN 0.5 s,
    then each of its callables until steady, as every callable was in the last run, where no
    timing needed a second attempt (in earlier runs cuDNN's forward spread ±5-13 %)."""
    out = []
    for i, kind in enumerate(kinds):
        new = i == 0 or kinds[i - 1] != kind
        if i == 0:
            out.append(900.0)
        elif kind == "cudnn":
            out.append(500.0 if new else 30.0)
        else:
            out.append(100.0 if new else 0.0)
    return out


KERNELS = {"attn_fwd": "forward", "attn_bwd_delta": "D = rowsum(dO o O)",
           "attn_bwd_dkdv": "dK, dV", "attn_bwd_dq": "dQ"}  # fmt: skip
FILL = "FillFunctor"  # PyTorch's fill kernel: autograd zero-fills the logsumexp's gradient


def kernel_of(name: str) -> str:
    """Our kernels by name; PyTorch's zero fill goes with the backward's preprocessing (D): both
    prepare the backward, and a fill of a few microseconds timed alone spreads ±9 %. A launch of
    anything else: 'other'."""
    if FILL in name:
        return "attn_bwd_delta"
    return next((key for key in KERNELS if key in name), "other")


def breakdown(n, tokens, heads, d, device, dtype, kernel_split, masks=("none", "causal"), seed=0):
    """Where the forward + backward time of ours goes, kernel by kernel (kernel_split:
    kernel_ms_by on the GPU), and each kernel's share of the sum."""
    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = qkv(tokens // n, heads, n, d, device, dtype, gen)
    do = torch.randn(q.shape, device=device, dtype=dtype, generator=gen)
    rows = []
    for mask in masks:
        split = kernel_split(runners(ours, q, k, v, mask == "causal", do)[1], kernel_of)
        total = sum(cell["ms"] for cell in split.values())
        for kernel, cell in split.items():
            rows.append({"n": n, "mask": mask, "kernel": kernel, "ms": cell["ms"],
                         "share": cell["ms"] / total})  # fmt: skip
    return rows


def peak_memory(lengths, tokens, heads, d, device, dtype, memory, impls, seed=0):
    """Peak memory above the inputs during one causal forward + backward (memory: peak_bytes_cuda
    on the GPU): naive attention holds n x n scores and probabilities per head, ours O(n) extra.
    One row per length: MiB of each implementation and naive / ours."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rows = []
    for n in lengths:
        q, k, v = qkv(tokens // n, heads, n, d, device, dtype, gen)
        do = torch.randn(q.shape, device=device, dtype=dtype, generator=gen)
        row = {"n": n}
        for name, fn in impls.items():
            both = runners(fn, q, k, v, True, do)[1]
            both()  # warm-up: compiles, autotuning and library workspaces are not the peak's
            row[f"{name}_mib"] = memory(both) / 2**20
        row["naive_over_ours"] = row["naive_mib"] / row["ours_mib"]
        rows.append(row)
        del q, k, v, do
    return rows


# --8<-- [end:measure]


# --8<-- [start:fp8]
FP8_ROWS = 256  # query rows per head that the fp64 reference of the errors covers


def measure_fp8(n, tokens, heads, d, device, dtype, kernel_times, peaks, rows=FP8_ROWS, seed=0):
    """The FP8 forward (quantized per block after the rotation) against ours in `dtype` (bf16 on
    the GPU) at one length, no mask, on FA3's outlier inputs: each kernel's time (kernel_times:
    kernel_ms_each on the GPU, in the order bf16, fp8, quantize), TFLOP/s by section 3.1's count
    and its fraction of that dtype's dense peak (peaks: {"bf16": ..., "fp8": ...}), the time of
    the quantization itself (rotation and V's transpose included), and fp8_errors."""
    gen = torch.Generator(device=device).manual_seed(seed)
    batch, block = tokens // n, fp8_block()
    q, k, v = outlier_qkv(batch, heads, n, d, device, dtype, gen)
    rotation = random_rotation(d, seed, device)
    x = quantize_qkv(q, k, v, block, rotation)
    fns = {"bf16": lambda: ours(q, k, v, False), "fp8": lambda: fp8_forward(x, None, dtype),
           "quantize": lambda: quantize_qkv(q, k, v, block, rotation)}  # fmt: skip
    ms = dict(zip(fns, kernel_times(list(fns.values()), list(fns)), strict=True))
    flops = attention_flops(n, d, heads, batch)
    timings = [{"impl": name, "ms": ms[name], "tflops": rate(flops, ms[name]) / 1e12,
                "of_peak": rate(flops, ms[name]) / 1e12 / peaks[name]}
               for name in ("bf16", "fp8")]  # fmt: skip
    errors = fp8_errors(q, k, v, min(rows, n), block, rotation, lambda *t: ours(*t, False))
    error = {row["variant"]: row["rel_error"] for row in errors}
    return {"timings": timings, "quantize_ms": ms["quantize"], "speedup": ms["bf16"] / ms["fp8"],
            "errors": errors, "gain_vs_tensor": error["fp8_tensor"] / error["fp8_block_hadamard"],
            "gain_of_rotation": error["fp8_block"] / error["fp8_block_hadamard"]}  # fmt: skip


# --8<-- [end:fp8]
