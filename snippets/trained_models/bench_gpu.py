"""On the H200 (nox -s gpu_docs, the shared models' own budget line): train the three shared
models, every seed of data/trained_models.yaml, keep the first seed of each in the run's model
cache for the posts that load them, time the target's decode step; write
results/trained-models/{training,decode}.json, then fail if a model missed its held-out loss."""

import copy
import os
import subprocess
import sys
import time

import torch

from snippets.common.bench import ceilings, graph_ms
from snippets.common.hardware import gpu_for_device_name
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.results import ROOT, write_result
from snippets.common.train import TrainingError, check_loss, save, train_new
from snippets.trained_models.card import SHAPES, decode_row, decode_times, run_row, weight_bytes

# --8<-- [start:train]
gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()!r} has no entry in data/hardware.yaml")
peak = gpu.bf16_dense_tflops * 1e12  # datasheet dense BF16, data/hardware.yaml
copy_bytes_per_s = ceilings()["copy_bytes_per_s"]  # measured in this run
spec = load_trained_models()
# the decode step's compile needs only shapes: another process compiles it while we train,
# on half the cores and at a lower priority: in one run the first draft seed, trained while
# Inductor's pool took every core, had its step time spread +-31 % (the suspected cause)
threads = str(max(1, (os.cpu_count() or 2) // 2))
warm = subprocess.Popen([sys.executable, "-m", "snippets.trained_models.warm"], cwd=ROOT,
                        env={**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": threads})  # fmt: skip
os.setpriority(os.PRIO_PROCESS, warm.pid, 10)  # its compile workers inherit it
n_matmul = {row["model"]: row["n_matmul"] for row in SHAPES}
runs, stats = [], []
for name, entry in spec.models.items():
    first = entry.train["seed"]
    for seed in range(first, first + entry.seeds):
        started = time.perf_counter()
        run = train_new(name, seed=seed, spec=spec)
        if seed == first:
            save(run)  # the checkpoint that trained(name) loads in the later posts
        if name == "target" and seed == first:
            target = run.model
        run_s = time.perf_counter() - started
        runs.append(run_row(name, run.stats, n_matmul[name], peak, run_s))
        stats.append((name, run.stats))
        del run
# --8<-- [end:train]

# --8<-- [start:decode]
decode_model = copy.deepcopy(target).to(torch.bfloat16)  # as served: bf16 weights, no autocast
del target
warmed = warm.wait() == 0  # if it failed, the compile below does all the work
# the compiled step is compiled before either timing; a replay holds about 40 ms of steps;
# a short settle: the step reads memory, and clock changes hardly move it
times = decode_times(decode_model, lambda fn: graph_ms(fn, settle_ms=300.0))
decode = decode_row(times, weight_bytes(decode_model), copy_bytes_per_s) | {"warmed": warmed}
# --8<-- [end:decode]

# --8<-- [start:record]
write_result("trained-models", "training", {"runs": runs})
write_result("trained-models", "decode", decode)
misses = []
for name, run_stats in stats:  # recorded first, so that a miss can be read in the record
    try:
        check_loss(name, run_stats, spec)
    except TrainingError as exc:
        misses.append(str(exc))
if misses:
    raise TrainingError("\n".join(misses))
# --8<-- [end:record]
