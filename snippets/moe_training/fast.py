"""The MoE layer's expert part on the Triton kernels: route, sort by expert (permute), two grouped
GEMMs around SwiGLU, put back weighted (unpermute). Same weights and routing as
snippets/moe_training/layer.py's MoeLayer, so the two are compared output for output."""

import torch

from snippets.moe_training.grouped_gemm import grouped_linear
from snippets.moe_training.layer import MoeLayer, capacity, keep_mask, route, swiglu
from snippets.moe_training.permute import permute, routing_map, unpermute


# --8<-- [start:fast]
def moe_forward_fast(layer: MoeLayer, x: torch.Tensor):
    cfg, flat = layer.cfg, x.reshape(-1, x.shape[-1])
    r = route(layer.gate(flat), cfg, layer.bias if layer.bias.any() else None)
    cap = capacity(flat.shape[0], cfg)
    rmap = routing_map(r.experts, cfg.experts, None if cap is None else keep_mask(r.experts, cap))
    xp = permute(flat, rmap)  # [kept slots, H], grouped by expert
    h = swiglu(grouped_linear(xp, layer.gate_up_proj, rmap.offsets))
    y = grouped_linear(h, layer.down_proj, rmap.offsets)
    out = unpermute(y, r.weights, rmap)
    if cfg.shared_inter:
        out = out + layer.shared_down(swiglu(layer.shared_gate_up(flat)))
    return out.view_as(x), r


# --8<-- [end:fast]
