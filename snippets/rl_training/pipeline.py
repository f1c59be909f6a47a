"""Synchronous, one-step off-policy and fully asynchronous RL pipelines as a discrete-event
simulation driven by a long-tailed response-length distribution.

Model (a model, not a measurement): the generator has `slots` sequences in flight, each grows
by one token per decode step, so a response of L tokens occupies a slot for L time units (time
is counted in decode steps). A training step takes `train` time units for `batch` samples; a
weight sync takes `sync` units and pauses generation. Utilization = generation time of the
samples that were trained on / (slots x wall time).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field


# --8<-- [start:lengths]
@dataclass(frozen=True)
class Lengths:
    """Response lengths min(L, cap) with ln L ~ Normal(ln median, sigma)."""

    median: float
    sigma: float
    cap: float

    def draw(self, n: int, seed: int = 0) -> list[float]:
        rng = random.Random(seed)
        return [min(self.cap, rng.lognormvariate(math.log(self.median), self.sigma))
                for _ in range(n)]  # fmt: skip

    def cdf(self, x: float) -> float:
        """P(min(L, cap) <= x): the lognormal's CDF below the cap, 1 from the cap on."""
        return 1.0 if x >= self.cap else self._lognormal_cdf(x)

    def _lognormal_cdf(self, x: float) -> float:
        z = (math.log(x) - math.log(self.median)) / self.sigma if x > 0 else -math.inf
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    def mean(self) -> float:
        """E[min(L, cap)] in closed form: E[L; L < c] + c P(L >= c)."""
        mu, s, c = math.log(self.median), self.sigma, self.cap
        phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
        return (math.exp(mu + s * s / 2) * phi((math.log(c) - mu - s * s) / s)
                + c * (1 - phi((math.log(c) - mu) / s)))  # fmt: skip

    def mean_max(self, n: int, points: int = 4001) -> float:
        """E[max of n lengths] = integral over [0, cap] of 1 - F(x)^n (trapezoid on a log grid)."""
        lo, hi = math.log(self.median) - 12 * self.sigma, math.log(self.cap)
        us = [lo + (hi - lo) * i / (points - 1) for i in range(points)]
        ys = [(1 - self._lognormal_cdf(math.exp(u)) ** n) * math.exp(u) for u in us]
        step = (hi - lo) / (points - 1)
        return math.exp(lo) + step * (sum(ys) - (ys[0] + ys[-1]) / 2)

    def truncated(self) -> float:
        return 1 - self._lognormal_cdf(self.cap)


# --8<-- [end:lengths]


# --8<-- [start:run]
@dataclass
class Run:
    slots: int
    wall: float = 0.0
    busy: float = 0.0  # generation time of the samples trained on
    staleness: list[int] = field(default_factory=list)  # one entry per trained sample
    trained: list[int] = field(default_factory=list)  # fully_async: sample ids, as trained

    @property
    def utilization(self) -> float:
        return self.busy / (self.slots * self.wall)

    @property
    def throughput(self) -> float:  # samples trained per decode step
        return len(self.staleness) / self.wall


def batches(lengths: list[float], batch: int) -> list[list[float]]:
    if batch < 1 or len(lengths) < batch:
        raise ValueError(f"need at least one batch of {batch}, got {len(lengths)} lengths")
    return [lengths[i : i + batch] for i in range(0, len(lengths) - batch + 1, batch)]


def synchronous(lengths, batch: int, train: float, sync: float = 0.0) -> Run:
    """Colocated, on-policy (verl's hybrid engine): generate a batch on `batch` slots, wait for
    its longest response, train, sync weights, repeat."""
    run = Run(slots=batch)
    for b in batches(lengths, batch):
        run.wall += max(b) + train + sync
        run.busy += sum(b)
        run.staleness += [0] * batch
    return run


def one_step_off(lengths, batch: int, train: float, sync: float = 0.0) -> Run:
    """slime's train_async.py and verl's one_step_off_policy: batch k+1 is generated (with the
    weights from before step k) while step k trains; weights sync once both are done."""
    bs = batches(lengths, batch)
    run = Run(slots=batch, wall=max(bs[0]))  # batch 0 has nothing to overlap with
    for k, b in enumerate(bs):
        following = max(bs[k + 1]) if k + 1 < len(bs) else 0.0
        run.wall += max(train, following) + sync
        run.busy += sum(b)
        run.staleness += [min(k, 1)] * batch
    return run


# --8<-- [end:run]


# --8<-- [start:async]
ORDERS = ("oldest", "completion", "start")  # how the trainer picks its batch, see below


def fully_async(lengths, batch: int, slots: int, train: float, eta: int, sync: float = 0.0,
                order: str = "oldest") -> Run:  # fmt: skip
    """AReaL-style: a slot starts a new response as soon as it is free, as long as the samples
    started so far stay within (version + eta + 1) x batch (AReaL's StalenessManager). The
    trainer waits until `batch` samples have finished and takes, among the finished ones:
    "oldest", the `batch` that started first (AReaL's wait_results sorts the finished results
    by creation time); "completion", the first `batch` to finish (a FIFO queue, as verl's
    fully_async MessageQueue); or "start", exactly the next `batch` in start order, waiting for
    all of them. It trains, then syncs the new weights; the sync pauses the responses in
    flight (interruptible rollout)."""
    if eta < 0 or slots < 1 or order not in ORDERS:
        raise ValueError(f"need eta >= 0, slots >= 1 and order in {ORDERS}, got "
                         f"{eta}, {slots}, {order!r}")  # fmt: skip
    steps = len(batches(lengths, batch))
    run = Run(slots=slots)
    t, version, started, step = 0.0, 0, 0, 0  # version: syncs done; step: batches taken
    running: list[tuple[float, int]] = []  # heap of (finish time, sample id)
    head: dict[int, int] = {}  # sample id -> version of its first token
    done: list[int] = []  # finished, not yet trained on, in completion order
    train_end = sync_end = math.inf  # the trainer's next events (inf: none pending)

    def admit():
        nonlocal started
        while (sync_end == math.inf and len(running) < slots and started < steps * batch
               and started < (version + eta + 1) * batch):  # fmt: skip
            heapq.heappush(running, (t + lengths[started], started))
            head[started] = version
            started += 1

    def take() -> list[int] | None:
        if order != "start" and len(done) < batch:
            return None
        if order == "oldest":  # ids are handed out in start order
            return sorted(done)[:batch]
        if order == "completion":
            return done[:batch]
        want = list(range(step * batch, (step + 1) * batch))
        return want if set(want) <= set(done) else None

    admit()
    while version < steps:
        if train_end == sync_end == math.inf and step == version:  # trainer idle
            taken = take()
            if taken is not None:
                done = [i for i in done if i not in set(taken)]
                run.staleness += [step - head[i] for i in taken]
                run.trained += taken
                run.busy += sum(lengths[i] for i in taken)
                step, train_end = step + 1, t + train
                continue
        t = min(running[0][0] if running else math.inf, train_end, sync_end)
        if t == train_end:  # training done: pause generation and sync the weights
            train_end, sync_end = math.inf, t + sync
            running = [(f + sync, i) for f, i in running]
            heapq.heapify(running)
        elif t == sync_end:  # the generator now has the new version
            sync_end, version = math.inf, version + 1
            admit()
        else:
            done.append(heapq.heappop(running)[1])
            admit()
        assert started <= (version + eta + 1) * batch  # the admission rule holds throughout
    run.wall = t
    return run


# --8<-- [end:async]
