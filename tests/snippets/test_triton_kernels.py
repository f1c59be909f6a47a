"""Unit tests for snippets/triton_kernels/: each kernel against fp64, the Qwen3 swap, the benchmark.

On the CPU the kernels run in the Triton interpreter in fp32 (fp16 where noted; the
interpreter mangles bf16). On the GPU those tests are skipped (`cpu`: they would only compile
every kernel again for arithmetic the CPU suite has checked); tests marked `gpu` run bf16 on
CUDA at Qwen3-8B sizes, where the kernels are mostly compiled already by the page's benchmark.

Tolerances (derived in snippets/triton_kernels/numerics.py, shown on the page): every check is
|kernel - exact| <= bound elementwise, exact = the same formula in fp64 on the same inputs.
u_p is the unit roundoff of a storage dtype (fp32 2^-24, fp16 2^-11, bf16 2^-8), counted once
per rounding to it, plus half the smallest subnormal for results that underflow; gamma_n =
nU/(1 - nU), U = 2^-24, for fp32 arithmetic and reductions of length n inside the kernels.
  RMSNorm (T rows of H)  y: (u_x + u_y + gamma(H+8))|y|
                         dx: (u_x + u_y + gamma(4H+32)) rstd (|g| + |n| mean|g||n|) (+|ds|)
                         dw: (u_x + u_w + gamma(T+H+16)) sum_rows |dy||n|
                         fused add: 2(u_x + U) more in each; s: (u_x + U)|s|
  SwiGLU                 h, dup: (u_p + (|g|+10)U)|.|;  dgate: u_p|dg| + U|dh up| s(...)
  RoPE                   (u_p + gamma_3)(|a||cos| + |b||sin|), forward and backward
  linear+CE (N, H, V)    logits off by (u_p + gamma_H)|h||W|; lse evaluation gamma(2V+8)(...);
                         mean gamma(N+2); dh: + gamma(V+3); dW: + gamma_N and one rounding to
                         W's dtype (or one per chunk when accumulating in W's dtype)
  Qwen3 model swap       2 gamma_n norm-wise, n = 1000 the longest reduction (as in
                         tests/snippets/test_qwen3_fusion.py)
test_bounds_are_not_vacuous shows that typical bugs land far outside these bounds.

The snippet modules are imported inside the tests: when the page has run first in the same
session (tests/pages.py registers each included file as its module), they are not re-executed.
"""

import importlib

import pytest
import torch

from snippets.common.device import DEVICE, ON_GPU
from snippets.common.models.qwen3 import QWEN3_8B
from snippets.common.results import Stat
from snippets.triton_kernels.numerics import (
    cross_entropy_exact,
    gamma,
    rmsnorm_exact,
    rope_exact,
    swiglu_exact,
    within,
)

gpu = pytest.mark.gpu  # CUDA-only: run by gpu_docs, with the post or among "the rest"
cpu = pytest.mark.skipif(ON_GPU, reason="the CPU suite covers it (nox -s tests)")


def kernel(name):
    return importlib.import_module(f"snippets.triton_kernels.{name}")


def randn(*shape, generator):
    """Normal samples drawn on DEVICE by a generator there: on the GPU, at Qwen3-8B sizes, no
    second of sampling on the CPU and copying."""
    return torch.randn(*shape, generator=generator, device=DEVICE)


# RMSNorm and fused add + RMSNorm ---------------------------------------------------------------


@cpu
@pytest.mark.parametrize(
    ("rows", "h", "block", "per", "step"),
    [
        (1, 100, None, None, None),  # one row (of a default 2- or 4-row step)
        (64, 300, None, 8, None),  # many rows, non-power-of-two H, 8 programs for dw
        (37, 64, None, 16, None),  # rows not a multiple of rows-per-program: masked tail
        (37, 64, None, None, None),  # the default tiles, a tail inside a step
        (45, 48, None, 8, 4),  # 4 rows a step, non-power-of-two H
        (9, 100, 32, 4, None),  # H wider than one block: the two-pass path
    ],
)
@pytest.mark.parametrize("residual", [False, True], ids=["norm", "add+norm"])
def test_rmsnorm_fp32(rows, h, block, per, step, residual):
    assert rmsnorm_within_bounds(rows, h, torch.float32, block, per, residual, step=step)


@cpu
@pytest.mark.parametrize(("h", "block", "per", "step"), [(64, None, 8, 3), (64, None, 8, 16),
                                                         (100, 32, 4, 2)])  # fmt: skip
def test_rmsnorm_rejects_a_step_that_does_not_tile(h, block, per, step):
    rn = kernel("rmsnorm")
    with pytest.raises(ValueError, match="rows per step"):
        rn.bwd_tile(h, False, block, per, step)


def rmsnorm_within_bounds(rows, h, dtype, block=None, per=None, residual=False, seed=1,
                          step=None):  # fmt: skip
    rn = kernel("rmsnorm")
    g = torch.Generator(DEVICE).manual_seed(seed)
    x, r, dy, ds = (randn(rows, h, generator=g).to(dtype) for _ in range(4))
    w = (1 + 0.1 * randn(h, generator=g)).to(dtype)
    x, r, w = (t.requires_grad_() for t in (x, r, w))
    if residual:
        s, y = rn.add_rms_norm(x, r, w, 1e-6, block, per, step)
        torch.autograd.backward((s, y), (ds, dy))
        got = {"y": y, "s": s, "dx": x.grad, "dr": r.grad, "dw": w.grad}
        exact, bound = rmsnorm_exact(x, w, dy, 1e-6, residual=r, ds=ds)
    else:
        y = rn.rms_norm(x, w, 1e-6, block, per, step)
        y.backward(dy)
        got = {"y": y, "dx": x.grad, "dw": w.grad}
        exact, bound = rmsnorm_exact(x, w, dy, 1e-6)
    return within(got, exact, bound)


@cpu
@pytest.mark.parametrize("layout", ["column-strided", "row-strided", "transposed"])
def test_rmsnorm_non_contiguous_inputs(layout):
    rn = kernel("rmsnorm")
    g = torch.Generator().manual_seed(2)
    base = torch.randn(6, 4, 2 * 40, generator=g).to(DEVICE)
    x = {
        "column-strided": base[..., ::2],  # stride 2 along H: copied to contiguous rows
        "row-strided": base[:, :, :40],  # rows 80 apart: a strided view, no copy
        "transposed": base[..., :40].transpose(0, 1),  # [4, 6, 40] with permuted strides
    }[layout].requires_grad_()
    w = (1 + 0.1 * torch.randn(40, generator=g)).to(DEVICE).requires_grad_()
    dy = torch.randn(x.shape, generator=g).to(DEVICE)
    y = rn.rms_norm(x, w, 1e-6)
    y.backward(dy)
    exact, bound = rmsnorm_exact(x, w, dy, 1e-6)
    assert y.shape == x.shape
    assert within({"y": y, "dx": x.grad, "dw": w.grad}, exact, bound)


@cpu
def test_rmsnorm_casts_like_hugging_face():
    """fp16 in, fp16 weight: our output equals the eager HF-order RMSNorm bit for bit (rare
    last-bit ties of the fp32 statistics aside), while rounding after the weight multiply
    agrees on far fewer elements, so the test tells the two orders apart."""
    from snippets.common.models.qwen3 import RMSNorm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 256, generator=g).to(DEVICE, torch.float16)
    w = (1 + 2 * torch.rand(256, generator=g)).to(DEVICE, torch.float16)
    eager = RMSNorm(256, 1e-6).to(DEVICE, torch.float16)
    with torch.no_grad():
        eager.weight.copy_(w)
    reference = eager(x)
    x32 = x.float()
    after = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()
    ours = kernel("rmsnorm").rms_norm(x, w, 1e-6)
    assert (ours == reference).float().mean() >= 0.999
    assert (after == reference).float().mean() <= 0.9


