"""Expert-parallel communication: bytes per token per layer, and a time model of DeepEP's
dispatch and combine, checked against the bandwidths DeepEP published for H800 (NVLink and
InfiniBand figures from data/interconnects.yaml), then used to predict H200 nodes.
A model, not a measurement: nothing here ran on a GPU."""

from __future__ import annotations

from math import comb

import torch

from snippets.common.datafile import DATA, load_entries
from snippets.common.results import computed_result

LINKS = {k: v["gb_per_s"] for k, v in load_entries(DATA / "interconnects.yaml", "links", "link",
                                                    ("gb_per_s",)).items()}  # fmt: skip


# --8<-- [start:volume]
def fp8_row_bytes(hidden: int) -> float:
    """One token in FP8 with DeepSeek-V3's 1x128 scaling: a byte per element, an fp32 scale
    per 128 elements (DeepEP's count; its low-latency kernels add 16 bytes of metadata)."""
    return hidden + hidden / 128 * 4


def remote_ranks(experts: int, top_k: int, ranks: int) -> float:
    """Expected number of other ranks one token's k distinct experts live on (E/R experts per
    rank, the k drawn uniformly): (R - 1) * (1 - C(E - E/R, k) / C(E, k))."""
    per = experts // ranks
    return (ranks - 1) * (1 - comb(experts - per, top_k) / comb(experts, top_k))


def a2a_bytes_per_token(hidden, experts, top_k, ranks, dedup: bool, dispatch_fp8: bool = True):
    """Bytes one token sends to other ranks in one MoE layer: dispatch, then combine (the
    same rows come back, BF16). Without dedup every (token, expert) pair is a row, as in a
    plain all-to-all (k (R-1)/R remote rows); DeepEP sends a token once per destination rank."""
    rows = remote_ranks(experts, top_k, ranks) if dedup else top_k * (ranks - 1) / ranks
    dispatch = rows * (fp8_row_bytes(hidden) if dispatch_fp8 else 2 * hidden)
    return {"rows": rows, "dispatch": dispatch, "combine": rows * 2 * hidden}


# --8<-- [end:volume]


