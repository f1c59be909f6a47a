"""Timing harness: every timing is n >= 5 repeats after warm-up, kept as a Stat (median, range).

Three clocks, each named in the record:
  graph_ms   GPU time: `calls` back-to-back calls captured in one CUDA graph, the replay timed
             with CUDA events (launch overhead gone, the GPU's own gaps kept);
  kernel_ms  GPU time: the durations of the kernels the calls launched (CUPTI, via
             torch.profiler), summed; gaps between kernels are not counted;
  python_ms  time seen from Python: wall clock around `calls` calls and a synchronize, CPU
             overhead included, as a training loop sees it;
  step_ms    time seen from Python per step of a loop that waits for each step (a decode loop
             that reads each token): the median step of each repeat, after a settling time.
Every benchmark states its byte or FLOP model; rates are reported against the ceilings measured
in the same run (ceilings()), and against the datasheet peak from data/hardware.yaml.
"""

from __future__ import annotations

import functools
import gc
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from snippets.common.results import FASTEST_SHARE, MAX_SPREAD, ResultError, Stat

REPEATS = 7
PYTHON_REPEATS = 15  # time seen from Python is noisier (a shared CPU): more, shorter repeats


def _traced(fn):
    """With HANDBOOK_BENCH_TRACE=<file> (gpu_docs sets it), each harness call appends its wall
    time and its caller's file:line, so a post over its budget shows where the seconds went."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        path = os.environ.get("HANDBOOK_BENCH_TRACE")
        if not path:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            caller = sys._getframe(1)
            where = f"{os.path.relpath(caller.f_code.co_filename)}:{caller.f_lineno}"
            _trace(time.perf_counter() - t0, fn.__name__, where)

    return wrapper


def _trace(seconds: float, name: str, where: str) -> None:
    if path := os.environ.get("HANDBOOK_BENCH_TRACE"):
        with open(path, "a", encoding="utf-8") as out:
            out.write(f"{seconds:.3f}\t{name}\t{where}\n")


@contextmanager
def _quiet():
    """No garbage collection while timing: a collection inside a repeat is noise."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _once_ms(fn) -> float:
    """A rough timing of one synchronised call."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return max((time.perf_counter() - t0) * 1e3, 1e-3)


def _calls_for(fn, target_ms: float, max_calls: int) -> int:
    """Calls per repeat so that one repeat takes about target_ms (from a rough first timing)."""
    return max(1, min(max_calls, math.ceil(target_ms / _once_ms(fn))))


SETTLE_TOL = 0.02  # settled: the last three chunks within ±2 % of their median (steady, a
# power-capped matmul's 40 ms chunks still varied ±2-3 %; the drop they wait out is ~15 %)
SETTLE_EXTRA_S = 2.0  # at most this long past the minimum
POWER_NEAR = 0.9  # drawing this share of the enforced limit, uncapped: the fast phase
POWER_EXTRA_S = 4.0  # at most this long past the minimum while the fast phase lasts
POWER_MIN_S = 1.0  # settles this long or longer (after idle: a process's first) read NVML
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap: the driver lowers clocks to the limit


@functools.cache
def _nvml():
    """(pynvml, handle) of the current CUDA device, or None where NVML cannot be read (no
    nvidia-ml-py, no driver): _settle then goes by time alone."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no nvidia-ml-py, or no driver library
        return None
    try:
        uuid = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except Exception:  # an older torch or NVML: the only GPU, where there is one
        if pynvml.nvmlDeviceGetCount() == 1:
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        return None


def _power() -> tuple[bool, float] | None:
    """(capped, draw / enforced limit) of the current GPU, from NVML; None without NVML.
    capped: the SW power cap clock-event reason is active. The draw NVML reports on Hopper
    is averaged over one second."""
    if (nvml := _nvml()) is None:
        return None
    pynvml, handle = nvml
    try:
        reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        draw = pynvml.nvmlDeviceGetPowerUsage(handle) / pynvml.nvmlDeviceGetEnforcedPowerLimit(
            handle
        )
    except pynvml.NVMLError:
        return None
    return bool(reasons & SW_POWER_CAP), draw


