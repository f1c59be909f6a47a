"""The timing harness on the GPU: each clock gives >= 5 repeats, a tight spread on steady work,
and they agree where they should (a large matmul has no launch gaps to hide)."""

import pytest

pytestmark = pytest.mark.gpu


def test_clocks_agree_on_a_large_matmul():
    import torch

    from snippets.common.bench import graph_ms, kernel_ms, python_ms

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    graph, kernels, wall = (
        graph_ms(lambda: a @ b),
        kernel_ms(lambda: a @ b),
        python_ms(lambda: a @ b),
    )
    for t in (graph, kernels, wall):
        assert t.n == 7 and t.lo <= t.median <= t.hi and t.spread < 0.05, t
    assert (graph.clock, kernels.clock, wall.clock) == ("gpu-graph", "gpu-kernels", "python")
    assert abs(kernels.median / graph.median - 1) < 0.1  # one kernel per call: no gaps
    assert wall.median > 0.9 * graph.median


def test_kernel_ms_sums_every_kernel_of_a_call():
    import torch

    from snippets.common.bench import kernel_ms

    x = torch.randn(1 << 24, device="cuda")
    one = kernel_ms(lambda: x.mul_(1.0), calls=20)
    three = kernel_ms(lambda: (x.mul_(1.0), x.add_(0.0), x.mul_(1.0)), calls=20)
    assert 2.5 < three.median / one.median < 3.5


def test_ceilings_are_plausible_for_an_h200():
    from snippets.common.bench import ceilings

    c = ceilings()
    assert 3.0e12 < c["copy_bytes_per_s"].median < 5.0e12
    assert 4.0e14 < c["bf16_matmul_flop_per_s"].median < 1.0e15


def test_kernel_ms_by_splits_a_call_by_kernel_class():
    import torch

    from snippets.common.bench import kernel_ms, kernel_ms_by

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        return (a @ a).relu_()

    def classify(name):
        return "other" if "elementwise" in name or "clamp" in name or "relu" in name else "gemm"

    by = kernel_ms_by(step, classify)
    assert set(by) == {"gemm", "other"} and all(c["kernels"] >= 1 for c in by.values())
    total = by["gemm"]["ms"].median + by["other"]["ms"].median
    assert abs(total / kernel_ms(step).median - 1) < 0.1