# --8<-- [start:routing]
def deepep_test_routing(tokens, experts, nodes, top_k=8, seed=0):
    """The routing DeepEP's tests draw (tests/legacy/test_internode.py): scores |N(0,1)| + 1,
    experts in one group per node, the best min(nodes, 4) groups by their max score, then the
    top k experts inside them."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(tokens, experts, generator=gen).abs() + 1
    groups = min(nodes, 4)
    best = scores.view(tokens, nodes, -1).amax(-1).topk(groups, dim=-1).indices
    allowed = torch.zeros(tokens, nodes, dtype=torch.bool).scatter_(1, best, True)
    masked = scores.view(tokens, nodes, -1).masked_fill(~allowed[..., None], -1).view(tokens, -1)
    return masked.topk(top_k, dim=-1).indices


# --8<-- [end:routing]


# --8<-- [start:normal]
def normal_kernel_gbps(tokens, hidden, experts, ranks, nvlink, rdma, seed=0):
    """DeepEP's normal (high-throughput) dispatch, as its tests count it: intranode (one node of
    8) the NVLink bytes each GPU receives over the time; internode the RDMA bytes of every
    (token, destination node) pair, its own node included, over the time. The time: the busier
    of the two links, every byte at its link's bandwidth (RDMA carries the pairs to other
    nodes; NVLink, in the receiving node, the (token, rank) pairs to other GPUs)."""
    nodes = max(1, ranks // 8)
    chosen = deepep_test_routing(tokens, experts, nodes, seed=seed)  # this rank's tokens
    rank_of, node_of = chosen // (experts // ranks), chosen // (experts // nodes)
    # which ranks / nodes each token goes to; this is rank 0 of node 0 (the routing is the same
    # on every rank, so what it receives matches what it sends)
    to_rank = torch.nn.functional.one_hot(rank_of, ranks).any(1)  # [T, ranks]
    to_node = torch.nn.functional.one_hot(node_of, nodes).any(1)
    row = fp8_row_bytes(hidden)
    nvl_rows = to_rank[:, 1:].sum().item()  # to the other GPUs
    if nodes == 1:
        seconds = nvl_rows * row / (nvlink * 1e9)
        return to_rank.sum().item() * row / seconds / 1e9
    logical = to_node.sum().item() * row  # as the test counts: own node included
    remote = to_node[:, 1:].sum().item() * row
    seconds = max(remote / (rdma * 1e9), nvl_rows * row / (nvlink * 1e9))
    return logical / seconds / 1e9


# --8<-- [end:normal]


# --8<-- [start:lowlatency]
def low_latency_us(tokens, hidden, top_k, ranks, nvlink, rdma, row_bytes, fixed_us):
    """DeepEP's low-latency kernels send every (token, expert) pair (no dedup). Pairs for the
    GPUs of the same node go over NVLink, the rest over RDMA, at the same time; plus a fixed
    latency. Returns (microseconds, GB/s as the test counts it: all pairs over the time)."""
    pairs = tokens * top_k * row_bytes
    remote_node = pairs * max(0.0, 1 - 8 / ranks)  # k experts spread evenly over the ranks
    same_node = pairs * (min(ranks, 8) - 1) / ranks
    us = fixed_us + max(remote_node / (rdma * 1e3), same_node / (nvlink * 1e3))
    return us, pairs / us / 1e3


# --8<-- [end:lowlatency]

# --8<-- [start:deepep]
# DeepEP docs/legacy.md (V1 on H800, CX7 400 Gb/s): normal kernels with 4096 tokens, hidden
# 7168, top-4 groups, top-8 of 256 experts, FP8 dispatch, BF16 combine; low-latency kernels
# with 128 tokens, top-8, FP8 dispatch, BF16 combine.
PUBLISHED_NORMAL = {8: (153, 158), 16: (43, 43), 32: (58, 57), 64: (51, 50)}  # GB/s
# us and GB/s of dispatch, then of combine
PUBLISHED_LL = {8: (77, 98, 114, 127), 16: (118, 63, 195, 74), 32: (155, 48, 273, 53),
                64: (173, 43, 314, 46), 128: (192, 39, 369, 39),
                256: (194, 39, 360, 40)}  # fmt: skip
H, NVL, IB = 7168, LINKS["h800-nvlink"], LINKS["cx7-ib-400g"]
DISPATCH_ROW, COMBINE_ROW = H + H / 128 * 4 + 16, 2 * H  # tests/legacy/test_low_latency.py


def fitted_latency(row_bytes, published_us, ranks=256):
    """The fixed latency that makes the model hit one published row (EP256, almost all RDMA)."""
    return published_us - low_latency_us(128, H, 8, ranks, NVL, IB, row_bytes, 0.0)[0]


FIXED = {
    "dispatch": fitted_latency(DISPATCH_ROW, PUBLISHED_LL[256][0]),
    "combine": fitted_latency(COMBINE_ROW, PUBLISHED_LL[256][2]),
}
rows = []
for ranks, (d_pub, c_pub) in PUBLISHED_NORMAL.items():
    model = normal_kernel_gbps(4096, H, 256, ranks, NVL, IB)
    for kind, pub in (("dispatch", d_pub), ("combine", c_pub)):  # same rows, either way
        rows.append({"kernel": "normal", "kind": kind, "ep": ranks, "published_gbps": pub,
                     "model_gbps": model, "ratio": model / pub})  # fmt: skip
for ranks, (d_us, d_pub, c_us, c_pub) in PUBLISHED_LL.items():
    for kind, row, us_pub, pub in (("dispatch", DISPATCH_ROW, d_us, d_pub),
                                   ("combine", COMBINE_ROW, c_us, c_pub)):  # fmt: skip
        us, gbps = low_latency_us(128, H, 8, ranks, NVL, IB, row, FIXED[kind])
        rows.append({"kernel": "low-latency", "kind": kind, "ep": ranks, "published_gbps": pub,
                     "model_gbps": gbps, "ratio": gbps / pub, "published_us": us_pub,
                     "model_us": us, "fitted": "拟合" if ranks == 256 else "预测"})  # fmt: skip
checked = [r for r in rows if r.get("fitted") != "拟合"]
print(len(checked), all(0.7 <= r["ratio"] <= 1.3 for r in checked))
#> 18 True
print({k: round(v) for k, v in FIXED.items()})
#> {'dispatch': 47, 'combine': 76}
# --8<-- [end:deepep]

# --8<-- [start:h200]
# The same model with H200's NVLink (its printed peak, one way): an upper bound, since DeepEP
# reached 153 of H800's 160 GB/s intranode. InfiniBand unchanged (CX7 400 Gb/s).
H200_NVL = LINKS["h200-nvlink"]
predict = []
for ranks in (8, 16, 32, 64):
    predict.append({"ep": ranks,
                    "h800_gbps": normal_kernel_gbps(4096, H, 256, ranks, NVL, IB),
                    "h200_gbps": normal_kernel_gbps(4096, H, 256, ranks, H200_NVL,
                                                    IB)})  # fmt: skip
predict_ll = []
for ranks in (8, 16, 64, 256):
    for kind, row in (("dispatch", DISPATCH_ROW), ("combine", COMBINE_ROW)):
        h800 = low_latency_us(128, H, 8, ranks, NVL, IB, row, FIXED[kind])[0]
        h200 = low_latency_us(128, H, 8, ranks, H200_NVL, IB, row, FIXED[kind])[0]
        predict_ll.append({"kind": kind, "ep": ranks, "h800_us": h800, "h200_us": h200})
for p in predict[:4]:
    print(p["ep"], round(p["h800_gbps"]), round(p["h200_gbps"]))
    #> 8 183 515
    #> 16 52 100
    #> 32 67 67
    #> 64 57 57
# --8<-- [end:h200]

# --8<-- [start:per_token]
DSV3 = {"hidden": 7168, "experts": 256, "top_k": 8}
volumes = []
for ranks in (8, 16, 32, 64, 256):
    for dedup in (False, True):
        v = a2a_bytes_per_token(DSV3["hidden"], DSV3["experts"], DSV3["top_k"], ranks, dedup)
        volumes.append({"ep": ranks, "dedup": dedup, "rows": v["rows"],
                        "dispatch_kib": v["dispatch"] / 1024,
                        "combine_kib": v["combine"] / 1024})  # fmt: skip
# --8<-- [end:per_token]

computed_result("moe-training", "comm-model", {
    "deepep": rows, "fixed_us": FIXED, "predict": predict, "predict_ll": predict_ll,
    "volumes": volumes,
    "links": {"h800_nvlink": NVL, "ib": IB, "h200_nvlink": H200_NVL},
    "worst_ratio": max(abs(r["ratio"] - 1) for r in checked),
})  # fmt: skip
