"""Benchmark functions: byte models, runners for ours / eager / torch.compile / Liger Kernel.

Functions only; bench_gpu.py runs them on the GPU at Qwen3-8B shapes with the clocks of
snippets/common/bench.py (kernel_ms_each) and snippets/common/hostbound.py
(fastest_interleaved), which come in as arguments: on the CPU they run at tiny shapes
(tests/snippets/test_triton_kernels.py) with stand-in clocks.
"""

import importlib
import importlib.metadata
from dataclasses import dataclass, replace
from functools import partial

import torch
from torch.func import functional_call

from snippets.common.bench import rate
from snippets.common.models.qwen3 import QWEN3_8B, RMSNorm, lm_loss, rope_tables
from snippets.common.models.qwen3 import apply_rope as eager_rope
from snippets.common.models.qwen3 import swiglu as eager_swiglu
from snippets.triton_kernels import fp8
from snippets.triton_kernels.cross_entropy import linear_cross_entropy
from snippets.triton_kernels.rmsnorm import (
    MAX_BLOCK,
    add_rms_norm,
    add_rms_norm_op,
    bwd_tile,
    rms_norm,
    rms_norm_op,
    rmsnorm_backward,
    rmsnorm_forward,
)
from snippets.triton_kernels.rope import apply_rope, rope_op
from snippets.triton_kernels.swiglu import swiglu, swiglu_op


# --8<-- [start:bytes]
@dataclass(frozen=True)
class Shapes:
    batch: int = 2
    seq: int = 4096
    hidden: int = QWEN3_8B.hidden_size
    intermediate: int = QWEN3_8B.intermediate_size
    q_heads: int = QWEN3_8B.num_attention_heads
    kv_heads: int = QWEN3_8B.num_key_value_heads
    head_dim: int = QWEN3_8B.head_dim
    vocab: int = QWEN3_8B.vocab_size
    eps: float = QWEN3_8B.rms_norm_eps

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def byte_model(op: str, s: Shapes, elem: int) -> tuple[int, int]:
    """Bytes that any implementation must move, forward and backward: each input read once,
    each output written once. Per-row statistics, weights and dw (O(T + H)) are left out:
    under 0.1% at these shapes."""
    t, h, i = s.tokens, s.hidden, s.intermediate
    qk = t * (s.q_heads + s.kv_heads) * s.head_dim
    fwd, bwd = {
        "rmsnorm": (2 * t * h, 3 * t * h),  # x -> y;  dy, x -> dx
        "add_rmsnorm": (4 * t * h, 4 * t * h),  # x, r -> s, y;  dy, ds, s -> dx (= dr)
        "swiglu": (3 * t * i, 5 * t * i),  # gate, up -> h;  dh, gate, up -> dgate, dup
        "rope": (2 * qk, 2 * qk),  # q, k -> q, k;  dq, dk -> dq, dk
    }[op]
    return fwd * elem, bwd * elem


def loss_flops(s: Shapes) -> int:
    """Three matmuls of 2 N H V FLOP each: logits, dh, dW (the softmax is negligible)."""
    return 6 * s.tokens * s.hidden * s.vocab


# --8<-- [end:bytes]


# --8<-- [start:implementations]
OPS = ("rmsnorm", "add_rmsnorm", "swiglu", "rope")  # data keys; the page maps them to names
IMPLS = ("ours", "eager", "compile", "liger")  # compile: torch.compile; liger: Liger Kernel


