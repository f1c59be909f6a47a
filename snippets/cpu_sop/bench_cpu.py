"""Measured on the GPU machine's CPUs by `nox -s gpu_docs`: DataLoader throughput against the
model, batch collation, three ways to read a corpus, threads against processes under the GIL.
Every timing is repeated (7 repeats after a warm-up) and kept with its spread."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from snippets.common.results import Stat, write_result
from snippets.cpu_sop.corpus_io import (
    JsonlSamples,
    MemmapSamples,
    make_docs,
    shard_stream,
    write_corpus,  # fmt: skip
)
from snippets.cpu_sop.gil import concurrency
from snippets.cpu_sop.loader import Tokens, diagnose, model_rate, watch

REPEATS = 7  # the loader grid: its repeats are long
SHORT = 15  # repeats of the short timings: more, so that n // 6 disturbed ones set no range


def repeated(fn, repeats: int = REPEATS) -> Stat:
    """fn() returns a rate; one warm-up call, then `repeats` timed ones (clock: from Python)."""
    fn()
    return Stat.of([fn() for _ in range(repeats)], "python")


# --8<-- [start:grid]
CORES = len(os.sched_getaffinity(0))
BATCH, COST, STEPS = 16, 0.001, 12  # 16 samples of 1 ms each: 16 ms to make one batch
grid = []
for work in ("sleep", "python"):
    for workers in (0, 1, 2, 4, 8):
        loader = DataLoader(Tokens(100_000, 256, work, COST), batch_size=BATCH,
                            num_workers=workers, persistent_workers=workers > 0,
                            prefetch_factor=4 if workers else None)  # fmt: skip
        reports = []

        def one(loader=loader, reports=reports):
            reports.append(watch(loader, STEPS))
            return reports[-1].batches_per_s

        rate = repeated(one)
        t_sample = sum(r.item_wall_s for r in reports) / (len(reports) * STEPS * BATCH)
        cores = CORES if work == "python" else float("inf")  # a sleep takes no core
        grid.append({"work": work, "workers": workers, "rate": rate,
                     "model": model_rate(workers, BATCH, t_sample, 0.0, cores),
                     "t_sample_ms": t_sample * 1e3,
                     "verdict": diagnose(reports[-1]).split(":")[0]})  # fmt: skip
        del loader
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


collate = {}
for name, ds, kw in (("per-sample", Tokens(100_000, 256), {}),
                     ("batched", Batched(100_000, 256), {"collate_fn": identity})):  # fmt: skip
    loader = DataLoader(ds, batch_size=256, **kw)
    collate[name] = repeated(lambda loader=loader: watch(loader, 20).batches_per_s, SHORT)
# --8<-- [end:collate]


# --8<-- [start:io]
folder = Path(tempfile.mkdtemp(prefix="handbook-corpus-"))
write_corpus(folder, make_docs(4000, seed=1))
order = np.random.default_rng(0).permutation(4000)


def per_second(read, passes: int) -> float:
    t0 = time.perf_counter()
    n = sum(read() for _ in range(passes))
    return n / (time.perf_counter() - t0)


mm, js = MemmapSamples(folder), JsonlSamples(folder)
readers = {  # each pass reads all 4000 documents; passes make a repeat last ~50 ms or more
    "memmap": (lambda: sum(len(mm[i]) > 0 for i in order), 5),
    "jsonl": (lambda: sum(len(js[i]) > 0 for i in order), 1),
    "shards": (lambda: sum(len(d) > 0 for d in shard_stream(folder)), 5),
}
io_rows = [{"reader": name, "rate": repeated(lambda f=f, p=p: per_second(f, p), SHORT)}
           for name, (f, p) in readers.items()]  # fmt: skip
# --8<-- [end:io]

# --8<-- [start:gil]
gil = {k: repeated(lambda k=k: concurrency(k, 4, n=1_000_000), SHORT)
       for k in ("threads", "processes")}  # fmt: skip
# --8<-- [end:gil]

write_result("cpu-sop", "cpu-loader", {
    "cores": CORES,
    "grid": grid,
    "collate_per_sample": collate["per-sample"],
    "collate_batched": collate["batched"],
    "collate_speedup": collate["batched"] / collate["per-sample"],
    "io": io_rows,
    "memmap_over_jsonl": io_rows[0]["rate"] / io_rows[1]["rate"],
    "gil_threads": gil["threads"],
    "gil_processes": gil["processes"],
    "torch": torch.__version__,
})  # fmt: skip