def _settle(chunk, min_s: float) -> float:
    """Run chunk() -- a few tens of ms of GPU work that returns its GPU time (CUDA events) --
    for at least min_s seconds, then until the last three chunks agree within SETTLE_TOL, for
    at most SETTLE_EXTRA_S more; return the seconds spent. Why: the H200 machine's GPU runs at
    its 700 W power cap under large matmuls, and after idle or lighter work a 4096³ matmul ran
    about 15 % fast before the clocks dropped to the state they then hold (176 vs 208 µs): for
    0.2-0.3 s after idle or other work in a 2026-12-04 probe, for about 1.1 s in earlier ones;
    a timing that straddles the drop spread 5-15 %. (A fast phase that seemed to outlast 8 s of
    settling was the harness's own gc.collect() between the settle and the repeats: graph_ms.)
    That fast phase looks steady too, so in a settle of at least POWER_MIN_S (the long ones,
    after idle) where NVML can be read, steady chunks count
    only once the power state is one that holds: the SW power cap active, or a draw under
    POWER_NEAR of the limit (work that the cap never reaches); while the GPU draws near its
    limit uncapped, settling goes on, for at most POWER_EXTRA_S. Short settles, after other
    work, go by the chunks alone: attention kernels drew 96-98 % of the limit for seconds
    without the cap engaging, and waiting on each stretched one post's settling to 28 s."""
    if min_s >= POWER_MIN_S:
        _power()  # NVML set up (import, init) before the chunks, not between them and repeats
    t0 = time.perf_counter()
    times: list[float] = []
    while True:
        times.append(chunk())
        spent = time.perf_counter() - t0
        last = sorted(times[-3:])
        steady = len(last) == 3 and last[2] - last[0] <= 2 * SETTLE_TOL * last[1]
        fast_phase = False
        if spent >= min_s >= POWER_MIN_S and (power := _power()) is not None:
            capped, draw = power
            fast_phase = not capped and draw >= POWER_NEAR
        if spent >= min_s and steady and not fast_phase:
            return spent
        if spent >= min_s + (POWER_EXTRA_S if fast_phase else SETTLE_EXTRA_S):
            if fast_phase:
                _trace(0.0, f"(settling gave up in the fast phase: draw {draw:.0%} of the "
                            "limit, not capped)", "bench.py")  # fmt: skip
            return spent


def _timed(fn, calls: int):
    """A chunk for _settle: `calls` calls of fn between two CUDA events, in ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def chunk() -> float:
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    return chunk


@_traced
def graph_ms(fn, *, repeats: int = REPEATS, warmup: int = 3, target_ms: float = 40.0,
             max_calls: int = 500, settle_ms: float = 2000.0) -> Stat:  # fmt: skip
    """GPU time of one call of `fn`, from replays of a CUDA graph of back-to-back calls.

    `fn` must be capturable (no host synchronisation, no CPU-side data-dependent control).
    Inputs stay in L2 between calls when they fit (50 MB on an H200): say so where it matters.
    Before the timed replays, untimed replays for at least settle_ms and until they hold
    steady (_settle): the clocks reach the state the timed replays will see.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the default stream, as capture requires
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    calls = _calls_for(fn, target_ms, max_calls)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # the collection before the settle, none between it and the repeats: that collection (87
    # ms over a test's heap, ~0.24 s in a post's) idled the GPU, its clocks rose, and a
    # matmul's repeats ran in the fast phase again (0.174 against 0.204 ms settled)
    with _quiet():
        for attempt in range(2):  # a second one only after the clocks changed under the first
            spent = _settle(_timed(graph.replay, 1), settle_ms / 1e3)
            samples = []
            for _ in range(repeats):
                start.record()
                graph.replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) / calls)
            _trace(spent, "(settling: clocks to their steady state)", "graph_ms")
            stat = Stat.of(samples, "gpu-graph")
            if stat.spread <= MAX_SPREAD or attempt:
                break
            _retimed(stat)
    del graph
    return stat


