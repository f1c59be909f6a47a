"""Compile what bench_gpu.py runs -- our kernels, Liger Kernel's and torch.compile's, at the
benchmark's shapes -- in several worker processes at once, into this run's Triton and Inductor
disk caches (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR: the workers inherit them). The
benchmark's first calls then load each kernel from the cache instead of compiling them one
after another, and it waits for the workers before its first call: nothing else uses the GPU
while it times.

A unit calls the same function of measure.py as the benchmark, with a clock that runs each
callable once and times nothing, so each kernel is specialised and compiled as the benchmark
will compile it. Inductor's autotuning stays with the benchmark: the workers keep no autotuning
result (they time the candidates while other workers use the GPU).

    python -m snippets.triton_kernels.warm CLAIMS_DIR   # a worker: (plan, units) on stdin
"""

import gc
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
from snippets.triton_kernels.measure import (
    OPS,
    Shapes,
    implementations,
    measure_loss,
    measure_ops,
    sweep_rmsnorm,
    sweep_rows_per_program,
)

MAX_WORKERS = 8  # each compiles on one core; the H200 machine has 16
WAIT_S = 120.0  # a worker still running then is stopped; the benchmark compiles the rest
WORKER = "snippets.triton_kernels.warm"  # python -m WORKER CLAIMS_DIR
ORDER = {"compile": 0, "liger": 1, "ours": 2}  # the longest compiles first; eager compiles none


@dataclass(frozen=True)
class Plan:
    """What bench_gpu.py measures: its shapes, implementations, sweeps and loss variants."""

    shapes: Shapes
    dtype: torch.dtype
    impls: tuple[str, ...]
    rows_choices: tuple[int, ...]
    hidden_sweep: tuple[int, ...]
    sweep_impls: tuple[str, ...]
    loss_variants: tuple
    device: str = "cuda"


def units(plan: Plan) -> list[tuple]:
    """(kind, implementation, argument) units of work, torch.compile's first (the longest)."""
    found = [("loss", name, None) for name in dict.fromkeys(n for n, _ in plan.loss_variants)]
    found += [("ops", name, op) for op in OPS for name in plan.impls]
    found.append(("rows", "ours", None))
    found += [("sweep", name, h) for h in plan.hidden_sweep for name in plan.sweep_impls]
    found = [u for u in found if u[1] in ORDER and u[1] in plan.impls]
    return sorted(found, key=lambda u: (ORDER[u[1]], u[0] != "loss"))


def once(fns):
    """A stand-in clock: calls each callable once (compiling what it runs), times nothing."""
    for fn in fns:
        fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return [1.0] * len(fns)


def run_unit(unit, plan: Plan, clock=once) -> None:
    """One unit, through the benchmark's own functions (measure.py)."""
    kind, name, arg = unit
    s, device, dtype = plan.shapes, plan.device, plan.dtype
    impls = implementations((name,), s.hidden, s.eps)  # the benchmark's, for this one
    if name not in impls:  # Liger Kernel not installed: the benchmark leaves it out too
        return
    if kind == "ops":
        measure_ops(s, device, dtype, clock, 1.0, impls, ops=(arg,))
    elif kind == "rows":
        sweep_rows_per_program(s, device, dtype, clock, 1.0, plan.rows_choices)
    elif kind == "sweep":
        sweep_rmsnorm((arg,), s.tokens, device, dtype, clock, 1.0, impls)
    elif kind == "loss":
        variants = [v for v in plan.loss_variants if v[0] == name]
        measure_loss(s, device, dtype, clock, 1.0, impls, lambda fn: 0, variants)
    else:
        raise ValueError(f"unknown unit {unit!r}")


def work(plan: Plan, todo: list[tuple], claims: Path) -> None:
    """A worker: every unit that no other worker has claimed yet (an exclusive file create),
    in order; a failure is written to failed-<i> and the worker goes on."""
    import torch._inductor.config as inductor

    inductor.compile_threads = 1  # the workers already run side by side
    inductor.autotune_local_cache = False  # the benchmark autotunes, on an idle GPU
    for i, unit in enumerate(todo):
        try:
            os.close(os.open(claims / f"claimed-{i}", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue
        try:
            run_unit(unit, plan)
        except Exception as exc:  # reported by finish(); the benchmark compiles it itself
            (claims / f"failed-{i}").write_text(f"{unit}: {type(exc).__name__}: {exc}")
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


@dataclass
class Workers:
    """Started workers: their processes, the folder of their claims and failures."""

    procs: list
    claims: Path
    todo: list
    started: float


def start(plan: Plan, workers: int | None = None) -> Workers:
    """Start the workers (`python -m snippets.triton_kernels.warm`) and return at once."""
    todo = units(plan)
    n = workers or max(1, min(MAX_WORKERS, len(todo), (os.cpu_count() or 2) // 2))
    claims = Path(tempfile.mkdtemp(prefix="triton-kernels-warm-"))
    payload = pickle.dumps((plan, todo))
    procs = []
    for _ in range(n):  # their prints (the kernel files' checks) go nowhere
        proc = subprocess.Popen([sys.executable, "-m", WORKER, str(claims)], cwd=ROOT,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)  # fmt: skip
        try:
            with proc.stdin:
                proc.stdin.write(payload)
        except BrokenPipeError:  # it died at once: finish() reports its exit code
            pass
        procs.append(proc)
    return Workers(procs, claims, todo, time.perf_counter())


def finish(w: Workers) -> dict:
    """Wait for the workers (stopping any still running WAIT_S after the start); warn about
    each unit that failed or was never run. Returns {"units", "failed", "waited_s"}."""
    t0 = time.perf_counter()
    if any(unit[1] == "compile" for unit in w.todo):
        import torch._inductor.compile_fx  # noqa: F401  (our first torch.compile imports it)
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
    unrun = [f"{u}: never run" for i, u in enumerate(w.todo)
             if not (w.claims / f"claimed-{i}").exists()]  # fmt: skip
    shutil.rmtree(w.claims, ignore_errors=True)
    for problem in problems + failed + unrun:
        warnings.warn(f"warm.py: {problem} (the benchmark compiles it itself)", stacklevel=2)
    waited = time.perf_counter() - t0
    _trace(waited, f"(waiting for {len(w.procs)} compile workers)", "warm.py")
    return {"units": len(w.todo), "failed": len(failed) + len(unrun), "waited_s": waited}


if __name__ == "__main__":
    plan, todo = pickle.loads(sys.stdin.buffer.read())
    work(plan, todo, Path(sys.argv[1]))
