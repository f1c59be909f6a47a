"""The harness's CPU-side logic: splitting profiler spans into repeats, tracing its calls."""

import inspect

import pytest

from snippets.common import bench
from snippets.common.bench import MARKER, split_repeats


def span(name, gpu, start, end):
    return (name, gpu, start, end)


def test_kernels_go_to_the_repeat_whose_gpu_marker_they_start_in():
    spans = [span(f"{MARKER}0", True, 0, 100), span(f"{MARKER}1", True, 200, 300),
             span(f"{MARKER}0", False, -50, 90),  # the CPU's copy: ignored when the GPU's exists
             span("gemm", True, 10, 40), span("relu", True, 50, 60),
             span("gemm", True, 210, 250), span("relu", True, 260, 272)]  # fmt: skip
    sums = split_repeats(spans, 2, lambda n: n)
    assert sums == [{"gemm": [0.03, 1], "relu": [0.01, 1]}, {"gemm": [0.04, 1], "relu": [0.012, 1]}]


def test_unaligned_clocks_fall_back_to_splitting_in_order():
    spans = [span(f"{MARKER}0", False, 0, 10), span(f"{MARKER}1", False, 10, 20)]
    spans += [span("k", True, 1000 + 10 * i, 1005 + 10 * i) for i in range(4)]
    assert split_repeats(spans, 2, lambda n: None) == [{None: [0.01, 2]}, {None: [0.01, 2]}]


def test_kernels_that_do_not_divide_into_repeats_raise():
    spans = [span("k", True, i, i + 1) for i in range(3)]
    with pytest.raises(RuntimeError, match="cannot split 3 kernels into 2 repeats"):
        split_repeats(spans, 2, lambda n: None)


def test_harness_calls_are_traced_with_their_call_site(monkeypatch, tmp_path):
    """With HANDBOOK_BENCH_TRACE set (gpu_docs sets it), each harness call appends its wall time,
    name and caller's file:line; without it nothing is written."""
    trace = tmp_path / "trace.tsv"

    @bench._traced
    def demo_ms():
        return 1

    monkeypatch.delenv("HANDBOOK_BENCH_TRACE", raising=False)
    demo_ms()
    assert not trace.exists()
    monkeypatch.setenv("HANDBOOK_BENCH_TRACE", str(trace))
    line = inspect.currentframe().f_lineno + 1
    assert demo_ms() == 1
    seconds, name, where = trace.read_text(encoding="utf-8").strip().split("\t")
    assert float(seconds) >= 0 and name == "demo_ms"
    assert where.endswith(f"test_bench_cpu.py:{line}")
