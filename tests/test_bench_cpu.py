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
    """settle_ms (not interleaved; one value or one per callable): a settling run before each
    callable's repeats, in the same profiler session, left out of its Stat; its chunks hold
    about SETTLE_CHUNK_MS of calls (50 ms of a 1 ms call: 50; of a 4 ms call: 13)."""
    runs = []

    def fake_profile(batch):
        spans, t = [], 0
        for fn, calls in batch:
            runs.append((fn.k, calls))
            n, slow = (1, 1000) if isinstance(calls, bench.Settle) else (calls, 1)
            spans += [(SPIN, t, t + 1), ("k", t + 10, t + 10 + n * fn.ms * 10**6 * slow)]
            t += 10**12
        return spans

    def make(k, ms):
        def fn():
            return None

        fn.k, fn.ms = k, ms
        return fn

    monkeypatch.setattr(bench, "_profile", fake_profile)
    monkeypatch.setattr(bench, "_once_ms", lambda fn: fn.ms)
    fns = [make(0, 1.0), make(1, 4.0)]
    stats = bench.kernel_ms_each(fns, repeats=5, calls=2, interleave=False, settle_ms=10.0)
    s0, s1 = bench.Settle(0.01, 50), bench.Settle(0.01, 13)
    assert runs == [(0, s0)] + [(0, 2)] * 5 + [(1, s1)] + [(1, 2)] * 5
    assert [s.median for s in stats] == [pytest.approx(1.0), pytest.approx(4.0)]
    assert all(s.hi == s.median for s in stats)  # nothing of the slow settling runs
    runs.clear()  # one value per callable: 0 settles nothing
    bench.kernel_ms_each(fns, repeats=5, calls=2, interleave=False, settle_ms=[0.0, 1500.0])
    assert runs == [(0, 2)] * 5 + [(1, bench.Settle(1.5, 13))] + [(1, 2)] * 5
    with pytest.raises(ValueError, match="2 callables"):
        bench.kernel_ms_each(fns, interleave=False, settle_ms=[1.0])
    runs.clear()  # interleaved: one settling run, of the first callable, before the turns
    stats = bench.kernel_ms_each(fns, repeats=5, calls=2, settle_ms=10.0)
    assert runs == [(0, s0)] + [(0, 2), (1, 2)] * 5
    assert all(s.hi == s.median for s in stats)
    with pytest.raises(ValueError, match="one value"):
        bench.kernel_ms_each(fns, settle_ms=[1.0, 1.0])


def test_kernel_ms_by_settles_inside_the_session_and_leaves_the_settling_out(monkeypatch):
    """settle_ms: one settling run (chunks of about SETTLE_CHUNK_MS) before the repeats, in the
    same session; its kernels count in no class. Without it, no settling run."""
    runs = []

    def fake_profile(batch):
        spans, t = [], 0
        for _fn, calls in batch:
            runs.append(calls)
            settle = isinstance(calls, bench.Settle)
            spans.append((SPIN, t, t + 1))
            for i, name in enumerate(("gemm", "copy") * (50 if settle else calls)):
                spans.append((name, t + 10 + i * 10**6, t + 10 + i * 10**6 + (3 if settle else 2)))
            t += 10**12
        return spans

    monkeypatch.setattr(bench, "_profile", fake_profile)
    monkeypatch.setattr(bench, "_once_ms", lambda fn: 5.0)  # 5 ms a call: chunks of 10 calls
    by = bench.kernel_ms_by(lambda: None, lambda n: n, repeats=5, calls=2, settle_ms=300.0)
    assert runs == [bench.Settle(0.3, 10)] + [2] * 5
    assert by["gemm"]["ms"].median == by["gemm"]["ms"].hi == pytest.approx(2e-6)  # ms a call
    assert by["gemm"]["kernels"] == 1 and by["copy"]["kernels"] == 1
    runs.clear()
    bench.kernel_ms_by(lambda: None, lambda n: n, repeats=5, calls=2)
    assert runs == [2] * 5


