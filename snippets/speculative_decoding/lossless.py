"""Speculative sampling does not change the output distribution: checked two ways on toy
models small enough to enumerate. A toy model is a table: every prefix (up to a length) of a
3-token vocabulary gets its own next-token distribution, drawn at random; token 0 is the end of
text (EOS). Target p and draft q are two such tables.

1. Exact, in fp64: the probability that speculative decoding starts with a given sequence is
   computed by enumerating every draft and every accept/reject branch with the same rule
   (accept_probability, residual) that the sampler uses, and compared with the target's own
   product of conditionals, for every sequence.
2. Statistical, end to end: `verify` (the batched sampler the engine runs) generates N
   sequences; their empirical distribution must lie within a distance of the target's that a
   correct sampler exceeds with probability below 1e-6. Two wrong samplers are run through the
   same test and must fail it.
"""

from __future__ import annotations

import math
from functools import cache

import torch

from snippets.speculative_decoding.sampling import (
    Verdict,
    accept_probability,
    emitted,
    residual,
    sample,
    verify,
)

V, EOS = 3, 0  # vocabulary {0, 1, 2}; 0 ends a sequence


# --8<-- [start:toy]
class Toy:
    """A next-token table over every prefix of length < max_len: row code(prefix)."""

    def __init__(self, max_len: int, seed: int, sharpness: float = 1.0):
        gen = torch.Generator().manual_seed(seed)
        n = (V + 1) ** max_len
        logits = sharpness * torch.randn(n, V, generator=gen, dtype=torch.float64)
        self.table = logits.softmax(-1)
        self.max_len = max_len

    @staticmethod
    def code(prefix: tuple[int, ...]) -> int:
        """A distinct integer per prefix: digits 1..V in base V + 1."""
        return sum((x + 1) * (V + 1) ** i for i, x in enumerate(prefix))

    def __call__(self, prefix: tuple[int, ...]) -> torch.Tensor:
        return self.table[self.code(prefix)]


def target_probability(p: Toy, seq: tuple[int, ...]) -> float:
    """The target's own probability of starting with seq: prod_t p(seq_t | seq_<t)."""
    return math.prod(p(seq[:t])[x].item() for t, x in enumerate(seq))


def outcomes(k: int) -> list[tuple[int, ...]]:
    """Every way a generation can start, cut after k tokens or after its EOS: k tokens with no
    EOS before the last one, or fewer tokens ending in EOS."""
    if k == 0:
        return [()]
    shorter = [s for s in outcomes(k - 1) if not s or s[-1] != EOS]  # still running
    return [s for s in outcomes(k - 1) if s and s[-1] == EOS] + [
        (*s, x) for s in shorter for x in range(V)
    ]


# --8<-- [end:toy]


# --8<-- [start:exact]
def round_distribution(p: Toy, q: Toy, prefix: tuple, gamma: int) -> dict[tuple, float]:
    """Every output of one speculative round after `prefix` with its exact probability: for
    each draft d ~ q, the branch "first n accepted, then a rejection" (or all gamma accepted)
    and the token the target then samples; output stops after an EOS."""
    out: dict[tuple, float] = {}

    def add(tokens: tuple, prob: float) -> None:
        if EOS in tokens:
            tokens = tokens[: tokens.index(EOS) + 1]
        out[tokens] = out.get(tokens, 0.0) + prob

    def walk(drafts: tuple, prob: float) -> None:
        if len(drafts) < gamma:  # draw the next draft
            qd = q(prefix + drafts)
            for x in range(V):
                walk((*drafts, x), prob * qd[x].item())
            return
        keep = 1.0  # probability that the first n drafts were all accepted
        for n in range(gamma + 1):
            p_n = p(prefix + drafts[:n])
            if n == gamma:  # all accepted: one more token from the target
                dist, branch = p_n, keep
            else:
                q_n, x = q(prefix + drafts[:n]), drafts[n]
                a = accept_probability(p_n[x], q_n[x]).item()
                dist, branch = residual(p_n, q_n), keep * (1 - a)
                keep *= a
            for t in range(V):
                add((*drafts[:n], t), prob * branch * dist[t].item())

    walk((), 1.0)
    return out


@cache
def _spec(p, q, gamma, prefix, rest):
    total = 0.0
    for out, prob in round_distribution(p, q, prefix, gamma).items():
        m = min(len(out), len(rest))
        if out[:m] != rest[:m]:
            continue
        if len(out) >= len(rest):  # this round covers the rest
            total += prob
        elif out[-1] != EOS:  # (an EOS here would end the text before `rest` does)
            total += prob * _spec(p, q, gamma, prefix + out, rest[len(out) :])
    return total