def liger_ops():
    """Liger Kernel's ops with our signatures; or, when it cannot be used here, the reason."""
    try:
        lk = importlib.import_module("liger_kernel.ops")
        rope = importlib.import_module("liger_kernel.transformers.rope")
        flce = importlib.import_module("liger_kernel.transformers.fused_linear_cross_entropy")
        version = importlib.metadata.version("liger-kernel")
    except ImportError as exc:  # not installed, or a dependency missing: its rows are left out
        return f"未安装（{exc}）"

    def add_norm(x, r, w, eps):
        y, s = lk.LigerFusedAddRMSNormFunction.apply(x, r, w, eps, 0.0, "llama", False)
        return s, y

    loss = flce.LigerFusedLinearCrossEntropyLoss()  # mean over labels != -100; (weight, x, y)
    return {
        "version": version,
        "rmsnorm": lambda x, w, eps: lk.LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False),
        "add_rmsnorm": add_norm,
        "swiglu": lambda g, u: lk.LigerSiLUMulFunction.apply(g, u),
        "rope": lambda q, k, cos, sin: rope.liger_rotary_pos_emb(q, k, cos, sin),
        "loss": lambda h, w, y: loss(w, h.reshape(-1, h.shape[-1]), y.reshape(-1)),
    }


def eager_ops(hidden, eps):
    norm = RMSNorm(hidden, eps)  # the model's own module, called with our weight tensor

    def rms(x, w, eps):
        return functional_call(norm, {"weight": w}, (x,))

    def add_norm(x, r, w, eps):
        s = x + r
        return s, rms(s, w, eps)

    return {"rmsnorm": rms, "add_rmsnorm": add_norm, "swiglu": eager_swiglu, "rope": eager_rope,
            "loss": lm_loss}  # fmt: skip


def one_pass_rms_norm(x, w, eps):
    return rms_norm(x, w, eps, block=1 << (x.shape[-1] - 1).bit_length())


def implementations(names, hidden, eps):
    """{implementation: {op: callable}} for the requested names that are available here."""
    ours = {"rmsnorm": rms_norm, "add_rmsnorm": add_rms_norm, "swiglu": swiglu,
            "rope": apply_rope, "loss": linear_cross_entropy}  # fmt: skip
    found = {}
    for name in names:
        if name == "ours":
            found[name] = ours
        elif name == "one_pass":  # RMSNorm with a whole row in one block however wide (ours
            # reads rows wider than MAX_BLOCK twice): the hidden-size sweep's other line
            found[name] = {"rmsnorm": one_pass_rms_norm}
        elif name == "custom_op":  # our custom ops called directly, as torch.compile calls them
            found[name] = {
                "rmsnorm": lambda x, w, eps: rms_norm_op(x, w, float(eps))[0],
                "add_rmsnorm": lambda x, r, w, eps: add_rms_norm_op(x, r, w, float(eps))[:2],
                "swiglu": swiglu_op,
                "rope": rope_op,
            }  # the loss is an op in both entries
        elif name == "eager":
            found[name] = eager_ops(hidden, eps)
        elif name == "compile":  # compiled on first call, for these shapes only
            eager = eager_ops(hidden, eps)
            found[name] = {op: torch.compile(fn, dynamic=False) for op, fn in eager.items()}
        elif name == "liger" and isinstance(liger := liger_ops(), dict):
            found[name] = liger
    return found


# --8<-- [end:implementations]


# --8<-- [start:runners]
def op_inputs(op, s: Shapes, device, dtype):
    """Leaves (requiring grad) and extra arguments for one operator at the given shapes."""
    t, h = s.tokens, s.hidden

    def leaf(*shape):
        return torch.randn(*shape, device=device, dtype=dtype).requires_grad_()

    def weight():
        return (1 + 0.1 * torch.randn(h, device=device)).to(dtype).requires_grad_()

    if op == "rmsnorm":
        return [leaf(t, h), weight()], [s.eps]
    if op == "add_rmsnorm":
        return [leaf(t, h), leaf(t, h), weight()], [s.eps]
    if op == "swiglu":
        return [leaf(t, s.intermediate), leaf(t, s.intermediate)], []
    cfg = replace(QWEN3_8B, head_dim=s.head_dim)
    cos, sin = (x.to(dtype) for x in rope_tables(cfg, s.seq, device))

    def heads(n):  # [batch, seq, heads, dim] viewed as [batch, heads, seq, dim], as in the model
        x = torch.randn(s.batch, s.seq, n, s.head_dim, device=device, dtype=dtype)
        return x.transpose(1, 2).requires_grad_()

    return [heads(s.q_heads), heads(s.kv_heads)], [cos, sin]


