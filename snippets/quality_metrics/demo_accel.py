"""The quantizers of accelerated.py on a weight-like matrix, on the CPU: what each format and
granularity does to the weights, and the bound each error stays within."""

import torch

from snippets.quality_metrics.accelerated import FORMATS, GRANULARITIES, quantize
from snippets.quality_metrics.synthetic import hashed_logits

# --8<-- [start:formats]
e4m3 = torch.finfo(torch.float8_e4m3fn)
print(e4m3.max, e4m3.eps, e4m3.smallest_normal)  # 3 mantissa bits: unit roundoff eps / 2
#> 448.0 0.125 0.015625
# --8<-- [end:formats]

# --8<-- [start:quantize]
# 64 rows of 512 bell-shaped weights (std 0.02), every eighth row ten times larger: rows whose
# largest weight differs a lot, as trained matrices have
w = hashed_logits(64, 512, seed=3, scale=0.02 / 1.155).float()
w[::8] *= 10
ordinary = w[1::8]  # rows of ordinary size
bf16_err = (ordinary - ordinary.bfloat16().float()).norm() / ordinary.norm()
print(f"bf16 (for scale)        error / weight {bf16_err:.4f}")  # on the ordinary rows
#> bf16 (for scale)        error / weight 0.0017
for fmt in FORMATS:
    for per in GRANULARITIES:
        q, scale = quantize(w, fmt, per)
        err = w.double() - q.double() * scale.double()
        if fmt == "int8":  # half a step of the grid (+ the fp32 division's rounding)
            bound = scale / 2 + 2**-24 * w.abs()
        else:  # half an ulp of E4M3: 2^-4 relative; 2^-10 x scale among the subnormals
            bound = torch.maximum(2**-4 * w.abs(), 2**-10 * scale) + 2**-23 * w.abs()
        rel = (err[1::8].norm() / ordinary.norm()).item()
        inside = bool((err.abs() <= bound).all())
        print(f"{fmt:4} per {per:6} |error| <= bound: {inside}, error / weight {rel:.4f}")
        #> fp8  per tensor |error| <= bound: True, error / weight 0.0262
        #> fp8  per row    |error| <= bound: True, error / weight 0.0264
        #> int8 per tensor |error| <= bound: True, error / weight 0.0713
        #> int8 per row    |error| <= bound: True, error / weight 0.0065
# --8<-- [end:quantize]