@cpu  # structure only
def test_rmsnorm_module_is_a_drop_in():
    rn = kernel("rmsnorm")
    module = rn.TritonRMSNorm(48, 1e-6)
    assert [n for n, _ in module.named_parameters()] == ["weight"]
    assert torch.equal(module.weight, torch.ones(48))


# SwiGLU ----------------------------------------------------------------------------------------


@cpu
@pytest.mark.parametrize(
    ("shape", "block", "fused_view"),
    [
        ((1, 300), None, False),  # one row, non-power-of-two width
        ((3, 11, 200), 64, False),  # 3-D input, several column blocks with a masked tail
        ((16, 96), 32, True),  # gate and up: halves of one fused [rows, 2I] matmul output
    ],
)
def test_swiglu_fp32(shape, block, fused_view):
    assert swiglu_within_bounds(shape, torch.float32, block, fused_view)


def swiglu_within_bounds(shape, dtype, block=None, fused_view=False, seed=3):
    sw = kernel("swiglu")
    g = torch.Generator(DEVICE).manual_seed(seed)
    if fused_view:
        both = randn(*shape[:-1], 2 * shape[-1], generator=g).to(dtype).requires_grad_()
        gate, up = both.chunk(2, dim=-1)  # non-contiguous views
    else:
        gate, up = (randn(*shape, generator=g).to(dtype).requires_grad_() for _ in range(2))
    dh = randn(*shape, generator=g).to(dtype)
    h = sw.swiglu(gate, up, block)
    dg, du = torch.autograd.grad(h, (gate, up), dh)
    exact, bound = swiglu_exact(gate, up, dh)
    return within({"h": h, "dg": dg, "du": du}, exact, bound)


@cpu
def test_swiglu_fp16():
    assert kernel("swiglu").check_swiglu(7, 130, torch.float16, block=64)


# RoPE ------------------------------------------------------------------------------------------


@cpu
@pytest.mark.parametrize(
    ("batch", "n_qh", "n_kh", "seq", "dim", "block_heads"),
    [
        (1, 1, 1, 1, 16, None),  # one position, one head
        (2, 4, 2, 8, 16, None),  # GQA 4:2, the TINY model's head_dim
        (1, 3, 1, 5, 12, 2),  # non-power-of-two heads and half-dim (6): masked tiles
    ],
)
def test_rope_fp32(batch, n_qh, n_kh, seq, dim, block_heads):
    assert kernel("rope").check_rope(batch, n_qh, n_kh, seq, dim, torch.float32, block_heads)


@cpu
def test_rope_contiguous_layout_and_general_tables():
    """q, k contiguous as [batch, heads, seq, dim]; cos and sin with different halves (not the
    model's duplicated table): the backward must still be the exact transpose."""
    rp = kernel("rope")
    g = torch.Generator().manual_seed(4)
    q, k = (torch.randn(2, n, 3, 8, generator=g).to(DEVICE).requires_grad_() for n in (2, 1))
    angles = torch.rand(3, 8, generator=g).to(DEVICE) * 6
    cos, sin = angles.cos(), angles.sin()
    qo, ko = rp.apply_rope(q, k, cos, sin)
    dqo, dko = torch.randn_like(qo), torch.randn_like(ko)
    dq, dk = torch.autograd.grad((qo, ko), (q, k), (dqo, dko))
    exact, bound = rope_exact(q, k, cos, sin, dqo, dko)
    assert within({"q": qo, "k": ko, "dq": dq, "dk": dk}, exact, bound)


# Linear + cross-entropy ------------------------------------------------------------------------


def ce_case(n, hid, vocab, seed, dtype=torch.float32, ignore=()):
    g = torch.Generator(DEVICE).manual_seed(seed)
    h = randn(n, hid, generator=g).to(dtype).requires_grad_()
    w = (randn(vocab, hid, generator=g) / hid**0.5).to(dtype).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=g, device=DEVICE)
    labels[list(ignore)] = -100
    return h, w, labels


@cpu
@pytest.mark.parametrize(
    ("n", "hid", "vocab", "chunk", "block_v", "ignore"),
    [
        (1, 32, 100, None, None, ()),  # one row, one vocabulary block
        (64, 64, 500, 16, 128, (3, 40)),  # many rows, 4 chunks, 4 vocabulary blocks
        (37, 40, 257, 8, 64, ()),  # chunks that do not divide the rows; V not a block multiple
        (12, 16, 50, 5, None, tuple(range(11))),  # all rows but one ignored
    ],
)
def test_linear_cross_entropy_fp32(n, hid, vocab, chunk, block_v, ignore):
    ce = kernel("cross_entropy")
    h, w, labels = ce_case(n, hid, vocab, seed=n, ignore=ignore)
    loss = ce.linear_cross_entropy(h, w, labels, -100, chunk, torch.float32, block_v)
    dh, dw = torch.autograd.grad(loss, (h, w))
    exact, bound = cross_entropy_exact(h, w, labels)
    assert within({"loss": loss, "dh": dh, "dw": dw}, exact, bound)


@cpu
def test_linear_cross_entropy_as_the_model_calls_it():
    """3-D, non-contiguous hidden states h[:, :-1] and labels[:, 1:]; an upstream gradient."""
    ce = kernel("cross_entropy")
    h, w, labels = ce_case(2 * 9, 24, 120, seed=5)
    h3 = h.detach().reshape(2, 9, 24).requires_grad_()
    labels = labels.reshape(2, 9)
    loss = ce.linear_cross_entropy(h3[:, :-1], w, labels[:, 1:])
    dh, dw = torch.autograd.grad(3 * loss, (h3, w))
    exact, bound = cross_entropy_exact(h3[:, :-1], w, labels[:, 1:])
    assert dh[:, -1].abs().max() == 0  # the last position predicts nothing
    scaled = {k: 3 * exact[k] for k in ("dh", "dw")}
    assert within({"dh": dh[:, :-1], "dw": dw}, scaled, {k: 3 * bound[k] for k in scaled})
    assert within({"loss": loss}, exact, bound)


@cpu
def test_linear_cross_entropy_dw_in_weight_dtype():
    """Accumulating dW in fp16 rounds once per chunk: the bound counts 4 roundings."""
    ce = kernel("cross_entropy")
    h, w, labels = ce_case(32, 32, 200, seed=6, dtype=torch.float16)
    loss = ce.linear_cross_entropy(h, w, labels, -100, 8, torch.float16)
    dh, dw = torch.autograd.grad(loss, (h, w))
    exact, bound = cross_entropy_exact(h, w, labels, dw_roundings=4)
    assert within({"loss": loss, "dh": dh, "dw": dw}, exact, bound)


# The bounds are tight enough to catch real bugs ------------------------------------------------


