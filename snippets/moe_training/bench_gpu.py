"""On the H200 (nox -s gpu_docs): the grouped GEMM at Qwen3-30B-A3B's expert shape against a
loop of matmuls, torch._grouped_mm and one dense GEMM of the same FLOPs, balanced and skewed,
forward and backward; FP8 against bf16; the load-balancing experiment on the shared MoE's shape;
the shared trained MoE's expert load. Writes results/moe-training/{grouped-gemm,fp8,balance}.json.

Budget: 60 s from a cold start. The run of 45fbab4 took 72.2 s: this file 48.4 s, of which
one kernel_ms_each session 22 s (settling 6.6, profiler ~3.8, warm-up and autotuning 5.8) and
one callable timed again 3.1 s, 12 graphed balancing runs and the shared MoE's load ~20 s;
the EP demo's 4 gloo processes 6.5 s; tests and the other fences ~17 s. Since then: 8 balancing
runs (2 seeds, -6.4 s), the dense GEMM once (it has no groups) and FP8 at one skew (4 callables
fewer, ~-1.6 s), 100 ms settling after the first callable (-2 s). Estimate ~59 s without a
re-timing, ~62 s with one.
The run of 72f8ed1 took 61.0 s (this file 40.9 s: kernel_ms_each 21.6 s, no re-timing); two
tests of the benchmark's and the balancing run's structure at tiny shapes now run on the CPU
only (-2.3 s on the GPU): ~58.7 s. Then the dW alone, ours and torch's at the first skew: 2
callables, ~1.2 s.
"""

import torch

from snippets.common.bench import kernel_ms_each
from snippets.common.hardware import gpu_for_device_name
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.results import write_result
from snippets.common.train import rows, trained
from snippets.moe_training.balance_run import (
    METHODS,
    curves,
    run,
    streams,
    summarize,
    trained_load,
)
from snippets.moe_training.configs import load_moe_models
from snippets.moe_training.grouped_gemm import (
    grouped_mm_dw_kernel,
    grouped_mm_kernel,
    grouped_mm_ptr_kernel,
)
from snippets.moe_training.measure import (
    autotuned_configs,
    fp8_jobs,
    grouped_jobs,
    grouped_mm_available,
    ratios,
)

# --8<-- [start:gemm]
gpu = gpu_for_device_name(torch.cuda.get_device_name())
if gpu is None:
    raise RuntimeError(f"{torch.cuda.get_device_name()!r} has no entry in data/hardware.yaml")
q = load_moe_models()["qwen3-30b-a3b"].config  # the expert shape, from the model's config
EXPERTS, HIDDEN, INTER = q["num_experts"], q["hidden_size"], q["moe_intermediate_size"]
ROWS = 65536  # routed rows in one call: 8192 tokens x top-8 (scaled to one GPU)
SKEWS = {"balanced": 0.0, "zipf-1": 1.0}  # Zipf exponent s: the r-th expert gets ~ 1 / r^s
missing = grouped_mm_available("cuda")


def gpu_times(fns):  # the kernels' own time (CUPTI); each callable's repeats back to back,
    # after settling: the first 2 s (an idle GPU's clocks drop only after a second of matmuls),
    # the others 100 ms and until three 50 ms chunks agree
    settle = [2000.0] + [100.0] * (len(fns) - 1)
    return kernel_ms_each(fns, target_ms=10.0, warmup=2, interleave=False, settle_ms=settle)


g_fns, g_finish = grouped_jobs(SKEWS, ROWS, EXPERTS, HIDDEN, 2 * INTER, "cuda", torch.bfloat16,
                               skip=("torch_grouped_mm",) if missing else ())  # fmt: skip
f_fns, f_finish = fp8_jobs({"balanced": 0.0}, ROWS, EXPERTS, HIDDEN, 2 * INTER, "cuda")
stats = gpu_times(g_fns + f_fns)  # one profiler session: the GPU settles once
(gemm, gemm_parts), fp8 = g_finish(stats[: len(g_fns)]), f_finish(stats[len(g_fns) :])

# the configs autotuning picked: two runs of this code put balanced forward at 0.87 and 0.94
# of torch._grouped_mm, and which config each had picked was not recorded. Forward and dX run
# the TMA kernel at this shape (bf16, K and N multiples of 8); the pointer kernel, the fallback
# for unaligned shapes, is listed only if it ran
autotuned = (autotuned_configs(grouped_mm_kernel, "forward / dX")
             + autotuned_configs(grouped_mm_ptr_kernel, "forward / dX (pointers)")
             + autotuned_configs(grouped_mm_dw_kernel, "dW"))  # fmt: skip
# --8<-- [end:gemm]

# --8<-- [start:balance]
BAL_STEPS, SEEDS, EVAL_TOKENS = 60, (0, 1), 32768  # 2 seeds: 8 runs of the post's 60 s
spec = load_trained_models()
runs = [run(method, seed, BAL_STEPS, spec, EVAL_TOKENS) for method in METHODS for seed in SEEDS]
shared = trained("moe", spec=spec)  # trained and cached by the trained-models post
_, heldout_stream = streams(spec)  # the corpus as the runs loaded it
held = rows(heldout_stream, shared.train.seq_len)[:64].to("cuda")
with torch.autocast("cuda", dtype=torch.bfloat16):
    shared_load = trained_load(shared.model, held, shared.train.batch_size)
# --8<-- [end:balance]

# --8<-- [start:record]
write_result("moe-training", "grouped-gemm", {
    "gpu": gpu.name, "peak_tflops": gpu.bf16_dense_tflops, "rows": ROWS, "k": HIDDEN,
    "n": 2 * INTER, "experts": EXPERTS, "unavailable": missing or "无", "runs": gemm,
    "ratios": ratios(gemm), "parts": gemm_parts, "part_ratios": ratios(gemm_parts),
    "autotuned": autotuned})  # fmt: skip
write_result("moe-training", "fp8", {"peak_tflops": gpu.fp8_dense_tflops, "runs": fp8})
write_result("moe-training", "balance", {
    "steps": BAL_STEPS, "eval_tokens": EVAL_TOKENS, "summary": summarize(runs, tail=10),
    "curves": curves(runs, every=5),
    "graph_errors": sorted({r["graph_error"] or "无" for r in runs}),  # 无: every run graphed
    "shared_load": shared_load, "shared_steps": shared.train.steps})  # fmt: skip
# --8<-- [end:record]
