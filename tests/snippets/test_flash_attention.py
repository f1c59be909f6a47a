"""Unit tests for snippets/flash_attention/: the online softmax on adversarial rows, the FLOP and
HBM counts by hand and against the papers, the Triton kernels (forward, backward, logsumexp)
against fp64 attention within derived bounds, the custom op under opcheck and torch.compile, and
the benchmark code at tiny shapes with stand-in clocks.

On the CPU the kernels run in the Triton interpreter in fp32 (and fp16, which it computes right;
it mangles bf16); on the GPU (`nox -s gpu_docs`) those are skipped and bf16 / fp16 run at larger
shapes. Tolerances: attention_bounds in snippets/flash_attention/numerics.py, the fp32 rounding-
error bound of the kernels' arithmetic (derivation in its docstring), never a fitted constant.
"""

from __future__ import annotations

import math

import pytest
import torch

from snippets.common.device import DEVICE, ON_GPU
from snippets.common.hardware import load_hardware, ridge_point
from snippets.common.results import Stat
from snippets.flash_attention import attention as fa
from snippets.flash_attention import fp8 as f8
from snippets.flash_attention import io_model as io
from snippets.flash_attention import online_softmax as osm
from snippets.flash_attention.numerics import (
    attention_bounds,
    attention_reference,
    check_attention,
)
from snippets.triton_kernels.numerics import U, within

gpu = pytest.mark.gpu  # CUDA-only: run by gpu_docs, with the post or among "the rest"
cpu = pytest.mark.skipif(ON_GPU, reason="the CPU suite covers it (nox -s tests)")


# ------------------------------------------------------------------ online softmax


@pytest.mark.parametrize("block", [1, 3, 16, 64, 1000])
def test_online_softmax_equals_softmax_for_any_block(block):
    g = torch.Generator().manual_seed(block)
    x = torch.randn(5, 3, 100, generator=g, dtype=torch.float64) * 30
    assert torch.allclose(osm.online_softmax(x, block), torch.softmax(x, -1), rtol=1e-13, atol=0)
    m, l = osm.online_stats(x, block)
    assert torch.equal(m, x.amax(-1))
    assert torch.allclose(osm.logsumexp(m, l), torch.logsumexp(x, -1), rtol=1e-14)


def test_online_softmax_masked_rows_and_bad_block():
    x = torch.full((2, 9), -math.inf, dtype=torch.float64)
    x[1, 8] = 3.0  # only the last entry, in the last block, is visible
    p = osm.online_softmax(x, 4)
    assert torch.equal(p[0], torch.zeros(9, dtype=torch.float64))  # softmax gives NaN here
    assert p[1, 8] == 1 and p[1, :8].eq(0).all()
    assert osm.logsumexp(*osm.online_stats(x, 4)).tolist() == [-math.inf, 3.0]
    with pytest.raises(ValueError, match="block must be >= 1"):
        osm.online_stats(x, 0)


