"""A token dataset with planted faults, and a diagnostic that names the fault from what the
training loop and the workers measured themselves.

Each sample carries the wall and CPU time its __getitem__ took (in the worker that made it), so
the main process learns, batch by batch, how long it waited for data and whether the workers
were computing (CPU-bound: more workers help only up to the cores; move the work out) or waiting
(IO-bound: more workers or a deeper prefetch hide it; read less or read sequentially).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, Dataset

# --8<-- [start:dataset]
SCHEDSTAT = "/proc/thread-self/schedstat"  # ns on a CPU, ns waiting for one, timeslices


def cpu_demand() -> float:
    """Seconds this thread ran (its CPU clock) or waited in the run queue for a core (Linux
    schedstat, updated each time the thread is scheduled in); where the kernel keeps no
    schedstat, CPU time alone, which undercounts a computing thread on a loaded machine."""
    try:
        with open(SCHEDSTAT) as f:
            queued = int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        queued = 0.0
    return time.thread_time() + queued


WORKS = ("none", "sleep", "python", "tokenize")  # the planted faults


class Tokens(Dataset):
    """`n` samples of `seq` tokens; `work` plants a fault in __getitem__:
    sleep     waits `cost_s` (a slow disk or network read: the worker is idle);
    python    spends about `cost_s` of CPU in a per-sample Python loop;
    tokenize  tokenizes a text in Python per sample (the classic slow __getitem__)."""

    def __init__(self, n: int, seq: int = 256, work: str = "none", cost_s: float = 0.0):
        if work not in WORKS:
            raise ValueError(f"Tokens(work={work!r}): one of {', '.join(WORKS)}")
        if n <= 0 or seq <= 0 or cost_s < 0:
            raise ValueError(f"Tokens(n={n}, seq={seq}, cost_s={cost_s}): n, seq > 0, cost_s >= 0")
        self.n, self.seq, self.work, self.cost_s = n, seq, work, cost_s
        self.text = "训推加速 token " * (seq // 2)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(f"Tokens: index {i} out of range 0..{self.n - 1}")
        wall0, cpu0 = time.perf_counter(), cpu_demand()
        if self.work == "sleep":
            time.sleep(self.cost_s)
        elif self.work == "python":
            end = time.thread_time() + self.cost_s
            while time.thread_time() < end:  # burn CPU in the interpreter
                sum(range(200))
        elif self.work == "tokenize":
            ids = [(ord(c) * 2654435761) % 50_000 for c in self.text]
            return self._sample(torch.tensor(ids[: self.seq]), wall0, cpu0)
        return self._sample(torch.full((self.seq,), i % 50_000), wall0, cpu0)

    def _sample(self, tokens, wall0, cpu0):
        return {"tokens": tokens, "wall_s": time.perf_counter() - wall0,
                "cpu_s": cpu_demand() - cpu0}  # fmt: skip


# --8<-- [end:dataset]


# --8<-- [start:watch]
@dataclass(frozen=True)
class Report:
    steps: int
    wall_s: float  # the whole loop
    wait_s: float  # inside next(loader): the step had no batch yet
    item_wall_s: float  # __getitem__ wall time, summed over the samples seen
    item_cpu_s: float  # __getitem__ time on a core or waiting for one, summed

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.wall_s

    @property
    def busy(self) -> float:
        """Share of __getitem__'s wall time spent computing or waiting for a core (not for IO):
        ~1 for a computing worker however loaded the machine is, ~0 for a waiting one."""
        return self.item_cpu_s / self.item_wall_s if self.item_wall_s > 0 else 0.0

    @property
    def batches_per_s(self) -> float:
        return self.steps / self.wall_s


def watch(loader: DataLoader, steps: int, step_s: float = 0.0, warmup: int = 2) -> Report:
    """Run a training loop whose step takes `step_s` (a sleep: the GPU working) and time, per
    step, how long next() waited. The first `warmup` batches (worker start-up) are not counted.
    `loader` may also be a running iterator of one: watch then continues where it stopped."""
    it = iter(loader)  # an iterator's iter() is itself
    for _ in range(warmup):
        next(it)
    wait = item_wall = item_cpu = 0.0
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        batch = next(it)
        wait += time.perf_counter() - t
        item_wall += float(batch["wall_s"].sum())
        item_cpu += float(batch["cpu_s"].sum())
        if step_s:
            time.sleep(step_s)
    return Report(steps, time.perf_counter() - t0, wait, item_wall, item_cpu)


# --8<-- [end:watch]


# --8<-- [start:diagnose]
DATA_BOUND = 0.10  # the loop waits for data more than 10 % of its time
BUSY = 0.5  # workers spend more than half of __getitem__ computing (or queued for a core)


def diagnose(r: Report) -> str:
    if r.wait_share < DATA_BOUND:
        return "ok: the step, not the data, sets the pace"
    if r.busy >= BUSY:
        return (
            "cpu-bound loader: __getitem__ computes (vectorize, precompute, or more workers "
            "up to the cores)"
        )
    return (
        "io-bound loader: __getitem__ waits (more workers or prefetch; read less, read "
        "sequentially)"
    )


# --8<-- [end:diagnose]


# --8<-- [start:model]
def model_rate(workers: int, batch: int, t_sample: float, t_step: float, cores: float = math.inf
               ) -> float:  # fmt: skip
    """Batches per second of a loop fed by `workers` processes, each making one batch of
    `batch` samples at `t_sample` each, when a step takes t_step. Without workers the main
    process makes each batch itself, in series with the step. With workers, a batch is ready
    every batch * t_sample / workers (CPU-bound work: at most `cores` workers run at once) and
    the loop takes the slower of that and the step."""
    make = batch * t_sample
    if workers == 0:
        return 1.0 / (make + t_step)
    return 1.0 / max(make / min(workers, cores), t_step)


# --8<-- [end:model]
