"""Compile ahead, in worker processes: a post's benchmark (or first GPU fence) starts them on
units of work -- each a call that compiles what the process will run, at its shapes -- and waits
for them before it times anything. The workers inherit the run's Triton and Inductor disk
caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR), so the first calls of this process load each
kernel from the cache instead of compiling them one after another. Workers only compile: they
time nothing, and Inductor keeps none of their autotuning (the post's run_unit turns it off).

A post keeps its units (picklable, the longest first) and the function that runs one,
`run_unit(unit, context)` in a module the workers import (`runner`, e.g.
"snippets.triton_kernels.warm"); everything else is here: the processes, an exclusive claim file
per unit, a failure file per unit that raised, the wait with its timeout, a warning for each
unit that failed or never ran (the process then compiles it itself) and the harness's trace line.

    python -m snippets.common.warm CLAIMS_DIR   # a worker: (runner, context, units) on stdin
"""

from __future__ import annotations

import gc
import importlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from snippets.common.bench import _trace
from snippets.common.results import ROOT

MAX_WORKERS = 8  # each compiles on one core; the H200 machine has 16
WAIT_S = 120.0  # a worker still running then is stopped; the process compiles the rest itself


@dataclass
class Workers:
    """Started workers: their processes, the folder of their claims and failures, their units."""

    procs: list
    claims: Path
    units: list
    runner: str
    started: float


def once(fns, *_, **__) -> list[float]:
    """A stand-in clock for a benchmark's own functions: calls each callable once (compiling what
    it runs) and times nothing."""
    for fn in fns:
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return [1.0] * len(fns)


def start(runner: str, units: list, context=None, workers: int | None = None) -> Workers:
    """Start the workers (`python -m snippets.common.warm`) and return at once; each runs
    runner's run_unit(unit, context) on the units no other worker has claimed, in order."""
    n = workers or max(1, min(MAX_WORKERS, len(units), (os.cpu_count() or 2) // 2))
    claims = Path(tempfile.mkdtemp(prefix="warm-"))
    payload = pickle.dumps((runner, context, units))
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # they run side by side
    procs = []
    for _ in range(n):  # their prints (the snippet files' checks) go nowhere
        proc = subprocess.Popen([sys.executable, "-m", __name__, str(claims)], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            with proc.stdin:
                proc.stdin.write(payload)
        except BrokenPipeError:  # it died at once: finish() reports its exit code
            pass
        procs.append(proc)
    return Workers(procs, claims, units, runner, time.perf_counter())


def work(runner: str, context, units: list, claims: Path) -> None:
    """A worker: every unit that no other worker has claimed yet (an exclusive file create),
    in order; a failure is written to failed-<i> and the worker goes on."""
    run_unit = importlib.import_module(runner).run_unit
    for i, unit in enumerate(units):
        try:
            os.close(os.open(claims / f"claimed-{i}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        t0 = time.perf_counter()
        try:
            run_unit(unit, context)
        except Exception as exc:  # reported by finish(); the process compiles it itself
            (claims / f"failed-{i}").write_text(f"{unit}: {type(exc).__name__}: {exc}")
        (claims / f"took-{i}").write_text(f"{time.perf_counter() - t0:.3f}")  # for the trace
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def finish(w: Workers) -> dict:
    """Wait for the workers (stopping any still running WAIT_S after the start); warn about
    each unit that failed or was never run. Returns {"units", "failed", "waited_s"}."""
    t0 = time.perf_counter()
    problems = []
    for proc in w.procs:
        try:
            proc.wait(timeout=max(0.0, w.started + WAIT_S - time.perf_counter()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            problems.append(f"a worker was still running {WAIT_S:.0f} s after the start")
        else:
            if proc.returncode:
                problems.append(f"a worker exited with code {proc.returncode}")
    failed = [f.read_text() for f in sorted(w.claims.glob("failed-*"))]
    took = {int(f.name.split("-")[1]): float(f.read_text()) for f in w.claims.glob("took-*")}
    unrun = [f"{u}: never run" for i, u in enumerate(w.units)
             if not (w.claims / f"claimed-{i}").exists()]  # fmt: skip
    shutil.rmtree(w.claims, ignore_errors=True)
    for problem in problems + failed + unrun:
        warnings.warn(f"{w.runner}: {problem} (compiled here instead)", stacklevel=2)
    waited = time.perf_counter() - t0
    _trace(waited, f"(waiting for {len(w.procs)} compile workers)", w.runner)
    if took:  # the unit that bounds the wait when there are as many workers as units
        i = max(took, key=took.get)
        _trace(took[i], f"(its slowest unit: {str(w.units[i])[:70]})", w.runner)
    return {"units": len(w.units), "failed": len(failed) + len(unrun), "waited_s": waited}


if __name__ == "__main__":
    work(*pickle.loads(sys.stdin.buffer.read()), Path(sys.argv[1]))
