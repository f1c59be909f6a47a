"""Measured on the GPU machine's CPUs by `nox -s gpu_docs`: DataLoader throughput against the
model, batch collation, three ways to read a corpus, threads against processes under the GIL.

Clock "python-fastest" for every timing: 21 repeats after a warm-up, and the Stat of the
fastest 7 (snippets/common/results.py FASTEST_SHARE); the timings of one section (collation,
the readers, threads and processes) take their repeats in turn, round by round. The host CPU
of the H200 machine changes speed by up to 2x within seconds and between runs
(docs/posts/cuda-graph.md, section 6.1): with all repeats kept, rates spread up to ±52 %
(n = 7); the slow repeats measure the host's other load, not the code (timeit's argument for
min()). A repeat lasts about 0.1 s (long enough that one late wake-up or batch hand-over moves
it by a few per cent at most, short enough that 21 of them fit the budget). Everything
recorded is a time per unit (smaller is faster, as
Stat.of's fastest third assumes); rates and ratios are derived from it.

Wall time on the H200 machine's 16 cores, estimated from the rates of this post's first
gpu_docs run (rejected for its spread): a batch took ~22 ms per worker with sleeps, ~18.5 ms
(W=0) to ~32 ms (W=8) with Python work; batched collation 0.08 ms a batch; memmap 2 us, jsonl
73 us, shards 4 us a document. Where that run gave none, from this 2-core machine scaled by
the same ratio (per-sample collation ~10 ms a batch; a fork ~25 ms; spin ~40 ns an iteration):
  grid     sleep: 5 x (1 + 21) x 6 rounds x 22 ms = 14.5 s; python: 22 x 6 x (18.5 + 32) ms
           = 6.7 s; 15 + 8 worker start-ups x ~0.05 s = 1.2 s                        ~ 22.4 s
  collate  22 x (10 x 10 ms + 1000 x 0.08 ms)                                         ~  4.0 s
  io       corpus written ~1 s; 22 x (10 x 4000 x 2 + 1000 x 73 + 5 x 4000 x 4) us    ~  6.1 s
  gil      threads 22 x 4 x 40 ms = 3.5 s; processes 22 x (4 x 25 + 40) ms = 3.1 s  ~  6.6 s
  imports (torch, numpy)                                                              ~  3 s
  total                                                                               ~ 42 s
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from snippets.common.results import FASTEST_SHARE, Stat, write_result
from snippets.cpu_sop.corpus_io import (
    JsonlSamples,
    MemmapSamples,
    make_docs,
    shard_stream,
    write_corpus,  # fmt: skip
)
from snippets.cpu_sop.gil import concurrency
from snippets.cpu_sop.loader import Tokens, diagnose, model_rate, watch

REPEATS = 7 * FASTEST_SHARE  # 21 repeats; the fastest 7 make the Stat
COLLATE_STEPS = (10, 1000)  # batches a repeat: per-sample ~10 ms each, batched ~0.08 ms
IO_PASSES = (10, 1, 5)  # memmap ~2 us a document, jsonl ~70 us (1000 documents), shards ~4 us
GIL_N = 1_000_000  # ~40 ms of Python per copy


def fastest(fns: dict, repeats: int = REPEATS) -> dict[str, Stat]:
    """Each fn() runs one repeat and returns its time per unit; one warm-up call each, then
    `repeats` rounds, each timing every fn once in turn, so that a slow phase of the host
    reaches all of them alike (timed one after the other, 16 of one reader's 21 repeats fell
    into one slow stretch: its fastest 7 spread ±52 %); the Stat of each one's fastest third
    (clock "python-fastest")."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            times[name].append(fn())
    return {name: Stat.of(xs, "python-fastest") for name, xs in times.items()}


