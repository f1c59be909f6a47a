"""The GIL: pure-Python work in threads runs one thread at a time; in processes it runs in
parallel. Measured as concurrency = (CPU seconds the workers used) / (wall seconds), which does
not depend on how fast the machine is: ~1 for threads however many there are, ~k for k
processes when k cores are free."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time


# --8<-- [start:gil]
def spin(n: int) -> tuple[float, float, float]:
    """Pure-Python work; returns (CPU seconds of the thread that ran it, start, end)."""
    start, t0 = time.perf_counter(), time.thread_time()
    x = 0
    for i in range(n):
        x += i % 7
    return time.thread_time() - t0, start, time.perf_counter()


def _in_process(n, ready, out):
    ready.wait()  # all started: the spins begin together
    out.put(spin(n))


def concurrency(kind: str, workers: int, n: int = 3_000_000) -> float:
    """CPU seconds used by `workers` copies of spin(n), divided by the wall time from the first
    start to the last end. The copies wait at a barrier until all exist, so process start-up
    (a fork each, one after another) is not counted: it is not the GIL."""
    if kind not in ("threads", "processes") or workers < 1:
        raise ValueError(f"concurrency({kind!r}, {workers}): threads|processes, workers >= 1")
    cpu: list[tuple[float, float, float]] = []
    if kind == "threads":
        ready = threading.Barrier(workers)

        def in_thread():
            ready.wait()
            cpu.append(spin(n))

        ts = [threading.Thread(target=in_thread) for _ in range(workers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        ctx = mp.get_context("fork")
        ready, out = ctx.Barrier(workers), ctx.Queue()
        ps = [ctx.Process(target=_in_process, args=(n, ready, out)) for _ in range(workers)]
        for p in ps:
            p.start()
        cpu = [out.get(timeout=120) for _ in ps]
        for p in ps:
            p.join()
    wall = max(end for _, _, end in cpu) - min(start for _, start, _ in cpu)
    return sum(c for c, _, _ in cpu) / wall


# --8<-- [end:gil]
