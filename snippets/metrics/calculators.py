"""The page's calculators, Python side: each takes a form's inputs and calls this post's code.

docs/assets/calculator.js repeats each formula term by term; both are checked on the test vectors
in tests/fixtures/calculators/<name>.json, which `Calculator.stored` writes from what is here
(snippets/common/calculator.py). Presets are computed from data/hardware.yaml and data/qwen3.yaml.
"""

from __future__ import annotations

from snippets.common.calculator import Calculator
from snippets.common.hardware import load_hardware
from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.metrics.memory import K, zero_model_state_bytes, zero_model_states
from snippets.metrics.qwen3 import qwen3_params
from snippets.metrics.roofline import busbw
from snippets.metrics.training import flops_per_token_6n, flops_per_token_palm, mfu


# --8<-- [start:presets]
def gpu_presets(**fields: str) -> list[dict]:
    """One preset per GPU of data/hardware.yaml: {input name: its attribute there}."""
    return [
        {"id": g.id, "label": g.name, "values": {k: getattr(g, a) for k, a in fields.items()}}
        for g in load_hardware().values()
    ]


def qwen3_presets(values) -> list[dict]:
    """One preset per Qwen3 model of data/qwen3.yaml; values(config, counts) -> inputs."""
    out = []
    for m in load_qwen3_configs().values():
        label = m.sources[0].split("/")[4]  # the Hugging Face repository: Qwen3-8B
        out.append({"id": m.id, "label": label, "values": values(m.fields, qwen3_params(m.fields))})
    return out


# --8<-- [end:presets]


# --8<-- [start:mfu]
def mfu_calculator(peak_tflops, params_b, layers, heads, head_dim, seq_len, tgs) -> dict:
    """FLOPs per token by 6N and by PaLM's 6N + 12LHQT, and the MFU each gives one GPU at `tgs`."""
    n = params_b * 1e9
    six, palm = flops_per_token_6n(n), flops_per_token_palm(n, layers, heads, head_dim, seq_len)
    peak = peak_tflops * 1e12
    return {"flops_6n": six, "flops_palm": palm,
            "mfu_6n": mfu(tgs, six, 1, peak), "mfu_palm": mfu(tgs, palm, 1, peak)}  # fmt: skip


# --8<-- [end:mfu]


# --8<-- [start:zero]
def zero_calculator(params_b, data_parallel, k, memory_gb) -> dict:
    """Per-GPU bytes of each model state under ZeRO stages 0-3, and the share of GPU memory."""
    out = {}
    for stage in range(4):
        states = zero_model_states(params_b * 1e9, data_parallel, stage, k)
        total = zero_model_state_bytes(params_b * 1e9, data_parallel, stage, k)
        out |= {f"stage{stage}_{state}": b for state, b in states.items()}
        out |= {f"stage{stage}_total": total, f"stage{stage}_share": total / (memory_gb * 1e9)}
    return out


# --8<-- [end:zero]


# --8<-- [start:busbw]
def busbw_calculator(op, ranks, size_gb, ms) -> dict:
    """algbw = S / t for the whole array S, and busbw (nccl-tests), in bytes/s."""
    alg = size_gb * 1e9 / (ms / 1e3)
    return {"algbw": alg, "busbw": busbw(alg, ranks, op)}


# --8<-- [end:busbw]

GPU = load_hardware()["h200-sxm"]
OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")
MFU_CASES = [
    {"peak_tflops": 275.0, "params_b": 540.0, "layers": 118, "heads": 48, "head_dim": 256,
     "seq_len": 2048, "tgs": 238.3e3 / 6144},  # PaLM 540B on 6144 TPU v4 (Table 3)
    {"peak_tflops": GPU.bf16_dense_tflops, "params_b": 7.568401408, "layers": 36, "heads": 32,
     "head_dim": 128, "seq_len": 4096, "tgs": 7500.0},
    {"peak_tflops": 312.0, "params_b": 0.5, "layers": 0, "heads": 0, "head_dim": 0, "seq_len": 0,
     "tgs": 1e5},
]  # fmt: skip


def mfu_fields(cfg: dict, n: dict) -> dict:
    return {"params_b": n["matmul"] / 1e9, "layers": cfg["num_hidden_layers"],
            "heads": cfg["num_attention_heads"], "head_dim": cfg["head_dim"]}  # fmt: skip


CALCULATORS = {
    "mfu": Calculator(
        mfu_calculator,
        cases=MFU_CASES,
        presets={
            "gpus": gpu_presets(peak_tflops="bf16_dense_tflops"),
            "models": qwen3_presets(mfu_fields),
        },
    ),
    # --8<-- [start:zero_entry]
    "zero": Calculator(
        zero_calculator,
        cases=[
            {"params_b": p, "data_parallel": nd, "k": k, "memory_gb": mem}
            for p in (7.5, 8.19073536)
            for nd in (1, 8, 64)
            for k, mem in ((K, GPU.memory_gb), (8, 80))
        ],
        presets={
            "gpus": gpu_presets(memory_gb="memory_gb"),
            "models": qwen3_presets(lambda cfg, n: {"params_b": n["total"] / 1e9}),
        },
        defaults={"k": K},
    ),
    # --8<-- [end:zero_entry]
    "busbw": Calculator(
        busbw_calculator,
        cases=[
            {"op": op, "ranks": n, "size_gb": 16.38147072, "ms": 100.0}
            for op in OPS
            for n in (1, 2, 8, 72)
        ],
        presets={
            "models": qwen3_presets(lambda cfg, n: {"size_gb": 2 * n["total"] / 1e9}),  # bf16 grads
        },
    ),
}

# --8<-- [start:count]
for name, calculator in CALCULATORS.items():
    print(f"{name:6} {len(calculator.cases):3} vectors")
    #> mfu      3 vectors
    #> zero    12 vectors
    #> busbw   24 vectors
# --8<-- [end:count]
