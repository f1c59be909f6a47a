"""Everything this page compiles on the GPU, compiled ahead in worker processes
(snippets/common/warm.py starts them, waits for them and reports what failed) into the run's
Triton and Inductor disk caches, so that this process's first calls load instead of compile.
check.py, the page's first GPU fence, runs prepare_page(): it starts one worker per unit, builds
cuDNN's plans for the benchmark meanwhile, and waits for the workers.

The units (page_units), the longest first:
- FlexAttention's compiled function at the benchmark's shapes (measure.py): the benchmark's own
  measure_tflops with a clock that only calls, so its graphs are traced and compiled as the
  benchmark's will be (Inductor's FX graph and AOTAutograd caches then serve the benchmark;
  Dynamo still traces in this process);
- our four kernels, one unit each, for bf16 at head dim 128 (check.py's and the benchmark's: the
  length and the mask are runtime arguments and every stride a multiple of 16, so one compile
  serves every length, mask and head mapping) and for fp16 at head dim 64 (the fp16 test's);
- the FP8 forward kernel (fp8.py) with a bf16 output at head dim 128: the page's FP8 check, the
  GPU tests and the benchmark share its one compile (length, block count and heads are not
  specialized; every stride is a multiple of 16, V's stride along the keys 1);
- the kernel files of the triton-kernels post, whose bf16 checks run when bench_gpu.py imports
  that post's memory meter.

cuDNN's execution plans cannot come from a worker: PyTorch caches them in memory, per thread
(thread_local caches in aten/src/ATen/native/cudnn/MHA.cpp), so cudnn_plans builds them in this
process, for every benchmarked shape and mask, while the workers compile.
"""

import importlib
import os

import torch
import triton

from snippets.common import warm
from snippets.common.bench import _traced
from snippets.common.device import DEVICE
from snippets.flash_attention.attention import flash_attention
from snippets.flash_attention.fp8 import FP8_HEAD_DIM, fp8_attention
from snippets.flash_attention.measure import (
    DTYPE,
    HEAD_DIM,
    HEADS,
    LENGTHS,
    TOKENS,
    flex,
    implementations,
    measure_tflops,
)

KERNELS = ("attn_bwd_dkdv_kernel", "attn_bwd_dq_kernel", "attn_fwd_kernel", "attn_bwd_delta_kernel")
CHECKED = (("bfloat16", 128), ("float16", 64))  # check.py and the benchmark; the fp16 test
TRITON_KERNELS = ("rmsnorm", "cross_entropy", "swiglu", "rope", "fp8")  # triton_kernels.measure's


def page_units() -> list[tuple]:
    """(kind, ...) units: FlexAttention, ours kernel by kernel, the FP8 kernel, the
    triton-kernels files."""
    found = [("flex", LENGTHS, TOKENS, HEADS, HEAD_DIM, DTYPE)]
    found += [("kernel", name, dtype, d) for dtype, d in CHECKED for name in KERNELS]
    found += [("fp8", "bfloat16")]
    return found + [("import", f"snippets.triton_kernels.{m}") for m in TRITON_KERNELS]


def compile_kernel(name: str, dtype: str, head_dim: int) -> None:
    """One of our kernels alone: a small forward + backward in which Triton compiles (and
    launches) only `name`. Before each compile Triton asks the jit_cache_hook; for every other
    kernel it answers that the compile is taken care of, and Triton neither compiles nor launches
    it (outputs stay uninitialized: nothing reads them). The arguments specialize the kernel as
    the checks and the benchmark do: the dtype, the head dim, 16-byte aligned pointers, strides
    that are multiples of 16. The interpreter (CPU) asks no hook and runs every kernel."""

    def others(*, fn, **_) -> bool:
        return fn.name != name

    triton.knobs.runtime.jit_cache_hook = others
    try:
        q = torch.randn(1, 2, 64, head_dim, device=DEVICE, dtype=getattr(torch, dtype),
                        requires_grad=True)  # fmt: skip
        flash_attention(q, q, q, causal=True).sum().backward()  # the mask is a runtime argument
    finally:
        triton.knobs.runtime.jit_cache_hook = None


def compile_fp8(dtype: str) -> None:
    """The FP8 forward kernel: one small call (quantization included), output in `dtype`."""
    q = torch.randn(1, 2, 64, FP8_HEAD_DIM, device=DEVICE, dtype=getattr(torch, dtype))
    fp8_attention(q, q, q)


def run_unit(unit, context=None, clock=warm.once) -> None:
    """One unit, in a worker (snippets/common/warm.py) or, for a test, here."""
    kind, *args = unit
    if kind == "kernel":
        compile_kernel(*args)
    elif kind == "fp8":
        compile_fp8(*args)
    elif kind == "import":  # runs the file's checks, which compile its kernels
        importlib.import_module(*args)
    elif kind == "flex":
        import torch._inductor.config as inductor

        lengths, tokens, heads, d, dtype = args
        impls = {"flex": flex(compiled=DEVICE.type == "cuda")}
        with inductor.patch(autotune_local_cache=False):  # any autotuning is the benchmark's
            measure_tflops(lengths, tokens, heads, d, DEVICE, dtype, clock, 1.0, impls)
    else:
        raise ValueError(f"unknown unit {unit!r}")


@_traced  # its wall time in the harness's trace
def cudnn_plans(lengths, tokens, heads, head_dim, dtype, cudnn=None) -> bool:
    """cuDNN's plans for every benchmarked shape and mask, forward and backward: one call of
    each, in this process (the forward's plans in this thread, the backward's in autograd's
    device thread, where the benchmark's calls look them up). cudnn: the implementation; by
    default SDPA's cuDNN backend where it runs here (where not, bench_gpu.py records why)."""
    if cudnn is None:
        probe = (tokens // lengths[-1], heads, lengths[-1], head_dim)
        cudnn = implementations(("cudnn",), DEVICE, probe)[0].get("cudnn")
    if cudnn is not None:
        measure_tflops(lengths, tokens, heads, head_dim, DEVICE, dtype, warm.once, 1.0,
                       {"cudnn": cudnn})  # fmt: skip
    return cudnn is not None


def prepare_page(units=None, plans: bool = True) -> dict:
    """Start one worker per unit (page_units), build cuDNN's plans here meanwhile (plans), wait
    for the workers: warm.finish's summary."""
    units = page_units() if units is None else units
    n = min(len(units), max(1, (os.cpu_count() or 2) - 2))  # this process only waits (and plans)
    workers = warm.start(__name__, units, workers=n)
    if plans:
        cudnn_plans(LENGTHS, TOKENS, HEADS, HEAD_DIM, DTYPE)
    return warm.finish(workers)
