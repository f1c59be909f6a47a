"""Techniques that have code of their own: compensated summation, derived tolerances instead of
fixed ones, pinned numerics switches for reference runs, swapping one kernel at a time.

(The others are shown where they are used: fp32 accumulators in the kernels, the fp64
reference and the site-by-site bisection of the model gate, parity with Hugging Face's casts in
the op gate, fp32 master weights in the end-to-end gate.)
"""

from contextlib import contextmanager
from dataclasses import fields, replace

import torch

from snippets.common.models.qwen3 import Kernels
from snippets.precision_alignment.sources import accumulate, hashed_uniform, sequential_sum
from snippets.triton_kernels.numerics import gamma


# --8<-- [start:kahan]
def kahan_sum(terms, dtype):
    """Compensated summation (Kahan; Higham 2002, §4.3) with every operation in `dtype`: the
    rounding error of each addition is carried into the next term, so the error bound is
    about 2 u sum|x| instead of (n - 1) u sum|x|. For accumulators that must stay narrow."""
    s = torch.zeros((), dtype=dtype)
    c = torch.zeros((), dtype=dtype)
    for t in terms.to(dtype):
        y = t - c
        total = s + y
        c = (total - s) - y  # what the addition lost
        s = total
    return s


grads = (0.25 + 0.5 * hashed_uniform(4096, seed=1)).float()  # the terms of the dtype demo
exact = grads.double().sum()
for name, s in (("naive", accumulate(grads, torch.bfloat16)),
                ("kahan", kahan_sum(grads, torch.bfloat16))):  # fmt: skip
    print(f"bf16 {name}: {((s.double() - exact).abs() / exact).item() / 2.0**-8:.2f} u")
    #> bf16 naive: 191.75 u
    #> bf16 kahan: 0.02 u
# --8<-- [end:kahan]


# --8<-- [start:tolerance]
terms = (hashed_uniform(4096) ** 2).float()  # the reduction-order demo's input
exact = terms.double().sum()
s = sequential_sum(terms)  # a correct fp32 sum, left to right
try:
    torch.testing.assert_close(s.double(), exact, rtol=1.3e-6, atol=1e-5)  # fp32's defaults
    print("assert_close: pass")
except AssertionError:
    print("assert_close: fail")
    #> assert_close: fail
print(bool((s.double() - exact).abs() <= gamma(4095) * terms.double().abs().sum()))
#> True
# --8<-- [end:tolerance]


# --8<-- [start:strict]
@contextmanager
def strict_numerics():
    """For reference runs: fp32 matmuls in IEEE fp32 (no TF32) and fp16 / bf16 matmuls that
    accumulate in fp32 without reduced-precision split-K; the previous settings come back."""
    m = torch.backends.cuda.matmul
    saved = (m.fp32_precision, m.allow_bf16_reduced_precision_reduction,
             m.allow_fp16_reduced_precision_reduction)  # fmt: skip
    m.fp32_precision = "ieee"
    m.allow_bf16_reduced_precision_reduction = False
    m.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (m.fp32_precision, m.allow_bf16_reduced_precision_reduction,
         m.allow_fp16_reduced_precision_reduction) = saved  # fmt: skip


before = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
with strict_numerics():
    m = torch.backends.cuda.matmul
    print(m.fp32_precision, m.allow_bf16_reduced_precision_reduction)
    #> ieee False
print(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction == before)
#> True
# --8<-- [end:strict]


# --8<-- [start:ablation]
def one_at_a_time(fused: Kernels, base: Kernels | None = None):
    """(name, Kernels) with only that one swap point taken from `fused`: a drift that the whole
    set shows can be traced to the kernel that brings it."""
    base = base or Kernels()
    for f in fields(Kernels):
        if getattr(fused, f.name) is not getattr(base, f.name):
            yield f.name, replace(base, **{f.name: getattr(fused, f.name)})


# --8<-- [end:ablation]
