"""The analysis of speculative decoding as functions (Leviathan, Kalman & Matias, ICML 2023,
arXiv:2211.17192, §3), reproduced against the paper's own numbers, and its generalization to a
draft tree. Notation as in the paper: p is the target's distribution, q the draft's, gamma the
number of drafted tokens per target run, c the time of one draft run over one target run.
"""

from __future__ import annotations

import itertools

import torch

from snippets.common.results import computed_result


# --8<-- [start:formulas]
def _check(alpha: float, gamma: int) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    if gamma < 0 or gamma != int(gamma):
        raise ValueError(f"gamma must be a whole number >= 0, got {gamma}")


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens one target run yields (eq. 1): a geometric count of accepted drafts, capped at
    gamma, plus the one token the target always adds: (1 - alpha^(gamma+1)) / (1 - alpha)."""
    _check(alpha, gamma)
    if alpha == 1.0:
        return gamma + 1.0
    power = 1.0
    for _ in range(gamma + 1):  # alpha^(gamma+1) by products: the same bits in calculator.js
        power *= alpha
    return (1 - power) / (1 - alpha)


def walltime_speedup(alpha: float, gamma: int, c: float) -> float:
    """Theorem 3.8: a run costs gamma draft runs and one target run, (gamma c + 1) T, and
    yields expected_tokens; plain decoding costs T per token."""
    if c < 0:
        raise ValueError(f"the cost ratio c must be >= 0, got {c}")
    return expected_tokens(alpha, gamma) / (gamma * c + 1)


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Theorem 3.11: arithmetic per token against plain decoding. The target does gamma + 1
    tokens' work per run, the draft gamma runs of c_hat each, all divided by the tokens won."""
    return (gamma * c_hat + gamma + 1) / expected_tokens(alpha, gamma)


def optimal_gamma(alpha: float, c: float, max_gamma: int = 64) -> tuple[int, float]:
    """§3.5: the whole gamma in 1..max_gamma with the largest walltime_speedup (ties: the
    smaller gamma), and that speedup. Below 1 when alpha <= c (Corollary 3.9)."""
    best = max(range(1, max_gamma + 1), key=lambda g: (walltime_speedup(alpha, g, c), -g))
    return best, walltime_speedup(alpha, best, c)


