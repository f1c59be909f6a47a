"""Why the speedup falls as the batch grows: a roofline model of one target pass.

Leviathan et al.'s walltime theorem assumes the target verifies gamma + 1 tokens in the time of
one decode step. A decode step at batch b is b tokens through every weight matrix; verifying
gamma drafts makes it b (gamma + 1) tokens. Each matmul takes the longer of its bytes at HBM
bandwidth and its FLOPs at the dense peak -- the metrics post's roofline (matmul_flops,
matmul_bytes, attainable_flops) -- and attention reads each sequence's KV cache once. While
b (gamma + 1) stays far below the ridge point (about 206 tokens for bf16 on an H200) the extra
tokens ride along with the weight reads; past it they cost compute in proportion.
This is a model, not a measurement: no kernel reaches the roofline, and small kernels take
microseconds of their own; the page sets it beside what the H200 measured.
"""

from __future__ import annotations

from dataclasses import asdict

from snippets.common.hardware import load_hardware
from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.common.results import computed_result
from snippets.metrics.roofline import (
    arithmetic_intensity,
    attainable_flops,
    matmul_bytes,
    matmul_flops,
)
from snippets.speculative_decoding.theory import expected_tokens


# --8<-- [start:model]
def pass_seconds(cfg: dict, batch: int, tokens: int, context: int, peak: float,
                 bandwidth: float, bytes_per_element: int = 2) -> float:  # fmt: skip
    """Roofline time of one pass of a dense Qwen3 model (config dict) over `tokens` new tokens
    for each of `batch` sequences with `context` tokens cached: every matmul at
    min(peak, intensity x bandwidth), attention as a read of the KV cache (2 bytes per
    element) and its FLOPs."""
    m = batch * tokens
    h, d, i = cfg["hidden_size"], cfg["head_dim"], cfg["intermediate_size"]
    hq, hkv, v = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]
    shapes = [(h, hq * d), (h, hkv * d), (h, hkv * d), (hq * d, h), (h, i), (h, i), (i, h)]
    total = 0.0
    for k, n in shapes * cfg["num_hidden_layers"] + [(h, v)]:  # the layers, then the LM head
        flops = matmul_flops(m, n, k)
        total += flops / attainable_flops(
            arithmetic_intensity(flops, matmul_bytes(m, n, k, bytes_per_element)), peak, bandwidth
        )
    kv_bytes = batch * context * 2 * hkv * d * bytes_per_element * cfg["num_hidden_layers"]
    attn_flops = 4 * m * context * hq * d * cfg["num_hidden_layers"]  # QK^T and PV
    total += max(kv_bytes / bandwidth, attn_flops / peak)
    return total


def modelled_speedup(target: dict, draft: dict, alpha: float, gamma: int, batch: int,
                     context: int, peak: float, bandwidth: float) -> dict:  # fmt: skip
    """Eq. 1's tokens per round over the round's modelled time (gamma draft steps and one
    verification of gamma + 1 tokens), against a target decode step, at one batch size."""
    step = pass_seconds(target, batch, 1, context, peak, bandwidth)
    verify = pass_seconds(target, batch, gamma + 1, context, peak, bandwidth)
    drafting = gamma * pass_seconds(draft, batch, 1, context, peak, bandwidth)
    return {"batch": batch, "verify_of_step": verify / step, "c": drafting / gamma / step,
            "speedup": expected_tokens(alpha, gamma) * step / (drafting + verify)}  # fmt: skip


# --8<-- [end:model]


# --8<-- [start:h200]
h200 = load_hardware()["h200-sxm"]
PEAK, BW = h200.bf16_dense_tflops * 1e12, h200.hbm_tb_per_s * 1e12
qwen3 = load_qwen3_configs()
TARGET, DRAFT = asdict(qwen3["qwen3-8b"].config), asdict(qwen3["qwen3-0.6b"].config)
ALPHA, GAMMA, CONTEXT = 0.8, 4, 2048  # inputs of the page's choosing (alpha: Table 3's range)
BATCHES = [1, 4, 16, 32, 64, 128, 256, 512]
curve = [modelled_speedup(TARGET, DRAFT, ALPHA, GAMMA, b, CONTEXT, PEAK, BW) for b in BATCHES]
print([(r["batch"], round(r["speedup"], 2)) for r in curve])
#> [(1, 2.45), (4, 2.2), (16, 1.67), (32, 1.38), (64, 1.08), (128, 0.87), (256, 0.77), (512, 0.77)]
# --8<-- [end:h200]

computed_result("speculative-decoding", "batch-model", {
    "alpha": ALPHA, "gamma": GAMMA, "context": CONTEXT, "curve": curve,
})  # fmt: skip
