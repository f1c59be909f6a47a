"""On the H200 (nox -s gpu_docs): the GPU-only sources and the three gates for our Triton kernels
in bf16 on the Qwen3 model; writes results/precision-alignment/*.json, then asserts the gates."""

import torch

from snippets.common.results import write_result
from snippets.precision_alignment.collect import (
    H200,
    SLUG,
    SOURCES,
    e2e_curves,
    model_rows,
    op_rows,
    records,
    source_rows,
)

# --8<-- [start:run]
DEVICE, DTYPE = torch.device("cuda"), torch.bfloat16
measured_sources = source_rows(H200, DEVICE)  # TF32 on and off; index_add_ with and without
ops = op_rows(H200, DTYPE, DEVICE)  # gate 1 at Qwen3-8B widths
model, sites, ablation, rope_bug = model_rows(H200, DTYPE, DEVICE)  # gate 2; one at a time; bug 4
curves = e2e_curves(H200, DTYPE, DEVICE)  # gate 3, the planted RoPE bug, a repeat, another seed
# --8<-- [end:run]

# --8<-- [start:record]
recorded = records(H200, measured_sources, ops, model, sites, ablation, rope_bug, curves)
for name, record in recorded.items():
    write_result(SLUG, name, sources=SOURCES, **record)
# written first, so that a failing gate leaves its numbers to look at
assert measured_sources[0]["value"] <= measured_sources[0]["reference"], "fp32 matmul bound"
assert measured_sources[1]["value"] <= measured_sources[1]["reference"], "TF32 bound"
assert measured_sources[3]["value"] == 1, "deterministic index_add_"
assert all(r["passed"] for r in ops), [r for r in ops if not r["passed"]]
assert model.passed, [s for s in model.sites if not s.ok]
assert curves["fused"].passed, curves["fused"].first_exceeded
assert not rope_bug["passed"], "the model gate must catch bf16 RoPE tables at 512 positions"
# --8<-- [end:record]
