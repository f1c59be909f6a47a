"""The page's calculator, Python side: Leviathan et al.'s analysis for your alpha, gamma and c.

docs/assets/calculator.js repeats it (formulas["speculative"]) operation by operation; both are
checked on tests/fixtures/calculators/speculative.json (snippets/common/calculator.py). The
presets are the rows of the paper's Table 4 (theory.TABLE4).
"""

from __future__ import annotations

from snippets.common.calculator import Calculator
from snippets.speculative_decoding.theory import (
    TABLE4,
    expected_tokens,
    operations_factor,
    optimal_gamma,
    walltime_speedup,
)


# --8<-- [start:calculator]
def speculative_calculator(alpha, gamma, c, c_hat) -> dict:
    """Tokens per target run (eq. 1), the walltime speedup (Theorem 3.8), the arithmetic per
    token against plain decoding (Theorem 3.11), the best gamma for this alpha and c, and two
    bounds: (1 + alpha) / (1 + c) at gamma = 1 (Corollary 3.9) and 1 / (1 - alpha), the limit
    of a free draft (c = 0) with gamma growing (§3.6)."""
    if gamma != int(gamma) or gamma < 0:
        raise ValueError(f"gamma must be a whole number >= 0, got {gamma}")
    gamma = int(gamma)
    best, best_speedup = optimal_gamma(alpha, c)
    return {
        "tokens": expected_tokens(alpha, gamma),
        "speedup": walltime_speedup(alpha, gamma, c),
        "operations": operations_factor(alpha, gamma, c_hat),
        "best_gamma": best,
        "best_speedup": best_speedup,
        "gamma_one": (1 + alpha) / (1 + c),
        "free_draft": 1 / (1 - alpha) if alpha < 1 else None,  # no limit: shown as "—"
    }


# --8<-- [end:calculator]

PRESETS = [
    {"id": f"{task}-{draft}-t{temp}".lower(), "label": f"T5-XXL {task}，{draft} 草稿，温度 {temp}",
     "values": {"alpha": float(a), "gamma": g, "c": float(c), "c_hat": float(c)}}
    for task, draft, temp, g, a, c, _ in TABLE4
]  # fmt: skip
CASES = [
    {"alpha": 0.75, "gamma": 7, "c": 0.02, "c_hat": 0.02},  # Table 4, EnDe, T5-small, argmax
    {"alpha": 0.8, "gamma": 5, "c": 0.0, "c_hat": 0.0},  # Table 1: speed 3.69, operations 1.63
    {"alpha": 0.2, "gamma": 3, "c": 0.0, "c_hat": 0.0},  # §3.6: a bigram draft, 1.25x
    {"alpha": 0.6, "gamma": 3, "c": 0.5, "c_hat": 0.1},  # alpha > c, barely worth it
    {"alpha": 0.3, "gamma": 2, "c": 0.5, "c_hat": 0.5},  # alpha < c: a slowdown at any gamma
    {"alpha": 0.0, "gamma": 4, "c": 0.1, "c_hat": 0.1},  # nothing accepted
    {"alpha": 0.99, "gamma": 4, "c": 0.1, "c_hat": 0.1},  # nearly everything accepted
    {"alpha": 0.9, "gamma": 0, "c": 0.05, "c_hat": 0.05},  # no drafts: plain decoding
]
CALCULATORS = {
    "speculative": Calculator(
        speculative_calculator,
        cases=CASES,
        presets={"table4": PRESETS},
        defaults={},
    ),
}
