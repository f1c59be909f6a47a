"""Compile what bench_gpu.py runs -- our kernels, Liger Kernel's and torch.compile's, at the
benchmark's shapes -- in several worker processes at once (snippets/common/warm.py starts them,
waits for them and reports what failed), into this run's Triton and Inductor disk caches. The
benchmark's first calls then load each kernel from the cache instead of compiling them one after
another, and it waits for the workers before its first call: nothing else uses the GPU while it
times.

A unit calls the same function of measure.py as the benchmark, with a clock that runs each
callable once and times nothing, so each kernel is specialised and compiled as the benchmark
will compile it. Inductor's autotuning stays with the benchmark: the workers keep no autotuning
result (they time the candidates while other workers use the GPU).
"""

from dataclasses import dataclass

import torch

from snippets.common import warm
from snippets.triton_kernels.measure import (
    FP8_GEMMS,
    OPS,
    Shapes,
    implementations,
    measure_fp8,
    measure_loss,
    measure_ops,
    sweep_rmsnorm,
    sweep_rows_per_program,
    swept,
)

# the longest compiles first; eager compiles none
ORDER = {"compile": 0, "liger": 1, "ours": 2, "one_pass": 3}
SWEEP_ONLY = ("one_pass",)  # implementations only the hidden-size sweep runs


@dataclass(frozen=True)
class Plan:
    """What bench_gpu.py measures: its shapes, implementations, sweeps and loss variants."""

    shapes: Shapes
    dtype: torch.dtype
    impls: tuple[str, ...]
    rows_choices: tuple[tuple[int, ...], ...]  # (rows per program, rows per step[, warps])
    hidden_sweep: tuple[int, ...]
    sweep_impls: tuple[str, ...]
    loss_variants: tuple
    fp8_configs: tuple[tuple[int, int, int], ...] = ()  # none: the FP8 section is not measured
    device: str = "cuda"


def units(plan: Plan) -> list[tuple]:
    """(kind, implementation, argument) units of work, torch.compile's first (the longest)."""
    found = [("loss", name, None) for name in dict.fromkeys(n for n, _ in plan.loss_variants)]
    found += [("ops", name, op) for op in OPS for name in plan.impls]
    found.append(("rows", "ours", None))
    found += [("sweep", name, h) for h in plan.hidden_sweep for name in plan.sweep_impls
              if swept(name, h)]  # fmt: skip
    if plan.fp8_configs:  # our quantize kernels; torch.compile's, one unit per shape
        found += [("fp8", "ours", None)] + [("fp8", "compile", g) for g in FP8_GEMMS]
    found = [u for u in found if u[1] in ORDER and (u[1] in plan.impls or u[1] in SWEEP_ONLY)]
    return sorted(found, key=lambda u: (ORDER[u[1]], u[0] != "loss"))


def run_unit(unit, plan: Plan, clock=warm.once) -> None:
    """One unit, through the benchmark's own functions (measure.py). Inductor keeps no
    autotuning result here: the benchmark autotunes, on an idle GPU."""
    import torch._inductor.config as inductor

    kind, name, arg = unit
    s, device, dtype = plan.shapes, plan.device, plan.dtype
    impls = implementations((name,), s.hidden, s.eps)  # the benchmark's, for this one
    if name not in impls:  # Liger Kernel not installed: the benchmark leaves it out too
        return
    with inductor.patch(autotune_local_cache=False):
        if kind == "ops":
            measure_ops(s, device, dtype, clock, 1.0, impls, ops=(arg,))
        elif kind == "rows":
            sweep_rows_per_program(s, device, dtype, clock, 1.0, plan.rows_choices)
        elif kind == "sweep":
            sweep_rmsnorm((arg,), s.tokens, device, dtype, clock, 1.0, impls)
        elif kind == "fp8" and name == "ours":
            measure_fp8(s, device, dtype, clock, clock, 1.0, plan.fp8_configs, quantizers=("ours",))
        elif kind == "fp8":
            measure_fp8(s, device, dtype, clock, clock, 1.0, (), (), (name,), shapes=(arg,))
        elif kind == "loss":
            variants = [v for v in plan.loss_variants if v[0] == name]
            measure_loss(s, device, dtype, clock, 1.0, impls, lambda fn: 0, variants)
        else:
            raise ValueError(f"unknown unit {unit!r}")


def start(plan: Plan, workers: int | None = None) -> warm.Workers:
    """Start the workers on every unit of the plan and return at once."""
    return warm.start(__name__, units(plan), plan, workers)


def finish(w: warm.Workers) -> dict:
    """Wait for the workers (warm.finish); meanwhile, import what our first torch.compile would."""
    if any(unit[1] == "compile" for unit in w.units):
        import torch._inductor.compile_fx  # noqa: F401
    return warm.finish(w)