def test_kernel_ms_each_times_again_what_the_clocks_changed_under(monkeypatch, tmp_path):
    """Not interleaved, a callable whose repeats spread wider than MAX_SPREAD (its clocks
    dropped mid-way: three fast repeats, four slow) is timed once more in a new session,
    settling at least RETRY_SETTLE_MS first; the steady one is kept, the first attempt is
    traced. Never a third attempt."""
    sessions = []

    def fake_profile(batch):
        sessions.append([(fn.k, calls) for fn, calls in batch])
        spans, t, seen = [], 0, {}
        for fn, calls in batch:
            i = seen[fn.k] = seen.get(fn.k, -1) + (0 if isinstance(calls, bench.Settle) else 1)
            n = 1 if isinstance(calls, bench.Settle) else calls
            ms = fn.ms * (
                0.85 if fn.k in fn.drop and i < 3 and len(sessions) in fn.drop[fn.k] else 1
            )
            spans += [(SPIN, t, t + 1), ("k", t + 10, t + 10 + round(n * ms * 10**6))]
            t += 10**12
        return spans

    def make(k, ms, drop):
        def fn():
            return None

        fn.k, fn.ms, fn.drop = k, ms, drop
        return fn

    trace = tmp_path / "trace.tsv"
    monkeypatch.setenv("HANDBOOK_BENCH_TRACE", str(trace))
    monkeypatch.setattr(bench, "_profile", fake_profile)
    monkeypatch.setattr(bench, "_once_ms", lambda fn: fn.ms)
    drop = {1: {1}}  # callable 1's clocks drop in the first session only
    fns = [make(0, 1.0, drop), make(1, 4.0, drop)]
    stats = bench.kernel_ms_each(fns, repeats=7, calls=2, interleave=False, settle_ms=100.0)
    assert len(sessions) == 2 and [k for k, _ in sessions[1]] == [1] * 8
    assert sessions[1][0][1] == bench.Settle(bench.RETRY_SETTLE_MS / 1e3, 13)
    assert [s.median for s in stats] == [pytest.approx(1.0), pytest.approx(4.0)]
    assert stats[1].spread == 0
    assert "timed again: first attempt" in trace.read_text()
    sessions.clear()
    drop[1] = {1, 2}  # it drops again: the second attempt stands, wide, for the record to reject
    stats = bench.kernel_ms_each(fns, repeats=7, calls=2, interleave=False, settle_ms=100.0)
    assert len(sessions) == 2 and stats[1].spread > bench.MAX_SPREAD


def test_settle_waits_for_the_clocks_to_drop_and_hold(monkeypatch):
    """_settle runs at least min_s, then until three chunks agree within SETTLE_TOL: chunks
    that run 15 % fast for 0.4 s and then hold a slower time (a power-capped GPU) settle
    after the drop; chunks that never agree stop at min_s + SETTLE_EXTRA_S. A fast phase that
    outlasts min_s looks steady too: min_s must cover it (graph_ms: 2 s)."""
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench, "_power", lambda: None)  # no NVML: by time alone

    def chunks(times):
        it = iter(times)

        def chunk():
            clock[0] += 0.05
            return next(it)

        return chunk

    fast_then_slow = [176.0] * 8 + [195.0, 204.0] + [208.0, 206.0, 209.0] * 20
    assert bench._settle(chunks(fast_then_slow), 0.5) == pytest.approx(0.05 * 12)
    assert bench._settle(chunks(fast_then_slow), 0.2) == pytest.approx(0.2)  # too short
    assert bench._settle(chunks([208.0] * 100), 0.5) == pytest.approx(0.5)
    jumpy = [100.0, 130.0] * 200
    assert bench._settle(chunks(jumpy), 0.5) == pytest.approx(0.5 + bench.SETTLE_EXTRA_S, abs=0.051)