def runners(fn, leaves, extra):
    """(forward, backward, forward + backward) callables; backward reuses one recorded graph."""
    out = fn(*leaves, *extra)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.randn_like(o) for o in outs]

    def forward():
        return fn(*leaves, *extra)

    def backward():
        return torch.autograd.grad(outs, leaves, grads, retain_graph=True)

    def both():
        o = fn(*leaves, *extra)
        return torch.autograd.grad(o if isinstance(o, tuple) else (o,), leaves, grads)

    return forward, backward, both


# --8<-- [end:runners]


# --8<-- [start:measure]
def measure_ops(s: Shapes, device, dtype, kernel_times, copy_bytes_per_s, impls, ops=OPS):
    """Two lists of rows. `ops`: one row per (operator, implementation), the kernels' own time of
    the forward and of the backward (kernel_times: kernel_ms_each on the GPU, one list of
    callables in, one Stat each out) and their fractions of the copy bandwidth. `fwdbwd`: one
    row per operator, forward + backward of each implementation (the sum of its two timings)."""
    elem = torch.finfo(dtype).bits // 8
    cases = []  # (op, implementation, forward, backward)
    for op in ops:
        for name, fns in impls.items():
            leaves, extra = op_inputs(op, s, device, dtype)
            cases.append((op, name, *runners(fns[op], leaves, extra)[:2]))
    times = iter(kernel_times([fn for case in cases for fn in case[2:]]))
    rows, fwdbwd = [], {}
    for op, name, *_ in cases:
        fwd_bytes, bwd_bytes = byte_model(op, s, elem)
        fwd, bwd = next(times), next(times)
        rows.append({"op": op, "impl": name, "fwd_ms": fwd, "bwd_ms": bwd,
                     "fwd_of_copy": rate(fwd_bytes, fwd) / copy_bytes_per_s,
                     "bwd_of_copy": rate(bwd_bytes, bwd) / copy_bytes_per_s})  # fmt: skip
        fwdbwd.setdefault(op, {"op": op})[name] = fwd + bwd
    return rows, list(fwdbwd.values())