@cpu  # structure only
def test_bounds_are_not_vacuous():
    g = torch.Generator().manual_seed(7)
    x, dy = torch.randn(8, 64, generator=g), torch.randn(8, 64, generator=g)
    w = 1 + torch.rand(64, generator=g)
    exact, bound = rmsnorm_exact(x, w, dy, 1e-6)
    rstd = (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
    no_mean_term = rstd * dy.double() * w.double()  # forgot d rstd / dx
    assert not within({"dx": no_mean_term}, {"dx": exact["dx"]}, {"dx": bound["dx"]})

    gate, up, dh = (torch.randn(64, generator=g) for _ in range(3))
    exact, bound = swiglu_exact(gate, up, dh)
    s = torch.sigmoid(gate.double())
    sigmoid_only = dh.double() * up.double() * s  # forgot the g s (1 - s) term of silu'
    assert not within({"dg": sigmoid_only}, {"dg": exact["dg"]}, {"dg": bound["dg"]})

    q, dq = torch.randn(1, 1, 4, 16, generator=g), torch.randn(1, 1, 4, 16, generator=g)
    angles = torch.rand(4, 16, generator=g) * 3
    exact, bound = rope_exact(q, q, angles.cos(), angles.sin(), dq, dq)
    plus_theta = rope_exact(dq, dq, angles.cos(), angles.sin(), dq, dq)[0]["q"]  # wrong sign
    assert not within({"dq": plus_theta}, {"dq": exact["dq"]}, {"dq": bound["dq"]})

    h, w, labels = ce_case(16, 16, 60, seed=8, ignore=(0, 1, 2, 3))
    exact, bound = cross_entropy_exact(h, w, labels)
    over_all_rows = exact["dw"] * 12 / 16  # divided by N instead of the 12 counted tokens
    assert not within({"dw": over_all_rows}, {"dw": exact["dw"]}, {"dw": bound["dw"]})
    logits = h.detach().double() @ w.detach().double().T
    probs = torch.softmax(logits, -1)
    probs[torch.arange(16), labels.clamp(min=0)] -= 1
    probs[:4] = 0  # the ignored rows
    lost_chunk = (probs[:12] / 12).T @ h.detach().double()[:12]  # last chunk of 4 rows missing
    assert not within({"dw": lost_chunk}, {"dw": exact["dw"]}, {"dw": bound["dw"]})


# Qwen3 with the kernels swapped in ---------------------------------------------------------------


@cpu
@pytest.mark.slow  # a Qwen3 model through the Triton interpreter: seconds
def test_qwen3_swap_points_and_fused_forward():
    q = kernel("qwen3")
    from snippets.common.models.qwen3 import TINY

    eager, ours = q.tiny_models(seed=3)
    ids = torch.randint(0, TINY.vocab_size, (1, 12), generator=torch.Generator().manual_seed(4))
    ids = ids.to(DEVICE)
    labels = ids.clone()
    labels[0, :3] = -100
    ref_loss, ref_grads = q.loss_and_grads(eager, ids, labels)
    assert type(ours.model.norm).__name__ == "TritonRMSNorm"
    for forward in (None, q.fused_loss):
        loss, grads = q.loss_and_grads(ours, ids, labels, forward)
        assert q.rel(loss, ref_loss) <= q.TOLERANCE
        assert grads.keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            assert q.rel(grads[name], g) <= q.TOLERANCE, name


# Custom operators: opcheck, the same numbers as the Functions, torch.compile ------------------


def op_cases():
    """(op, arguments) for every custom operator, small CPU fp32 inputs, odd shapes, 3-D."""
    rn, sw, rp, ce = (kernel(n) for n in ("rmsnorm", "swiglu", "rope", "cross_entropy"))
    g = torch.Generator().manual_seed(20)

    def t(*shape, grad=True):
        return torch.randn(*shape, generator=g).requires_grad_(grad)

    w = (1 + 0.1 * torch.randn(40, generator=g)).requires_grad_()
    x, r, dy = t(2, 5, 40), t(2, 5, 40), t(2, 5, 40, grad=False)
    rstd = torch.rand(10, generator=g) + 0.5
    q, k = t(1, 5, 3, 16).transpose(1, 2), t(1, 5, 1, 16).transpose(1, 2)  # the model's layout
    angles = torch.rand(5, 16, generator=g) * 6
    labels = torch.randint(0, 50, (2, 5), generator=g)
    labels[0, 1] = -100
    return {
        "rms_norm": (rn.rms_norm_op, (x, w, 1e-6, None, 4)),
        "add_rms_norm": (rn.add_rms_norm_op, (x, r, w, 1e-6, 16, 4)),  # two passes of 16
        "rms_norm_backward": (
            rn.rms_norm_backward_op,
            (dy, x.detach(), w.detach(), rstd, dy, None, 4, 2),  # 2 rows a step
        ),
        "swiglu": (sw.swiglu_op, (t(3, 7, 70), t(3, 7, 70), 32)),
        "swiglu_backward": (sw.swiglu_backward_op, (dy, x.detach(), r.detach(), 16)),
        "rope": (rp.rope_op, (q, k, angles.cos(), angles.sin(), 2)),
        "rope_backward": (
            rp.rope_backward_op,
            (q.detach(), k.detach(), angles.cos(), angles.sin(), None),
        ),
        "linear_cross_entropy": (
            ce.linear_cross_entropy_op,
            (t(2, 5, 16), t(50, 16), labels, -100, 4, torch.float32, 16),
        ),
        "linear_cross_entropy_backward": (
            ce.linear_cross_entropy_backward_op,
            (torch.tensor(2.0), t(10, 16, grad=False), t(50, 16, grad=False)),
        ),
    }


# The loss's backward scales the gradients its forward returned, in place (as the Function did:
# no second dW in memory, which the loss table's peak counts). opcheck's AOT test returns every
# output of the op from the graph and then sees it mutated; the wrapper returns only the loss,
# and the compile tests below check that use: AOT's own test is left out for this one op.
NO_AOT = {"linear_cross_entropy": ("test_schema", "test_autograd_registration", "test_faketensor")}


OP_NAMES = ("rms_norm", "add_rms_norm", "rms_norm_backward", "swiglu", "swiglu_backward", "rope",
            "rope_backward", "linear_cross_entropy", "linear_cross_entropy_backward")  # fmt: skip


@cpu
@pytest.mark.parametrize("name", OP_NAMES)
def test_custom_op_passes_opcheck(name):
    """Schema (no aliasing, mutations declared), autograd registered, fake implementation's
    shapes, dtypes and strides equal to the real one's, and tracing through AOTAutograd."""
    op, args = op_cases()[name]
    assert op._qualname == f"handbook::{name}"
    only = {"test_utils": NO_AOT[name]} if name in NO_AOT else {}
    result = torch.library.opcheck(op, args, **only)
    assert set(result.values()) == {"SUCCESS"}


@cpu
@pytest.mark.parametrize("case", ["norm", "add+norm", "add+norm two-pass", "swiglu", "rope"])
def test_ops_and_functions_agree_bit_for_bit(case):
    """The entry points call the torch.autograd.Functions in eager and the custom operators
    under torch.compile; both launch the same kernels: outputs and gradients equal, not just
    close. fp16 activations with an fp32 weight (mixed dtypes), 3-D and strided inputs."""
    rn, sw, rp = kernel("rmsnorm"), kernel("swiglu"), kernel("rope")
    g = torch.Generator().manual_seed(21)
    x, r = (torch.randn(2, 7, 48, generator=g).half() for _ in range(2))
    w = 1 + 0.1 * torch.randn(48, generator=g)
    both = torch.randn(3, 5, 2 * 40, generator=g)
    q, k = (torch.randn(2, 5, n, 16, generator=g).transpose(1, 2) for n in (4, 2))
    angles = torch.rand(5, 16, generator=g) * 6
    tables = (angles.cos(), angles.sin())
    entry, op, function, inputs, extra = {
        "norm": (rn.rms_norm, lambda *a: rn.rms_norm_op(*a)[0], rn.RMSNormFunction,
                 (x, w), (1e-6, None, 4)),
        "add+norm": (rn.add_rms_norm, lambda *a: rn.add_rms_norm_op(*a)[:2],
                     rn.AddRMSNormFunction, (x, r, w), (1e-6, None, 4)),
        "add+norm two-pass": (rn.add_rms_norm, lambda *a: rn.add_rms_norm_op(*a)[:2],
                              rn.AddRMSNormFunction, (x, r, w), (1e-6, 16, 4)),
        "swiglu": (sw.swiglu, sw.swiglu_op, sw.SwiGLUFunction, (both,), (32,)),
        "rope": (rp.apply_rope, rp.rope_op, rp.RoPEFunction, (q, k), (*tables, 2)),
    }[case]  # fmt: skip

    def run(fn, backward_name):
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        args = leaves[0].chunk(2, -1) if case == "swiglu" else leaves  # halves of one matmul
        out = fn(*args, *extra)
        outs = out if isinstance(out, tuple) else (out,)
        assert outs[0].grad_fn.name().startswith(backward_name)  # the entry point it says
        grads = [torch.randn(o.shape, generator=torch.Generator().manual_seed(22)).to(o.dtype)
                 for o in outs]  # fmt: skip
        return [*outs, *torch.autograd.grad(outs, leaves, grads)]

    got = run(op, "GeneratedBackwardFor_handbook_")  # torch.library's autograd for the op
    want = run(entry, function.__name__)  # eager: the entry calls the Function
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want, strict=True))


