"""CPU-bound steps timed on a host whose speed changes: several timings interleaved round by
round over one window of at least WINDOW_S seconds, each kept as the fastest KEEP of its
repeats (clock "python-fastest", `drawn` = its repeats).

Why a window, not more repeats. On the H200 machine the host runs Python in two states that
last seconds each: a fixed 20 000-addition loop took 0.60-0.72 ms, then 1.0-1.4 ms for a few
seconds, then fast again (steal 0, the whole VM busy only with the timing process: the core
itself changes speed). Three recordings of an eager decode step and a 64-launch loop timed
alternately for 20-40 s (2026-12-04) were cut into every window of a given length: the
fastest 15 of 45 consecutive repeats (~2 s) spread up to ±57 %, the fastest 7 of any 3-4 s
up to ±50 %, 6 s up to ±30 %, 8 s or more at most ±4.6 %. A window must span the slow
phases; interleaving lets every timing of a benchmark share one window instead of paying
for one each.
"""

from __future__ import annotations

import gc
import time

import torch

from snippets.common.bench import _traced
from snippets.common.results import FASTEST_SHARE, Stat

WINDOW_S = 15.0  # 8 s held every recording within ±4.6 %, but in gpu_docs runs on slow hosts
# 10 s did not: cuda-graph's eager decode spread ±7.8 % (11a4529) and ±11.1 % (733fb02), its
# fastest 7 of 83 repeats 5.57-6.52 ms with the slowest at 12.2: the fast phases were short
KEEP = 7  # the fastest 7 repeats of each timing: the statistic and its range (Stat.of)


@_traced
def fastest_interleaved(steps: dict[str, tuple], *, seconds: float = WINDOW_S, keep: int = KEEP,
                        warmup: int = 3) -> dict[str, Stat]:  # fmt: skip
    """Time every step of `steps` ({name: (fn, calls)} or (fn, calls, repeats a round)) round
    by round until `seconds` have passed and each has FASTEST_SHARE * keep repeats or more. A
    repeat: `calls` calls of fn, each followed by a synchronize and timed alone; its value, the
    median call (ms). A short step next to long ones takes several repeats a round, so that its
    repeats sample the window as densely as the host's phases need. Returns {name: Stat of its
    fastest `keep` repeats}."""
    if not steps:
        raise ValueError("fastest_interleaved: no steps to time")
    steps = {name: (*step, 1)[:3] for name, step in steps.items()}
    for fn, _, _ in steps.values():
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in steps}
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()  # a collection inside a repeat is noise
    t0 = time.perf_counter()
    try:
        rounds = 0
        while rounds < FASTEST_SHARE * keep or time.perf_counter() - t0 < seconds:
            for name, (fn, calls, per_round) in steps.items():
                for _ in range(per_round):
                    samples[name].append(_repeat_ms(fn, calls))
            rounds += 1
    finally:
        if enabled:
            gc.enable()
    return {name: Stat.of(xs, "python-fastest", keep=keep) for name, xs in samples.items()}


def _repeat_ms(fn, calls: int) -> float:
    """The median of `calls` calls of fn, each followed by a synchronize and timed alone."""
    times = []
    for _ in range(calls):
        t1 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t1)
    times.sort()
    mid = len(times) // 2
    return (times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2) * 1e3