def acceptance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Theorem 3.5: the probability that a draft x ~ q is accepted against p, per context
    (the last dimension is the vocabulary): beta = sum_x min(p(x), q(x)). Corollary 3.6:
    alpha is its mean over contexts."""
    if p.shape != q.shape:
        raise ValueError(f"p and q differ in shape: {tuple(p.shape)} and {tuple(q.shape)}")
    return torch.minimum(p, q).sum(-1)


# --8<-- [end:formulas]


# --8<-- [start:tree]
def tree_expected_tokens(parents: list[int], accept: list[float]) -> float:
    """Tokens one target run yields when it verifies a draft tree. Node i (0-based, in an
    order where a parent precedes its children) hangs under parents[i] (-1: under the last
    committed token) and is accepted with probability accept[i] once its parent is, siblings
    excluding each other (greedy verification keeps the child equal to the target's argmax).
    Every node on the accepted path is a token; the target adds one more:
    1 + sum_v prod_{u on the path to v} accept[u]. A chain with accept = alpha is eq. 1."""
    if len(parents) != len(accept):
        raise ValueError(f"{len(parents)} parents for {len(accept)} acceptance probabilities")
    reach = []  # probability that node i is accepted
    children: dict[int, float] = {}
    for i, (parent, a) in enumerate(zip(parents, accept, strict=True)):
        if not -1 <= parent < i:
            raise ValueError(f"node {i}: parent {parent} must be -1 or an earlier node")
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"node {i}: acceptance {a} is not a probability")
        children[parent] = children.get(parent, 0.0) + a
        if children[parent] > 1.0 + 1e-12:  # mutually exclusive siblings
            raise ValueError(f"the children of node {parent} are accepted with total "
                             f"probability {children[parent]:.3f} > 1")  # fmt: skip
        reach.append(a * (1.0 if parent < 0 else reach[parent]))
    return 1.0 + sum(reach)


# --8<-- [end:tree]


# --8<-- [start:printed]
def interval(text: str) -> tuple[float, float]:
    """The values a number printed as `text` may stand for: "0.75" is [0.745, 0.755]. (The
    rule of the metrics post's reproductions: a reproduction passes when the formula's range
    over its printed inputs overlaps the printed result's interval; no tolerance chosen.)"""
    half = 0.5 * 10.0 ** -len(text.partition(".")[2])
    return float(text) - half, float(text) + half


def span(f, *texts: str) -> tuple[float, float]:
    """Smallest and largest f over the corners of its printed inputs' intervals."""
    values = [f(*corner) for corner in itertools.product(*map(interval, texts))]
    return min(values), max(values)


def reproduces(computed: tuple[float, float], printed: str) -> bool:
    lo, hi = interval(printed)
    eps = 1e-12  # the interval's edges themselves, despite float rounding
    return computed[0] <= hi + eps and computed[1] >= lo - eps


# --8<-- [end:printed]


# --8<-- [start:leviathan]
# Leviathan et al. Table 1 (c = c_hat = 0): alpha, gamma -> "Operations", "Speed".
TABLE1 = [
    ("0.6", 2, "1.53", "1.96"),
    ("0.7", 3, "1.58", "2.53"),
    ("0.8", 2, "1.23", "2.44"),
    ("0.8", 5, "1.63", "3.69"),
    ("0.9", 2, "1.11", "2.71"),
    ("0.9", 10, "1.60", "6.86"),
]
# Table 4 (Appendix A.3), T5-XXL with T5 drafts: task, draft, temperature, gamma, alpha, c,
# and the expected improvement factor "Exp" of Theorem 3.8.
TABLE4 = [
    ("EnDe", "T5-small", 0, 7, "0.75", "0.02", "3.2"),
    ("EnDe", "T5-base", 0, 7, "0.8", "0.04", "3.3"),
    ("EnDe", "T5-large", 0, 7, "0.82", "0.11", "2.5"),
    ("EnDe", "T5-small", 1, 7, "0.62", "0.02", "2.3"),
    ("EnDe", "T5-base", 1, 5, "0.68", "0.04", "2.4"),
    ("EnDe", "T5-large", 1, 3, "0.71", "0.11", "2.0"),
    ("CNNDM", "T5-small", 0, 5, "0.65", "0.02", "2.4"),
    ("CNNDM", "T5-base", 0, 5, "0.73", "0.04", "2.6"),
    ("CNNDM", "T5-large", 0, 3, "0.74", "0.11", "2.0"),
    ("CNNDM", "T5-small", 1, 5, "0.53", "0.02", "1.9"),
    ("CNNDM", "T5-base", 1, 3, "0.55", "0.04", "1.8"),
    ("CNNDM", "T5-large", 1, 3, "0.56", "0.11", "1.6"),
]

table1 = []
for a, g, ops, speed in TABLE1:
    ops_span = span(lambda x, g=g: operations_factor(x, g, 0.0), a)
    speed_span = span(lambda x, g=g: expected_tokens(x, g), a)
    table1.append({
        "alpha": float(a), "gamma": g, "operations": operations_factor(float(a), g, 0.0),
        "speed": expected_tokens(float(a), g), "printed_operations": float(ops),
        "printed_speed": float(speed),
        "reproduced": reproduces(ops_span, ops) and reproduces(speed_span, speed),
    })  # fmt: skip
table4 = []
for task, draft, temp, g, a, c, exp in TABLE4:
    at_printed = walltime_speedup(float(a), g, float(c))
    around = span(lambda x, y, g=g: walltime_speedup(x, g, y), a, c)
    table4.append({
        "task": task, "draft": draft, "temperature": temp, "gamma": g, "alpha": float(a),
        "c": float(c), "expected": at_printed, "printed": float(exp),
        "rounds_to_printed": round(at_printed, 1) == float(exp),
        "reproduced": reproduces(around, exp),
    })  # fmt: skip
# §3.6: a bigram draft (alpha ~ 0.2, c = 0) on EnDe "yields a 1.25X" speedup with gamma = 3.
bigram = walltime_speedup(0.2, 3, 0.0)
print(all(r["reproduced"] for r in table1), round(bigram, 2))
#> True 1.25
reproduced = sum(r["reproduced"] for r in table4)
rounds = sum(r["rounds_to_printed"] for r in table4)
print(reproduced, rounds, len(table4))
#> 12 9 12
# --8<-- [end:leviathan]


# --8<-- [start:optimal]
# Corollary 3.9: with alpha > c, gamma = 1 already wins (1 + alpha) / (1 + c). The best gamma
# grows with alpha and shrinks with c (§3.5, Figure 3): a grid of the page's choosing.
ALPHAS = [0.5, 0.6, 0.7, 0.8, 0.9]  # the range of Table 3's model drafts
COSTS = [0.01, 0.05, 0.2, 0.5]  # c = 0 has no optimum: the speedup grows towards 1 / (1 - alpha)
optimum = [{"alpha": a, "c": c, "gamma": optimal_gamma(a, c)[0], "speedup": optimal_gamma(a, c)[1]}
           for a in ALPHAS for c in COSTS]  # fmt: skip
print([r["gamma"] for r in optimum if r["c"] == 0.05])
#> [3, 4, 6, 8, 13]
# a sweep for the page's plot: speedup against gamma at alpha = 0.8
sweep = [{"gamma": g, "c": c, "speedup": walltime_speedup(0.8, g, c)}
         for c in (0.0, *COSTS) for g in range(1, 13)]  # fmt: skip
# --8<-- [end:optimal]

computed_result("speculative-decoding", "leviathan", {
    "table1": table1, "table4": table4, "bigram_speedup": bigram,
    "table4_reproduced": reproduced, "table4_rounds": rounds,
    "optimum": optimum, "sweep": sweep,
    "oracle_bound_alpha_08": 1 / (1 - 0.8),
})  # fmt: skip