def test_online_attention_matches_masked_softmax_attention():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(12, 4, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(12, 12, generator=g) > 0.5
    mask[3] = False  # a row that sees nothing: output 0, logsumexp -inf
    out, lse = osm.online_attention(q, k, v, 5, mask)
    s = (q @ k.T / 2).masked_fill(~mask, -math.inf)
    seen = mask.any(-1)
    assert torch.allclose(out[seen], (torch.softmax(s, -1) @ v)[seen], rtol=0, atol=1e-14)
    assert out[3].eq(0).all() and lse[3] == -math.inf


# ------------------------------------------------------------------ FLOP and IO counts


def test_flop_counts_follow_the_papers():
    assert io.attention_flops(1024, 64) == 4 * 1024**2 * 64
    assert io.attention_flops(1024, 64, heads=16, batch=2, causal=True) == 2 * 1024**2 * 64 * 32
    assert io.attention_flops(512, 128, backward=True) == 2.5 * io.attention_flops(512, 128)
    assert io.MATMULS["backward, FlashAttention-2"] / io.MATMULS["forward"] == 2.5


def test_io_counts_by_hand():
    n, d = 8, 4
    nd, nn = n * d, n * n
    want = {"forward": 4 * nd + 4 * nn, "backward": 8 * nd + 7 * nn}
    assert io.standard_bytes(n, d, elem=1) == want
    fa1 = io.fa1_bytes(1024, 64, 192 * 1024)  # M = 98304 fp16 elements: B_c = M / 4d = 384
    assert (fa1["block_c"], fa1["passes"]) == (384, 3)
    assert fa1["forward"] == 2 * 1024 * 64 * 2 + 3 * (3 * 1024 * 64 * 2 + 16 * 1024)
    one_block = io.tiled_bytes(n, d, block=8, elem=1)  # a single block: K and V read once
    assert one_block["forward"] == 2 * 32 + 4 * n + 2 * 32  # Q, O; lse; K, V once
    assert io.floor_bytes(n, d, elem=1) == {"forward": 4 * 32 + 4 * n, "backward": 8 * 32 + 8 * n}


def test_theorem_2_scaling_and_the_limits_of_intensity():
    """FA1's traffic falls as 1/M while n d^2 / M dominates; standard attention's intensity stays
    below d / elem and the tiled order's below 2 block / elem, whatever n."""
    small, large = (io.fa1_bytes(2**16, 64, m * 1024)["forward"] for m in (48, 96))
    assert 1.9 < small / large <= 2
    for n in (256, 4096, 2**20):
        assert io.intensity(n, 128, io.standard_bytes) < 128 / 2
        assert io.intensity(n, 128, io.tiled_bytes, block=128) < 2 * 128 / 2
    h200 = load_hardware()["h200-sxm"]
    ridge = ridge_point(h200)
    assert io.crossing(128, ridge, io.standard_bytes) is None
    at = io.crossing(128, ridge, io.floor_bytes)
    below = io.intensity(at - 1, 128, io.floor_bytes)
    assert io.intensity(at, 128, io.floor_bytes) >= ridge > below


def test_papers_figures():
    """FA3 Table 2 (arXiv:2407.08608): times and TFLOP/s at batch 4, 8448 tokens, 16 heads, d 128;
    FA3 §3.1: 3.9 TFLOPS of exp on the H100; FA2 §3.1: 16x on the A100."""
    flops = io.attention_flops(8448, 128, heads=16, batch=4)
    assert [round(flops / ms / 1e9) for ms in (3.538, 4.021, 4.105)] == [661, 582, 570]
    hw = load_hardware()
    assert round(16 * hw["h100-sxm"].sms * 1.83e9 / 1e12, 1) == 3.9
    assert hw["a100-sxm-80gb"].bf16_dense_tflops / hw["a100-sxm-80gb"].fp32_tflops == 16


# ------------------------------------------------------------------ the kernels (CPU: fp32)


@cpu
@pytest.mark.parametrize(
    ("batch", "q_heads", "kv_heads", "n", "d", "causal"),
    [
        (1, 2, 2, 1, 16, False),  # a single token
        (1, 2, 2, 1, 16, True),
        (2, 2, 1, 37, 32, False),  # MQA; a partial last block
        (1, 4, 2, 64, 32, True),  # GQA; the length a multiple of every block
        (1, 6, 2, 40, 16, True),  # 3 query heads per KV head
        (1, 2, 2, 29, 128, False),  # head dim 128
    ],
    ids=["n1", "n1-causal", "mqa", "gqa-even", "gqa3-causal", "d128"],
)
def test_kernels_fp32(batch, q_heads, kv_heads, n, d, causal):
    assert check_attention(batch, q_heads, kv_heads, n, d, causal, torch.float32, seed=n)


@cpu
def test_gradient_through_the_logsumexp():
    """A loss that reads the logsumexp: its gradient enters through D (attn_bwd_delta_kernel)."""
    assert check_attention(1, 4, 2, 40, 32, True, torch.float32, seed=5, lse_grad=True)


@cpu
@pytest.mark.parametrize("causal", [False, True])
def test_other_block_shapes(causal):
    """Tiles of 32 x 16 forward, 16 x 32 (dK/dV) and 32 x 32 (dQ): the loops' ranges still
    cover each row and key exactly once."""
    g = torch.Generator().manual_seed(6)
    q, k, v, do = (torch.randn(1, 2, 53, 32, generator=g) for _ in range(4))
    out, lse = fa.attention_forward(q, k, v, causal, 32**-0.5, blocks=(32, 16))
    grads = fa.attention_backward(do, q, k, v, out, lse, None, causal, 32**-0.5,
                                  blocks={"dkdv": (16, 32), "dq": (32, 32)})  # fmt: skip
    exact = attention_reference(q, k, v, causal, do=do)
    bound = attention_bounds(q, k, v, causal, exact, do=do)
    got = {"out": out, "lse": lse, **dict(zip(("dq", "dk", "dv"), grads, strict=True))}
    assert within(got, exact, bound)


@cpu
def test_strided_inputs_and_gradients_keep_their_layout():
    """q, k, v as views of [batch, n, heads, d] (a projection's layout), as models pass them."""
    g = torch.Generator().manual_seed(7)
    base = [torch.randn(2, 30, h, 16, generator=g).requires_grad_() for h in (4, 2, 2)]
    q, k, v = (t.transpose(1, 2) for t in base)
    out = fa.flash_attention(q, k, v, causal=True)
    do = torch.randn(out.shape, generator=g)
    dq, dk, dv = torch.autograd.grad(out, base, do)
    exact = attention_reference(q, k, v, True, do=do)
    bound = attention_bounds(q, k, v, True, exact, do=do)
    got = {"out": out, "dq": dq.transpose(1, 2), "dk": dk.transpose(1, 2),
           "dv": dv.transpose(1, 2)}  # fmt: skip
    assert within(got, {key: exact[key] for key in got}, {key: bound[key] for key in got})
    assert out.stride() == q.stride()  # the output takes q's layout


@cpu
@pytest.mark.parametrize(
    ("batch", "q_heads", "kv_heads", "n", "d", "causal", "seed"),
    [(1, 4, 2, 41, 32, True, 8), (1, 2, 2, 45, 64, False, 9)],
    ids=["gqa-causal", "d64"],
)
def test_kernels_fp16_in_the_interpreter(batch, q_heads, kv_heads, n, d, causal, seed):
    """fp16 in the interpreter (its bf16 is garbage): P and dS rounded to fp16 for the matmuls,
    u_dot = 2^-11 in the bounds; d64 is the GPU fp16 test's head dim."""
    assert check_attention(batch, q_heads, kv_heads, n, d, causal, torch.float16, seed=seed)


def test_bounds_are_not_vacuous():
    """Outputs of typical bugs, computed in fp64, land outside the kernels' bounds."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, 40, 16, generator=g)
    k, v = (torch.randn(1, 2, 40, 16, generator=g) for _ in range(2))
    do = torch.randn(q.shape, generator=g)
    exact = attention_reference(q, k, v, True, do=do)
    bound = attention_bounds(q, k, v, True, exact, do=do)

    def outside(name, value):
        return not within({name: value}, {name: exact[name]}, {name: bound[name]})

    # query head h reads KV head h % 2 instead of h // 2 (the heads of each group swapped)
    swapped = attention_reference(q[:, [0, 2, 1, 3]], k, v, True, do=do[:, [0, 2, 1, 3]])
    assert outside("out", swapped["out"][:, [0, 2, 1, 3]]) and outside("dk", swapped["dk"])
    # the causal mask off by one (j < i): each row loses its diagonal, the first row everything
    s = (q.double() @ k.double().repeat_interleave(2, 1).transpose(-1, -2)) / 4
    s = s.masked_fill(~torch.ones(40, 40, dtype=torch.bool).tril(-1), -math.inf)
    off_by_one = (torch.softmax(s, -1) @ v.double().repeat_interleave(2, 1)).nan_to_num()
    assert outside("out", off_by_one) and outside("lse", torch.logsumexp(s, -1).nan_to_num())
    assert outside("lse", exact["lse"] * math.log2(math.e))  # base-2 logsumexp saved as natural
    assert outside("dk", exact["dk"] * 4)  # dK without the softmax scale 1/sqrt(16)
    # dS = P o dP, D forgotten: the softmax Jacobian's rank-one term
    kr, vr = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
    p = torch.softmax((q.double() @ kr.transpose(-1, -2) / 4).masked_fill(
        ~torch.ones(40, 40, dtype=torch.bool).tril(), -math.inf), -1)  # fmt: skip
    no_d = p * (do.double() @ vr.transpose(-1, -2))
    assert outside("dq", no_d @ kr / 4)
    # the running sum not rescaled when the maximum grows (alpha forgotten), blocks of 8
    out = torch.zeros_like(exact["out"])
    sc = (q.double() @ kr.transpose(-1, -2) / 4).masked_fill(
        ~torch.ones(40, 40, dtype=torch.bool).tril(), -math.inf)  # fmt: skip
    m = sc.amax(-1, keepdim=True)
    total, l = torch.zeros_like(out), torch.zeros_like(m)
    running = torch.full_like(m, -math.inf)
    for start in range(0, 40, 8):
        blk = sc[..., start : start + 8]
        running = torch.maximum(running, blk.amax(-1, keepdim=True))
        w = torch.exp(blk - running).nan_to_num()
        total, l = total + w @ vr[:, :, start : start + 8], l + w.sum(-1, keepdim=True)
    assert m.isfinite().all() and outside("out", total / l)


@cpu
def test_custom_op_passes_opcheck():
    g = torch.Generator().manual_seed(10)
    q = torch.randn(1, 2, 9, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(1, 1, 9, 16, generator=g, requires_grad=True) for _ in range(2))
    result = torch.library.opcheck(fa.flash_attention_op, (q, k, v, True, 0.25))
    assert set(result.values()) == {"SUCCESS"}


@cpu
def test_composes_with_torch_compile():
    """fullgraph: the op is one opaque node with a fake implementation for tracing and an
    autograd formula; AOTAutograd (aot_eager) gives the same output and gradients, bit for bit."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g, requires_grad=True) for _ in range(3))

    def loss(q, k, v):
        return fa.flash_attention(q, k, v, causal=True).square().sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    got = [compiled(q, k, v), *torch.autograd.grad(compiled(q, k, v), (q, k, v))]
    want = [loss(q, k, v), *torch.autograd.grad(loss(q, k, v), (q, k, v))]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@cpu
@pytest.mark.slow  # Inductor generates and compiles C++ for the graph around the op: seconds
def test_composes_with_inductor():
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g, requires_grad=True) for _ in range(3))

    def loss(q, k, v):
        return (fa.flash_attention(q, k, v) * 2).square().sum()

    compiled = torch.compile(loss, fullgraph=True)
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(loss(q, k, v), (q, k, v))
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want, strict=True))


