"""Weight synchronisation: bytes of the policy over a link's bandwidth (a model, not a timing)."""

from snippets.common.datafile import load_host_links
from snippets.common.hardware import load_hardware
from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.common.results import computed_result
from snippets.metrics.qwen3 import qwen3_params


# --8<-- [start:model]
def sync_seconds(n_params: float, gb_per_s: float, bytes_per_param: int = 2) -> float:
    """Lower bound on one full weight sync: every parameter crosses the link once, at its peak
    one-way bandwidth (no latency, no overlap, no resharding)."""
    if n_params <= 0 or gb_per_s <= 0 or bytes_per_param <= 0:
        raise ValueError(f"need positive sizes and bandwidth, got {n_params}, {gb_per_s}")
    return n_params * bytes_per_param / (gb_per_s * 1e9)


links = {name: link["total_gb_per_s"] / 2 for name, link in load_host_links().items()}  # one way
links["h200-hbm-copy"] = load_hardware()["h200-sxm"].hbm_tb_per_s * 1e3 / 2  # read + write
models = {m: qwen3_params(c.fields)["total"] for m, c in load_qwen3_configs().items()}
rows = [{"model": m, "link": name, "gb": n * 2 / 1e9, "seconds": sync_seconds(n, bw)}
        for m, n in models.items() for name, bw in links.items()]  # fmt: skip
for r in rows:
    if r["model"] == "qwen3-8b":
        print(r["link"], f"{r['seconds']:.3f} s")
        #> pcie-gen5-x16 0.256 s
        #> nvlink-c2c 0.036 s
        #> h200-hbm-copy 0.007 s
# --8<-- [end:model]

# --8<-- [start:step]
# verl's one-step-off recipe (docs/advance/one_step_off.md) lists a colocated DAPO step of
# Qwen2.5-Math-7B on H20 GPUs (vLLM + FSDP2) at 749 s; 8B parameters over PCIe are a sliver.
VERL_STEP_S = 749
at = {(r["model"], r["link"]): r["seconds"] for r in rows}
pcie_8b = at["qwen3-8b", "pcie-gen5-x16"]
print(f"{pcie_8b / VERL_STEP_S:.1e}")
#> 3.4e-04
# --8<-- [end:step]

computed_result(
    "rl-training",
    "weight-sync",
    {"rows": rows, "verl_step_s": VERL_STEP_S, "pcie_8b_share": pcie_8b / VERL_STEP_S},
)
