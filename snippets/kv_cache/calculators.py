"""The page's calculator, Python side: KV bytes, capacity and the decode bound for one model.

It turns the form's inputs into a config and calls formulas.py; docs/assets/calculator.js repeats
it term by term, and both are checked on tests/fixtures/calculators/kv-cache.json
(snippets/common/calculator.py). The presets come from data/kv_presets.yaml's menu and
data/hardware.yaml.
"""

from __future__ import annotations

import inspect

from snippets.common.calculator import Calculator
from snippets.common.models.kv_presets import load_kv_presets
from snippets.kv_cache.formulas import (
    decode_bytes,
    decode_floor_s,
    kv_budget,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    max_sequences,
)
from snippets.metrics.calculators import gpu_presets
from snippets.metrics.qwen3 import qwen3_params


# --8<-- [start:config]
def form_config(layers, kv_heads, head_dim, kv_lora_rank, rope_dim, window, window_pattern):
    """The config dict formulas.py reads, from the form's fields (0 = the field is absent)."""
    if not (kv_lora_rank or (kv_heads and head_dim)):
        raise ValueError("give kv_heads and head_dim, or kv_lora_rank (MLA)")
    if kv_lora_rank:  # MLA: the latent and the decoupled RoPE key
        cfg = {"kv_lora_rank": kv_lora_rank, "qk_rope_head_dim": rope_dim}
    else:  # MHA / GQA / MQA: kv_heads K and V heads of head_dim each
        cfg = {"num_attention_heads": kv_heads, "num_key_value_heads": kv_heads,
               "head_dim": head_dim}  # fmt: skip
    cfg["num_hidden_layers"] = layers
    if window:
        cfg["sliding_window"] = window
    if window_pattern:
        cfg["sliding_window_pattern"] = window_pattern
    return cfg


def model_fields(cfg: dict) -> dict:
    """The form's fields of a model's config: what form_config turns back into it."""
    mla = "kv_lora_rank" in cfg
    heads = cfg["num_attention_heads"]
    return {
        "layers": cfg["num_hidden_layers"],
        "kv_heads": 0 if mla else cfg.get("num_key_value_heads", heads),
        "head_dim": 0 if mla else cfg.get("head_dim") or cfg["hidden_size"] // heads,
        "kv_lora_rank": cfg.get("kv_lora_rank", 0),
        "rope_dim": cfg.get("qk_rope_head_dim", 0),
        "window": cfg.get("sliding_window") or 0,
        "window_pattern": cfg.get("sliding_window_pattern") or 0,
    }


# --8<-- [end:config]


# --8<-- [start:calculator]
def kv_calculator(layers, kv_heads, head_dim, kv_lora_rank, rope_dim, window, window_pattern,
                  kv_format, group, context, batch, gpus, memory_gb, bandwidth_tb_s,
                  params_b, read_b, weight_bytes, workspace_gb, utilization) -> dict:  # fmt: skip
    """Bytes per token and per sequence, how many sequences of `context` tokens fit on `gpus`
    GPUs (their memory and bandwidth pooled), and the decode step's bandwidth bound at `batch`.
    group = 0: one scale per tensor. The weights: params_b resident, read_b read every step."""
    for name, n in (("context", context), ("batch", batch), ("gpus", gpus)):
        if n < 1 or n != int(n):
            raise ValueError(f"{name} must be a whole number >= 1, got {n}")
    cfg = form_config(layers, kv_heads, head_dim, kv_lora_rank, rope_dim, window, window_pattern)
    group = group or None
    per_seq = kv_bytes_per_sequence(cfg, context, kv_format, group)
    try:
        budget = kv_budget(gpus * memory_gb * 1e9, params_b * 1e9 * weight_bytes,
                           gpus * workspace_gb * 1e9, utilization)  # fmt: skip
        fit = max_sequences(budget, cfg, context, kv_format, group)
    except ValueError:  # the weights and the workspace leave no room
        budget, fit = 0, 0
    weights_read = read_b * 1e9 * weight_bytes
    step = decode_floor_s(weights_read, [per_seq] * int(batch), gpus * bandwidth_tb_s * 1e12)
    return {
        "per_token": kv_bytes_per_token(cfg, kv_format, group),
        "per_seq": per_seq,
        "budget": budget,
        "max_seqs": fit,
        "step_ms": step * 1e3,
        "tokens_per_s": batch / step,
        "kv_share": 1 - weights_read / decode_bytes(weights_read, [per_seq] * int(batch)),
    }


# --8<-- [end:calculator]


# --8<-- [start:presets]
def model_presets() -> list[dict]:
    """data/kv_presets.yaml's menu: each model's fields and parameter counts (billions)."""
    out = []
    for p in load_kv_presets():
        if p.params_b is None:  # a Qwen3 model: resident = every tensor, read = the matmuls
            n = qwen3_params(p.config)
            total, read = n["total"] / 1e9, n["matmul"] / 1e9
        else:  # as printed; a mixture of experts reads at least its active parameters
            total, read = float(p.params_b), float(p.active_b or p.params_b)
        fields = model_fields(p.config) | {"params_b": total, "read_b": read}
        out.append({"id": p.id, "label": p.label, "values": fields})
    return out


# --8<-- [end:presets]

QWEN3_8B = model_presets()[0]["values"]
KV_DEFAULTS = {
    "utilization": inspect.signature(kv_budget).parameters["utilization"].default,  # vLLM's
}
CALCULATORS = {
    "kv-cache": Calculator(
        kv_calculator,
        cases=[
            {**p["values"], "kv_format": fmt, "group": group, "context": context, "batch": batch,
             "gpus": gpus, "memory_gb": 141, "bandwidth_tb_s": 4.8, "weight_bytes": wb,
             "workspace_gb": 4.0, "utilization": 0.9}
            for p in model_presets()
            for fmt, group, context, batch, gpus, wb in (
                ("bf16", 0, 8192, 32, 1, 2),
                ("fp8", 0, 32768, 1, 8, 1),
                ("int4", 64, 131072, 7, 2, 2),
            )
        ]
        + [{**QWEN3_8B, "kv_format": "int8", "group": 32, "context": 1, "batch": 1, "gpus": 1,
            "memory_gb": 80, "bandwidth_tb_s": 3.35, "weight_bytes": 2, "workspace_gb": 100.0,
            "utilization": 0.9}],  # no room: nothing fits
        presets={
            "models": model_presets(),
            "gpus": gpu_presets(memory_gb="memory_gb", bandwidth_tb_s="hbm_tb_per_s"),
        },
        defaults=KV_DEFAULTS,
    ),
}  # fmt: skip

# --8<-- [start:demo]
# The page's example of section 4 in the form: Qwen3-8B, bf16, one H200, 8192 tokens each
h200 = next(g for g in CALCULATORS["kv-cache"].presets["gpus"] if g["id"] == "h200-sxm")
form = {"kv_format": "bf16", "group": 0, "context": 8192, "batch": 32, "gpus": 1,
        "weight_bytes": 2, "workspace_gb": 4, "utilization": 0.9}  # fmt: skip
shown = kv_calculator(**QWEN3_8B, **h200["values"], **form)
print(shown["max_seqs"], round(shown["per_token"] / 2**10))  # sequences, KiB per token
#> 88 144
# --8<-- [end:demo]
