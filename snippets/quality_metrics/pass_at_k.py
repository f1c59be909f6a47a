"""pass@k: the probability that at least one of k samples passes, estimated from n >= k samples
of which c passed (Chen et al. 2021, arXiv:2107.03374, §2.1)."""

from __future__ import annotations

import math
from fractions import Fraction


# --8<-- [start:estimator]
def _check(n: int, c: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c, k are counts (int), got {n!r}, {c!r}, {k!r}")
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@{k} needs 1 <= k <= n samples, got n={n} (draw at least k)")


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k), as the paper's Figure 3 computes it: the ratio of binomials is
    the product over i = n-c+1 .. n of (1 - k/i), every factor in [0, 1]."""
    _check(n, c, k)
    if n - c < k:  # every choice of k samples contains a correct one
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_exact(n: int, c: int, k: int) -> Fraction:
    """The same estimator with exact integers: the reference the product is tested against."""
    _check(n, c, k)
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_at_k_floats(n: int, c: int, k: int) -> float:
    """The formula typed directly in floating point: C(n, k) overflows a double (about
    1.8e308) for large n, e.g. from C(1030, 515) on."""
    _check(n, c, k)
    return 1.0 - float(math.comb(n - c, k)) / float(math.comb(n, k))


def pass_at_k_plugin(n: int, c: int, k: int) -> float:
    """1 - (1 - c/n)^k: the pass rate plugged into the formula for k independent draws.
    Biased low (the paper's Appendix A), because 1 - (1 - x)^k is concave in x."""
    _check(n, c, k)
    return 1.0 - (1.0 - c / n) ** k


def expected(estimator, n: int, p: float, k: int) -> float:
    """E[estimator(n, c, k)] when c ~ Binomial(n, p): summed exactly over c = 0..n."""
    return math.fsum(math.comb(n, c) * p**c * (1 - p) ** (n - c) * estimator(n, c, k)
                     for c in range(n + 1))  # fmt: skip


# --8<-- [end:estimator]