def speculative_probability(p: Toy, q: Toy, gamma: int, seq: tuple[int, ...]) -> float:
    """The probability that speculative decoding starts with seq, round after round."""
    return _spec(p, q, gamma, (), seq)


# --8<-- [end:exact]


# --8<-- [start:batched]
def codes(rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Toy.code of each row's prefix rows[i, :lengths[i]]."""
    pos = torch.arange(rows.shape[1])
    digits = torch.where(pos < lengths[:, None], rows + 1, 0)
    return (digits * (V + 1) ** pos).sum(1)


def generate(p: Toy, q: Toy, gamma: int, k: int, n: int, seed: int, rule=verify):
    """n sequences of (up to) k tokens by speculative decoding, all rows at once: each round
    drafts gamma tokens per row, verifies them with `rule` (the engine's `verify`), and
    appends what it returns; a row stops at EOS or at k tokens. Returns [n, k] (-1 past the
    end) and the count of drafts accepted per round."""
    gen = torch.Generator().manual_seed(seed)
    buf = torch.zeros(n, k + gamma + 1, dtype=torch.long)
    length = torch.zeros(n, dtype=torch.long)
    accepted = []
    while True:
        ended = ((buf == EOS) & (torch.arange(buf.shape[1]) < length[:, None])).any(1)
        live = (length < k) & ~ended
        if not live.any():
            break
        rows, at = buf[live], length[live]
        drafts, qs, ps = [], [], []
        for i in range(gamma + 1):
            ctx = rows.clone()
            if drafts:
                ctx.scatter_(1, at[:, None] + torch.arange(len(drafts)), torch.stack(drafts, 1))
            ps.append(p.table[codes(ctx, at + i)])
            if i < gamma:
                qs.append(q.table[codes(ctx, at + i)])
                drafts.append(sample(qs[-1], gen))
        draft = torch.stack(drafts, 1) if drafts else torch.zeros(len(rows), 0, dtype=torch.long)
        q_all = torch.stack(qs, 1) if qs else None
        verdict = rule(draft, q_all, torch.stack(ps, 1), generator=gen)
        out = emitted(draft, verdict)
        accepted.append(verdict.accepted)
        rows.scatter_(1, at[:, None] + torch.arange(gamma + 1), out)
        buf[live] = rows
        length[live] = at + verdict.accepted + 1
    seqs = buf[:, :k].clone()
    end = torch.minimum(length, torch.full_like(length, k))
    eos_at = torch.where(seqs == EOS, torch.arange(k), k).min(1).values + 1  # stop after EOS
    seqs[torch.arange(k) >= torch.minimum(end, eos_at)[:, None]] = -1
    return seqs, torch.cat(accepted)


def l1_bound(outcomes: int, n: int, delta: float) -> float:
    """Bretagnolle-Huber-Carol: an empirical distribution of n draws over m outcomes is at
    L1 distance >= eps from the true one with probability <= 2^m exp(-n eps^2 / 2); the eps
    at which that probability is delta."""
    return math.sqrt(2 * (outcomes * math.log(2) + math.log(1 / delta)) / n)


def l1_distance(seqs: torch.Tensor, exact: dict[tuple, float]) -> float:
    counts: dict[tuple, int] = {}
    for row in seqs.tolist():
        key = tuple(x for x in row if x >= 0)
        counts[key] = counts.get(key, 0) + 1
    unknown = set(counts) - set(exact)
    if unknown:
        raise AssertionError(f"sequences no target can produce: {sorted(unknown)[:3]}")
    n = len(seqs)
    return sum(abs(counts.get(s, 0) / n - prob) for s, prob in exact.items())


# --8<-- [end:batched]


# --8<-- [start:mutants]
def resample_from_target(draft, q, p, *, generator=None) -> Verdict:
    """Wrong: after a rejection, sample from p itself instead of the residual."""
    v = verify(draft, q, p, generator=generator)
    b, gamma = draft.shape
    again = sample(p.gather(1, v.accepted[:, None, None].expand(b, 1, V))[:, 0], generator)
    return Verdict(v.accepted, torch.where(v.accepted < gamma, again, v.token))


def ratio_upside_down(draft, q, p, *, generator=None) -> Verdict:
    """Wrong: accept with min(1, q(x) / p(x)), as if p and q had been swapped."""
    return verify(draft, p[:, :-1], torch.cat([q, p[:, -1:]], 1), generator=generator)


# --8<-- [end:mutants]