def sweep_rows_per_program(s: Shapes, device, dtype, kernel_times, copy_bytes_per_s, choices):
    """Our RMSNorm and add + RMSNorm backward (the launcher: the kernel and the partial sums'
    reduction) for several (rows per program, rows per loop step[, warps]): fewer rows per
    program give more programs in flight but a larger fp32 partial-sum buffer (programs x H,
    written once and read once); more rows a step put more loads in flight between two
    reductions; warps (when not given, bwd_tile's rule) trade registers a thread (spills) for
    threads a program."""
    elem = torch.finfo(dtype).bits // 8
    t, h = s.tokens, s.hidden
    cases = []
    for op in ("rmsnorm", "add_rmsnorm"):
        fused = op == "add_rmsnorm"
        for per, step, *warps in choices:
            (x, *rest), (eps,) = op_inputs(op, s, device, dtype)
            with torch.no_grad():
                w = rest[-1]
                res = rest[0] if fused else None
                _, rstd, total = rmsnorm_forward(x, w, eps, residual=res)
                x = total if fused else x  # the fused backward reads the sum s
                dy = torch.randn_like(x)
            tile = bwd_tile(h, fused, None, per, step, *warps)
            backward = partial(rmsnorm_backward, dy, x, w, rstd, dy if fused else None, None,
                               per, step, *warps)  # fmt: skip
            cases.append((op, per, step, tile[2], backward))
    rows = []
    times = kernel_times([case[4] for case in cases])
    for (op, per, step, warps, _), ms in zip(cases, times, strict=True):
        programs = -(-t // per)
        of_copy = rate(byte_model(op, s, elem)[1], ms) / copy_bytes_per_s
        rows.append({"op": op, "rows_per_program": per, "rows_per_step": step, "warps": warps,
                     "programs": programs, "partial_mb": 2 * programs * h * 4 / 1e6, "bwd_ms": ms,
                     "bwd_of_copy": of_copy})  # fmt: skip
    return rows


def swept(name: str, hidden: int) -> bool:
    """Whether the hidden-size sweep times `name` at `hidden`: one_pass only past MAX_BLOCK,
    below which it is the default kernel with the same block and tile (a second timing of it)."""
    return name != "one_pass" or hidden > MAX_BLOCK


def sweep_rmsnorm(hiddens, tokens, device, dtype, kernel_times, copy_bytes_per_s, impls):
    """RMSNorm forward + backward over hidden sizes: kernel time and fraction of the copy
    bandwidth per implementation (columns <impl>_ms, <impl>_of_copy; none where not swept)."""
    elem = torch.finfo(dtype).bits // 8
    cases = []  # (hidden, implementation, forward + backward)
    for h in hiddens:
        s = Shapes(batch=1, seq=tokens, hidden=h)
        for name, fns in impls.items():
            if not swept(name, h):
                continue
            leaves, extra = op_inputs("rmsnorm", s, device, dtype)
            cases.append((h, name, runners(fns["rmsnorm"], leaves, extra)[2]))
    rows = {}
    for (h, name, _), ms in zip(cases, kernel_times([c[2] for c in cases]), strict=True):
        nbytes = sum(byte_model("rmsnorm", Shapes(batch=1, seq=tokens, hidden=h), elem))
        row = rows.setdefault(h, {"hidden": h})
        row[f"{name}_ms"] = ms
        row[f"{name}_of_copy"] = rate(nbytes, ms) / copy_bytes_per_s
    return list(rows.values())


def loss_variant(chunk_rows, dw_dtype):
    def loss(h, w, y):
        return linear_cross_entropy(h, w, y, -100, chunk_rows, dw_dtype)

    return loss


DW_ACCUM = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def measure_loss(s: Shapes, device, dtype, kernel_times, matmul_flop_per_s, impls, memory,
                 variants):  # fmt: skip
    """Linear + cross-entropy, forward + backward: time, matmul-throughput fraction, and peak
    memory beyond the inputs and the two gradients every implementation returns (dh, dW), as a
    fraction of the bf16 logits. `variants`: (implementation, options), options = (chunk
    rows, dW accumulator dtype) for ours."""
    gen = torch.Generator(device=device).manual_seed(0)
    h = torch.randn(s.tokens, s.hidden, device=device, dtype=dtype, generator=gen)
    w = torch.randn(s.vocab, s.hidden, device=device, dtype=dtype, generator=gen) * s.hidden**-0.5
    y = torch.randint(0, s.vocab, (s.tokens,), device=device, generator=gen)
    h.requires_grad_(), w.requires_grad_()
    logits_bytes = s.tokens * s.vocab * torch.finfo(dtype).bits // 8
    grads_bytes = (h.numel() + w.numel()) * torch.finfo(dtype).bits // 8
    cases = []  # (implementation, options, forward + backward)
    for name, options in variants:
        if name not in impls:
            continue
        fn = loss_variant(*options) if options else impls[name]["loss"]

        def both(fn=fn):
            return torch.autograd.grad(fn(h, w, y), (h, w))

        cases.append((name, options, both))
    times = kernel_times([c[2] for c in cases])  # first: compiles what needs compiling
    rows = []
    for (name, options, both), ms in zip(cases, times, strict=True):
        extra = memory(both) - grads_bytes
        row = {"impl": name}
        if options:
            row |= {"chunk_rows": options[0], "dw_accum": DW_ACCUM[options[1]]}
        row |= {"ms": ms, "of_matmul": rate(loss_flops(s), ms) / matmul_flop_per_s,
                "extra_gib": extra / 2**30, "extra_of_logits": extra / logits_bytes}  # fmt: skip
        rows.append(row)
    return rows


# --8<-- [start:fp8]
FP8_GEMMS = ("gate_up", "down")  # the MLP's two GEMM shapes (gate and up: one each)
MASSIVE = (512, 2, 1e5)  # every 512th token, in 2 channels, 100,000 times a typical entry


def fp8_gemm_shape(s: Shapes, gemm: str) -> tuple[int, int, int]:
    """(M, N, K) of y = x @ w.T."""
    if gemm == "gate_up":
        return s.tokens, s.intermediate, s.hidden
    return s.tokens, s.hidden, s.intermediate


def fp8_inputs(s: Shapes, gemm, device, dtype, massive=False, seed=0):
    """x [M, K] with unit normal entries, w [N, K] with std 0.02. massive: Sun et al.'s massive
    activations (arXiv:2402.17762) -- a few entries, at a few tokens, in a few fixed channels,
    MASSIVE[2] times larger than the rest."""
    m, n, k = fp8_gemm_shape(s, gemm)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, device=device, generator=gen)
    if massive:
        every, channels, gain = MASSIVE
        picked = torch.randperm(k, device=device, generator=gen)[:channels]
        x[::every, picked] = gain
    w = torch.randn(n, k, device=device, generator=gen) * 0.02
    return x.to(dtype), w.to(dtype)