SM90 = r"""
import json
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget

import snippets.flash_attention.attention as fa
import snippets.flash_attention.fp8 as f8

RUNTIME = {"n_ctx", "group", "q_heads", "kv_heads", "causal", "n_blocks"}  # do_not_specialize


def compile_sm90(kernel, config, pointers, ones=(), **constexprs):
    constexprs |= {"HEAD_DIM": 128, "STATIC_N": 0, **config.kwargs}
    constexprs |= {name: 1 for name in ones}  # the JIT makes an integer 1 a constant
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        signature[name] = pointers.get(name, "fp32" if "scale" in name else "i32")
        if name in pointers or (signature[name] == "i32" and name not in RUNTIME):
            attrs[(i,)] = [["tt.divisibility", 16]]  # as the JIT specializes aligned arguments
    src = triton.compiler.ASTSource(kernel, signature, constexprs, attrs)
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    ttgir = compiled.asm["ttgir"]
    with tempfile.TemporaryDirectory() as tmp:  # ptxas -v again, as Triton runs it: the spills
        ptx = os.path.join(tmp, "kernel.ptx")
        with open(ptx, "w") as f:
            f.write(compiled.asm["ptx"])
        log = subprocess.run([triton.knobs.nvidia.ptxas.path, "-v", "--gpu-name=sm_90a", ptx,
                              "-o", ptx + ".o"], capture_output=True, text=True, check=True).stderr
    dots = [line for line in ttgir.splitlines() if "ttng.warp_group_dot " in line]
    transposed = re.findall(r"^(#shared\d*) = #ttg.nvmma_shared<.*transposed = true", ttgir, re.M)
    return {"shared": compiled.metadata.shared, "async": "async_copy_global_to_local" in ttgir,
            "wgmma": bool(dots), "e4m3_dots": sum("f8E4M3FN" in line for line in dots),
            "dots": len(dots), "async_to_transposed": any(
                re.search(rf"async_copy_global_to_local .*f8E4M3FN, {t}, ", ttgir)
                for t in transposed),
            "spill_bytes": sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", log))}


bf16 = {name: "*bf16" for name in ("Q", "K", "V", "O", "DO", "DK", "DV", "DQ")}
fp32 = {"LSE": "*fp32", "DELTA": "*fp32", "DLSE": "*fp32"}
ptrs = bf16 | fp32
report = {}
for name, kernel, configs, extra in (("fwd", fa.attn_fwd_kernel, fa.FWD_CONFIGS, {}),
                                     ("dkdv", fa.attn_bwd_dkdv_kernel, fa.DKDV_CONFIGS,
                                      {"STATIC_GROUP": 0}),
                                     ("dq", fa.attn_bwd_dq_kernel, fa.DQ_CONFIGS, {})):
    for config in configs:  # every autotuning candidate
        tile = "x".join(str(config.kwargs[b]) for b in ("BLOCK_M", "BLOCK_N"))
        report[f"{name} {tile}"] = compile_sm90(kernel, config, ptrs, DOT="tf32", **extra)
fp8_ptrs = {name: "*fp8e4nv" for name in ("Q", "K", "V")} | {
    name: "*fp32" for name in ("QS", "KS", "VS")} | {"O": "*bf16"}
config = triton.Config({"BLOCK": f8.BLOCK}, **f8.FP8_OPTIONS)
report["fp8"] = compile_sm90(f8.attn_fp8_fwd_kernel, config, fp8_ptrs, ones=("stride_vn",))
print(json.dumps(report))
"""


