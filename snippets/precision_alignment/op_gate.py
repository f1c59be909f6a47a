"""Gate 1, the op gate: a kernel's forward output and every gradient against the same formula
in fp64, within the elementwise bounds derived in snippets/triton_kernels/numerics.py (unit
roundoff per rounding to a storage dtype, gamma_n for an n-term fp32 reduction); and, in low
precision, parity with eager PyTorch where the kernel promises eager's rounding.

A case is inputs, upstream gradients and the fp64 reference; an implementation is any callable
with the eager signature, so the same case checks our kernel, a library's, or a planted bug.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from snippets.common.device import DEVICE
from snippets.common.models.qwen3 import TINY, RMSNorm, rope_tables
from snippets.precision_alignment.metrics import ulp_distance
from snippets.triton_kernels import numerics as nm
from snippets.triton_kernels.cross_entropy import linear_cross_entropy
from snippets.triton_kernels.rmsnorm import add_rms_norm, rms_norm
from snippets.triton_kernels.rope import apply_rope
from snippets.triton_kernels.swiglu import swiglu

EPS = 1e-6


# --8<-- [start:case]
@dataclass
class OpCase:
    name: str
    inputs: dict  # name -> tensor; those named in `grads` get gradients
    grads: dict  # input name -> key of its gradient in the reference
    outputs: tuple  # keys of the outputs, in the order the op returns them
    upstream: tuple  # d loss / d output, one per output
    reference: Callable  # (inputs, upstream) -> (exact, bound), fp64, keyed like got
    eager: Callable | None = None  # eager PyTorch in the same dtype, when parity is promised
    parity_h: int = 0  # the reduction length behind the rounded value (for the threshold)


@dataclass
class OpReport:
    name: str
    dtype: torch.dtype
    ratios: dict  # key -> max |got - exact| / bound; <= 1 passes
    parity: dict = field(default_factory=dict)  # key -> (mismatch fraction, max ULP, allowed)

    @property
    def passed(self) -> bool:
        accurate = all(r <= 1 for r in self.ratios.values())
        return accurate and all(mismatch <= a for mismatch, _, a in self.parity.values())


def parity_allowed(h: int, dtype) -> float | None:
    """Expected fraction of elements that two correct implementations round differently.

    Both compute the same fp32 value within gamma_{h+8} relative (any order of the h-term
    sum); they round to different neighbours only when a rounding midpoint of `dtype` falls
    between them. Midpoints are at least u_p |z| apart, so, for values spread evenly within
    an ULP, the chance is at most 2 gamma_{h+8} / u_p. In fp32 that exceeds 1: no parity.
    (Where they differ, a later product, e.g. by the norm weight, can widen the gap to a few
    ULPs; the report shows the largest gap, the gate judges the fraction.)
    """
    allowed = 2 * nm.gamma(h + 8) / nm.unit_roundoff(dtype)
    return allowed if allowed < 1 else None


def op_gate(case: OpCase, impl: Callable) -> OpReport:
    leaves = {k: v.detach().clone().requires_grad_(k in case.grads) for k, v in case.inputs.items()}
    outs = impl(**leaves)
    outs = outs if isinstance(outs, tuple) else (outs,)
    wrt = list(case.grads)
    grads = torch.autograd.grad(outs, [leaves[k] for k in wrt], case.upstream)
    got = dict(zip(case.outputs, outs, strict=True))
    got |= {case.grads[k]: g for k, g in zip(wrt, grads, strict=True)}
    exact, bound = case.reference(case.inputs, case.upstream)
    ratios = {k: ((got[k].double() - exact[k]).abs() / bound[k]).max().item() for k in got}
    dtype = next(iter(case.inputs.values())).dtype
    report = OpReport(case.name, dtype, ratios)
    allowed = parity_allowed(case.parity_h, dtype)
    if case.eager is not None and allowed is not None:
        with torch.no_grad():
            ref = case.eager(**case.inputs)
        ref = ref if isinstance(ref, tuple) else (ref,)
        for key, mine, theirs in zip(case.outputs, outs, ref, strict=True):
            mismatch = (mine != theirs).float().mean().item()
            report.parity[key] = (mismatch, ulp_distance(mine, theirs).max().item(), allowed)
    return report


# --8<-- [end:case]


# --8<-- [start:cases]
def eager_rmsnorm(x, w, eps=EPS):
    """The model's own RMSNorm module, with weight w."""
    norm = RMSNorm(w.shape[0], eps).to(w.device, w.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    return norm(x)


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def rmsnorm_case(rows, h, dtype, device=DEVICE, seed=0, residual=False) -> OpCase:
    """dy shares the sign of n (plus noise): every weight has a consistent gradient, as in
    training, which is also when a low-precision dW accumulator loses the most."""
    gen = torch.Generator().manual_seed(seed)
    x, r = _randn(gen, rows, h), _randn(gen, rows, h)
    s = x + r if residual else x
    dy = s / s.pow(2).mean(-1, keepdim=True).sqrt() + 0.3 * _randn(gen, rows, h)
    w = 1 + 0.5 * torch.rand(h, generator=gen)
    ds = _randn(gen, rows, h)
    t = {k: v.to(device, dtype) for k, v in dict(x=x, r=r, w=w, dy=dy, ds=ds).items()}
    if not residual:
        return OpCase(
            "rmsnorm", dict(x=t["x"], w=t["w"]), dict(x="dx", w="dw"), ("y",), (t["dy"],),
            lambda i, up: nm.rmsnorm_exact(i["x"], i["w"], up[0], EPS), eager_rmsnorm, h,
        )  # fmt: skip
    return OpCase(
        "add_rmsnorm", dict(x=t["x"], r=t["r"], w=t["w"]), dict(x="dx", r="dr", w="dw"),
        ("s", "y"), (t["ds"], t["dy"]),
        lambda i, up: nm.rmsnorm_exact(i["x"], i["w"], up[1], EPS, residual=i["r"], ds=up[0]),
        lambda x, r, w: (x + r, eager_rmsnorm(x + r, w)), h,
    )  # fmt: skip


def swiglu_case(rows, cols, dtype, device=DEVICE, seed=0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    g, u, dh = (_randn(gen, rows, cols).to(device, dtype) for _ in range(3))
    return OpCase("swiglu", dict(gate=g, up=u), dict(gate="dg", up="du"), ("h",), (dh,),
                  lambda i, up: nm.swiglu_exact(i["gate"], i["up"], up[0]))  # fmt: skip


def rope_case(batch, n_q, n_kv, seq, dim, dtype, device=DEVICE, seed=0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)

    def heads(n):  # the model's layout: [batch, seq, heads, dim] seen as [batch, heads, seq, dim]
        return _randn(gen, batch, seq, n, dim).to(device, dtype).transpose(1, 2)

    q, k, dq, dk = heads(n_q), heads(n_kv), heads(n_q), heads(n_kv)
    cos, sin = (t.to(dtype) for t in rope_tables(replace(TINY, head_dim=dim), seq, device))
    return OpCase(
        "rope", dict(q=q, k=k, cos=cos, sin=sin), dict(q="dq", k="dk"), ("q", "k"), (dq, dk),
        lambda i, up: nm.rope_exact(i["q"], i["k"], i["cos"], i["sin"], up[0], up[1]),
    )  # fmt: skip


def cross_entropy_case(n, hid, vocab, dtype, device=DEVICE, seed=0) -> OpCase:
    gen = torch.Generator().manual_seed(seed)
    h = _randn(gen, n, hid).to(device, dtype)
    w = (_randn(gen, vocab, hid) / hid**0.5).to(device, dtype)
    labels = torch.randint(0, vocab, (n,), generator=gen)
    labels[::4] = -100  # padding
    return OpCase(
        "linear_ce", dict(hidden=h, weight=w, labels=labels.to(device)),
        dict(hidden="dh", weight="dw"), ("loss",), (torch.ones((), device=device),),
        lambda i, up: nm.cross_entropy_exact(i["hidden"], i["weight"], i["labels"]),
    )  # fmt: skip


OURS = {  # our Triton kernels, with the eager signatures, by case name
    "rmsnorm": lambda x, w: rms_norm(x, w, EPS),
    "add_rmsnorm": lambda x, r, w: add_rms_norm(x, r, w, EPS),
    "swiglu": swiglu,
    "rope": lambda q, k, cos, sin: apply_rope(q, k, cos, sin),
    "linear_ce": linear_cross_entropy,
}


def small_cases(dtype, device=DEVICE) -> list[OpCase]:
    """CPU-sized shapes at the TINY model's widths (hidden 64, MLP 192, 4:2 heads of 16, a
    vocabulary of 1000; padded labels), so that on the GPU they reuse the kernels the model
    compiles; the GPU run also uses Qwen3-8B's widths."""
    return [
        rmsnorm_case(9, 64, dtype, device),
        rmsnorm_case(9, 64, dtype, device, residual=True),
        swiglu_case(5, 192, dtype, device),
        rope_case(2, 4, 2, 5, 16, dtype, device),
        cross_entropy_case(10, 48, 1000, dtype, device),
    ]


# --8<-- [end:cases]
