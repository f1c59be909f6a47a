"""On the GPU: one real training step of the shared Qwen3 model (Qwen3-8B's width, 8 of its 36
layers), timed as a training loop sees it; its TGS and MFU by the page's formulas."""

import torch

from snippets.common.bench import ceilings, python_ms
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result
from snippets.metrics.measure import BATCH, SEQ, STEP_CFG, make_step, step_metrics

# --8<-- [start:measure]
gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()!r} has no entry in data/hardware.yaml")
step, n_matmul = make_step(STEP_CFG, BATCH, SEQ)
# Wall clock of whole steps, CPU overhead included, as a training loop sees it; one step is
# hundreds of ms of GPU work, so a repeat of one step is long enough, and the CPU's share is
# hidden behind it: 7 repeats, as for the GPU's clocks (15 steps spread ±1.2 %). The warm-up
# steps allocate the AdamW state.
ms = python_ms(step, calls=1, repeats=7)
values = step_metrics(
    ms,
    BATCH * SEQ,
    n_matmul,
    STEP_CFG,
    SEQ,
    peak=gpu.bf16_dense_tflops * 1e12,  # datasheet dense BF16, data/hardware.yaml
    ceiling=ceilings()["bf16_matmul_flop_per_s"],  # measured in this run
)
write_result("metrics", "qwen3-training-step", values)
# --8<-- [end:measure]
