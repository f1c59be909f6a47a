"""KV offload: reloading a cached prefix's KV from host memory versus recomputing it."""

from __future__ import annotations

from snippets.common.datafile import load_host_links
from snippets.common.hardware import load_hardware
from snippets.common.models.kv_configs import kv_config
from snippets.common.results import computed_result
from snippets.kv_cache.formulas import kv_bytes_per_sequence, kv_bytes_per_token
from snippets.metrics.qwen3 import qwen3_params


# --8<-- [start:model]
def reload_s(kv_bytes: float, link_bytes_per_s: float) -> float:
    """Seconds to copy a prefix's KV (every layer) over one direction of a host link."""
    if link_bytes_per_s <= 0:
        raise ValueError(f"a link needs a positive bandwidth (bytes/s), got {link_bytes_per_s}")
    return kv_bytes / link_bytes_per_s


def prefill_flops(cfg: dict, tokens: int) -> float:
    """Forward FLOPs that recompute the KV of a `tokens`-token prefix of a dense Qwen3 model:
    2 per layer weight and token (no LM head: a prefix needs no logits), plus causal attention,
    where token t (0-based) scores and sums t + 1 keys: 4 d_h (t + 1) FLOPs per query head and
    layer, 2 L n_q d_h T (T + 1) over the prefix."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    weights = 2 * qwen3_params(cfg)["layers"] * tokens
    heads = cfg["num_hidden_layers"] * cfg["num_attention_heads"] * cfg["head_dim"]
    return weights + 2 * heads * tokens * (tokens + 1)


def recompute_s(flops: float, flops_per_s: float) -> float:
    """Seconds to recompute at a given rate (the peak gives a lower bound)."""
    return flops / flops_per_s


def break_even_tokens_per_s(kv_bytes_per_token: float, link_bytes_per_s: float) -> float:
    """The prefill throughput (tokens/s) above which recomputing a prefix is faster than
    reloading its KV over the link."""
    return link_bytes_per_s / kv_bytes_per_token


# --8<-- [end:model]

# --8<-- [start:run]
model = kv_config("qwen3-8b")
peak = load_hardware()["h200-sxm"].bf16_dense_tflops * 1e12  # dense bf16 peak of the H200
one_way = {name: link["total_gb_per_s"] / 2 * 1e9 for name, link in load_host_links().items()}
# vLLM's offloading blog (blog.vllm.ai, 2026-01-08) measured up to about 50 GB/s in one
# direction between an H100 and its host: what DMA copies reach, against PCIe Gen5's 64
one_way["pcie-measured"] = 50e9
per_token = kv_bytes_per_token(model)
rows = []
for link in ("pcie-gen5-x16", "pcie-measured", "nvlink-c2c"):
    even = break_even_tokens_per_s(per_token, one_way[link]) / 1e3  # k tokens/s
    for tokens in (1024, 8192, 32768):
        reload = reload_s(kv_bytes_per_sequence(model, tokens), one_way[link])
        recompute = recompute_s(prefill_flops(model, tokens), peak)
        rows.append({"link": link, "gb_s": one_way[link] / 1e9, "tokens": tokens,
                     "reload_ms": 1e3 * reload, "recompute_ms": 1e3 * recompute,
                     "ratio": recompute / reload,
                     "break_even_ktok_s": even})  # fmt: skip
peak_prefill = 1024 / recompute_s(prefill_flops(model, 1024), peak) / 1e3  # k tokens/s
print(per_token // 1024, round(peak_prefill), sorted({round(r["break_even_ktok_s"]) for r in rows}))
#> 144.0 70 [339, 434, 3052]
print([round(r["ratio"], 1) for r in rows])
#> [6.2, 7.2, 10.3, 4.9, 5.6, 8.1, 43.8, 50.3, 72.7]
# --8<-- [end:run]

computed_result(
    "kv-cache",
    "offload",
    {
        "kv_kib_per_token": per_token / 2**10,
        "peak_prefill_ktok_s": peak_prefill,
        "rows": rows,
    },
)