@cpu
def test_ops_check_their_inputs():
    """RoPE's tables must be [seq, head_dim]: the real and the fake implementation (what
    torch.compile traces with, here on meta tensors) raise the same clear error."""
    rp = kernel("rope")
    q, k = torch.randn(1, 2, 5, 16), torch.randn(1, 1, 5, 16)
    cos = sin = torch.ones(4, 16)  # one position short
    for device in ("cpu", "meta"):
        args = (t.to(device) for t in (q, k, cos, sin))
        with pytest.raises(ValueError, match=r"cos, sin: \[seq, head_dim\] = \(5, 16\)"):
            rp.rope_op(*args)
    meta = rp.rope_op(*(t.to("meta") for t in (q, k, torch.ones(5, 16), torch.ones(5, 16))))
    assert [t.shape for t in meta] == [q.shape, k.shape]


def qwen3_batch(seed):
    from snippets.common.models.qwen3 import TINY

    ids = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[1, 5:] = -100  # padding
    return ids.to(DEVICE), labels.to(DEVICE)


@cpu
def test_an_autograd_function_does_not_compile_whole_in_the_interpreter():
    """Why the page registers custom ops, the part CI can see: on the CPU (Triton's
    interpreter) Dynamo cannot trace the kernels inside an autograd.Function, so fullgraph
    raises; the registered op compiles (test_qwen3_composes_with_torch_compile)."""
    rn = kernel("rmsnorm")
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.ones(32, requires_grad=True)
    compiled = torch.compile(lambda x, w: rn.RMSNormFunction.apply(x, w, 1e-6),
                             backend="aot_eager", fullgraph=True)  # fmt: skip
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(x, w)
    torch._dynamo.reset()


@cpu
def test_entry_points_take_the_op_where_torch_compile_traces():
    """The same call that runs the Function in eager traces the custom op under torch.compile:
    fullgraph holds (the Function would break the graph, above), and the compiled forward and
    gradients equal eager's bit for bit."""
    rn = kernel("rmsnorm")
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.ones(32, requires_grad=True)

    def f(x, w):
        return rn.rms_norm(x, w, 1e-6)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    got, want = compiled(x, w), f(x, w)  # compiled: fullgraph raised for the Function's path
    assert want.grad_fn.name() == "RMSNormFunctionBackward"
    assert torch.equal(got, want)
    dy = torch.randn(4, 32)
    for a, b in zip(torch.autograd.grad(got, (x, w), dy), torch.autograd.grad(want, (x, w), dy),
                    strict=True):  # fmt: skip
        assert torch.equal(a, b)
    torch._dynamo.reset()


@cpu
@pytest.mark.slow  # Dynamo and AOTAutograd trace the TINY model, then it runs twice: ~7-10 s
def test_qwen3_composes_with_torch_compile():
    """The fused forward (all five ops: RMSNorm, add + RMSNorm, RoPE, SwiGLU, linear + CE) in
    one graph: fullgraph raises on any graph break. AOTAutograd (aot_eager) runs the same ops
    in the same order, so loss and all 25 gradients equal eager's bit for bit."""
    q = kernel("qwen3")
    _, model = q.tiny_models(seed=5)
    ids, labels = qwen3_batch(6)
    want_loss, want = q.loss_and_grads(model, ids, labels, q.fused_loss)
    want = {n: g.clone() for n, g in want.items()}
    compiled = torch.compile(q.fused_loss, backend="aot_eager", fullgraph=True)
    loss, got = q.loss_and_grads(model, ids, labels, compiled)
    assert torch.equal(loss, want_loss)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[n], g) for n, g in want.items())


@cpu
@pytest.mark.slow  # Inductor generates and compiles C++ for everything around the ops: seconds
def test_qwen3_composes_with_inductor():
    """Inductor fuses and reorders the eager parts (attention, residual adds, the embedding's
    backward), so not bit for bit: within the swap check's 2 gamma_n norm-wise (qwen3.py)."""
    q = kernel("qwen3")
    _, model = q.tiny_models(seed=5)
    ids, labels = qwen3_batch(6)
    want_loss, want = q.loss_and_grads(model, ids, labels, q.fused_loss)
    want = {n: g.clone() for n, g in want.items()}
    compiled = torch.compile(q.fused_loss, fullgraph=True)
    loss, got = q.loss_and_grads(model, ids, labels, compiled)
    assert q.rel(loss, want_loss) <= q.TOLERANCE
    assert all(q.rel(got[n], g) <= q.TOLERANCE for n, g in want.items())


# The benchmark code, at tiny shapes with a stand-in timer ---------------------------------------


# FP8 quantization and the scaled GEMMs ----------------------------------------------------------


def as_bytes(q):
    return q.view(torch.uint8)