@cpu
@pytest.mark.slow  # Triton's bundled ptxas compiles three kernels for sm_90: seconds
def test_gpu_path_compiles_for_hopper():
    """The GPU path (runtime loop bounds, every autotuning configuration, causal) compiled for
    sm_90 without a GPU: the interpreter never compiles, so only this catches what a compile
    sees (a global that is not constexpr inside @jit, a layout that does not lower). Each fits
    the H100's 227 KiB of shared memory per block, its loads are pipelined into asynchronous
    copies and its matmuls are WGMMA; the forward and dQ kernels spill no register (dK/dV, which
    keeps two 128 x 128 fp32 accumulators, uses all 255 and spills a little: attention.py).
    The FP8 forward (fp8.py): both matmuls on e4m3 operands, V's tiles (stored keys-contiguous)
    copied asynchronously into the transposed, K-major layout its WGMMA needs; it spills a little
    (fp8.py, FP8_OPTIONS). In a fresh interpreter without TRITON_INTERPRET."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {
        **os.environ,
        "TRITON_INTERPRET": "0",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(root),
    }
    done = subprocess.run([sys.executable, "-c", SM90], env=env, capture_output=True, text=True,
                          cwd=root, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for kernel, found in report.items():
        assert found["shared"] <= 227 * 1024 and found["async"] and found["wgmma"], (kernel, found)
        assert kernel == "fp8" or kernel.startswith("dkdv") or found["spill_bytes"] == 0, kernel
    fp8 = report["fp8"]
    assert fp8["dots"] == fp8["e4m3_dots"] >= 2 and fp8["async_to_transposed"], fp8


def test_warm_units_cover_the_page():
    """FlexAttention at the benchmark's shapes first; one unit per kernel of ours, for the checks'
    (and the benchmark's) bf16 at head dim 128 and the fp16 test's head dim 64, each naming a
    kernel of attention.py; the FP8 kernel with a bf16 output; one per kernel file of the
    triton-kernels post that bench_gpu.py's import of its meter runs."""
    from snippets.common.results import ROOT, import_closure
    from snippets.flash_attention import measure as m
    from snippets.flash_attention import warm

    units = warm.page_units()
    assert units[0] == ("flex", m.LENGTHS, m.TOKENS, m.HEADS, m.HEAD_DIM, m.DTYPE)
    kernels = [u for u in units if u[0] == "kernel"]
    assert {(dtype, d) for _, _, dtype, d in kernels} == {("bfloat16", 128), ("float16", 64)}
    assert len(kernels) == 8 and kernels[0][1] == "attn_bwd_dkdv_kernel"  # the longest first
    assert all(getattr(fa, name).fn.__qualname__ == name for _, name, _, _ in kernels)
    assert [u for u in units if u[0] == "fp8"] == [("fp8", "bfloat16")]  # the page's FP8 dtype
    meter = import_closure(ROOT / "snippets/triton_kernels/measure.py")
    files = {p.stem for p in meter if p.parent.name == "triton_kernels"}
    kernel_files = files - {"__init__", "measure", "numerics"}
    imported = {u[1] for u in units if u[0] == "import"}
    assert imported == {f"snippets.triton_kernels.{m}" for m in kernel_files}


@cpu
def test_warm_compiles_one_kernel_at_a_time(monkeypatch):
    """Triton asks the jit_cache_hook before each compile: it answers "taken care of" (True: no
    compile, no launch) for every kernel but the unit's, and is removed afterwards."""
    from types import SimpleNamespace

    import triton

    from snippets.flash_attention import warm

    answers = {}

    def fake(q, k, v, causal):
        hook = triton.knobs.runtime.jit_cache_hook
        for name in warm.KERNELS:
            answers[name] = hook(key=None, repr="", fn=SimpleNamespace(name=name), compile={},
                                 is_manual_warmup=False, already_compiled=False)  # fmt: skip
        return q * 1

    monkeypatch.setattr(warm, "flash_attention", fake)
    warm.run_unit(("kernel", "attn_bwd_dq_kernel", "float32", 16))
    assert answers == {name: name != "attn_bwd_dq_kernel" for name in warm.KERNELS}
    assert triton.knobs.runtime.jit_cache_hook is None


@cpu
def test_warm_flex_unit_and_cudnn_plans_call_what_the_benchmark_times():
    """The FlexAttention unit hands the benchmark's measure_tflops every length and mask, forward
    and forward + backward; cudnn_plans calls cuDNN's forward and backward at each of them (a
    stand-in here) and does nothing where cuDNN cannot run (the CPU)."""
    from snippets.flash_attention import warm

    kinds = []

    def clock(fns, names):
        kinds.extend(names)
        return [1.0] * len(fns)

    warm.run_unit(("flex", (16, 32), 64, 2, 16, torch.float32), clock=clock)
    assert kinds == ["flex"] * 8  # 2 lengths x 2 masks, forward and forward + backward
    calls = []

    def cudnn(q, k, v, causal):
        calls.append((q.shape[2], causal))
        return q + k + v

    assert warm.cudnn_plans((16, 32), 64, 2, 16, torch.float32, cudnn)
    assert sorted(set(calls)) == [(16, False), (16, True), (32, False), (32, True)]
    assert len(calls) == 8  # each case's forward, then its forward + backward
    assert not warm.cudnn_plans((16,), 64, 2, 16, torch.float32)  # no cuDNN here: nothing
    assert len(calls) == 8
    with pytest.raises(ValueError, match="unknown unit"):
        warm.run_unit(("nothing",))


@cpu
@pytest.mark.slow  # Python processes that import torch and Triton: seconds
def test_warm_workers_compile_in_child_processes():
    """The page's workers (fresh interpreters) import this package and run a kernel unit and an
    import unit; on the CPU in the interpreter, which they inherit, so this checks the
    mechanics the GPU run relies on (pickling, imports, arguments), not a cache."""
    from snippets.flash_attention import warm

    units = [
        ("kernel", "attn_fwd_kernel", "float32", 16),
        ("import", "snippets.flash_attention.io_model"),
    ]
    done = warm.prepare_page(units, plans=False)
    assert done == {"units": 2, "failed": 0, "waited_s": done["waited_s"]}


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ([(2, 4, 8, 16), (2, 4, 8), (2, 4, 8, 16)], r"\[batch, heads, n, head_dim\]"),
        ([(2, 4, 8, 16), (2, 2, 8, 16), (2, 1, 8, 16)], "the same shape"),
        ([(2, 4, 8, 16), (2, 2, 9, 16), (2, 2, 9, 16)], "batch, length and head_dim"),
        ([(2, 3, 8, 16), (2, 2, 8, 16), (2, 2, 8, 16)], "multiple of kv_heads"),
        ([(2, 4, 8, 48), (2, 2, 8, 48), (2, 2, 8, 48)], "head_dim must be one of"),
    ],
    ids=["rank", "k-v", "length", "heads", "head-dim"],
)
def test_bad_inputs_name_the_problem(shapes, message):
    q, k, v = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        fa.flash_attention(q, k, v)


