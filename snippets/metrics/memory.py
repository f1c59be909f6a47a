"""Memory: bytes per parameter of mixed-precision Adam; ZeRO-1/2/3 model states per GPU."""

from snippets.common.hardware import load_hardware
from snippets.common.results import computed_result
from snippets.metrics.qwen3 import QWEN3_8B, qwen3_params

# --8<-- [start:bytes]
# ZeRO (Rajbhandari et al., arXiv:1910.02054) §3.1: mixed-precision Adam, bytes per parameter.
ADAM_MIXED_PRECISION = {
    "fp16/bf16 parameters": 2,
    "fp16/bf16 gradients": 2,
    "fp32 master parameters": 4,  # the three fp32 tensors are the optimizer states,
    "fp32 momentum": 4,  # K = 4 + 4 + 4 = 12 bytes per parameter
    "fp32 variance": 4,
}
K = 12
print(sum(ADAM_MIXED_PRECISION.values()))
#> 16
# --8<-- [end:bytes]


# --8<-- [start:zero]
def zero_model_states(psi: float, nd: int, stage: int, k: float = K) -> dict[str, float]:
    """Model-state bytes per GPU, by state, for psi parameters and data-parallel degree nd
    (ZeRO Figure 1): each stage shards one more state into nd pieces.

    stage 0: plain data parallelism, everything replicated       (2 + 2 + K) psi
    stage 1: P_os,     optimizer states sharded                 2 psi + 2 psi + K psi / nd
    stage 2: P_os+g,   + gradients sharded                      2 psi + (2 + K) psi / nd
    stage 3: P_os+g+p, + parameters sharded                     (2 + 2 + K) psi / nd
    """
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"ZeRO stage must be 0, 1, 2 or 3, not {stage!r}")
    return {
        "parameters": 2 * psi / (nd if stage >= 3 else 1),  # fp16/bf16
        "gradients": 2 * psi / (nd if stage >= 2 else 1),  # fp16/bf16
        "optimizer": k * psi / (nd if stage >= 1 else 1),  # fp32 master, momentum, variance
    }


def zero_model_state_bytes(psi: float, nd: int, stage: int, k: float = K) -> float:
    """All model states per GPU: the sum of the three."""
    return sum(zero_model_states(psi, nd, stage, k).values())


# --8<-- [end:zero]

# --8<-- [start:qwen3]
psi = qwen3_params(QWEN3_8B)["total"]
h200 = load_hardware()["h200-sxm"]
stages = []  # Qwen3-8B on 8 data-parallel GPUs, against one H200's memory
for stage in range(4):
    gb = zero_model_state_bytes(psi, nd=8, stage=stage) / 1e9
    stages.append({"stage": stage, "gb": gb, "of_h200": gb / h200.memory_gb})
    print(stage, round(gb, 1), "GB", f"{gb / h200.memory_gb:.0%} of an H200")
    #> 0 131.1 GB 93% of an H200
    #> 1 45.0 GB 32% of an H200
    #> 2 30.7 GB 22% of an H200
    #> 3 16.4 GB 12% of an H200
# --8<-- [end:qwen3]

# The figures the page quotes, checked on every run (results/metrics/qwen3-zero.json).
computed_result("metrics", "qwen3-zero", {"stages": stages})
