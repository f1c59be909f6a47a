"""pass@k in the Codex paper's setting: n = 200 samples per problem, k up to 100."""

from fractions import Fraction

from snippets.quality_metrics.pass_at_k import (
    expected,
    pass_at_k,
    pass_at_k_exact,
    pass_at_k_floats,
    pass_at_k_plugin,
)

# --8<-- [start:demo]
n, c = 200, 5  # 200 samples of one problem, 5 of them pass
for k in (1, 10, 100):
    exact = pass_at_k_exact(n, c, k)
    assert abs(pass_at_k(n, c, k) - exact) <= 1e-15
    print(k, f"{pass_at_k(n, c, k):.4f}", f"{pass_at_k_plugin(n, c, k):.4f}")
    #> 1 0.0250 0.0250
    #> 10 0.2283 0.2237
    #> 100 0.9703 0.9205

# typed directly in floating point, the binomials overflow once n is large enough
try:
    pass_at_k_floats(2000, 20, 1000)
except OverflowError as err:
    print("OverflowError:", err)
    #> OverflowError: int too large to convert to float
print(f"{pass_at_k(2000, 20, 1000):.6f}", pass_at_k_exact(2000, 20, 1000) > Fraction(999, 1000))
#> 0.999999 True

# unbiased: over c ~ Binomial(n, p), the estimator's mean is the true pass@k, 1 - (1 - p)^k;
# the plug-in estimator's mean falls short (Appendix A)
p, k = 0.02, 100
truth = 1 - (1 - p) ** k
print(f"{truth:.4f} {expected(pass_at_k, n, p, k):.4f} {expected(pass_at_k_plugin, n, p, k):.4f}")
#> 0.8674 0.8674 0.7962
# --8<-- [end:demo]
