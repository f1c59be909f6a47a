"""Measured on the GPU: peak memory and step time of one global batch split into k micro-batches."""

import copy
import functools
import time

import torch

from snippets.common.bench import ceilings, kernel_ms_each, rate
from snippets.common.results import write_result

# --8<-- [start:model]
HIDDEN, LAYERS, TOKENS = 4096, 4, 16384  # one global batch: 16384 tokens of width 4096


class Block(torch.nn.Module):
    """A transformer-sized MLP block: 4096 -> 16384 -> 4096 with a residual."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def accumulate_fp32(main, param):
    """Post-accumulate hook: add the bf16 micro-batch gradient into the fp32 one, free it."""
    main.grad.add_(param.grad)
    param.grad = None


def make_step(k):
    torch.manual_seed(0)
    with torch.device("cuda"):
        master = torch.nn.Sequential(*[Block() for _ in range(LAYERS)])  # fp32 master weights
        x = torch.randn(TOKENS, HIDDEN, dtype=torch.bfloat16)
    model = copy.deepcopy(master).bfloat16()  # the bf16 copy that runs forward and backward
    for main, p in zip(master.parameters(), model.parameters(), strict=True):
        main.grad = torch.zeros_like(main)  # fp32 gradient, accumulated over the k micro-batches
        p.register_post_accumulate_grad_hook(functools.partial(accumulate_fp32, main))
    opt = torch.optim.AdamW(master.parameters(), lr=1e-5, fused=True)  # fp32 moments too

    def step():
        opt.zero_grad(set_to_none=False)  # zero the fp32 gradients in place
        for xb in x.chunk(k):
            (model(xb).float().pow(2).mean() / k).backward()
        opt.step()  # AdamW on the fp32 master weights
        with torch.no_grad():
            for p, main in zip(model.parameters(), master.parameters(), strict=True):
                p.copy_(main)  # round the updated weights into the bf16 copy

    n_params = sum(p.numel() for p in model.parameters())
    return step, n_params


# --8<-- [end:model]


# --8<-- [start:measure]
KS = (1, 2, 4, 8, 16)
runs, peaks = [], []
for k in KS:  # all five models stay on the GPU, a few GiB each
    before = torch.cuda.memory_allocated()  # the models built so far
    step, n_params = make_step(k)
    step()  # warm-up: allocates optimizer state and grads
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peaks.append(torch.cuda.max_memory_allocated() - before)  # this model's step alone
    runs.append(step)
t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.0:  # a second of steps: the clocks settle under this load
    for step in runs:
        step()
        torch.cuda.synchronize()
# GPU time of the steps' kernels, two steps a repeat, the five k in turn within each repeat:
# the GPU sits at its power limit and its clock wanders; timed one k after another, k = 2
# and 4 spread ±5-7 %, taken in turn the clock's wandering reaches every k alike (at one step
# a repeat, k = 1 and 16 spread ±7-8 %). No further warm-up: every step ran in the second above.
times = kernel_ms_each(runs, calls=2, warmup=0)
steps = []
for k, peak, ms in zip(KS, peaks, times, strict=True):
    achieved = rate(6 * n_params * TOKENS, ms)  # matmul FLOPs: forward 2NT + backward 4NT
    steps.append(
        {
            "k": k,
            "micro_tokens": TOKENS // k,
            "peak_gib": peak / 2**30,
            "ms": ms,
            "tflops": achieved / 1e12,
            "of_matmul_ceiling": achieved / ceilings()["bf16_matmul_flop_per_s"],
        }
    )
del runs

by_k = {r["k"]: r for r in steps}
write_result(
    "gradient-accumulation",
    "accumulation-step",
    {
        "n_params": n_params,
        "steps": steps,
        "memory_saving_k16": 1 - by_k[16]["peak_gib"] / by_k[1]["peak_gib"],
        "time_ratio_k16": by_k[16]["ms"] / by_k[1]["ms"],
        "matmul_ceiling_tflops": ceilings()["bf16_matmul_flop_per_s"] / 1e12,
    },
)
# --8<-- [end:measure]
