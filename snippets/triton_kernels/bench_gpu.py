"""On the GPU (nox -s gpu_docs): the kernels at Qwen3-8B shapes against eager PyTorch,
torch.compile and Liger Kernel (when installed); writes results/triton-kernels/*.json.

Wall time (budget 60 s a post, from empty Triton and Inductor caches). The last H200 run took
68.4 s: pytest 62.6 s, of which this file 42.8 -- kernel_ms_each 18.7 (its warm-up 8.6: the
backward passes' compiles, torch.compile's loss, Inductor's autotuning; profiler 2.2; settling
1.3; the timed calls ~6.6) and ~24 s outside the harness, by elimination the forward passes'
compiles (ours, Liger's, torch.compile's) and the imports of Liger Kernel and Dynamo -- the
page's checks ~10 (the kernel files' bf16 checks at import: 11 compiles), the GPU tests ~4,
pytest's start ~6. Now, estimated (the compiles are the uncertain part):
  compiles    ~30 -> ~13  warm.py: 8 workers compile every unit side by side, each ~3.5 s to
                          start (torch, CUDA, the kernel files' checks from the cache), the
                          longest unit torch.compile's loss (~8 s on one core), while this
                          process imports Liger Kernel and Dynamo; left here: the wait (~9 s),
                          loading kernels from the caches and Dynamo's traces (~2 s),
                          Inductor's autotuning (~1 s), the warm-up calls' GPU time (~0.7 s)
  GPU tests    ~4 -> ~3   inputs drawn on the GPU (~0.3 G normals were drawn on the CPU), the
                          loss test at the benchmark's vocabulary: its kernel from the cache
  total      68.4 -> ~50-57 s; if the workers do not help (a warning says so), 68.4 - ~1 s
The last run took 45 s. Added since, not yet run: the from-Python view, 5 s of interleaved
timings plus their warm-up (3 calls of each of 16 steps: ~0.1 s) and inputs, nothing compiled
(our Functions launch our ops' kernels; torch.compile's and Liger's are compiled above): ~6 s;
the RMSNorm sweep over 8 hidden sizes instead of 2: 12 more forward + backward compiles (ours
and Liger's) in the workers, side by side, and 12 more timed callables (~0.1 s each): ~2-4 s.
Then the FP8 section, not yet run either: 10 GEMMs timed after a 1 s settle (~0.7 s of calls),
15 quantizer timings (~1 s), the errors' fp64 products (20 GEMMs of ~0.8 TFLOP at the H200's
fp64 rate: ~0.3 s), our 6 quantize compiles and torch.compile's 2 in the workers: ~4-5 s. If
the post overruns its 60 s, the FP8 section is the first to move out (a post of its own).
Also added: the rows sweep's 4 warps variants (8 timed callables, 8 compiles in the workers)
and the hidden-size sweep's one_pass line (timed at 12288 and 16384 only: below MAX_BLOCK it is
the default kernel; 2 timed callables, 2 compiles in the workers): ~1 s.
"""

import math

import torch

from snippets.common.bench import ceilings, kernel_ms_each
from snippets.common.hostbound import fastest_interleaved
from snippets.common.results import write_result
from snippets.triton_kernels import fp8, warm
from snippets.triton_kernels.measure import (
    IMPLS,
    PYTHON_IMPLS,
    Shapes,
    fp8_errors,
    implementations,
    liger_ops,
    loss_flops,
    measure_fp8,
    measure_from_python,
    measure_loss,
    measure_ops,
    peak_bytes_cuda,
    sweep_rmsnorm,
    sweep_rows_per_program,
)

# --8<-- [start:run]
SHAPES, DTYPE = Shapes(), torch.bfloat16  # 2 x 4096 tokens, H 4096, I 12288, V 151,936
# (rows a program, rows a step[, warps]); warps, when given, from the compile below
ROWS_CHOICES = ((16, 1), (32, 1), (64, 1), (32, 2), (64, 2), (64, 4), (32, 1, 32), (32, 2, 16),
                (32, 2, 32), (64, 4, 32))  # fmt: skip
# Compiled for sm_90 on the CPU as the JIT specialises them (bf16, H 4096, ptxas -v): the
# defaults, 32 / 2 at 8 warps (124 registers a thread, 2 programs an SM) and 64 / 4 at 16 (123
# registers, 1 program), keep 16 warps an SM of its 64; at 32 warps both keep 32 (64 registers;
# 32 / 2 spills nothing, 64 / 4 a few bytes): more loads in flight
HIDDEN_SWEEP = (1024, 2048, 3072, 4096, 5120, 8192, 12288, 16384)  # 1 K-16 K, powers of two and
# three between (a row padded to the next power of two); 12288 and 16384 > MAX_BLOCK: two passes
SWEEP_IMPLS = ("ours", "one_pass", "liger")  # torch.compile would compile again for each H
LOSS_VARIANTS = [  # (implementation, (chunk rows, dW accumulator) for ours)
    ("ours", (1024, torch.float32)),  # the default
    ("ours", (1024, torch.bfloat16)),
    ("ours", (256, torch.bfloat16)),
    ("eager", None),
    ("compile", None),
    ("liger", None),
]


