"""The harness's CPU-side logic: splitting profiler spans into runs, tracing its calls."""

import inspect

import pytest

from snippets.common import bench
from snippets.common.bench import SENTINEL, split_runs

SPIN = f"at::cuda::(anonymous namespace)::{SENTINEL}(long)"  # as the profiler names it


def test_kernels_go_to_the_run_of_the_sentinel_before_them():
    spans = [(SPIN, 0, 1), ("gemm", 10, 40), ("relu", 50, 60),
             (SPIN, 200, 201), ("gemm", 210, 250), ("relu", 260, 272)]  # fmt: skip
    sums = split_runs(spans[::-1], 2, lambda n: n)  # in any order: sorted by start
    assert sums == [{"gemm": [0.03, 1], "relu": [0.01, 1]}, {"gemm": [0.04, 1], "relu": [0.012, 1]}]


def test_runs_of_different_callables_keep_their_own_kernels():
    spans = [(SPIN, 0, 1), ("a", 5, 10), (SPIN, 20, 21), ("b", 25, 45), ("b", 50, 70)]
    assert split_runs(spans, 2, lambda n: None) == [{None: [0.005, 1]}, {None: [0.04, 2]}]


def test_a_lost_sentinel_or_an_empty_run_raises():
    with pytest.raises(RuntimeError, match="1 sentinel kernels for 2 runs"):
        split_runs([(SPIN, 0, 1), ("k", 5, 6)], 2, lambda n: None)
    with pytest.raises(RuntimeError, match=r"run\(s\) \[1\] launched no CUDA kernel"):
        split_runs([(SPIN, 0, 1), ("k", 5, 6), (SPIN, 10, 11)], 2, lambda n: None)
    with pytest.raises(RuntimeError, match="'k' ran before the first run's sentinel"):
        split_runs([("k", 0, 1), (SPIN, 5, 6)], 1, lambda n: None)


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


@pytest.mark.parametrize("interleave", [True, False])
def test_kernel_ms_each_gives_each_callable_its_own_runs(monkeypatch, interleave):
    """Runs go to the profiler in turn (interleave) or callable by callable; either way each
    Stat is built from its own callable's runs. A fake profiler: callable k's kernel takes
    (k + 1) ms in repeat i, plus i microseconds."""
    order = []

    def fake_profile(runs):
        spans, t = [], 0
        for fn, calls in runs:
            k, i = fn.k, sum(1 for f in order if f == fn.k)
            order.append(k)
            ns = calls * ((k + 1) * 10**6 + i * 10**3)
            spans += [(SPIN, t, t + 1), ("k", t + 10, t + 10 + ns)]
            t += 10**9
        return spans

    def make(k):
        def fn():
            return None

        fn.k = k
        return fn

    monkeypatch.setattr(bench, "_profile", fake_profile)
    monkeypatch.setattr(bench, "_once_ms", lambda fn: fn.k + 1.0)  # a synchronised call, in ms
    stats = bench.kernel_ms_each([make(0), make(1)], repeats=5, calls=3, interleave=interleave)
    assert order == ([0, 1] * 5 if interleave else [0] * 5 + [1] * 5)
    assert [s.median for s in stats] == [pytest.approx(1.002), pytest.approx(2.002)]
    assert [s.lo for s in stats] == [pytest.approx(1.0), pytest.approx(2.0)]


def test_kernel_ms_each_settles_each_callable_untimed_inside_the_session(monkeypatch):
    """settle_ms (not interleaved): an extra run of about settle_ms before each callable's
    repeats, in the same profiler session, left out of its Stat; its calls follow from the
    callable's own time (10 ms of a 1 ms call: 10 calls; of a 4 ms call: 3)."""
    runs = []

    def fake_profile(batch):
        spans, t = [], 0
        for fn, calls in batch:
            runs.append((fn.k, calls))
            slow = 1000 if len(runs) in (1, 7) else 1  # the settling runs: far slower
            spans += [(SPIN, t, t + 1), ("k", t + 10, t + 10 + calls * fn.ms * 10**6 * slow)]
            t += 10**12
        return spans

    def make(k, ms):
        def fn():
            return None

        fn.k, fn.ms = k, ms
        return fn

    monkeypatch.setattr(bench, "_profile", fake_profile)
    monkeypatch.setattr(bench, "_once_ms", lambda fn: fn.ms)
    stats = bench.kernel_ms_each([make(0, 1.0), make(1, 4.0)], repeats=5, calls=2,
                                 interleave=False, settle_ms=10.0)  # fmt: skip
    assert runs == [(0, 10)] + [(0, 2)] * 5 + [(1, 3)] + [(1, 2)] * 5
    assert [s.median for s in stats] == [pytest.approx(1.0), pytest.approx(4.0)]
    assert all(s.hi == s.median for s in stats)  # nothing of the slow settling runs


def test_step_ms_takes_the_median_step_of_each_repeat(monkeypatch):
    """One step in eight is ten times slower: each repeat's value is its median step, so the
    slow steps do not move it (a repeat's mean would be 2.1x the median)."""
    import time

    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    count = [0]

    def step():
        count[0] += 1
        time.sleep(0.01 if count[0] % 8 == 0 else 0.001)

    t = bench.step_ms(step, repeats=5, calls=8, settle_s=0.0, warmup=0)
    assert t.n == 5 and t.clock == "python"
    assert 1.0 <= t.median < 1.6 and t.hi < 2.0, t