def test_settle_waits_out_a_fast_phase_that_nvml_sees(monkeypatch, tmp_path):
    """With NVML, in a long settle (min_s >= POWER_MIN_S): steady chunks while the GPU draws near
    its limit uncapped (after a long idle the fast phase outlasted 2 s) do not end settling; the
    SW power cap does, and so does a draw well under the limit (work the cap never reaches). A
    fast phase that never ends stops at min_s + POWER_EXTRA_S, traced. Short settles ignore it."""
    clock = [0.0]
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    trace = tmp_path / "trace.tsv"
    monkeypatch.setenv("HANDBOOK_BENCH_TRACE", str(trace))

    def chunk():
        clock[0] += 0.05
        return 176.0 if clock[0] < 3.0 else 208.0  # fast, steady, for 3 s; then capped

    monkeypatch.setattr(bench, "_power", lambda: (clock[0] >= 3.0, 0.97))
    assert bench._settle(chunk, 1.0) == pytest.approx(3.1, abs=0.051)  # 3 chunks after the cap
    clock[0] = 0.0  # a short settle (after other work) goes by the chunks alone
    assert bench._settle(chunk, 0.5) == pytest.approx(0.5, abs=0.051)
    clock[0] = 0.0
    monkeypatch.setattr(bench, "_power", lambda: (False, 0.6))  # small work: never capped
    assert bench._settle(chunk, 1.0) == pytest.approx(1.0, abs=0.051)
    clock[0] = -100.0  # the fast phase never ends
    monkeypatch.setattr(bench, "_power", lambda: (False, 0.97))
    spent = bench._settle(chunk, 1.0)
    assert spent == pytest.approx(1.0 + bench.POWER_EXTRA_S, abs=0.051)
    assert "gave up in the fast phase: draw 97% of the limit" in trace.read_text()


def test_graph_ms_collects_before_the_settle_not_between_it_and_the_repeats(monkeypatch):
    """A gc.collect() between the settle and the timed replays idles the GPU (87 ms over a
    test's heap) and the clocks rise again: on the H200 a 4096^3 matmul's replays then ran in
    the fast phase, 0.174 against 0.204 ms settled. The order must be collect, settle, replays."""
    from contextlib import nullcontext

    log = []

    class Event:
        def __init__(self, **_):
            pass

        def record(self):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, _):
            return 1.0

    class Graph:
        def replay(self):
            log.append("replay")

    class Stream:
        def wait_stream(self, _):
            pass

    cuda = bench.torch.cuda
    for name, fake in (("Event", Event), ("CUDAGraph", Graph), ("Stream", Stream),
                       ("current_stream", Stream), ("graph", lambda _: nullcontext()),
                       ("stream", lambda _: nullcontext())):  # fmt: skip
        monkeypatch.setattr(cuda, name, fake)
    monkeypatch.setattr(bench, "_calls_for", lambda *_: 1)
    monkeypatch.setattr(bench.gc, "collect", lambda: log.append("collect"))
    monkeypatch.setattr(bench, "_settle", lambda chunk, min_s: log.append("settle") or min_s)
    t = bench.graph_ms(lambda: None, repeats=5, warmup=0)
    assert t.n == 5 and log == ["collect", "settle"] + ["replay"] * 5, log


@pytest.mark.parametrize(("timer", "kwargs", "want"), [
    # 4 settling calls of 0.25 s, then 5 repeats of 3 calls
    ("step_ms", {"calls": 3, "warmup": 0}, ["collect"] + ["call"] * (4 + 5 * 3)),
    # 1 warm-up call, the collection, 4 settling calls, then 5 repeats of 2 calls
    ("python_ms", {"calls": 2, "warmup": 1}, ["call", "collect"] + ["call"] * (4 + 5 * 2)),
])  # fmt: skip
def test_host_timers_collect_before_their_settle_not_between_it_and_the_repeats(
    monkeypatch, timer, kwargs, want
):
    """As graph_ms: the settling calls follow the collection, and the repeats follow them."""
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    clock, log = [0.0], []
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench.gc, "collect", lambda: log.append("collect"))

    def call():
        log.append("call")
        clock[0] += 0.25

    getattr(bench, timer)(call, repeats=5, settle_s=1.0, **kwargs)
    assert log == want, log


def test_a_long_settle_sets_nvml_up_before_its_first_chunk(monkeypatch):
    """NVML's first use (import, init, lookup) is lazy: inside the settle it could fall between
    the last chunk and the timed repeats, an idle GPU again. A long settle reads it first."""
    clock, log = [0.0], []
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(bench, "_power", lambda: log.append("nvml") or (True, 0.99))

    def chunk():
        log.append("chunk")
        clock[0] += 0.05
        return 10.0

    bench._settle(chunk, bench.POWER_MIN_S)
    assert log[0] == "nvml" and log[1] == "chunk", log
    log.clear()
    bench._settle(chunk, 0.2)  # a short settle goes by the chunks alone: no NVML
    assert set(log) == {"chunk"}, log


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


