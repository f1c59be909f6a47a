"""What bench_gpu.py measures, as functions of a timer: acceptance per drafted position, tokens
per round, the time of each part of a round, and the speedup over target-only decoding next to
Leviathan et al.'s prediction. On the CPU, tests/snippets/test_speculative_decoding.py runs them
on the stand-in models with a stand-in timer; on the H200 the timer is graph_ms.

Every round is one CUDA graph (Engine.round captured once), so a round's time is the time of
replaying it: `round_time` replays it with `advance = 0` (the same work, nothing committed).
The tokens a round yields come from a separate run that commits (`acceptance`), over many rows
and rounds: a round's time does not depend on what it accepts (every shape is fixed), so the
speedup is tokens per round x the target's step time / the round's time.
"""

from __future__ import annotations

import math

import torch

from snippets.common.results import Stat
from snippets.speculative_decoding.engine import Engine
from snippets.speculative_decoding.runner import Tree
from snippets.speculative_decoding.theory import expected_tokens, walltime_speedup


# --8<-- [start:prompts]
def prompts(stream: torch.Tensor, batch: int, length: int) -> torch.Tensor:
    """`batch` prompts of `length` tokens from a held-out token stream, evenly spaced."""
    stride = (stream.numel() - length) // batch
    if stride < 1:
        raise ValueError(f"a stream of {stream.numel()} tokens has no {batch} prompts of {length}")
    return torch.stack([stream[i * stride : i * stride + length] for i in range(batch)]).long()


# --8<-- [end:prompts]


# --8<-- [start:run]
def run(engine: Engine, rounds: int) -> None:
    """`rounds` rounds from the prompts, committing. On CUDA one round is captured as a graph
    (after an eager warm-up round, which the reset undoes) and replayed."""
    if not engine.room(rounds):
        raise ValueError(f"{rounds} rounds of up to {engine.gamma + 1} tokens overflow "
                         f"{engine.max_len} slots")  # fmt: skip
    if engine.seq.is_cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            engine.round()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            engine.round()
        engine.reset()
        for _ in range(rounds):
            graph.replay()
        torch.cuda.synchronize()
    else:
        engine.reset()
        for _ in range(rounds):
            engine.round()


def acceptance(engine: Engine, rounds: int, delta: float = 1e-6) -> dict:
    """Run `rounds` rounds and read the statistics: how many rounds accepted n drafts, per
    drafted position i the rate of acceptance among rounds that reached it (all earlier
    drafts accepted), the pooled rate alpha (accepted / judged: Leviathan's alpha under the
    i.i.d. assumption), the tokens a round yields, and eq. 1's prediction from alpha.
    Sampled runs also give the expected rate sum_x min(p, q) at each judged position; a
    correct sampler's measured rate lies within `bound` of it (Azuma-Hoeffding: the accept
    indicators minus their conditional means are bounded martingale differences, so
    P(|mean| >= eps) <= 2 exp(-n eps^2 / 2); eps at probability delta)."""
    run(engine, rounds)
    g = engine.gamma
    hist = engine.hist.tolist()
    rounds_total = sum(hist)
    judged = [sum(hist[i:]) for i in range(g)]  # rounds that reached draft i
    accepted = [sum(hist[i + 1 :]) for i in range(g)]
    alpha = sum(accepted) / max(1, sum(judged))
    out = {
        "gamma": g, "rounds": rounds_total, "hist": hist,
        "per_position": [a / j if j else None for a, j in zip(accepted, judged, strict=True)],
        "alpha": alpha, "tokens_per_round": 1 + sum(accepted) / rounds_total,
        "predicted_tokens": expected_tokens(alpha, g),
        "generated": engine.generated().tolist(),
    }  # fmt: skip
    if not engine.greedy and engine.overlap.any():
        expected = engine.overlap.tolist()
        out["expected_alpha"] = sum(expected) / max(1, sum(judged))
        out["bound"] = math.sqrt(2 * math.log(2 / delta) / max(1, sum(judged)))
    return out


# --8<-- [end:run]


# --8<-- [start:time]
def round_time(engine: Engine, timer) -> Stat:
    """One round's time, by `timer` (graph_ms on the GPU), replaying it without committing."""
    engine.reset()
    engine.advance.zero_()
    try:
        return timer(engine.round)
    finally:
        engine.advance.fill_(1)
        engine.reset()


def verify_time(engine: Engine, n: int, timer) -> Stat:
    """The target's pass over n tokens per row at the rows' current positions (logits
    included): the verification of n - 1 drafts, or (n = 1) a plain decode step."""
    tree = Tree.chain(n, engine.seq.device)
    tokens = engine.seq[:, :n].clone()
    pos = engine.length - 1

    def step():
        hidden, _ = engine.target.forward(engine.cache, tokens, pos, tree)
        return engine.target.logits(hidden)

    return timer(step)


def propose_time(engine: Engine, timer) -> Stat:
    """The drafter's work for one round: gamma drafts (and their distributions)."""
    return timer(engine.drafter.propose)


# --8<-- [end:time]


# --8<-- [start:speedup]
def speedup_row(stats: dict, t_round: Stat, t_step: Stat, t_propose: Stat) -> dict:
    """A drafter at one gamma against target-only decoding (t_step: a target-only round).
    measured: tokens per round / round time, over 1 / step time. c: the drafter's time per
    draft over the target's step (Leviathan's cost coefficient, here with everything a round
    of drafting launches); predicted: Theorem 3.8 with the measured alpha and that c, which
    takes verification to cost one step; predicted_verify: eq. 1's tokens over the measured
    round time, i.e. the theorem with the verification's real cost."""
    g = stats["gamma"]
    c = t_propose / (g * t_step)
    at = [walltime_speedup(stats["alpha"], g, x) for x in (c.median, c.hi, c.lo)]  # falls with c
    return {
        "gamma": g, "round_ms": t_round, "propose_ms": t_propose, "c": c,
        "speedup": stats["tokens_per_round"] * t_step / t_round,
        "predicted": Stat(*at, n=c.n, derived=True),
        "predicted_verify": stats["predicted_tokens"] * t_step / t_round,
    }  # fmt: skip


# --8<-- [end:speedup]


def greedy_match(spec: Engine, plain: Engine, tokens: int) -> float:
    """The fraction of rows whose first `tokens` generated tokens are the same under
    speculative and target-only greedy decoding (both engines run from the same prompts)."""
    start = int(spec.start[0])
    a, b = spec.seq[:, start : start + tokens], plain.seq[:, start : start + tokens]
    if int(spec.generated().min()) < tokens or int(plain.generated().min()) < tokens:
        raise ValueError(f"fewer than {tokens} tokens generated to compare")
    return (a == b).all(1).double().mean().item()