def _retimed(stat: Stat) -> None:
    """Trace a timing that is measured again: the clocks of a power-capped matmul dropped
    during the timed repeats (176 -> 200 µs; then because the harness collected garbage, and
    the GPU idled, between the settle and the repeats); the harness then settles again and
    times once more, keeping the second attempt (the first stays in the trace). A guard now."""
    lo, hi = stat.extremes or (stat.lo, stat.hi)
    _trace(0.0, f"(timed again: first attempt {stat.median:.4g} ms ±{stat.spread:.1%}, "
                f"repeats {lo:.4g}-{hi:.4g})", "bench.py")  # fmt: skip


@dataclass(frozen=True)
class Settle:
    """In a run list for _profile: a settling run of fn in chunks of `chunk` calls (_settle)."""

    min_s: float
    chunk: int


def _profile(runs) -> list[tuple]:
    """Run `runs` [(fn, calls)] in order inside one torch.profiler session, each run starting
    with a sentinel kernel (torch.cuda._sleep's spin_kernel, a few cycles) and ending in a
    synchronize; return the spans (name, start_ns, end_ns) of the CUDA kernels (and copies).
    `calls` may be a Settle: that run lasts until the clocks hold steady.
    The sentinels, not profiler markers, split the kernels into runs: with only the CUDA
    activity on, torch.profiler records no CPU-side marker at all."""
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    t0 = time.perf_counter()
    with _quiet(), torch.profiler.profile(activities=[cuda]) as prof:
        t1 = time.perf_counter()
        settling = 0.0
        for fn, calls in runs:
            torch.cuda._sleep(1)
            if isinstance(calls, Settle):
                settling += _settle(_timed(fn, calls.chunk), calls.min_s)
            else:
                for _ in range(calls):
                    fn()
            torch.cuda.synchronize()
        t2 = time.perf_counter()
    # the raw events: prof.events() would build a Python object per event, ~50 us each
    gpu = torch.autograd.DeviceType.CUDA
    names: dict[str, str] = {}  # demangled, as prof.events() names them
    spans = []
    for e in prof.profiler.kineto_results.events():
        hidden = getattr(e, "is_hidden_event", lambda: False)()  # absent in some builds
        if hidden or e.device_type() != gpu:
            continue
        name = e.name()
        if name not in names:
            names[name] = torch._C._demangle(name) if len(name) > 1 else name
        spans.append((names[name], e.start_ns(), e.end_ns()))
    # the profiler's own cost, apart from the timed calls: starting, stopping, reading events
    _trace((t1 - t0) + (time.perf_counter() - t2), "(profiler start, stop, events)", "bench.py")
    if settling:
        _trace(settling, "(settling: clocks to their steady state)", "kernel_ms_each")
    return spans


SENTINEL = "spin_kernel"  # the kernel of torch.cuda._sleep


def split_runs(spans, runs: int, classify) -> list[dict]:
    """Per run, {class: [microseconds, kernels]} from kernel spans (name, start_ns, end_ns):
    a kernel belongs to the run of the latest sentinel that started before it."""
    sums: list[dict] = []
    for name, start, end in sorted(spans, key=lambda s: s[1]):
        if SENTINEL in name:
            sums.append({})
            continue
        if not sums:
            raise RuntimeError(f"kernel_ms: kernel {name!r} ran before the first run's sentinel")
        cell = sums[-1].setdefault(classify(name), [0.0, 0])
        cell[0] += (end - start) / 1e3
        cell[1] += 1
    if len(sums) != runs:
        raise RuntimeError(f"kernel_ms: {len(sums)} sentinel kernels for {runs} runs: "
                           "the profiler lost events")  # fmt: skip
    if empty := [i for i, s in enumerate(sums) if not s]:
        raise RuntimeError(f"kernel_ms: run(s) {empty} launched no CUDA kernel")
    return sums