def test_step_ms_fastest_keeps_the_fastest_third_of_three_times_the_repeats(monkeypatch):
    """fastest=True: 3 x repeats repeats, the Stat of the fastest third. A host that runs at
    half speed for two repeats in three (every step 2 ms instead of 1 ms) leaves the fast
    repeats' time; all repeats' median would be the slow one."""
    monkeypatch.setattr(bench.torch.cuda, "synchronize", lambda: None)
    clock, count = [0.0], [0]  # a fake clock: each step advances it by its own time
    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock[0])

    def step():
        count[0] += 1
        slow = (count[0] - 1) // 4 % 3 != 0  # 4 steps a repeat: repeats 1, 2 of each 3 slow
        clock[0] += 0.004 if slow else 0.002 + 1e-5 * count[0]

    t = bench.step_ms(step, repeats=5, calls=4, settle_s=0.0, warmup=0, fastest=True)
    assert count[0] == 15 * 4 and t.n == 5 and t.clock == "python-fastest"
    assert 2.0 <= t.lo <= t.median <= t.hi < 2.7, t  # the fast repeats only
    assert t.extremes[1] == pytest.approx(4.0)  # min and max still span every repeat


def test_fastest_interleaved_times_every_step_round_by_round_over_the_window(monkeypatch):
    """Two steps timed alternately on a fake clock whose host is slow (2x) for 2 s of every
    3 s: each keeps its 7 fastest repeats, all from the fast phase; the window (10 s) sets the
    rounds, each step the same number; the Stats say how many repeats they were drawn from."""
    from snippets.common import hostbound

    monkeypatch.setattr(hostbound.torch.cuda, "synchronize", lambda: None)
    clock, order = [0.0], []
    monkeypatch.setattr(hostbound.time, "perf_counter", lambda: clock[0])

    def step(name, ms):
        def fn():
            order.append(name)
            slow = clock[0] % 3.0 >= 1.0
            clock[0] += ms / 1e3 * (2 if slow else 1)

        return fn

    out = hostbound.fastest_interleaved(
        {"a": (step("a", 20.0), 2), "b": (step("b", 5.0), 4)}, seconds=10.0, keep=7, warmup=1
    )
    assert order[:2] == ["a", "b"] and order[2:8] == ["a", "a", "b", "b", "b", "b"]
    a, b = out["a"], out["b"]
    assert a.drawn == b.drawn and a.drawn >= 21 and clock[0] >= 10.0
    assert (a.n, a.clock, b.n) == (7, "python-fastest", 7)
    assert a.hi == pytest.approx(20.0) and b.hi == pytest.approx(5.0)  # the fast phase only
    assert a.extremes[1] == pytest.approx(40.0)  # the slow phase was timed, and left out


def test_fastest_interleaved_takes_several_repeats_a_round_of_a_short_step(monkeypatch):
    """(fn, calls, 3): three repeats of the short step each round, one of the long one."""
    from snippets.common import hostbound

    monkeypatch.setattr(hostbound.torch.cuda, "synchronize", lambda: None)
    clock, order = [0.0], []
    monkeypatch.setattr(hostbound.time, "perf_counter", lambda: clock[0])

    def step(name, s):
        def fn():
            order.append(name)
            clock[0] += s

        return fn

    out = hostbound.fastest_interleaved(
        {"long": (step("long", 0.1), 1), "short": (step("short", 0.01), 2, 3)},
        seconds=1.0, keep=5, warmup=0,
    )  # fmt: skip
    assert order[:7] == ["long"] + ["short"] * 6
    assert out["short"].drawn == 3 * out["long"].drawn and out["long"].drawn == 15


def test_fastest_interleaved_runs_enough_rounds_past_a_short_window(monkeypatch):
    """A step so slow that the window ends first still gets 3 x keep repeats."""
    from snippets.common import hostbound

    monkeypatch.setattr(hostbound.torch.cuda, "synchronize", lambda: None)
    clock = [0.0]
    monkeypatch.setattr(hostbound.time, "perf_counter", lambda: clock[0])

    def slow():
        clock[0] += 1.0

    out = hostbound.fastest_interleaved({"s": (slow, 1)}, seconds=2.0, keep=5, warmup=0)
    assert out["s"].drawn == 15 and out["s"].median == pytest.approx(1000.0)
    with pytest.raises(ValueError, match="no steps"):
        hostbound.fastest_interleaved({})
