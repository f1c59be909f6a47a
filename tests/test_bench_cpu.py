"""The harness's CPU-side logic: splitting profiler spans into repeats."""

import pytest

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