def test_mixed_dtypes_are_refused():
    with pytest.raises(ValueError, match="share one of"):
        fa.flash_attention(torch.zeros(1, 2, 4, 16), torch.zeros(1, 2, 4, 16, dtype=torch.float16),
                           torch.zeros(1, 2, 4, 16))  # fmt: skip


# ------------------------------------------------------------------ FP8 forward (fp8.py)


def scaled_rows(shape, gen, spread=4):
    """randn with each row times 2^e, e in [-spread, spread): block scales far apart, so a scale
    read for the wrong block moves the result by far more than rounding."""
    e = torch.randint(-spread, spread, (*shape[:-1], 1), generator=gen)
    return torch.randn(shape, generator=gen) * 2.0**e


@pytest.mark.parametrize("per_tensor", [False, True], ids=["block", "tensor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fp8_quantize_round_trip(per_tensor, dtype):
    """One scale per 16 rows of each head (37 rows: 3 blocks, the last of 5 rows), amax / 448:
    each block's largest |x| becomes +-448; x8 * scale is within half an e4m3 step of x,
    (2^-4 + 2U)|x| in the normal range plus 2^-10 scale among the subnormals (x / scale is
    rounded in fp32 first: the 2U), and some element comes close to that bound."""
    x = scaled_rows((2, 3, 37, 128), torch.Generator().manual_seed(0)).to(dtype)
    x8, scale = f8.quantize(x, 16, per_tensor)
    assert x8.dtype == torch.float8_e4m3fn and scale.shape == (2, 3, 3)
    blocks = torch.nn.functional.pad(x.float().abs(), (0, 0, 0, 11)).view(2, 3, 3, 16 * 128)
    amax = blocks.amax(-1)
    want = amax.amax().expand_as(amax) if per_tensor else amax
    assert torch.equal(scale, want / 448)
    top = torch.nn.functional.pad(x8.float().abs(), (0, 0, 0, 11)).view(2, 3, 3, -1).amax(-1)
    assert top.eq(448).all() if not per_tensor else top.max() == 448 and top.lt(448).any()
    rows = scale.double().repeat_interleave(16, -1)[..., :37, None]
    err = (f8.dequantize(x8, scale, 16) - x.double()).abs()
    bound = (f8.U8 + 2 * U) * x.double().abs() + 2.0**-10 * rows
    assert (err <= bound).all() and (err / bound).max() > 0.9


def test_fp8_quantize_zero_block_and_bad_input():
    """A block of zeros gets scale 1 and stays zero (no 0 / 0); the last, partial block's scale
    comes from its own rows; bad arguments are refused, naming the argument."""
    x = torch.randn(1, 1, 37, 128)
    x[:, :, 16:32] = 0
    x8, scale = f8.quantize(x, 16)
    assert scale[0, 0, 1] == 1 and x8[:, :, 16:32].float().eq(0).all()
    assert scale[0, 0, 2] == x[:, :, 32:].abs().max() / 448
    assert torch.isfinite(x8.float()).all()
    for bad in (torch.zeros(1, 1, 4, 128, dtype=torch.int32), torch.zeros(1, 4, 128),
                torch.zeros(1, 1, 4, 128, dtype=torch.float64)):  # fmt: skip
        with pytest.raises(ValueError, match=r"^x must be"):
            f8.quantize(bad, 16)
    with pytest.raises(ValueError, match=r"^block must be"):
        f8.quantize(x, 0)
    with pytest.raises(ValueError, match=r"^head_dim must be 128, got 64"):
        f8.quantize_qkv(*(torch.zeros(1, 1, 8, 64) for _ in range(3)), 16)
    with pytest.raises(ValueError, match=r"^q, k, v must share one shape"):
        f8.quantize_qkv(torch.zeros(1, 2, 8, 128), *(torch.zeros(1, 1, 8, 128),) * 2, 16)
    with pytest.raises(ValueError, match=r"^d must be a power of two, got 96"):
        f8.random_rotation(96)
    x = f8.quantize_qkv(*(torch.zeros(1, 1, 8, 128) for _ in range(3)), 16)
    with pytest.raises(ValueError, match=r"^x must hold e4m3"):
        f8.fp8_forward(x._replace(q8=x.q8.float()))


def test_hadamard_rotation_is_orthogonal_and_keeps_qk():
    """H H^T = d I exactly; M = D H / sqrt(d) in fp32 is orthogonal to its rounding (entries
    +-1/sqrt(d) off by U each: |M M^T - I| <= 3U); (q M)(k M)^T = q k^T in fp64 to 5 gamma_(d+1)
    ||q||_1 ||k||_1 (the two rotations, the dot product and the reference's, each gamma_d times
    ||q||_1 ||k||_1 over d terms of size 1/sqrt(d)); a one-hot outlier spreads evenly."""
    for d in (1, 2, 128):
        h = f8.hadamard(d)
        assert torch.equal(h @ h.T, d * torch.eye(d))
    m = f8.random_rotation(128, seed=3).double()
    assert ((m @ m.T - torch.eye(128, dtype=torch.float64)).abs() <= 3 * U).all()
    assert torch.equal(f8.random_rotation(128, 3), f8.random_rotation(128, 3))
    assert not torch.equal(f8.random_rotation(128, 3), f8.random_rotation(128, 4))
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(5, 128, generator=g, dtype=torch.float64) for _ in range(2))
    m64 = f8.hadamard(128).double() * (f8.random_rotation(128, 3).double().sign()[:, :1])
    m64 = m64 / math.sqrt(128)
    eps = 128 * 2.0**-53 / (1 - 128 * 2.0**-53)
    bound = 5 * eps * q.abs().sum(-1)[:, None] * k.abs().sum(-1)[None, :]
    assert (((q @ m64) @ (k @ m64).T - q @ k.T).abs() <= bound).all()
    spike = torch.zeros(1, 128)
    spike[0, 7] = 100.0
    spread = (spike @ f8.random_rotation(128, 3)).abs()
    want = torch.full_like(spread, 100 / math.sqrt(128))  # three fp32 roundings apart
    assert torch.allclose(spread, want, rtol=4 * U, atol=0)


@cpu
def test_interpreter_rounding_to_e4m3_matches_pytorch():
    """_round_e4m3 (the kernel's P in the interpreter) equals PyTorch's cast on every e4m3 value,
    every midpoint between neighbours (ties to even), points just either side of them and random
    values over [2^-14, 2^9): and the interpreter's own cast of the result changes nothing."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(X, R, C, N: tl.constexpr):
        offs = tl.arange(0, N)
        r = f8._round_e4m3(tl.load(X + offs))
        tl.store(R + offs, r)
        tl.store(C + offs, r.to(tl.float8e4nv))

    grid = torch.arange(0, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    grid = grid[grid <= 256 * 1.75]
    mids = (grid[1:] + grid[:-1]) / 2
    g = torch.Generator().manual_seed(2)
    random = torch.rand(3000, generator=g) * 2.0 ** torch.randint(-14, 9, (3000,), generator=g)
    x = torch.cat([grid, mids, mids * (1 + 2.0**-20), mids * (1 - 2.0**-20), random])
    x = torch.nn.functional.pad(x, (0, 4096 - x.numel()))
    r, c = torch.empty(4096), torch.empty(4096, dtype=torch.float8_e4m3fn)
    kernel[(1,)](x, r, c, N=4096)
    want = x.to(torch.float8_e4m3fn).float()
    assert torch.equal(r, want) and torch.equal(c.float(), want)


def fp8_inputs(n, rotate, per_tensor, dtype=torch.float32, seed=0, zero_blocks=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (scaled_rows((1, 2, n, 128), g).to(dtype) for _ in range(3))
    if zero_blocks:  # a block of keys and values that is all zero: scale 1
        k[:, :, :16], v[:, :, 16:32] = 0, 0
    rotation = f8.random_rotation(128, seed) if rotate else None
    return f8.quantize_qkv(q, k, v, f8.CPU_BLOCK, rotation, per_tensor)


FP8_CASES = [  # (n, rotate, per_tensor, dtype, zero blocks)
    (1, False, False, torch.float32, False),  # one row, one key: a partial block
    (37, False, False, torch.float32, False),  # a partial last block
    (64, True, False, torch.float32, False),  # a multiple of the block; rotated
    (50, False, True, torch.float32, True),  # one scale per tensor; zero blocks
    (45, True, False, torch.float16, False),  # fp16 in, fp16 out
]
FP8_IDS = ["n1", "partial", "rotated", "tensor-zeros", "fp16"]


@cpu
@pytest.mark.parametrize(("n", "rotate", "per_tensor", "dtype", "zeros"), FP8_CASES, ids=FP8_IDS)
def test_fp8_kernel_and_reference_within_bound(n, rotate, per_tensor, dtype, zeros):
    """The kernel (interpreter, fp32 arithmetic) and fp8_reference (PyTorch fp32) against fp64
    attention on the dequantized inputs, each element within fp8_bound (its docstring derives
    it: all that is left is rounding, P's e4m3 rounding the largest part). Row magnitudes vary
    by 2^8, so every block has its own scale."""
    x = fp8_inputs(n, rotate, per_tensor, dtype, seed=n, zero_blocks=zeros)
    exact, bound = f8.fp8_bound(x, out_dtype=dtype)
    out = f8.fp8_forward(x, out_dtype=dtype)
    assert out.dtype == dtype and torch.isfinite(out).all()
    got = {"kernel": out, "reference": f8.fp8_reference(x)}
    assert within(got, dict.fromkeys(got, exact), dict.fromkeys(got, bound))


def test_fp8_bound_is_not_vacuous():
    """Bugs land outside fp8_bound: a K, Q or V scale read from the neighbouring block, and P not
    shifted by 2^8 before its rounding (on a row where one key outscores 2000 others by 7.6 in
    natural log units, their weights e^-7.6 < 2^-10 flush to zero: half the mass lost)."""
    x = fp8_inputs(64, False, False, seed=4)
    exact, bound = f8.fp8_bound(x)

    def outside(bad):
        return not within({"o": f8.fp8_reference(bad)}, {"o": exact}, {"o": bound})

    assert within({"o": f8.fp8_reference(x)}, {"o": exact}, {"o": bound})
    for name in ("k_scale", "q_scale", "v_scale"):
        assert outside(x._replace(**{name: getattr(x, name).roll(1, -1)})), name
    n = 2000
    q, k = torch.zeros(1, 1, n, 128), torch.zeros(1, 1, n, 128)
    q[..., 0], k[..., 0, 0] = 1.0, 7.6 * math.sqrt(128)
    sink = f8.quantize_qkv(q, k, torch.ones(1, 1, n, 128), f8.CPU_BLOCK)
    exact, bound = f8.fp8_bound(sink)
    assert within({"o": f8.fp8_reference(sink)}, {"o": exact}, {"o": bound})
    assert not within({"o": f8.fp8_reference(sink, shift=0)}, {"o": exact}, {"o": bound})


@cpu
def test_fp8_errors_and_measurement_run_at_tiny_shapes():
    """measure_fp8 on the CPU (fp32 for bf16, interpreter, a stand-in clock): the three callables
    in the clock's order, section 3.1's FLOP count, each peak its own dtype's; the errors of the
    four variants against fp64 (fp32 ours is exact to rounding, every FP8 variant far from it)."""
    from snippets.flash_attention import measure as m

    calls = []
    res = m.measure_fp8(32, 64, 2, 128, DEVICE, torch.float32, stand_in_each(calls),
                        {"bf16": 100.0, "fp8": 200.0}, rows=16)  # fmt: skip
    assert [kind for kind, _ in calls] == ["bf16", "fp8", "quantize"]
    assert isinstance(calls[2][1], f8.Fp8Qkv) and calls[1][1].shape == (2, 2, 32, 128)
    flops = 4 * 32**2 * 128 * 2 * 2  # 4 n^2 d x heads x batch
    bf16, fp8 = res["timings"]
    assert bf16["tflops"].median == fp8["tflops"].median == flops / 1e-3 / 1e12
    assert fp8["of_peak"].median == pytest.approx(bf16["of_peak"].median / 2)  # twice the peak
    assert res["speedup"].median == 1 and res["quantize_ms"].median == 1
    errors = {r["variant"]: r["rel_error"] for r in res["errors"]}
    assert list(errors) == ["bf16", "fp8_tensor", "fp8_block", "fp8_block_hadamard"]
    assert errors["bf16"] < 1e-5 < 1e-3 < min(list(errors.values())[1:]) < 0.2
    assert res["gain_vs_tensor"] == errors["fp8_tensor"] / errors["fp8_block_hadamard"]
    assert res["gain_of_rotation"] == errors["fp8_block"] / errors["fp8_block_hadamard"]


def test_outlier_inputs_follow_fa3():
    """FA3 §4.3's distribution: N(0, 1) plus, for 0.1 % of entries, N(0, 100). Of 2^21 entries,
    the share beyond 6 is 0.001 P(|N(0, 101)| > 6) (N(0, 1) alone: 2e-9), the mean square
    1 + 0.001 x 100; each within 5 standard errors (of a count; of a mean of x^2, E x^4 ~ 33)."""
    gen = torch.Generator().manual_seed(5)
    q, _, _ = f8.outlier_qkv(1, 4, 4096, 128, "cpu", torch.float32, gen)
    n = q.numel()
    p = 0.001 * math.erfc(6 / math.sqrt(2 * 101))
    assert abs((q.abs() > 6).double().mean().item() - p) < 5 * math.sqrt(p / n)
    assert abs(q.double().square().mean().item() - 1.1) < 5 * math.sqrt(33 / n)


@cpu
def test_warm_fp8_unit_runs():
    """The FP8 unit (a worker's compile on the GPU) runs the path: quantize, rotate, kernel."""
    from snippets.flash_attention import warm

    warm.run_unit(("fp8", "float32"))


# ------------------------------------------------------------------ the benchmark code


def stand_in_each(calls):
    """kernel_ms_each for the CPU: each callable run once, a steady 1 ms for each; records
    (implementation, output) in the order the callables came."""

    def times(fns, kinds):
        out = []
        for fn, kind in zip(fns, kinds, strict=True):
            calls.append((kind, fn()))
            out.append(Stat.of([1.0] * 5, "gpu-kernels"))
        return out

    return times


@cpu
def test_flex_prefix_masks_are_causal_and_no_mask():
    """The benchmark's FlexAttention runner: one mask_mod, prefix_mask, for both masks (one
    compiled graph on the GPU). visible = 0 is causal, visible = n sees everything: every block
    full. Eager flex on the CPU applies the mask_mod to each element, so this checks the mask
    itself; forward only (the CPU has no FlexAttention backward)."""
    from torch.nn.attention.flex_attention import create_block_mask

    from snippets.flash_attention import measure as m

    g = torch.Generator().manual_seed(15)
    q, k, v = (torch.randn(2, 2, 300, 16, generator=g) for _ in range(3))
    run = m.flex(compiled=False)
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert torch.allclose(run(q, k, v, causal), want, atol=1e-5)
    n = 256  # the benchmark's lengths are multiples of the 128-token blocks
    everything = create_block_mask(m.prefix_mask(torch.tensor(n)), None, None, n, n, device="cpu")
    assert everything.kv_num_blocks.eq(0).all() and everything.full_kv_num_blocks.eq(2).all()


def test_settling_plan():
    """Long once, short per implementation, none within one; cuDNN before each callable."""
    from snippets.flash_attention.measure import settles

    kinds = ["ours", "ours", "flash", "flash", "flex", "cudnn", "cudnn", "cudnn"]
    assert settles(kinds) == [900.0, 0.0, 100.0, 0.0, 100.0, 500.0, 30.0, 30.0]
    assert settles([]) == []


@cpu
def test_measurement_code_runs_at_tiny_shapes():
    from snippets.flash_attention import measure as m

    impls, missing = m.implementations(("ours", "flash", "cudnn"), DEVICE)
    assert set(impls) == {"ours", "flash"}  # SDPA's flash backend has a CPU kernel; cuDNN not:
    assert missing["cudnn"].startswith("RuntimeError")  # its reason is recorded instead of a row
    impls["naive"] = m.naive
    calls = []
    rows, wide = m.measure_tflops((16, 32), 64, 2, 16, DEVICE, torch.float32,
                                  stand_in_each(calls), 100.0, impls)  # fmt: skip
    assert [(r["n"], r["mask"], r["impl"]) for r in rows][:4] == [
        (16, "none", "ours"), (16, "none", "flash"), (16, "none", "naive"),
        (32, "none", "ours")]  # fmt: skip
    assert len(rows) == 12 and len(calls) == 24  # forward, forward + backward
    # timed one implementation after another: its 4 forwards (n, mask), then its 4 backwards
    assert [kind for kind, _ in calls] == [k for k in impls for _ in range(8)]
    by_kind = {kind: [out for k, out in calls if k == kind] for kind in impls}
    for kind in ("flash", "naive"):  # same inputs, same attention
        for case in range(4):  # (16, none), (16, causal), (32, none), (32, causal)
            assert torch.allclose(by_kind[kind][case], by_kind["ours"][case], atol=1e-5)
            got, want = by_kind[kind][4 + case], by_kind["ours"][4 + case]
            assert all(torch.allclose(a, b, atol=1e-4) for a, b in zip(got, want, strict=True))
    first = rows[0]
    assert first["fwd_tflops"].median == 4 * 16**2 * 16 * 2 * 4 / 1e-3 / 1e12  # 4 x 16 tokens
    assert first["fwdbwd_tflops"].median == pytest.approx(3.5 * first["fwd_tflops"].median)
    assert rows[6]["fwd_tflops"].median == first["fwd_tflops"].median / 2  # causal: half
    assert set(wide[0]) == {"n", "mask"} | {f"{i}_{p}" for i in impls for p in ("fwd", "fwdbwd")}

    def split(fn, classify):
        fn()
        return {classify(name): {"ms": Stat.of([t] * 5, "gpu-kernels"), "kernels": 1}
                for name, t in (("attn_fwd_kernel", 1.0), ("attn_bwd_dq_kernel", 3.0))}  # fmt: skip

    shares = m.breakdown(32, 64, 2, 16, DEVICE, torch.float32, split, masks=("causal",))
    want = [("attn_fwd", 0.25), ("attn_bwd_dq", 0.75)]
    assert [(r["kernel"], r["share"].median) for r in shares] == want
    assert m.kernel_of("triton_poi_fused_zeros_0") == "other"
    fill = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
    assert m.kernel_of(fill) == "attn_bwd_delta"  # the zero fill joins the backward's preparation
    memory = m.peak_memory((16,), 32, 2, 16, DEVICE, torch.float32, lambda fn: 2**21,
                           {"ours": m.ours, "naive": m.naive})  # fmt: skip
    assert memory == [{"n": 16, "ours_mib": 2.0, "naive_mib": 2.0, "naive_over_ours": 1.0}]


# ------------------------------------------------------------------ GPU: bf16, fp16


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("batch", "q_heads", "kv_heads", "n", "causal"),
    [(2, 8, 2, 1000, True), (1, 8, 1, 515, False), (1, 4, 4, 2048, True)],
    ids=["gqa-causal", "mqa", "mha-2k"],
)
def test_kernels_bf16_head_dim_128(batch, q_heads, kv_heads, n, causal):
    assert check_attention(batch, q_heads, kv_heads, n, 128, causal, torch.bfloat16, seed=n)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_kernels_fp16_head_dim_64(causal):
    """fp16 and head dim 64: four more kernels to compile, for both masks (a runtime argument).
    check.py, the page's first GPU fence, has them compiled in worker processes (warm.py): here
    they load from Triton's cache."""
    assert check_attention(2, 8, 2, 777, 64, causal, torch.float16, seed=13)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("batch", "heads", "n", "rotate", "per_tensor"),
    [(2, 4, 1000, False, False), (1, 8, 2048, True, False), (1, 4, 515, True, True)],
    ids=["block", "rotated-2k", "tensor"],
)
def test_fp8_kernel_bf16_on_the_gpu(batch, heads, n, rotate, per_tensor):
    """The FP8 kernel compiled for Hopper (e4m3 WGMMA, the hardware's e4m3 cast, its sums kept
    to about 14 bits: FP8_ACC_U) within fp8_bound, bf16 in and out; lengths not multiples of
    the 128-row block. Its one compile is warm.py's fp8 unit."""
    assert f8.check_fp8(batch, heads, n, rotate, per_tensor, torch.bfloat16, seed=n)