def quantize_bytes(m, k, elem, blockwise=False) -> int:
    """Read x, write q (1 byte) and the fp32 scales."""
    scales = -(-m // fp8.TILE) * (k // fp8.TILE) if blockwise else m * (k // fp8.TILE)
    return m * k * (elem + 1) + scales * 4


def row_error(y, exact) -> float:
    """Median over rows (tokens) of a row's relative error, |y_r - exact_r| / |exact_r|: each
    token's output on its own, a few tokens' large rows do not hide the others."""
    off, size = (y.double() - exact).norm(dim=1), exact.norm(dim=1)
    zero = torch.zeros_like(off)
    rows = torch.where(size > 0, off / size, torch.where(off > 0, zero + float("inf"), zero))
    return rows.median().item()  # a row that should be 0: exact when it is, else infinitely off


def fp8_errors(s: Shapes, device, dtype, recipes=fp8.RECIPES):
    """Each recipe's GEMM against the fp64 product of the bf16 inputs (`error`), on normal
    inputs and with massive activations; `gemm_error`: against the fp64 product of the FP8
    values themselves (what the GEMM adds: its accumulation, rounding its output to bf16);
    `floor`: rounding the exact product to bf16, which every recipe's output pays. All
    row_error."""
    rows = []
    for gemm in FP8_GEMMS:
        for massive in (False, True):
            x, w = fp8_inputs(s, gemm, device, dtype, massive, seed=1)
            exact = x.double() @ w.double().t()
            floor = row_error(exact.to(dtype), exact)
            for recipe in recipes:
                row = {"gemm": gemm, "inputs": "massive" if massive else "normal",
                       "recipe": recipe, "floor": floor}  # fmt: skip
                if recipe == "bf16":
                    row["error"] = row_error(x @ w.t(), exact)
                else:
                    ops = fp8.operands(recipe, x, w)
                    y = fp8.fp8_matmul(recipe, ops)
                    row |= {"error": row_error(y, exact),
                            "gemm_error": row_error(y, fp8.exact_product(recipe, ops))}  # fmt: skip
                rows.append(row)
    return rows


def measure_fp8(s: Shapes, device, dtype, gemm_times, kernel_times, copy_bytes_per_s, configs,
                recipes=fp8.RECIPES, quantizers=("ours", "eager", "compile"),
                shapes=FP8_GEMMS):  # fmt: skip
    """`gemms`: each recipe's GEMM at both shapes (gemm_times: the matmuls in one session),
    TFLOP/s and speed-up over bf16 (the first recipe). `quantize`: each quantizer on the
    activations (1 x 128 tiles) of both GEMMs, and ours and eager on their weights (128 x 128
    blocks), fraction of the copy bandwidth. `configs`: our activation kernel at the first
    shape for each (rows, tiles, warps)."""
    elem = torch.finfo(dtype).bits // 8
    gemms = []  # (gemm, recipe, (M, N, K), fn)
    for gemm in shapes:
        x, w = fp8_inputs(s, gemm, device, dtype)
        for recipe in recipes:
            if recipe == "bf16":
                fn = partial(torch.matmul, x, w.t())
            else:
                fn = partial(fp8.fp8_matmul, recipe, fp8.operands(recipe, x, w))
            gemms.append((gemm, recipe, fp8_gemm_shape(s, gemm), fn))
    reference = {"ours": fp8.quantize, "eager": fp8.quantize_reference,
                 "compile": torch.compile(fp8.quantize_reference, dynamic=False)}  # fmt: skip
    quants = []  # (tensor, gemm, blockwise, implementation, (M, K), fn)
    for gemm in shapes:
        x, w = fp8_inputs(s, gemm, device, dtype)
        for tensor, t, blockwise in (("activation", x, False), ("weight", w, True)):
            for name in [q for q in quantizers if not (blockwise and q == "compile")]:
                fn = partial(reference[name], t, blockwise)
                quants.append((tensor, gemm, blockwise, name, tuple(t.shape), fn))
    x = fp8_inputs(s, FP8_GEMMS[0], device, dtype)[0]
    sweep = [(c, partial(fp8.quantize, x, config=c)) for c in configs]  # the default's among them
    rows = []
    by_recipe = dict(zip([(g, r) for g, r, *_ in gemms], gemm_times([c[3] for c in gemms]),
                         strict=True))  # fmt: skip
    for gemm, recipe, (m, n, k), _ in gemms:
        ms = by_recipe[gemm, recipe]
        rows.append({"gemm": gemm, "recipe": recipe, "m": m, "n": n, "k": k, "ms": ms,
                     "tflops": rate(2 * m * n * k, ms) / 1e12,
                     "vs_bf16": by_recipe[gemm, recipes[0]] / ms})  # fmt: skip
    times = iter(kernel_times([q[5] for q in quants] + [c[1] for c in sweep]))
    quantize = []
    for tensor, gemm, blockwise, name, (m, k), _ in quants:
        ms = next(times)
        quantize.append({"tensor": tensor, "gemm": gemm, "impl": name, "m": m, "k": k, "ms": ms,
                         "of_copy": rate(quantize_bytes(m, k, elem, blockwise), ms)
                         / copy_bytes_per_s})  # fmt: skip
    swept = []
    for (rows_, tiles, warps), _ in sweep:
        ms = next(times)
        swept.append({"rows": rows_, "tiles": tiles, "warps": warps, "ms": ms,
                      "of_copy": rate(quantize_bytes(*x.shape, elem), ms)
                      / copy_bytes_per_s})  # fmt: skip
    return {"gemms": rows, "quantize": quantize, "configs": swept}


# --8<-- [end:fp8]


PYTHON_IMPLS = ("ours", "custom_op", "compile", "liger")  # ours: the entry points
PYTHON_CALLS = 3  # calls a repeat, each followed by a synchronize (hostbound._repeat_ms)


def measure_from_python(s: Shapes, device, dtype, interleaved, impls, ops=OPS):
    """One row per operator: forward + backward of each implementation as Python sees it, CPU
    overhead included (dispatch, autograd, launches, Dynamo's guards), each call waited for.
    `interleaved`: fastest_interleaved on the GPU ({key: (fn, calls)} in, {key: Stat} out): all
    timings round by round over one window, each kept as its fastest repeats."""
    steps = {}
    for op in ops:
        for name, fns in impls.items():
            leaves, extra = op_inputs(op, s, device, dtype)
            steps[op, name] = (runners(fns[op], leaves, extra)[2], PYTHON_CALLS)
    rows = {}
    for (op, name), ms in interleaved(steps).items():
        rows.setdefault(op, {"op": op})[name] = ms
    return list(rows.values())


def peak_bytes_cuda(fn):
    """Peak allocated bytes while fn runs, above what was allocated before it."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del result
    return peak


# --8<-- [end:measure]