def _kernel_sums(fn, repeats: int, calls: int, classify) -> list[dict]:
    return split_runs(_profile([(fn, calls)] * repeats), repeats, classify)


@_traced
def kernel_ms(fn, *, repeats: int = REPEATS, calls: int | None = None, target_ms: float = 10.0,
              warmup: int = 2, settle_ms: float = 0.0) -> Stat:  # fmt: skip
    """GPU time of one call of `fn`: its kernels' durations (CUPTI) summed, per repeat of
    `calls` calls (by default as many as take about target_ms). Works for anything, capturable
    or not; time the GPU waits is not counted. settle_ms: a settling run inside the profiler
    session, right before the repeats (see kernel_ms_each)."""
    if settle_ms <= 0:
        for _ in range(warmup):
            fn()
        calls = calls or _calls_for(fn, target_ms, 1000)
        sums = _kernel_sums(fn, repeats, calls, lambda name: None)
        return Stat.of([s[None][0] / calls / 1e3 for s in sums], "gpu-kernels")
    return kernel_ms_each([fn], repeats=repeats, calls=calls, target_ms=target_ms,
                          warmup=warmup, interleave=False, settle_ms=settle_ms)[0]  # fmt: skip


SETTLE_CHUNK_MS = 50.0  # a settling chunk: about this much GPU work between two events
RETRY_SETTLE_MS = 2000.0  # settling before a second attempt


@_traced
def kernel_ms_each(fns, *, repeats: int = REPEATS, calls: int | None = None,
                   target_ms: float = 10.0, warmup: int = 2, interleave: bool = True,
                   settle_ms: float | Sequence[float] = 0.0,
                   retry: bool = True) -> list[Stat]:  # fmt: skip
    """kernel_ms of several callables in one profiler session (a session costs about 0.4 s to
    start, stop and read on the H200 machine). interleave: repeat i of each callable in turn,
    then repeat i + 1, so a change of the GPU's clocks reaches all of them alike (steps of one
    kind of work); otherwise every repeat of one callable, then the next, so each is timed in
    its own steady clock state (large matmuls among small memory-bound operators: timed in
    turn with them, a matmul ran faster and spread wider than on its own). settle_ms (one
    value, or one per callable when not interleaved): before each callable's repeats (when
    interleaved: once, the first callable, before the turns), an untimed run inside the
    session for at least that long and until it holds steady (_settle), so
    the clocks leave the state that the previous callable, or the idle GPU while the profiler
    started, left them in (settled outside the session, a matmul's first repeats still ran
    about 10 % fast: the GPU idles while the profiler starts). Order power-hungry callables
    (large matmuls) together and give the first of them the long settle. retry (not
    interleaved): callables whose spread is wider than MAX_SPREAD are timed once more in a new
    session, the first of them settling at least RETRY_SETTLE_MS (see _retimed)."""
    fns = list(fns)
    mins = [float(settle_ms)] * len(fns) if isinstance(settle_ms, int | float) else list(settle_ms)
    if len(mins) != len(fns):
        raise ValueError(f"kernel_ms_each: {len(mins)} settle_ms values for {len(fns)} callables")
    if interleave and not isinstance(settle_ms, int | float):
        raise ValueError("kernel_ms_each: interleaved, settle_ms is one value (a settling run "
                         "of the first callable before the repeats)")  # fmt: skip
    t0 = time.perf_counter()
    for fn in fns:
        for _ in range(warmup):
            fn()
    # a rough time per call: to size the repeats (when calls is not given) and settling chunks
    once = [_once_ms(fn) for fn in fns] if calls is None or any(mins) else [1.0] * len(fns)
    per = [calls or max(1, min(1000, math.ceil(target_ms / t))) for t in once]
    _trace(time.perf_counter() - t0, "(warm-up: compiles, autotuning)", "kernel_ms_each")
    if interleave:  # one settling run, of the first callable, before the turns
        order = [(-1, 0)] * (mins[0] > 0) + [(i, k) for i in range(repeats)
                                             for k in range(len(fns))]  # fmt: skip
    else:
        order = [(i, k) for k in range(len(fns))
                 for i in ([-1] if mins[k] > 0 else []) + list(range(repeats))]  # fmt: skip
    chunk = [max(1, math.ceil(SETTLE_CHUNK_MS / t)) for t in once]
    runs = [(fns[k], per[k] if i >= 0 else Settle(mins[k] / 1e3, chunk[k])) for i, k in order]
    sums = split_runs(_profile(runs), len(order), lambda n: None)
    ms = {ik: s[None][0] / per[ik[1]] / 1e3 for ik, s in zip(order, sums, strict=True)}
    stats = [Stat.of([ms[i, k] for i in range(repeats)], "gpu-kernels") for k in range(len(fns))]
    wide = [k for k, st in enumerate(stats) if st.spread > MAX_SPREAD]
    if wide and not interleave and retry:  # the clocks changed under these: settle, time again
        for k in wide:
            _retimed(stats[k])
        again = kernel_ms_each([fns[k] for k in wide], repeats=repeats, calls=calls,
                               target_ms=target_ms, warmup=0, interleave=False,
                               settle_ms=[max(RETRY_SETTLE_MS, mins[wide[0]])]
                               + [mins[k] for k in wide[1:]], retry=False)  # fmt: skip
        for k, st in zip(wide, again, strict=True):
            stats[k] = st
    return stats