@cpu
@pytest.mark.parametrize(
    ("m", "k", "blockwise", "config"),
    [
        (1, 128, False, None),
        (70, 384, False, None),
        (257, 512, False, (16, 4, 4)),
        (33, 1024, False, (64, 2, 8)),
        (1, 256, True, None),
        (130, 384, True, None),
        (256, 256, True, None),
    ],
    ids=str,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_quantize_matches_pytorch_bit_for_bit(m, k, blockwise, config, dtype):
    """Odd row counts (a last partial block), a row's tiles not a multiple of a program's (384:
    3 tiles, 2 or 4 a program), magnitudes over four decades in a row."""
    fp8 = kernel("fp8")
    gen = torch.Generator().manual_seed(m + k)
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-2, 2, k)).to(DEVICE, dtype)
    q, s = fp8.quantize(x, blockwise, config)
    q_ref, s_ref = fp8.quantize_reference(x, blockwise)
    assert torch.equal(as_bytes(q), as_bytes(q_ref)) and torch.equal(s, s_ref)
    assert s.shape == s_ref.shape == ((-(-m // 128) if blockwise else m), k // 128)
    assert s.stride() == ((k // 128, 1) if blockwise else (1, m))  # _scaled_mm's layouts
    assert fp8.check_quantize(m, k, dtype, blockwise)


@cpu
def test_quantize_zero_tiles_largest_magnitude_and_bad_input():
    fp8 = kernel("fp8")
    x = torch.zeros(3, 256, device=DEVICE)
    x[1, 128:] = torch.linspace(-5, 5, 128)
    q, s = fp8.quantize(x)
    assert s[0, 0] == s[1, 0] == torch.tensor(fp8.TINY) / 448  # all-zero tiles: q = 0
    assert not as_bytes(q)[0].any() and not as_bytes(q[1, :128]).any()
    assert q[1, 128:].float().abs().max() == 448  # the tile's largest magnitude maps to 448
    with pytest.raises(ValueError, match="K = 100 must be a multiple of 128"):
        fp8.quantize(torch.zeros(2, 100, device=DEVICE))
    with pytest.raises(ValueError, match="rows contiguous"):
        fp8.quantize(torch.zeros(256, 2, device=DEVICE).t())


@cpu
def test_interpreter_e4m3_cast_is_fixed_for_these_tests():
    """tests/interpreter.py replaces the interpreter's fp32 -> e4m3 rounding with torch's
    (round to nearest even, saturate at 448). Without it, Triton 3.6's interpreter drops the
    carry (126.24 -> 64) and rounds ties up (1.0625 -> 1.125): this test fails once an upgrade
    fixes that, and the fix can go."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter as triton_interpreter

    from tests import interpreter

    @triton.jit
    def cast(X, Q, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Q + i, tl.load(X + i).to(tl.float8e4nv))

    x = torch.tensor([126.24, 31.61, 1.0625, 1.1875, -3.3, 447.0, 460.0, 2.0**-10, 0.0, -0.0,
                      1e-3, 240.5, 239.9, 17.0, -0.015625, 5.0], device=DEVICE)  # fmt: skip
    want = as_bytes(x.to(torch.float8_e4m3fn))
    q = torch.empty(16, dtype=torch.float8_e4m3fn, device=DEVICE)
    cast[(1,)](x, q, N=16)
    assert torch.equal(as_bytes(q), want)
    fixed = triton_interpreter._convert_float
    try:
        triton_interpreter._convert_float = fixed.__closure__[0].cell_contents  # the original
        cast[(1,)](x, q, N=16)
    finally:
        triton_interpreter._convert_float = fixed
    wrong = q.float()[:4].tolist()
    assert wrong[:3] == [64.0, 16.0, 1.125], f"the interpreter rounds right now: {wrong}"
    interpreter.fix_e4m3_rounding()  # installed once, not twice
    assert triton_interpreter._convert_float is fixed


@cpu
def test_quantize_divides_exactly_when_compiled_for_hopper():
    """Bit for bit on the GPU needs the kernel's division to be IEEE (div.rn.f32), as PyTorch's
    is: Triton compiles `/` to div.full.f32 (approximate, 2 ulp), which the interpreter does not
    show. Each configuration the benchmark runs, compiled for sm_90 on the CPU through ptxas
    (tests/lowering.py, full=True); the e4m3 rounding is the hardware's, nearest even."""
    from tests import lowering

    if not lowering.enabled():
        pytest.skip("needs the interpreter's launch records")
    fp8 = kernel("fp8")
    for config in fp8.QUANT_CONFIGS:
        fp8.quantize(torch.randn(8, 512, device=DEVICE), config=config)
    fp8.quantize(torch.randn(130, 256, device=DEVICE), blockwise=True)
    launches = [
        launch
        for launch in lowering.LAUNCHES.values()
        if launch.kernel.fn.__name__ == "quantize_kernel"
    ]
    assert len({dict(launch.constexprs)["BLOCKWISE"] for launch in launches}) == 2
    ptx = {}
    assert not lowering.lower_all(launches, full=True, ptx=ptx)
    for launch, text in ptx.items():
        assert "div.rn.f32" in text and "div.full.f32" not in text, launch.constexprs
        assert "cvt.rn.satfinite.e4m3x2.f32" in text


@cpu
def test_rmsnorm_backward_registers_as_the_page_says():
    """§11.2: compiled for sm_90 as the JIT specialises them (bf16, H 4096), both default tiles
    keep 16 warps resident an SM, 32 / 2 and 64 / 4 at 32 warps keep 32, the last spilling 8
    bytes (the exact counts are ptxas's: a Triton upgrade may move them). An SM has
    64 K 32-bit registers (compute capability 9.0): programs an SM = 65536 // (registers a
    thread x threads a program), whole programs only."""
    from tests import lowering

    if not lowering.enabled():
        pytest.skip("needs the interpreter's launch records")
    rn = kernel("rmsnorm")
    x, dy = (torch.randn(64, 4096, device=DEVICE).bfloat16() for _ in range(2))
    w, rstd = torch.ones(4096, device=DEVICE).bfloat16(), torch.ones(64, device=DEVICE)
    assert rn.bwd_tile(4096, False)[2:] == (8, 32, 2) and rn.bwd_tile(4096, True)[2:] == (16, 64, 4)
    # (fused, rows, step, warps): (warps resident an SM, bytes of spill stores)
    tiles = {(False, 32, 2, 8): (16, 0), (True, 64, 4, 16): (16, 0), (False, 32, 2, 32): (32, 0),
             (True, 64, 4, 32): (32, 8)}  # fmt: skip
    for fused, per, step, warps in tiles:
        rn.rmsnorm_backward(dy, x, w, rstd, dy if fused else None, None, per, step, warps)
    launches = {}
    for launch in lowering.LAUNCHES.values():
        c, o, types = dict(launch.constexprs), dict(launch.options), dict(launch.signature)
        tile = (c.get("HAS_DSUM"), c.get("ROWS"), c.get("STEP"), o.get("num_warps"))
        if (launch.kernel.fn.__name__ == "rmsnorm_bwd_kernel" and tile in tiles
                and c["BLOCK"] == 4096 and types["DY"] == "*bf16"):  # fmt: skip
            launches[tile] = launch
    assert set(launches) == set(tiles)
    ptx = {}
    assert not lowering.lower_all(list(launches.values()), full=True, ptx=ptx)
    for tile, launch in launches.items():
        used = lowering.resources(ptx[launch])
        warps = tile[3]
        resident = 65536 // (used["registers"] * 32 * warps) * warps
        assert (resident, used["spill_stores"]) == tiles[tile], (tile, used)


def tiny_fp8_shapes():
    return kernel("measure").Shapes(batch=1, seq=6, hidden=512, intermediate=1024)


@cpu
@pytest.mark.parametrize("recipe", ["tensor", "row", "row_fast", "block"])
def test_fp8_operands_fit_scaled_mm(recipe):
    """Every recipe's operands pass torch._scaled_mm's shape checks (its meta kernel); where the
    CPU has the GEMM (per tensor, per row) its result is the product of the FP8 values, up to
    rounding it to bf16 (u = 2^-8) and an fp32 sum of K terms (gamma_K of sum |a||b|)."""
    fp8, m = kernel("fp8"), kernel("measure")
    x, w = m.fp8_inputs(tiny_fp8_shapes(), "down", DEVICE, torch.float32)
    ops = fp8.operands(recipe, x, w)
    meta = torch._scaled_mm(*(t.to("meta") for t in ops[:2]), scale_a=ops[2].to("meta"),
                            scale_b=ops[3].to("meta"), out_dtype=torch.bfloat16)  # fmt: skip
    assert meta.shape == (x.shape[0], w.shape[0])
    exact = fp8.exact_product(recipe, ops)
    assert m.row_error(exact, x.double() @ w.double().t()) < 2.0**-4  # each token, not the norm
    if recipe == "block":  # no CPU kernel: the GPU test below runs it
        with pytest.raises(ValueError, match="K = 384 must be a multiple of 512"):
            fp8.operands(recipe, x[:, :384], w[:, :384])  # cuBLASLt would pad nothing
        return
    a, b, sa, sb = (t.double() for t in ops)
    magnitude = (a.abs() * sa) @ (b.abs() * sb)
    k = x.shape[1]
    bound = 2.0**-8 * exact.abs() + gamma(k) * magnitude
    assert ((fp8.fp8_matmul(recipe, ops).double() - exact).abs() <= bound).all()


@cpu
def test_fp8_measurement_code_runs_at_tiny_shapes():
    fp8, m = kernel("fp8"), kernel("measure")
    s = tiny_fp8_shapes()
    kernels, calls = stand_in_each("gpu-kernels")
    gemms, gemm_calls = stand_in_each("gpu-kernels")
    configs = kernel("fp8").QUANT_CONFIGS  # 4 tiles a row: none shrinks (lowered for sm_90)
    recipes = ("bf16", "tensor", "row")  # no blockwise GEMM on the CPU
    out = m.measure_fp8(s, DEVICE, torch.float32, gemms, kernels, 1e9, configs, recipes,
                        quantizers=("ours", "eager"))  # fmt: skip
    assert [(r["gemm"], r["recipe"]) for r in out["gemms"]] == [
        (g, r) for g in m.FP8_GEMMS for r in recipes]  # fmt: skip
    assert len(gemm_calls) == 6 and len(calls) == 2 * 2 * 2 + len(configs)
    down = out["gemms"][3]
    assert (down["m"], down["n"], down["k"]) == (6, 512, 1024)
    assert down["tflops"].median == 2 * 6 * 512 * 1024 / 1e-3 / 1e12
    assert down["vs_bf16"].median == 1.0
    assert [(r["tensor"], r["gemm"], r["impl"]) for r in out["quantize"]][:4] == [
        ("activation", "gate_up", "ours"), ("activation", "gate_up", "eager"),
        ("weight", "gate_up", "ours"), ("weight", "gate_up", "eager")]  # fmt: skip
    weight = out["quantize"][2]
    assert (weight["m"], weight["k"]) == (1024, 512)
    assert weight["of_copy"].median == (1024 * 512 * 5 + 8 * 4 * 4) / 1e-3 / 1e9
    assert [(r["rows"], r["tiles"], r["warps"]) for r in out["configs"]] == list(configs)
    assert out["configs"][0]["of_copy"].median == (6 * 512 * 5 + 6 * 4 * 4) / 1e-3 / 1e9
    assert fp8.QUANT_CONFIG in fp8.QUANT_CONFIGS  # the sweep shows the default


@cpu
def test_fp8_errors_at_tiny_shapes():
    """Rows for each GEMM, input kind and recipe. On normal inputs every FP8 recipe is off by
    about e4m3's rounding (2^-4 at most, a few per cent typically), the fp32 GEMM by almost
    nothing; with massive activations one scale for the whole tensor pushes the other tokens'
    entries down among e4m3's subnormals (below 2^-6 of 448 / amax), and their rows' error grows,
    while a scale per row keeps them."""
    m = kernel("measure")
    s = m.Shapes(batch=1, seq=64, hidden=512, intermediate=384)
    rows = m.fp8_errors(s, DEVICE, torch.float32, ("bf16", "tensor", "row"))
    assert [(r["gemm"], r["inputs"], r["recipe"]) for r in rows][:4] == [
        ("gate_up", "normal", "bf16"), ("gate_up", "normal", "tensor"),
        ("gate_up", "normal", "row"), ("gate_up", "massive", "bf16")]  # fmt: skip
    assert len(rows) == 2 * 2 * 3
    by = {(r["gemm"], r["inputs"], r["recipe"]): r for r in rows}
    for (gemm, inputs, recipe), r in by.items():
        assert 0 <= r["floor"] < 2.0**-20  # fp32 outputs
        if recipe == "bf16":
            assert "gemm_error" not in r and r["error"] < 2.0**-20
        else:
            assert r["gemm_error"] < 2.0**-8  # the CPU's GEMM rounds to bf16 once
            if inputs == "normal" or recipe == "row":
                assert 2.0**-8 < r["error"] < 2.0**-4
            else:
                assert r["error"] > 2 * by[gemm, inputs, "row"]["error"]
    exact = torch.tensor([[3.0, 4.0], [0.0, 0.0], [6.0, 8.0]], dtype=torch.float64)
    assert m.row_error(exact.float(), exact) == 0  # a zero row matched exactly: no 0 / 0
    assert m.row_error(torch.tensor([[3.0, 4.5], [1.0, 0.0], [6.0, 8.0]]), exact) == 0.1
    x, _ = m.fp8_inputs(s, "gate_up", DEVICE, torch.float32, massive=True)
    assert (x == m.MASSIVE[2]).sum() == m.MASSIVE[1] * -(-64 // m.MASSIVE[0])


@cpu  # structure only
def test_byte_model_matches_the_fusion_ranking():
    """The same bytes as the qwen3-fusion post's fusion candidates (forward + backward)."""
    m = kernel("measure")
    s = m.Shapes()
    t, h, i = s.tokens, s.hidden, s.intermediate
    assert sum(m.byte_model("rmsnorm", s, 2)) == 2 * 5 * t * h
    assert sum(m.byte_model("add_rmsnorm", s, 2)) == 2 * 8 * t * h
    assert sum(m.byte_model("swiglu", s, 2)) == 2 * 8 * t * i
    assert m.loss_flops(s) == 6 * 8192 * 4096 * 151_936


def stand_in(clock):
    """A clock for the CPU: runs fn once, records it, and says 1 ms (a steady timing)."""
    calls = []

    def time_it(fn):
        fn()
        calls.append(fn)
        return Stat.of([1.0] * 5, clock)

    return time_it, calls


def stand_in_each(clock):
    """stand_in for kernel_ms_each: a list of callables in, one timing each out."""
    time_it, calls = stand_in(clock)
    return lambda fns: [time_it(fn) for fn in fns], calls


@cpu
def test_measurement_code_runs_at_tiny_shapes():
    m = kernel("measure")
    s = m.Shapes(batch=1, seq=4, hidden=32, intermediate=48, q_heads=2, kv_heads=1, head_dim=8,
                 vocab=40)  # fmt: skip
    kernels, kernel_calls = stand_in_each("gpu-kernels")
    impls = m.implementations(("ours", "eager"), s.hidden, s.eps)
    rows, wide = m.measure_ops(s, DEVICE, torch.float32, kernels, 1e9, impls)
    assert [(r["op"], r["impl"]) for r in rows] == [(op, n) for op in m.OPS for n in impls]
    assert len(kernel_calls) == 2 * len(rows)  # forward, backward
    rms = next(r for r in rows if r["op"] == "rmsnorm")
    assert rms["fwd_of_copy"].median == 2 * 4 * 32 * 4 / 1e-3 / 1e9
    assert set(rms) == {"op", "impl", "fwd_ms", "bwd_ms", "fwd_of_copy", "bwd_of_copy"}
    assert [r["op"] for r in wide] == list(m.OPS)
    assert set(wide[0]) == {"op", "ours", "eager"}
    assert wide[0]["ours"].median == 2.0 and wide[0]["ours"].derived
    choices = ((1, 1), (4, 2), (4, 2, 2))  # (rows a program, a step[, warps])
    tuned = m.sweep_rows_per_program(s, DEVICE, torch.float32, kernels, 1e9, choices)
    tiles = [(1, 1, 4, 4), (4, 2, 4, 1), (4, 2, 2, 1)]  # per, step, warps (4: the rule's), programs
    got = [(r["op"], r["rows_per_program"], r["rows_per_step"], r["warps"], r["programs"])
           for r in tuned]  # fmt: skip
    assert got == [(op, *t) for op in ("rmsnorm", "add_rmsnorm") for t in tiles]
    assert tuned[3]["bwd_of_copy"].median == 4 * 4 * 32 * 4 / 1e-3 / 1e9  # dy, ds, s -> dx
    sweep = m.sweep_rmsnorm((16, 24), 4, DEVICE, torch.float32, kernels, 1e9, impls)
    assert [r["hidden"] for r in sweep] == [16, 24]
    assert set(sweep[0]) == {"hidden", "ours_ms", "ours_of_copy", "eager_ms", "eager_of_copy"}
    # one_pass is the default kernel up to MAX_BLOCK: timed only past it
    assert not m.swept("one_pass", m.MAX_BLOCK) and m.swept("one_pass", m.MAX_BLOCK + 1)
    assert m.swept("ours", 16) and m.swept("liger", 16)
    variants = [("ours", (2, torch.float32)), ("eager", None), ("absent", None)]
    loss = m.measure_loss(s, DEVICE, torch.float32, kernels, 1e12, impls, lambda fn: 10**6,
                          variants)  # fmt: skip
    assert [(r["impl"], r.get("chunk_rows"), r.get("dw_accum")) for r in loss] == [
        ("ours", 2, "fp32"), ("eager", None, None)]  # fmt: skip
    grads = (4 * 32 + 40 * 32) * 4
    assert loss[0]["extra_of_logits"] == (10**6 - grads) / (4 * 40 * 4)


@cpu
def test_from_python_view_at_tiny_shapes():
    """Every (operator, entry point) timed in one interleaved call (fastest_interleaved's
    {key: (fn, calls)} in, {key: Stat} out), each a forward + backward that reaches every leaf;
    one row per operator with a column per entry point; the custom ops' entry has no loss."""
    m = kernel("measure")
    s = m.Shapes(batch=1, seq=4, hidden=32, intermediate=48, q_heads=2, kv_heads=1, head_dim=8,
                 vocab=40)  # fmt: skip
    impls = m.implementations(("ours", "custom_op", "eager"), s.hidden, s.eps)
    assert "loss" not in impls["custom_op"] and impls["ours"].keys() - {"loss"} == set(m.OPS)
    seen = {}

    def interleaved(steps):  # stand-in for fastest_interleaved: one call each, 1 ms
        for key, (fn, calls) in steps.items():
            grads = fn()
            seen[key] = (calls, all(g is not None for g in grads))
        return {key: Stat.of([1.0] * 21, "python-fastest", keep=7) for key in steps}

    rows = m.measure_from_python(s, DEVICE, torch.float32, interleaved, impls)
    assert list(seen) == [(op, n) for op in m.OPS for n in ("ours", "custom_op", "eager")]
    assert all(v == (m.PYTHON_CALLS, True) for v in seen.values())
    assert [r["op"] for r in rows] == list(m.OPS)
    assert set(rows[0]) == {"op", "ours", "custom_op", "eager"}
    assert rows[0]["ours"].clock == "python-fastest"
    assert m.PYTHON_IMPLS == ("ours", "custom_op", "compile", "liger")


@cpu
def test_one_pass_rmsnorm_keeps_a_wide_row_in_one_block(monkeypatch):
    """The sweep's `one_pass` line: a row wider than MAX_BLOCK in one block (one read), where
    the default reads it twice; both within the bounds of numerics.py."""
    m, rn = kernel("measure"), kernel("rmsnorm")
    monkeypatch.setattr(rn, "MAX_BLOCK", 16)  # rows of 24 are "wide" here
    assert rn._block(24, None)[:2] == (16, 2) and rn._block(24, 32)[:2] == (32, 1)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 24, generator=g).requires_grad_()
    w = (1 + 0.1 * torch.randn(24, generator=g)).requires_grad_()
    dy = torch.randn(6, 24, generator=g)
    exact, bound = rmsnorm_exact(x, w, dy, 1e-6)
    for norm in (rn.rms_norm, m.one_pass_rms_norm):
        y = norm(x, w, 1e-6)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        assert within({"y": y, "dx": dx, "dw": dw}, exact, bound)


def tiny_plan(impls):
    w, m = kernel("warm"), kernel("measure")
    s = m.Shapes(batch=1, seq=4, hidden=32, intermediate=48, q_heads=2, kv_heads=1, head_dim=8,
                 vocab=40)  # fmt: skip
    variants = (("ours", (2, torch.float32)), ("ours", (4, torch.bfloat16)), ("eager", None),
                ("compile", None), ("liger", None))  # fmt: skip
    return w.Plan(s, torch.float32, impls, ((1, 1), (4, 2)), (16, 24), ("ours", "liger"), variants,
                  device=str(DEVICE))  # fmt: skip


@cpu  # structure only
def test_warm_units_cover_the_benchmark(monkeypatch):
    w = kernel("warm")
    todo = w.units(tiny_plan(("ours", "eager", "compile", "liger")))
    assert [u[1] for u in todo] == ["compile"] * 5 + ["liger"] * 7 + ["ours"] * 8  # longest first
    assert todo[0] == ("loss", "compile", None)
    assert ("ops", "ours", "rope") in todo and ("rows", "ours", None) in todo
    sweeps = [u[1:] for u in todo if u[0] == "sweep"]
    assert sweeps == [("liger", 16), ("liger", 24), ("ours", 16), ("ours", 24)]
    assert not any(u[1] == "eager" for u in todo)  # nothing to compile
    plan = tiny_plan(("ours", "liger"))
    plan = w.Plan(**(plan.__dict__ | {"sweep_impls": ("ours", "one_pass", "liger")}))
    monkeypatch.setattr(kernel("measure"), "MAX_BLOCK", 16)  # rows of 24 are "wide" here
    # the sweep's own line, only where it is not the default kernel (H > MAX_BLOCK)
    assert [u for u in w.units(plan) if u[1] == "one_pass"] == [("sweep", "one_pass", 24)]


@cpu
def test_warm_units_call_what_the_benchmark_times():
    """Each unit runs every callable its measure.py function would time (the stand-in clock
    counts them); Liger's units do nothing where it is not installed, as the benchmark."""
    w = kernel("warm")
    plan = tiny_plan(("ours", "liger"))
    liger = isinstance(kernel("measure").liger_ops(), dict)
    counts = {}
    for unit in w.units(plan):
        if unit[1] == "liger" and liger:
            continue  # its kernels would run in Triton's interpreter: the GPU run covers them
        clock, calls = stand_in_each("gpu-kernels")
        w.run_unit(unit, plan, clock)
        counts[unit] = len(calls)
    ours = {u: n for u, n in counts.items() if u[1] == "ours"}
    assert ours[("loss", "ours", None)] == 2  # two variants
    assert ours[("ops", "ours", "rmsnorm")] == 2  # forward, backward
    assert ours[("rows", "ours", None)] == 4  # two tiles, each for both norms
    assert ours[("sweep", "ours", 16)] == 1  # forward + backward
    assert all(n == 0 for u, n in counts.items() if u[1] == "liger")
    with pytest.raises(ValueError, match="unknown unit"):
        w.run_unit(("nothing", "ours", None), plan)


@cpu
def test_warm_units_for_fp8(monkeypatch):
    """With FP8 configurations in the plan: our kernels in one unit, torch.compile's quantizer
    in one unit per shape (each compiles for its shapes), with the benchmark's arguments."""
    w = kernel("warm")
    plan = w.Plan(*tiny_plan(("ours", "compile")).__dict__.values())
    assert not any(u[0] == "fp8" for u in w.units(plan))
    plan = w.Plan(**(plan.__dict__ | {"fp8_configs": ((8, 4, 4),)}))
    todo = [u for u in w.units(plan) if u[0] == "fp8"]
    compiles = [("fp8", "compile", "gate_up"), ("fp8", "compile", "down")]
    assert todo == [*compiles, ("fp8", "ours", None)]
    seen = []
    monkeypatch.setattr(w, "measure_fp8", lambda *a, **k: seen.append((a[6:], k)))
    for unit in todo:
        w.run_unit(unit, plan)
    assert seen == [(((), (), ("compile",)), {"shapes": ("gate_up",)}),
                    (((), (), ("compile",)), {"shapes": ("down",)}),
                    ((((8, 4, 4),),), {"quantizers": ("ours",)})]  # fmt: skip


@cpu
@pytest.mark.slow  # two Python processes that import torch and the kernel files: seconds
def test_warm_workers_run_every_unit():
    w = kernel("warm")
    plan = tiny_plan(("ours",))
    done = w.finish(w.start(plan, workers=2))
    assert done == {"units": 8, "failed": 0, "waited_s": done["waited_s"]}


def test_liger_rows_only_when_installed():
    m = kernel("measure")
    found = m.implementations(("liger",), 32, 1e-6)
    liger = m.liger_ops()
    assert ("liger" in found) == isinstance(liger, dict)
    if not isinstance(liger, dict):
        assert liger.startswith("未安装")  # the reason, recorded in the result


# GPU: bf16 at Qwen3-8B sizes (nox -s gpu_docs) ------------------------------------------------


@pytest.fixture
def exact_matmul_accumulation():
    """The loss bounds assume fp32 accumulation inside cuBLAS: no reduced-precision split-K."""
    cfg = torch.backends.cuda.matmul
    saved = cfg.allow_bf16_reduced_precision_reduction, cfg.allow_fp16_reduced_precision_reduction
    cfg.allow_bf16_reduced_precision_reduction = cfg.allow_fp16_reduced_precision_reduction = False
    yield
    cfg.allow_bf16_reduced_precision_reduction, cfg.allow_fp16_reduced_precision_reduction = saved


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("rows", "h"),
    [(4096, 4096), (256, 16384)],  # Qwen3-8B's hidden size; two passes (> MAX_BLOCK)
    ids=str,
)
def test_rmsnorm_bf16(rows, h):
    assert rmsnorm_within_bounds(rows, h, torch.bfloat16)  # default block and rows per program
    assert rmsnorm_within_bounds(rows, h, torch.bfloat16, residual=True)


@pytest.mark.gpu
@gpu
def test_swiglu_and_rope_bf16():
    assert swiglu_within_bounds((2048, 12288), torch.bfloat16)
    assert kernel("rope").check_rope(2, 32, 8, 512, 128, torch.bfloat16)


@pytest.mark.gpu
@gpu
def test_linear_cross_entropy_bf16(exact_matmul_accumulation):
    """Qwen3's vocabulary, every third row padding: the kernel is the benchmark's (38 blocks
    of the vocabulary a row), compiled when the page ran it."""
    ce = kernel("cross_entropy")
    vocab = QWEN3_8B.vocab_size
    h, w, labels = ce_case(
        1024, 1024, vocab, seed=0, dtype=torch.bfloat16, ignore=range(0, 1024, 3)
    )
    loss = ce.linear_cross_entropy(h, w, labels, -100, 256, torch.float32)
    dh, dw = torch.autograd.grad(loss, (h, w))
    exact, bound = cross_entropy_exact(h, w, labels)
    assert within({"loss": loss, "dh": dh, "dw": dw}, exact, bound)


@pytest.mark.gpu
@gpu
def test_rmsnorm_casts_like_hugging_face_in_bf16():
    from snippets.common.models.qwen3 import RMSNorm

    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    eager = RMSNorm(4096, 1e-6).to("cuda", torch.bfloat16)
    with torch.no_grad():
        eager.weight.uniform_(1, 3)
    ours = kernel("rmsnorm").rms_norm(x, eager.weight.detach(), 1e-6)
    assert (ours == eager(x)).float().mean() >= 0.999


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("blockwise", [False, True], ids=["tiles", "blocks"])
def test_quantize_bf16_bit_for_bit(blockwise):
    """The compiled kernel (the GPU's own e4m3 rounding) against PyTorch's, bf16 at the MLP's
    widths, magnitudes over four decades in a row."""
    fp8 = kernel("fp8")
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    x = randn(4096, 12288, generator=gen) * torch.logspace(-2, 2, 12288, device=DEVICE)
    x = x.to(torch.bfloat16)
    q, s = fp8.quantize(x, blockwise)
    q_ref, s_ref = fp8.quantize_reference(x, blockwise)
    assert torch.equal(as_bytes(q), as_bytes(q_ref)) and torch.equal(s, s_ref)
    assert fp8.check_quantize(257, 384, torch.bfloat16, blockwise)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("recipe", ["tensor", "row", "block"])  # row_fast: measured, not bounded
def test_scaled_mm_computes_the_product_of_the_fp8_values(recipe):
    """torch._scaled_mm on our operands returns the product of the values they stand for: a
    misread scale layout (transposed, or per row where per tile) is off by O(1), since the
    scales span four decades along K. Bound, per token (row_error): rounding the output to bf16,
    at most u = 2^-8; the accumulation, 2^-8 more -- the tensor cores keep about 14 bits
    (DeepSeek-V3 §3.3.2), over K = 12288 with partial sums promoted to fp32 each 128 at most."""
    fp8, m = kernel("fp8"), kernel("measure")
    s = m.Shapes(batch=1, seq=1024)
    x, w = m.fp8_inputs(s, "down", DEVICE, torch.bfloat16)  # not massive: one scale for the
    # tensor would round whole rows to 0 (0 / 0 then); the layouts show without it
    x = (x.float() * torch.logspace(-2, 2, x.shape[1], device=DEVICE)).to(torch.bfloat16)
    ops = fp8.operands(recipe, x, w)
    exact = fp8.exact_product(recipe, ops)
    assert m.row_error(fp8.fp8_matmul(recipe, ops), exact) <= 2 * 2.0**-8


def test_loss_backward_allocates_nothing_the_size_of_its_gradients():
    """The backward only scales dh and dW in place: autograd must not materialise zero
    gradients for the op's dh and dW outputs (an H200 run measured 1.2 GiB of them)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from snippets.triton_kernels.cross_entropy import linear_cross_entropy

    h = torch.randn(16, 32, device=DEVICE, requires_grad=True)
    w = torch.randn(64, 32, device=DEVICE, requires_grad=True)
    loss = linear_cross_entropy(h, w, torch.randint(0, 64, (16,), device=DEVICE), -100, 8)
    made = []

    class Allocations(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple | list) else [out]:
                if isinstance(t, torch.Tensor) and t.numel() >= h.numel():
                    made.append(str(func))
            return out

    with Allocations():
        dh, dw = torch.autograd.grad(loss, (h, w))
    assert made == [], made
    assert dh.shape == h.shape and dw.shape == w.shape
