"""On the H200 (nox -s gpu_docs): the GPU-only sources and the three gates for our Triton kernels
in bf16 on the Qwen3 model; writes results/precision-alignment/*.json, whose claims the page
states and the gate checks."""

import torch

from snippets.common.results import write_result
from snippets.precision_alignment.collect import (
    H200,
    SLUG,
    e2e_runs,
    e2e_values,
    model_values,
    op_values,
    source_values,
)

# --8<-- [start:run]
DEVICE, DTYPE = torch.device("cuda"), torch.bfloat16
measured_sources = source_values(H200, DEVICE)  # TF32 off and on; index_add_ with and without
ops = op_values(H200, DTYPE, DEVICE)  # gate 1 at Qwen3-8B widths
model = model_values(H200, DTYPE, DEVICE)  # gate 2; one kernel at a time; planted bug 4
curves = e2e_values(e2e_runs(H200, DTYPE, DEVICE), H200.every)  # gate 3, bug 4, repeat, seed
# --8<-- [end:run]

# --8<-- [start:record]
write_result(SLUG, "precision-sources", measured_sources)
write_result(SLUG, "precision-op-gate", ops)
write_result(SLUG, "precision-model-gate", model)
write_result(SLUG, "precision-e2e", curves)
# --8<-- [end:record]
