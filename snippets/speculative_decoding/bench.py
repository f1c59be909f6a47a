"""The measurements, end to end, as one function of the models, the sizes and a timer:
bench_gpu.py calls it on the H200 with the shared trained models and graph_ms and writes what
it returns to results/; tests/snippets/test_speculative_decoding.py calls it on the CPU with
the stand-in models, tiny sizes and a stand-in timer, and checks every record it would write.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from snippets.speculative_decoding import engine as E
from snippets.speculative_decoding.eagle import (
    TAPS,
    HeadRunner,
    HeadTraining,
    agreement,
    train_heads,
)
from snippets.speculative_decoding.measure import (
    acceptance,
    greedy_match,
    prompts,
    propose_time,
    round_time,
    run,
    speedup_row,
    verify_time,
)
from snippets.speculative_decoding.runner import Runner


# --8<-- [start:sizes]
@dataclass(frozen=True)
class Sizes:
    prompt: int = 128  # tokens of held-out text before generation starts
    stats_batch: int = 64  # rows of the runs that count acceptance
    stats_rounds: int = 48
    gammas: tuple[int, ...] = (1, 3, 5)  # the page reads 3 (speedups) and 5 (positions)
    sampled_gamma: int = 3  # temperature 1 is measured at this gamma
    batches: tuple[int, ...] = (1, 16, 64, 256)  # the batch sweep, at batch_gamma
    sampled_batches: tuple[int, ...] = (1, 256)  # temperature 1 at the sweep's two ends
    batch_gamma: int = 3
    compare: int = 48  # greedy tokens compared with target-only decoding
    agreement_rows: int = 32  # held-out rows of training.seq_len for the heads' agreement
    agreement_batch: int = 8
    training: HeadTraining = field(default_factory=HeadTraining)
    dtype: torch.dtype = torch.bfloat16  # as served


# --8<-- [end:sizes]


# --8<-- [start:measure]
def measure(target_model, draft_model, train_stream, heldout, sizes: Sizes, timer,
            copy_bytes_per_s) -> dict:  # fmt: skip
    """Every record of the page: {name: values}. target_model, draft_model: the shared
    models (trained(...).model); the streams: the corpus's training and held-out tokens;
    copy_bytes_per_s: the copy bandwidth measured in the same run (the step's bound)."""
    dev = next(target_model.parameters()).device
    g_max = max(sizes.gammas)
    long_len = sizes.prompt + sizes.stats_rounds * (g_max + 1) + 2 * (g_max + 1)
    target = Runner(target_model, sizes.dtype, max(long_len, sizes.training.seq_len), TAPS)
    draft = Runner(draft_model, sizes.dtype, target.max_len)
    heads = train_heads(target, train_stream, sizes.training)
    runners = {h["ttt_steps"]: HeadRunner(h["head"], target) for h in heads}
    ttt = max(runners)
    kinds = {"draft": E.draft_model(draft), "eagle3": E.eagle(runners[ttt]), "ngram": E.ngram()}
    many = prompts(heldout, sizes.stats_batch, sizes.prompt).to(dev)
    short_len = sizes.prompt + 2 * (g_max + 2)  # timing engines never commit: a tight cache

    def engine(kind, batch, gamma, greedy, max_len, head=None):
        k = None if kind is None else (E.eagle(head) if head else kinds[kind])
        e = E.Engine(target, k, batch, gamma, greedy=greedy, max_len=max_len)
        e.prefill(many[:batch] if batch <= len(many) else many[torch.arange(batch) % len(many)])
        return e

    # target-only decoding: the step time, the pass over n tokens, and greedy text to compare
    # (one greedy engine serves both: timing replays commit nothing)
    e1 = engine(None, 1, 0, True, short_len)
    step = {"greedy": round_time(e1, timer),
            "sampled": round_time(engine(None, 1, 0, False, short_len), timer)}  # fmt: skip
    # a plain step (n = 1) and the pass that verifies each measured gamma (n = gamma + 1)
    verify = [{"n": n, "ms": verify_time(e1, n, timer)}
              for n in sorted({1, *(g + 1 for g in sizes.gammas)})]  # fmt: skip
    for row in verify:
        row["of_step"] = row["ms"] / verify[0]["ms"]
    weights = sum(t.numel() * t.element_size() for t in target.weights())
    bound_ms = weights / copy_bytes_per_s * 1e3  # every weight read once
    plain = engine(None, sizes.stats_batch, 0, True, long_len)
    run(plain, sizes.compare)

    runs, positions, rows, match = [], [], [], []
    rounds_1 = {}  # batch-1 round times: (drafter, mode, gamma) -> Stat, reused by the sweep

    def record(name, mode, stats):
        runs.append({"drafter": name, "mode": mode} | _acceptance_fields(stats))
        for i, rate in enumerate(stats["per_position"]):
            if rate is None:  # no round reached this draft
                continue
            positions.append({"drafter": name, "mode": mode, "gamma": stats["gamma"],
                              "position": i + 1, "rate": rate})  # fmt: skip

    for name in kinds:
        for gamma in sizes.gammas:
            modes = ("greedy", "sampled") if gamma == sizes.sampled_gamma else ("greedy",)
            for mode in modes:
                greedy = mode == "greedy"
                stats_engine = engine(name, sizes.stats_batch, gamma, greedy, long_len)
                stats = acceptance(stats_engine, sizes.stats_rounds)
                if greedy and gamma == sizes.sampled_gamma:
                    same = greedy_match(stats_engine, plain, sizes.compare)
                    match.append({"drafter": name, "gamma": gamma, "fraction": same})
                timing = engine(name, 1, gamma, greedy, short_len)
                t_round, t_propose = round_time(timing, timer), propose_time(timing, timer)
                rounds_1[name, mode, gamma] = t_round
                row = speedup_row(stats, t_round, step[mode], t_propose)
                record(name, mode, stats)
                rows.append({"drafter": name, "mode": mode} | row)
    for gamma in sizes.gammas:  # the head trained without training-time test: acceptance only
        for steps, head in runners.items():
            if steps != ttt:
                e = engine("eagle3", sizes.stats_batch, gamma, True, long_len, head)
                stats = acceptance(e, sizes.stats_rounds)
                record(f"eagle3-ttt{steps}", "greedy", stats)

    # the batch sweep at batch_gamma, greedy and (batch_gamma == sampled_gamma) sampled at
    # sampled_batches; the tokens per round come from the acceptance runs above (they do not
    # depend on the batch). Batch 1 was timed above with the same engines: its step, its pass
    # over batch_gamma + 1 tokens and its rounds are those timings, not new ones.
    per_round = {(r["drafter"], r["mode"]): r["tokens_per_round"] for r in runs
                 if r["gamma"] == sizes.batch_gamma}  # fmt: skip
    batch_rows, g = [], sizes.batch_gamma
    for b in sizes.batches:
        sampled = g == sizes.sampled_gamma and b in sizes.sampled_batches
        modes = ("greedy", "sampled") if sampled else ("greedy",)
        if b == 1 and g in sizes.gammas:  # timed above, by engines of the same settings
            t_verify = next(row["ms"] for row in verify if row["n"] == g + 1)
            t_step = step
            t_round = {(name, mode): rounds_1[name, mode, g] for name in kinds for mode in modes}
        else:
            plain_b = engine(None, b, 0, True, short_len)  # greedy: its step and the pass
            t_verify = verify_time(plain_b, g + 1, timer)
            t_step = {mode: round_time(plain_b if mode == "greedy" else
                                       engine(None, b, 0, False, short_len), timer)
                      for mode in modes}  # fmt: skip
            t_round = {(name, mode): round_time(engine(name, b, g, mode == "greedy", short_len),
                                                timer)
                       for mode in modes for name in kinds}  # fmt: skip
        for mode in modes:
            for name in kinds:
                batch_rows.append({
                    "drafter": name, "mode": mode, "batch": b, "step_ms": t_step[mode],
                    "round_ms": t_round[name, mode], "verify_of_step": t_verify / t_step[mode],
                    "speedup": per_round[name, mode] * t_step[mode] / t_round[name, mode],
                })  # fmt: skip

    held = heldout[: sizes.agreement_rows * sizes.training.seq_len]
    losses = [{"ttt_steps": h["ttt_steps"], "loss_first": h["loss"][0], "loss_last": h["loss"][-1]}
              for h in heads]  # fmt: skip
    agree = []
    for h in heads:
        rates = agreement(h["head"], target, held, ttt, sizes.training.seq_len,
                          sizes.agreement_batch)  # fmt: skip
        steps = h["ttt_steps"]
        agree += [{"ttt_steps": steps, "step": s + 1, "rate": r} for s, r in enumerate(rates)]
    return {
        "verify": {
            "rows": verify,
            "step_ms": step,
            "weight_gb": weights / 1e9,
            "bound_ms": bound_ms,
            "step_of_bound": step["greedy"] / bound_ms,
        },
        "acceptance": {"runs": runs, "positions": positions},
        "speedup": {"rows": rows, "match": match},
        "batch": {"rows": batch_rows},
        "eagle": {"heads": losses, "agreement": agree, "steps": sizes.training.steps},
    }


def _acceptance_fields(stats: dict) -> dict:
    keep = ("gamma", "alpha", "tokens_per_round", "predicted_tokens", "expected_alpha", "bound")
    return {k: stats[k] for k in keep if k in stats}


# --8<-- [end:measure]