# --8<-- [start:grid]
CORES = len(os.sched_getaffinity(0))
BATCH, COST = 16, 0.001  # 16 samples of 1 ms each: 16 ms to make one batch
ROUNDS = 6  # a repeat: 6 batches from each worker (~0.13 s)
GRID = {"sleep": (0, 1, 2, 4, 8), "python": (0, 8)}  # the claims use sleep at 0, 1 and 4
grid = []
for work, counts in GRID.items():
    for workers in counts:
        loader = DataLoader(Tokens(100_000, 256, work, COST), batch_size=BATCH,
                            num_workers=workers,
                            prefetch_factor=4 if workers else None)  # fmt: skip
        it = iter(loader)  # one iterator: the workers run on from one repeat to the next
        # Worker i makes batches i, i + W, i + 2W, ...: a repeat of whole rounds ends with a
        # batch of the worker it began after, so it spans ROUNDS of its batches whatever the
        # workers' phases (12 batches of 8 workers that started together took one round).
        steps = ROUNDS * max(workers, 1)
        watch(it, steps, warmup=max(workers, 1))  # start-up (the first round) and a warm-up
        reports = sorted((watch(it, steps, warmup=0) for _ in range(REPEATS)),
                         key=lambda r: r.wall_s)  # fmt: skip
        batch_ms = Stat.of([1e3 * r.wall_s / steps for r in reports], "python-fastest")
        kept = reports[: REPEATS // FASTEST_SHARE]  # the repeats batch_ms is made of
        t_sample = sum(r.item_wall_s for r in kept) / (len(kept) * steps * BATCH)
        cores = CORES if work == "python" else float("inf")  # a sleep takes no core
        grid.append({"work": work, "workers": workers, "batch_ms": batch_ms,
                     "rate": 1e3 / batch_ms,
                     "model": model_rate(workers, BATCH, t_sample, 0.0, cores),
                     "t_sample_ms": t_sample * 1e3,
                     "verdict": diagnose(kept[0]).split(":")[0]})  # fmt: skip
        del it, loader
# --8<-- [end:grid]


# --8<-- [start:collate]
class Batched(Tokens):
    """The same samples, fetched a batch at a time: DataLoader calls __getitems__ when the
    dataset has it, and one tensor op replaces BATCH small tensors and their collation."""

    def __getitems__(self, idx):
        tokens = torch.as_tensor(idx)[:, None].remainder(50_000).expand(-1, self.seq).clone()
        zeros = torch.zeros(len(idx))
        return {"tokens": tokens, "wall_s": zeros, "cpu_s": zeros}


def identity(batch):
    return batch


batches = {}  # ms per batch of 256 samples, made in the main process
for name, ds, kw, steps in (("per-sample", Tokens(10**7, 256), {}, COLLATE_STEPS[0]),
                            ("batched", Batched(10**7, 256), {"collate_fn": identity},
                             COLLATE_STEPS[1])):  # fmt: skip
    it = iter(DataLoader(ds, batch_size=256, **kw))
    batches[name] = lambda it=it, n=steps: 1e3 * watch(it, n, warmup=0).wall_s / n
collate = fastest(batches)
# --8<-- [end:collate]


# --8<-- [start:io]
folder = Path(tempfile.mkdtemp(prefix="handbook-corpus-"))
write_corpus(folder, make_docs(4000, seed=1))
order = np.random.default_rng(0).permutation(4000)


def us_per_doc(read, passes: int) -> float:
    t0 = time.perf_counter()
    n = sum(read() for _ in range(passes))
    return (time.perf_counter() - t0) * 1e6 / n


mm, js = MemmapSamples(folder), JsonlSamples(folder)
readers = {  # the same documents every repeat; passes make a repeat last ~0.08 s
    "memmap": (lambda: sum(len(mm[i]) > 0 for i in order), IO_PASSES[0]),
    "jsonl": (lambda: sum(len(js[i]) > 0 for i in order[:1000]), IO_PASSES[1]),
    "shards": (lambda: sum(len(d) > 0 for d in shard_stream(folder)), IO_PASSES[2]),
}
io_us = fastest({name: lambda f=read, p=passes: us_per_doc(f, p)
                 for name, (read, passes) in readers.items()})  # fmt: skip
io_rows = [{"reader": name, "us_per_doc": us, "rate": 1e6 / us} for name, us in io_us.items()]
# --8<-- [end:io]

# --8<-- [start:gil]
# wall seconds per CPU second of 4 copies of spin (1 / concurrency): the smaller, the more parallel
wall_per_cpu = fastest({k: lambda k=k: 1 / concurrency(k, 4, n=GIL_N)
                        for k in ("threads", "processes")})  # fmt: skip
# --8<-- [end:gil]

write_result("cpu-sop", "cpu-loader", {
    "cores": CORES,
    "repeats": REPEATS,
    "grid": grid,
    "collate_per_sample_ms": collate["per-sample"],
    "collate_batched_ms": collate["batched"],
    "collate_speedup": collate["per-sample"] / collate["batched"],
    "io": io_rows,
    "memmap_over_jsonl": io_rows[1]["us_per_doc"] / io_rows[0]["us_per_doc"],
    "gil_threads_wall_per_cpu": wall_per_cpu["threads"],
    "gil_processes_wall_per_cpu": wall_per_cpu["processes"],
    "gil_threads": 1 / wall_per_cpu["threads"],
    "gil_processes": 1 / wall_per_cpu["processes"],
    "torch": torch.__version__,
})  # fmt: skip