def gpu_times(fns):  # the kernels' own time, summed (CUPTI), all in one profiler session
    return kernel_ms_each(fns, target_ms=10.0)  # about 10 ms of calls per repeat


def gemm_times(fns):  # matmuls, the most power-hungry: first a second of the first callable
    return kernel_ms_each(fns, settle_ms=1000.0)


def loss_times(fns):  # one call of the loss is tens of ms of matmuls: two calls a repeat (at
    # one, the first variant spread ±5.2 %), in turn; first a second of the first variant: the
    # clocks drop to their state under matmuls
    return kernel_ms_each(fns, calls=2, warmup=1, settle_ms=1000.0)


def python_times(steps):  # from Python, the host's speed moving: the fastest 7 repeats of each,
    # round by round over 8 s (hostbound uses 15 s). At 5 s the H200 run of a938a39 spread
    # ±5.1-5.6 % on three of the 16 (a slow host: its loop timing doubled during the run), and
    # the record was rejected
    return fastest_interleaved(steps, seconds=8.0)


ceil = ceilings()  # measured in this run: copy bandwidth and bf16 matmul throughput
copy = ceil["copy_bytes_per_s"]
plan = warm.Plan(SHAPES, DTYPE, IMPLS, ROWS_CHOICES, HIDDEN_SWEEP, SWEEP_IMPLS,
                 tuple(LOSS_VARIANTS), fp8.QUANT_CONFIGS)  # fmt: skip
workers = warm.start(plan)  # other processes compile all that follows, into the disk caches
impls = implementations(IMPLS, SHAPES.hidden, SHAPES.eps)  # meanwhile: imports Liger Kernel
warm.finish(workers)  # they are done before our first call: the GPU is ours while we time
ops, fwdbwd = measure_ops(SHAPES, "cuda", DTYPE, gpu_times, copy, impls)
entries = implementations(("custom_op",), SHAPES.hidden, SHAPES.eps) | impls  # our two entries
entries = {name: entries[name] for name in PYTHON_IMPLS if name in entries}  # nothing compiles
from_python = measure_from_python(SHAPES, "cuda", DTYPE, python_times, entries)
rows = sweep_rows_per_program(SHAPES, "cuda", DTYPE, gpu_times, copy, ROWS_CHOICES)
swept = impls | implementations(("one_pass",), SHAPES.hidden, SHAPES.eps)  # H varies
no_recompile = {name: swept[name] for name in SWEEP_IMPLS if name in swept}
sweep = sweep_rmsnorm(HIDDEN_SWEEP, SHAPES.tokens, "cuda", DTYPE, gpu_times, copy, no_recompile)
fp8s = measure_fp8(SHAPES, "cuda", DTYPE, gemm_times, gpu_times, copy, fp8.QUANT_CONFIGS)
fp8s["errors"] = fp8_errors(SHAPES, "cuda", DTYPE)  # no clock: one run of each GEMM
loss = measure_loss(SHAPES, "cuda", DTYPE, loss_times, ceil["bf16_matmul_flop_per_s"], impls,
                    peak_bytes_cuda, LOSS_VARIANTS)  # fmt: skip
# --8<-- [end:run]

# --8<-- [start:record]
liger = impls["liger"]["version"] if "liger" in impls else liger_ops()  # or why not
write_result(
    "triton-kernels",
    "kernels",
    {"copy_tb_s": copy / 1e12, "liger": liger, "ops": ops, "fwdbwd": fwdbwd},
)
write_result("triton-kernels", "rmsnorm-rows", {"rows": rows})
write_result("triton-kernels", "rmsnorm-sweep", {"rows": sweep})
write_result("triton-kernels", "fp8", fp8s)
chunks = math.ceil(SHAPES.tokens / LOSS_VARIANTS[0][1][0])  # of the default variant
dw_bytes = chunks * 2 * SHAPES.vocab * SHAPES.hidden * 4  # fp32 dW read + written per chunk
write_result(
    "triton-kernels",
    "loss",
    {
        "rows": loss,
        # two parts of our default's time: the three matmuls at the measured matmul
        # throughput, and the fp32 dW accumulator's traffic at the measured copy bandwidth
        "matmul_floor_ms": loss_flops(SHAPES) / ceil["bf16_matmul_flop_per_s"] * 1e3,
        "dw_traffic_ms": dw_bytes / copy * 1e3,
    },
)
# last: host-bound, the likeliest to fail the spread rule, which raises here
write_result("triton-kernels", "from-python", {"rows": from_python})
# --8<-- [end:record]
