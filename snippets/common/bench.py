"""Timing harness: every timing is n >= 5 repeats after warm-up, kept as a Stat (median, range).

Three clocks, each named in the record:
  graph_ms   GPU time: `calls` back-to-back calls captured in one CUDA graph, the replay timed
             with CUDA events (launch overhead gone, the GPU's own gaps kept);
  kernel_ms  GPU time: the durations of the kernels the calls launched (CUPTI, via
             torch.profiler), summed; gaps between kernels are not counted;
  python_ms  time seen from Python: wall clock around `calls` calls and a synchronize, CPU
             overhead included, as a training loop sees it.
Every benchmark states its byte or FLOP model; rates are reported against the ceilings measured
in the same run (ceilings()), and against the datasheet peak from data/hardware.yaml.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import sys
import time
from contextlib import contextmanager

import torch

from snippets.common.results import MAX_SPREAD, ResultError, Stat

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


def _calls_for(fn, target_ms: float, max_calls: int) -> int:
    """Calls per repeat so that one repeat takes about target_ms (from a rough first timing)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = (time.perf_counter() - t0) * 1e3
    return max(1, min(max_calls, math.ceil(target_ms / max(once, 1e-3))))


@_traced
def graph_ms(fn, *, repeats: int = REPEATS, warmup: int = 3, target_ms: float = 40.0,
             max_calls: int = 500) -> Stat:  # fmt: skip
    """GPU time of one call of `fn`, from replays of a CUDA graph of back-to-back calls.

    `fn` must be capturable (no host synchronisation, no CPU-side data-dependent control).
    Inputs stay in L2 between calls when they fit (50 MB on an H200): say so where it matters.
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
    t0 = time.perf_counter()
    while True:  # replays first: the clocks settle into the state the timed replays will see
        graph.replay()  # (0.2 s left the first repeat of a small matmul 10 % faster than the rest)
        torch.cuda.synchronize()
        if time.perf_counter() - t0 > 0.5:
            break
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    with _quiet():
        for _ in range(repeats):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
    del graph
    return Stat.of(samples, "gpu-graph")


def _kernel_sums(fn, repeats: int, calls: int, classify) -> list[dict]:
    """Per repeat of `calls` calls: {class: [microseconds, kernels]} of the CUDA kernels (and
    copies) the calls launched, read by CUPTI through torch.profiler."""
    torch.cuda.synchronize()
    cuda = torch.profiler.ProfilerActivity.CUDA
    t0 = time.perf_counter()
    with _quiet(), torch.profiler.profile(activities=[cuda]) as prof:
        t1 = time.perf_counter()
        for i in range(repeats):
            with torch.profiler.record_function(f"{MARKER}{i}"):
                for _ in range(calls):
                    fn()
                torch.cuda.synchronize()
        t2 = time.perf_counter()
    # the raw events: prof.events() would build a Python object per event, ~50 us each
    gpu = torch.autograd.DeviceType.CUDA
    names: dict[str, str] = {}  # demangled, as prof.events() names them
    spans = []
    for e in prof.profiler.kineto_results.events():
        name, on_gpu = e.name(), e.device_type() == gpu
        hidden = getattr(e, "is_hidden_event", lambda: False)()  # absent in some builds
        if hidden or not (on_gpu or name.startswith(MARKER)):
            continue
        if name not in names:
            names[name] = torch._C._demangle(name) if len(name) > 1 else name
        spans.append((names[name], on_gpu, e.start_ns(), e.end_ns()))
    # the profiler's own cost, apart from the timed calls: starting, stopping, reading events
    _trace((t1 - t0) + (time.perf_counter() - t2), "(profiler start, stop, events)", "bench.py")
    return split_repeats(spans, repeats, classify)


MARKER = "handbook_repeat_"


def split_repeats(spans, repeats: int, classify) -> list[dict]:
    """Sums per repeat from profiler spans (name, on_gpu, start_ns, end_ns): each GPU span
    belongs to the repeat whose marker range it started in (the GPU's copy of the marker if
    there is one); if the ranges do not line up, and every repeat launched the same kernels,
    they are split in order."""
    marks = [s for s in spans if s[0].startswith(MARKER)]
    on_gpu = [s for s in marks if s[1]]
    ranges = sorted((s[2], s[3]) for s in (on_gpu or marks))
    kernels = sorted((s for s in spans if s[1] and not s[0].startswith(MARKER)),
                     key=lambda s: s[2])  # fmt: skip
    sums: list[dict] = [{} for _ in range(repeats)]
    for name, _, start, end in kernels:
        i = next((i for i, (lo, hi) in enumerate(ranges) if lo <= start <= hi), None)
        if i is None or len(ranges) != repeats:
            break
        cell = sums[i].setdefault(classify(name), [0.0, 0])
        cell[0] += (end - start) / 1e3
        cell[1] += 1
    else:
        if all(sums):
            return sums
    if not kernels or len(kernels) % repeats:  # clocks not aligned, nor the same kernels a repeat
        raise RuntimeError(f"kernel_ms: cannot split {len(kernels)} kernels into {repeats} repeats")
    per = len(kernels) // repeats
    sums = [{} for _ in range(repeats)]
    for k, (name, _, start, end) in enumerate(kernels):
        cell = sums[k // per].setdefault(classify(name), [0.0, 0])
        cell[0] += (end - start) / 1e3
        cell[1] += 1
    return sums


@_traced
def kernel_ms(fn, *, repeats: int = REPEATS, calls: int | None = None, target_ms: float = 10.0,
              warmup: int = 2) -> Stat:  # fmt: skip
    """GPU time of one call of `fn`: its kernels' durations (CUPTI) summed, per repeat of
    `calls` calls (by default as many as take about target_ms). Works for anything, capturable
    or not; time the GPU waits is not counted."""
    for _ in range(warmup):
        fn()
    calls = calls or _calls_for(fn, target_ms, 1000)
    sums = _kernel_sums(fn, repeats, calls, lambda name: None)
    return Stat.of([s[None][0] / calls / 1e3 for s in sums], "gpu-kernels")


@_traced
def kernel_ms_by(fn, classify, *, repeats: int = REPEATS, calls: int = 1,
                 warmup: int = 1) -> dict[str, dict]:  # fmt: skip
    """kernel_ms per class of kernel: {classify(name): {"ms": Stat, "kernels": per call}}."""
    for _ in range(warmup):
        fn()
    sums = _kernel_sums(fn, repeats, calls, classify)
    classes = sorted({c for s in sums for c in s}, key=str)
    out = {}
    for c in classes:
        ms = [s.get(c, [0.0, 0])[0] / calls / 1e3 for s in sums]
        counts = sorted(s.get(c, [0.0, 0])[1] / calls for s in sums)
        out[c] = {"ms": Stat.of(ms, "gpu-kernels"), "kernels": counts[len(counts) // 2]}
    return out


@_traced
def python_ms(fn, *, repeats: int = PYTHON_REPEATS, calls: int | None = None,
              target_ms: float = 20.0, warmup: int = 3) -> Stat:  # fmt: skip
    """Time seen from Python: wall clock of `calls` calls (not synchronised between calls,
    as in a training or generation loop; by default as many as take about target_ms) and one
    synchronize, per call."""
    for _ in range(warmup):
        fn()
    calls = calls or _calls_for(fn, target_ms, 1000)
    samples = []
    with _quiet():
        for _ in range(repeats):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3 / calls)
    return Stat.of(samples, "python")


@functools.cache
@_traced
def ceilings() -> dict[str, Stat]:
    """Practical ceilings, measured in this run: copy bandwidth (bytes read + written per
    second, 1 GiB buffers, far larger than the L2) and bf16 matmul FLOP/s (8192^3, random
    data, never zeros). Two seconds of matmuls first take the clocks out of their idle state;
    repeats of 100 ms average out the clock changes of a power-limited GPU."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 2.0:  # synchronised: two seconds of GPU work, not queued
        a @ b
        torch.cuda.synchronize()
    matmul = graph_ms(lambda: a @ b, target_ms=100.0)  # power-limited clocks: average them out
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = graph_ms(lambda: dst.copy_(src), target_ms=50.0)
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