@_traced
def kernel_ms_by(fn, classify, *, repeats: int = REPEATS, calls: int = 1, warmup: int = 1,
                 settle_ms: float = 0.0) -> dict[str, dict]:  # fmt: skip
    """kernel_ms per class of kernel: {classify(name): {"ms": Stat, "kernels": per call}}.
    settle_ms: a settling run inside the profiler session before the repeats, left out (see
    kernel_ms_each: without it a power-hungry step's first repeats ran in the fast phase)."""
    for _ in range(warmup):
        fn()
    runs = [(fn, calls)] * repeats
    if settle_ms > 0:
        runs = [(fn, Settle(settle_ms / 1e3, max(1, math.ceil(SETTLE_CHUNK_MS / _once_ms(fn)))))]
        runs += [(fn, calls)] * repeats
    sums = split_runs(_profile(runs), len(runs), classify)[len(runs) - repeats :]
    classes = sorted({c for s in sums for c in s}, key=str)
    out = {}
    for c in classes:
        ms = [s.get(c, [0.0, 0])[0] / calls / 1e3 for s in sums]
        counts = sorted(s.get(c, [0.0, 0])[1] / calls for s in sums)
        out[c] = {"ms": Stat.of(ms, "gpu-kernels"), "kernels": counts[len(counts) // 2]}
    return out


@_traced
def python_ms(fn, *, repeats: int = PYTHON_REPEATS, calls: int | None = None,
              target_ms: float = 20.0, warmup: int = 3, settle_s: float = 0.0) -> Stat:  # fmt: skip
    """Time seen from Python: wall clock of `calls` calls (not synchronised between calls,
    as in a training or generation loop; by default as many as take about target_ms) and one
    synchronize, per call. settle_s: fn runs untimed that long first, after the collection and
    right before the repeats (after idle, matmuls ran fast for the first fraction of a second)."""
    for _ in range(warmup):
        fn()
    calls = calls or _calls_for(fn, target_ms, 1000)
    samples = []
    with _quiet():  # collected before the settle: none between it and the repeats (graph_ms)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < settle_s:
            fn()
            torch.cuda.synchronize()
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return Stat.of(samples, "python")


@_traced
def step_ms(fn, *, repeats: int = PYTHON_REPEATS, calls: int = 16, settle_s: float = 1.0,
            warmup: int = 3, fastest: bool = False) -> Stat:  # fmt: skip
    """Time seen from Python per step of a loop that waits for each step's result (a decode
    loop that reads every token): each call is followed by a synchronize and timed alone; a
    repeat's value is the median of its `calls` steps (an occasional slow step, a CPU hiccup,
    does not move it). Before timing, `fn` runs for settle_s seconds: on the H200 machine the
    host CPU ran at half speed for about a second after a model was built (a pure-Python loop
    interleaved with the steps slowed down 2x as well).
    fastest: for CPU-bound steps (eager decode: launching ~100 kernels), `repeats` times
    FASTEST_SHARE repeats, and the Stat of the fastest third (clock "python-fastest"). The
    host's speed moved 2x within seconds, back and forth, so that the median of 15 repeats
    spread ±18-51 % and moved 2x between runs; as the timeit documentation argues for min(),
    the slow repeats measure other load on the host, not the code."""
    if fastest:
        repeats *= FASTEST_SHARE
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    with _quiet():  # collected before the settle: none between it and the repeats (graph_ms)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < settle_s:
            fn()
            torch.cuda.synchronize()
        for _ in range(repeats):
            steps = []
            for _ in range(calls):
                t1 = time.perf_counter()
                fn()
                torch.cuda.synchronize()
                steps.append(time.perf_counter() - t1)
            steps.sort()
            mid = len(steps) // 2
            median = steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2
            samples.append(median * 1e3)
    return Stat.of(samples, "python-fastest" if fastest else "python")


CEILINGS_ENV = "HANDBOOK_CEILINGS"  # set by gpu_docs: one file of ceilings for its whole run


@functools.cache
def ceilings() -> dict[str, Stat]:
    """Practical ceilings, measured in this run: copy bandwidth (bytes read + written per
    second by an elementwise kernel, 1 GiB buffers, far larger than the L2) and bf16 matmul
    FLOP/s (8192^3, random data, never zeros). Under gpu_docs ($HANDBOOK_CEILINGS) a process
    of their own measures them before the first post, and every post of the run reads that
    file: one GPU, one run, one pair of ceilings (measuring them costs about 4.5 s)."""
    shared = os.environ.get(CEILINGS_ENV)
    if shared and os.path.exists(shared):
        with open(shared, encoding="utf-8") as f:
            stored = json.load(f)
        return {k: Stat(v["median"], v["lo"], v["hi"], v["n"], v.get("clock"), derived=True)
                for k, v in stored.items()}  # fmt: skip
    found = _measure_ceilings()
    if shared:
        tmp = f"{shared}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({k: v.to_json() for k, v in found.items()}, f)
        os.replace(tmp, shared)
    return found


@_traced
def _measure_ceilings() -> dict[str, Stat]:
    """Two seconds of matmul replays first take the clocks out of their idle state; repeats of
    100 ms average out the clock changes of a power-limited GPU."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    matmul = graph_ms(lambda: a @ b, target_ms=100.0, settle_ms=2000.0)
    # an elementwise kernel, not dst.copy_(src): captured in a graph, copy_ is a memcpy node
    # that the copy engine runs, about 2.7 TB/s on the H200 -- kernels reached 1.4x that
    n = 1 << 30
    src = torch.randn(n // 4, device="cuda")  # fp32, 1 GiB
    dst = torch.empty_like(src)
    copy = graph_ms(lambda: torch.mul(src, 1.0, out=dst), target_ms=50.0)
    for name, t in (("copy", copy), ("matmul", matmul)):  # rates derived from them skip the check
        if t.spread > MAX_SPREAD:
            raise ResultError(f"ceilings(): the {name} timing spread ±{t.spread:.1%} > ±5%: {t}")
    return {
        "copy_bytes_per_s": rate(2 * n, copy),
        "bf16_matmul_flop_per_s": rate(2 * 8192**3, matmul),
    }


def rate(amount, ms):
    """Bytes or FLOPs per second for `amount` done in `ms` milliseconds (Stat or number)."""
    return amount / (ms * 1e-3)
