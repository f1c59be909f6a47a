"""Timing CPU-bound steps on a host whose speed changes under the benchmark.

On the H200 machine a fixed pure-Python loop took 6.3 ms and 12.7 ms a few seconds apart, with
no steal and the timing thread on the CPU all the while (gpu-sop's `host` rows, run ff38baa):
the core itself ran at half speed at times. A step bound by Python and the CUDA driver slows
down with it, so repeats taken in a slow phase measure the host's other load, not the code.
`gated_ms` brackets every repeat with a short probe of the host's speed and keeps the repeats
during which the host ran at full speed (both probes within GATE of the fastest probe of the
timing). The result is the step's time on the host at its own full speed; clock "python-gated".
"""

from __future__ import annotations

import time

from snippets.common.results import Stat

PROBE_N = 40_000  # ~1.3 ms of pure Python at full speed
# Both probes within 3 % of the fastest: repeats taken at host speeds 3 % apart differ by at
# most 3 % from that cause, which leaves 2 % of the 5 % spread rule (results.MAX_SPREAD) to
# the step's own noise. A probe repeats to about 1 % on a steady host (the CPU machine: the
# median of 60 probes 1 % above the fastest).
GATE = 1.03
GATED: list[dict] = []  # one entry per gated timing of this process: how many repeats it kept


# --8<-- [start:gated]
def probe_ms(n: int = PROBE_N) -> float:
    """Wall time of a fixed pure-Python loop: how fast the host runs Python right now."""
    t0 = time.perf_counter()
    total = 0
    for i in range(n):
        total += i
    return (time.perf_counter() - t0) * 1e3


def gated_ms(fn, *, calls: int = 16, repeats: int = 5, settle_s: float = 1.0,
             warmup: int = 3, max_repeats: int = 60, name: str = "") -> Stat:  # fmt: skip
    """Time per step of `fn` (each call followed by a synchronize, as bench.step_ms; a
    repeat's value is the median of its `calls` steps), from the repeats taken while the host
    ran at full speed: runs repeats until `repeats` of them count, at most `max_repeats`.
    Raises where the host never held its full speed for `repeats` repeats."""
    import torch  # here: the site's build reads GATE without importing torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < settle_s:
        fn()
        sync()
    taken: list[tuple[float, float]] = []  # (slower probe, the repeat's median step in ms)
    good: list[float] = []
    fastest = float("inf")
    while len(taken) < max_repeats:
        before = probe_ms()
        steps = []
        for _ in range(calls):
            t1 = time.perf_counter()
            fn()
            sync()
            steps.append(time.perf_counter() - t1)
        after = probe_ms()
        steps.sort()
        mid = len(steps) // 2
        median = steps[mid] if len(steps) % 2 else (steps[mid - 1] + steps[mid]) / 2
        taken.append((max(before, after), median * 1e3))
        fastest = min(fastest, before, after)
        good = [v for p, v in taken if p <= GATE * fastest]
        if len(good) >= repeats:
            break
    slowest = max(p for p, _ in taken)
    GATED.append({"timing": name, "kept": len(good), "repeats": len(taken),
                  "probe_fastest_ms": fastest, "probe_slowest_ms": slowest})  # fmt: skip
    if len(good) < repeats:
        raise RuntimeError(
            f"gated_ms({name or fn!r}): the host ran at full speed (probe within {GATE - 1:.0%} "
            f"of its fastest, {fastest:.2f} ms) for {len(good)} of {len(taken)} repeats, "
            f"fewer than {repeats}; its probes ranged {fastest:.2f}-{slowest:.2f} ms"
        )
    return Stat.of(good, "python-gated")


# --8<-- [end:gated]
