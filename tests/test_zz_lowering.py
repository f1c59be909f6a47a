"""Runs last (the name sorts last): every Triton kernel the CPU suite launched in the
interpreter goes through the code generator for sm_90, as on the H200 (tests/lowering.py)."""

import pytest

from tests import lowering

# Launch configurations that exist only in the interpreter, each with the one message it may
# give: kernel name -> (the message's text, why). Nothing else is excused.
INTERPRETER_ONLY = {
    "attn_fp8_fwd_kernel": (
        "K >= 32",
        "fp8 tl.dot needs K >= 32 on sm_90; the CPU tests use CPU_BLOCK = 16 to stay fast, the "
        "GPU launches BLOCK = 128 (snippets/flash_attention/fp8.py)",
    ),
}


def excused(failure: str) -> bool:
    name = failure.split(" (", 1)[1].split(")", 1)[0] if " (" in failure else ""
    return name in INTERPRETER_ONLY and INTERPRETER_ONLY[name][0] in failure


@pytest.mark.skipif(not lowering.enabled(), reason="on CUDA the GPU compiles every launch")
def test_every_launched_kernel_lowers_for_hopper():
    if not lowering.LAUNCHES:
        pytest.skip("no Triton kernel was launched before this test: run it after the suite")
    failures = [f for f in lowering.lower_all() if not excused(f)]
    assert not failures, "\n".join(failures)


@pytest.mark.skipif(not lowering.enabled(), reason="needs the interpreter's launches")
def test_a_branch_type_mismatch_fails_to_lower(tmp_path, monkeypatch):
    """The defect that cost a GPU run: a constexpr if whose branches return different types
    passes in the interpreter and fails the code generator, named by file and line."""
    import importlib
    import sys

    import torch

    source = """import triton
import triton.language as tl


@triton.jit
def _where(FLAT: tl.constexpr, BLOCK: tl.constexpr):
    if FLAT:
        return 0, tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    return tl.program_id(0).to(tl.int64), tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def copy_kernel(X, Y, n, FLAT: tl.constexpr, BLOCK: tl.constexpr):
    row, c = _where(FLAT, BLOCK)
    tl.store(Y + row * n + c, tl.load(X + row * n + c, mask=c < n), mask=c < n)
"""
    (tmp_path / "tests_lowering_demo.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    demo = importlib.import_module("tests_lowering_demo")
    monkeypatch.setitem(sys.modules, "tests.lowering_demo", demo)  # swapped like tests.*
    x = torch.arange(8.0)
    y = torch.empty_like(x)
    before = dict(lowering.LAUNCHES)
    demo.copy_kernel[(1,)](x, y, 8, FLAT=True, BLOCK=8)
    assert torch.equal(x, y)  # the interpreter runs it fine
    new = [v for k, v in lowering.LAUNCHES.items() if k not in before]
    assert len(new) == 1
    (failure,) = lowering.lower_all(new)
    assert "tests_lowering_demo.py:14 (copy_kernel)" in failure  # the line calling _where
    assert "FLAT=True" in failure and "Inconsistent return types" in failure


@pytest.mark.skipif(not lowering.enabled(), reason="needs the interpreter")
def test_the_command_line_lowers_a_scripts_kernels(tmp_path):
    """`python -m tests.lowering script.py`: a probe or a GPU-only script's CPU dry run, checked
    before it spends device time; exit 1 and the kernel's line when one does not lower."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "probe.py"
    script.write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n"
        "@triton.jit\ndef pick(FLAT: tl.constexpr):\n"
        "    if FLAT:\n        return 0\n"
        "    return tl.program_id(0).to(tl.int64)\n\n\n"  # int32 against int64 on the GPU
        "@triton.jit\ndef k(X, FLAT: tl.constexpr):\n"
        "    tl.store(X + pick(FLAT), 1.0)\n\n\n"
        "x = torch.zeros(2)\nk[(1,)](x, FLAT=True)\nassert x[0] == 1.0\n"
    )
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(root),
    }
    done = subprocess.run([sys.executable, "-m", "tests.lowering", str(script)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 launches lowered for sm_90, 1 failed" in done.stdout
    assert f"{script}:15 (k) [FLAT=True]" in done.stdout  # the line calling pick


@pytest.mark.skipif(not lowering.enabled(), reason="needs the interpreter")
def test_full_compile_catches_what_ttir_cannot(tmp_path):
    """`--full` compiles through ptxas for sm_90: a matmul whose pipelined tiles need more
    shared memory than a block may have lowers to TTIR fine, and fails the full compile with
    the bytes it needs (the GPU would raise OutOfResources at launch)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "probe.py"
    script.write_text(
        "import torch\nimport triton\nimport triton.language as tl\n\n\n"
        "@triton.jit\ndef mm(A, B, C, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):\n"
        "    r, c, k = tl.arange(0, BM), tl.arange(0, BN), tl.arange(0, BK)\n"
        "    acc = tl.zeros((BM, BN), tl.float32)\n"
        "    for i in range(4):\n"
        "        a = tl.load(A + r[:, None] * BK * 4 + i * BK + k[None, :])\n"
        "        b = tl.load(B + (i * BK + k[:, None]) * BN + c[None, :])\n"
        "        acc += tl.dot(a, b)\n"
        "    tl.store(C + r[:, None] * BN + c[None, :], acc)\n\n\n"
        "a = torch.ones(256, 512, dtype=torch.float16)\n"
        "b = torch.ones(512, 256, dtype=torch.float16)\n"
        "c = torch.empty(256, 256)\n"
        "mm[(1,)](a, b, c, BM=256, BN=256, BK=128, num_warps=8, num_stages=4)\n"
        "assert c[0, 0] == 512\n"
    )
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(root)}  # fmt: skip

    def lower(*flags):
        command = [sys.executable, "-m", "tests.lowering", *flags, str(script)]
        return subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                              timeout=300)  # fmt: skip

    ttir = lower()
    assert ttir.returncode == 0 and "1 launches lowered for sm_90, 0 failed" in ttir.stdout
    full = lower("--full")
    assert full.returncode == 1, full.stdout + full.stderr
    assert "1 launches compiled to cubins for sm_90, 1 failed" in full.stdout
    assert f"{script}:7 (mm) [BM=256, BN=256, BK=128]" in full.stdout
    assert "bytes of shared memory, sm_90 has 232448 a block" in full.stdout
