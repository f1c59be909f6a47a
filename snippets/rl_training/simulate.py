"""The three pipelines on one workload, checked against their closed-form bounds."""

import math
from collections import Counter

from snippets.common.results import computed_result
from snippets.rl_training.pipeline import Lengths, fully_async, one_step_off, synchronous

# --8<-- [start:workload]
BATCH, STEPS = 64, 300  # samples per training step, training steps simulated
WORKLOAD = Lengths(median=2048, sigma=1.0, cap=20480)  # cap: DAPO §4.1's generation limit
ROLLOUT_SHARE = 0.7  # verl's one-step-off recipe: rollout ~70% of a DAPO 32B step
lengths = WORKLOAD.draw(BATCH * STEPS, seed=0)
mean_len, mean_max = WORKLOAD.mean(), WORKLOAD.mean_max(BATCH)
TRAIN = mean_max * (1 - ROLLOUT_SHARE) / ROLLOUT_SHARE  # decode steps per training step
print(f"{WORKLOAD.truncated():.1%} truncated, E[L] = {mean_len:.0f}, E[max of 64] = {mean_max:.0f}")
#> 1.1% truncated, E[L] = 3269, E[max of 64] = 17901
# --8<-- [end:workload]


# --8<-- [start:bounds]
def ratio_and_error(num: list[float], den: list[float]) -> tuple[float, float]:
    """sum(num) / sum(den) and its standard error (delta method over the batches)."""
    n, r = len(num), sum(num) / sum(den)
    resid = [a - r * b for a, b in zip(num, den, strict=True)]
    var = sum(x * x for x in resid) / (n - 1)
    return r, math.sqrt(var / n) / (sum(den) / n)


def check(run, slots, train, trained_lengths):
    """Bounds that hold for any pipeline: generation rate and training rate."""
    generation_rate = slots / (sum(trained_lengths) / len(trained_lengths))
    assert run.throughput <= generation_rate * (1 + 1e-12)
    assert run.throughput <= BATCH / train * (1 + 1e-12)
    assert 0 < run.utilization <= 1 + 1e-12


runs = {"sync": synchronous(lengths, BATCH, TRAIN)}
sync = runs["sync"]
per_batch = [lengths[i : i + BATCH] for i in range(0, len(lengths), BATCH)]
simulated, error = ratio_and_error([sum(b) / BATCH for b in per_batch],
                                   [max(b) + TRAIN for b in per_batch])  # fmt: skip
closed_form = mean_len / (mean_max + TRAIN)  # synchronous utilization, closed form
assert math.isclose(sync.utilization, simulated, rel_tol=1e-12)
assert abs(simulated - closed_form) < 4 * error
runs["one-step"] = one_step_off(lengths, BATCH, TRAIN)
assert set(runs["one-step"].staleness) == {0, 1}
for eta in (0, 1, 2, 4, 8):  # AReaL's batching: the oldest of the finished samples first
    runs[f"async-{eta}"] = fully_async(lengths, BATCH, BATCH, TRAIN, eta)
runs["async-4-fifo"] = fully_async(lengths, BATCH, BATCH, TRAIN, 4, order="completion")
runs["async-4-start"] = fully_async(lengths, BATCH, BATCH, TRAIN, 4, order="start")
assert math.isclose(runs["async-0"].wall, sync.wall, rel_tol=1e-12)  # η = 0 is synchronous
assert max(runs["async-4-start"].staleness) <= 4
longest_span = WORKLOAD.cap / TRAIN  # training steps the longest response stays in flight
for run in runs.values():
    check(run, BATCH, TRAIN, lengths)
print(f"{simulated:.3f} ± {error:.3f} (simulated), {closed_form:.3f} (closed form)")
#> 0.128 ± 0.001 (simulated), 0.128 (closed form)
for name, run in runs.items():
    speedup, stale = run.throughput / sync.throughput, sum(run.staleness) / len(run.staleness)
    print(f"{name:14} {run.utilization:.3f} {speedup:.2f}x {stale:.2f} {max(run.staleness)}")
    #> sync           0.128 1.00x 0.00 0
    #> one-step       0.183 1.43x 1.00 1
    #> async-0        0.128 1.00x 0.00 0
    #> async-1        0.396 3.09x 1.00 3
    #> async-2        0.426 3.32x 1.99 3
    #> async-4        0.427 3.33x 3.96 4
    #> async-8        0.427 3.33x 7.84 8
    #> async-4-fifo   0.427 3.33x 3.96 7
    #> async-4-start  0.423 3.30x 3.97 4
# --8<-- [end:bounds]

# --8<-- [start:equal]
# The same GPUs split between generation (a share f of the slots) and training (the rest, so a
# step takes TRAIN / (1 - f)). Throughput <= min(f B / E[L], (1 - f) B / TRAIN), whose largest
# value over f is B / (E[L] + TRAIN), at f = E[L] / (E[L] + TRAIN).
share = mean_len / (mean_len + TRAIN)
slots = round(share * BATCH)
split = fully_async(lengths, BATCH, slots, TRAIN / (1 - slots / BATCH), eta=4)
ideal = BATCH / (mean_len + TRAIN)
check(split, slots, TRAIN / (1 - slots / BATCH), lengths)
assert split.throughput <= BATCH / (sum(lengths) / len(lengths) + TRAIN)  # any f, same draw
print(slots, f"{split.throughput / sync.throughput:.2f}", f"{ideal / sync.throughput:.2f}")
#> 19 2.30 2.34
# --8<-- [end:equal]

# --8<-- [start:sweep]
sweep = []  # the generation phase alone (no training time): how the tail sets the waiting
for sigma in (0.25, 0.5, 0.75, 1.0, 1.25, 1.5):
    w = Lengths(WORKLOAD.median, sigma, WORKLOAD.cap)
    drawn = w.draw(BATCH * STEPS, seed=1)
    for pipeline, run in (("sync", synchronous(drawn, BATCH, train=0.0)),
                          ("async-4", fully_async(drawn, BATCH, BATCH, 0.0, eta=4))):  # fmt: skip
        sweep.append({"sigma": sigma, "pipeline": pipeline, "utilization": run.utilization})
    sweep.append({"sigma": sigma, "pipeline": "sync-closed-form",
                  "utilization": w.mean() / w.mean_max(BATCH)})  # fmt: skip
# --8<-- [end:sweep]

hist = Counter(runs["async-4"].staleness)
computed_result(
    "rl-training",
    "pipelines",
    {
        "mean_len": mean_len,
        "mean_max": mean_max,
        "truncated": WORKLOAD.truncated(),
        "train": TRAIN,
        "sync_closed_form": closed_form,
        "sync_simulated": simulated,
        "sync_error": error,
        "longest_span": longest_span,
        "rows": [
            {
                "pipeline": name,
                "utilization": run.utilization,
                "speedup": run.throughput / sync.throughput,
                "staleness_mean": sum(run.staleness) / len(run.staleness),
                "staleness_max": max(run.staleness),
            }
            for name, run in runs.items()
        ],
        "staleness_eta4": [
            {"staleness": k, "share": hist[k] / len(runs["async-4"].staleness)}
            for k in sorted(hist)
        ],
        "split_slots": slots,
        "split_speedup": split.throughput / sync.throughput,
        "ideal_speedup": ideal / sync.throughput,
        "sweep": sweep,
    },
)
