"""What an accelerated path changes in a trained model's output, measured against its fp32 self.

Every path starts from the same trained weights:
  round        the fp32 model's logits rounded to bf16: section 7.1's input rounding, alone
  bf16         weights and activations in bf16, eager PyTorch
  triton       bf16 with the triton-kernels post's RMSNorm, RoPE and SwiGLU at the model's
               `Kernels` swap points (fp32 on the CPU, whose Triton interpreter mangles bf16)
  fp8_*, int8_*  bf16 with the decoder's linear weights stored in FP8 E4M3 or INT8 (weight-only),
               one scale per tensor or per output row
The reference is the fp32 model with IEEE fp32 matmuls. Per slice of held-out rows, each path
gets the forward KL(reference || path) per position (mean and 99th percentile), top-1 agreement
and the change of the cross-entropy; log-softmax and KL in fp64 (section 7: the metric's own
error must stay far below what it measures).

The verdict borrows the precision-alignment post's rule for "only rounding": its end-to-end gate
lets a candidate deviate by at most twice what rounding-only runs deviate (the maximum over those
runs and over time), plus the measurement's resolution. Here the rounding-only runs are `round`
and `bf16`, the slices take the place of time, and the deviations are: the mean and the 99th
percentile of KL, with a factor 4 instead of 2 (KL ~ Var_P(delta) / 2 is quadratic in the logit
perturbation delta: twice the perturbation is four times the KL); the disagreement rate 1 - top-1
(resolution: one position); and |delta CE| (resolution: two fp32 ulps of the loss, as there).
"""

from __future__ import annotations

import copy
import math
import statistics
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from snippets.common.models.qwen3 import Kernels
from snippets.common.train import build_model, rows
from snippets.quality_metrics.divergence import forward_kl, top1_agreement, top2_margin
from snippets.quality_metrics.lm import nll
from snippets.triton_kernels.rmsnorm import TritonRMSNorm
from snippets.triton_kernels.rope import apply_rope as triton_rope
from snippets.triton_kernels.swiglu import swiglu as triton_swiglu

# --8<-- [start:quantize]
FORMATS = {"fp8": (torch.float8_e4m3fn, 448.0), "int8": (torch.int8, 127.0)}  # dtype, largest
GRANULARITIES = ("tensor", "row")


def quantize(w: torch.Tensor, fmt: str, per: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with w ~ q * scale, symmetric absmax scaling: scale = max|w| / qmax over the
    whole tensor (per="tensor", scale [1, 1]) or over each output row (per="row", [out, 1]).
    INT8 rounds w / scale to the nearest integer; FP8 E4M3 to the nearest of its values (a
    float format: 3 mantissa bits at every magnitude, subnormal below 2^-6)."""
    if fmt not in FORMATS or per not in GRANULARITIES:
        raise ValueError(f"format must be one of {sorted(FORMATS)} and granularity one of "
                         f"{GRANULARITIES}, got {fmt!r} and {per!r}")  # fmt: skip
    if w.ndim != 2 or not w.dtype.is_floating_point:
        raise ValueError(f"quantize a [out, in] float weight, got {tuple(w.shape)} {w.dtype}")
    if not bool(torch.isfinite(w).all()):
        raise ValueError("the weight has a non-finite entry: no scale can represent it")
    dtype, qmax = FORMATS[fmt]
    w32 = w.float()
    amax = w32.abs().amax(1, keepdim=True) if per == "row" else w32.abs().amax().view(1, 1)
    scale = torch.where(amax > 0, amax / qmax, 1.0)  # an all-zero row keeps scale 1
    x = (w32 / scale).clamp(-qmax, qmax)  # the division may land a hair above qmax
    q = x.round().to(dtype) if fmt == "int8" else x.to(dtype)
    return q, scale


class QuantLinear(nn.Module):
    """A bias-free nn.Linear whose weight is stored quantized. The forward turns q into the
    activation dtype (exact: every INT8 and E4M3 value is a bf16 value), multiplies as a
    bf16 linear does (fp32 accumulation, output rounded to bf16) and applies the fp32 scale
    to the output columns: one more rounding of the output than the bf16 linear."""

    def __init__(self, linear: nn.Linear, fmt: str, per: str):
        super().__init__()
        if linear.bias is not None:
            raise ValueError("QuantLinear takes bias-free linears (the Qwen3 model's)")
        q, scale = quantize(linear.weight.detach(), fmt, per)
        self.fmt, self.per = fmt, per
        self.register_buffer("q", q)
        self.register_buffer("scale", scale.t().contiguous())  # [1, out]: per output column

    def forward(self, x):
        y = F.linear(x, self.q.to(x.dtype))
        return (y.float() * self.scale).to(x.dtype)


def quantized_copy(model: nn.Module, fmt: str, per: str) -> nn.Module:
    """A copy of `model` whose decoder-layer linears (attention q/k/v/o, MLP gate/up/down) are
    QuantLinear; the embedding and the LM head tied to it stay as they are."""
    out = copy.deepcopy(model)
    for layer in out.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, QuantLinear(child, fmt, per))
    return out


# --8<-- [end:quantize]


# --8<-- [start:paths]
TRITON = Kernels(norm=TritonRMSNorm, rope=triton_rope, mlp_act=triton_swiglu)
ROUNDING = ("round", "bf16")  # rounding only: they set the band
CANDIDATES = ("triton", "fp8_tensor", "fp8_row", "int8_tensor", "int8_row")
PATHS = ROUNDING + CANDIDATES


def path_models(model: nn.Module, kernel_dtype: torch.dtype = torch.bfloat16) -> dict:
    """Every path but `round` (which needs no model) as a model built from `model`'s weights."""
    device = next(model.parameters()).device
    bf16 = copy.deepcopy(model).to(torch.bfloat16).eval()
    with torch.device(device):
        triton = build_model(model.config, TRITON)
    triton.load_state_dict(model.state_dict())
    out = {"bf16": bf16, "triton": triton.to(kernel_dtype).eval()}
    for fmt in FORMATS:
        for per in GRANULARITIES:
            out[f"{fmt}_{per}"] = quantized_copy(bf16, fmt, per).eval()
    return out


@contextmanager
def ieee_fp32():
    """fp32 matmuls in IEEE fp32, no TF32 (precision-alignment §4's strict_numerics, the part
    an fp32 reference needs); the previous setting comes back."""
    m = torch.backends.cuda.matmul
    saved, m.fp32_precision = m.fp32_precision, "ieee"
    try:
        yield
    finally:
        m.fp32_precision = saved


# --8<-- [end:paths]


# --8<-- [start:compare]
@dataclass(frozen=True)
class Plan:
    slices: int  # held-out slices, each its own measurement
    rows_per_slice: int
    seq_len: int | None = None  # tokens per row; None: the model's training length


GPU_PLAN = Plan(slices=8, rows_per_slice=8)  # 8 x 8 x 512 = 32,768 held-out tokens
CPU_PLAN = Plan(slices=2, rows_per_slice=1, seq_len=32)  # the CPU stand-in, Triton interpreted


def heldout_slices(heldout: torch.Tensor, seq_len: int, plan: Plan) -> torch.Tensor:
    """[slices, rows_per_slice, seq_len]: the first rows of the held-out stream, in order;
    rows of plan.seq_len tokens where the plan sets it, else of `seq_len`."""
    seq_len = plan.seq_len or seq_len
    held = rows(heldout, seq_len)
    need = plan.slices * plan.rows_per_slice
    if len(held) < need:
        raise ValueError(f"{plan.slices} slices of {plan.rows_per_slice} rows need {need} held-"
                         f"out rows of {seq_len} tokens; the stream has {len(held)}")  # fmt: skip
    return held[:need].reshape(plan.slices, plan.rows_per_slice, seq_len)


def slice_stats(ref_logits, logits, targets) -> dict:
    """One path on one slice, against the reference: logits [rows, positions, vocab], targets
    [rows, positions]. KL and cross-entropy in fp64."""
    ref64, fast64 = ref_logits.double(), logits.double()
    kl = forward_kl(ref64.log_softmax(-1), fast64.log_softmax(-1)).flatten()
    flipped = (ref_logits.argmax(-1) != logits.argmax(-1)).flatten()
    return {
        "kl_mean": kl.mean().item(),
        "kl_p99": torch.quantile(kl, 0.99).item(),
        "top1": top1_agreement(ref_logits, logits),
        "ce_delta": nll(fast64, targets).mean() - nll(ref64, targets).mean(),
        "flip_margins": top2_margin(ref_logits).flatten()[flipped].float().cpu(),
    }


@torch.no_grad()
def measure(model: nn.Module, slices: torch.Tensor, kernel_dtype=torch.bfloat16) -> dict:
    """Per path, its slice_stats on every slice; the reference's cross-entropy per slice and
    the top-2 margins of all its positions. `model` is the fp32 trained model."""
    device = next(model.parameters()).device
    models = path_models(model, kernel_dtype)
    stats = {name: [] for name in PATHS}
    ref_ce, margins = [], []
    for ids in slices.to(device).long():
        targets = ids[:, 1:]
        with ieee_fp32():
            ref = model(ids)[:, :-1].float()
        ref_ce.append(nll(ref.double(), targets).mean())
        margins.append(top2_margin(ref).flatten().cpu())
        stats["round"].append(slice_stats(ref, ref.to(torch.bfloat16), targets))
        for name, m in models.items():
            stats[name].append(slice_stats(ref, m(ids)[:, :-1], targets))
    return {"stats": stats, "ref_ce": ref_ce, "margins": torch.cat(margins),
            "positions": slices.shape[1] * (slices.shape[2] - 1)}  # fmt: skip


# --8<-- [end:compare]


# --8<-- [start:band]
EPS32 = torch.finfo(torch.float32).eps  # 2^-23: the end-to-end gate's resolution of a loss
RULES = {  # metric: (per-slice deviation from the reference, factor on the rounding-only max)
    "kl": (lambda r: r["kl_mean"], 4.0),  # quadratic in the perturbation: (2x)^2
    "p99": (lambda r: r["kl_p99"], 4.0),
    "flip": (lambda r: 1 - r["top1"], 2.0),
    "ce": (lambda r: abs(r["ce_delta"]), 2.0),
}


def band_ratios(measured: dict) -> dict[str, dict[str, float]]:
    """Per candidate path and metric: its largest deviation over the slices divided by the
    band = factor x (largest deviation of a rounding-only path over the slices) + resolution.
    A ratio <= 1 reads: this path changes the output no more than rounding does."""
    stats = measured["stats"]
    resolution = {"kl": 0.0, "p99": 0.0, "flip": 1 / measured["positions"],
                  "ce": 2 * EPS32 * max(measured["ref_ce"])}  # fmt: skip
    out = {name: {} for name in stats if name not in ROUNDING}
    for metric, (deviation, factor) in RULES.items():
        envelope = max(deviation(r) for name in ROUNDING for r in stats[name])
        band = factor * envelope + resolution[metric]
        if band <= 0:
            raise ValueError(f"{metric}: the rounding-only paths changed nothing, so there is "
                             "no band to judge the others by")  # fmt: skip
        for name in out:
            out[name][f"{metric}_ratio"] = max(deviation(r) for r in stats[name]) / band
    return out


# --8<-- [end:band]


# --8<-- [start:summary]
def summarize(measured: dict) -> dict:
    """The record: per slice and path the mean KL and the perplexity change; per path the
    median over slices (with the range where the page shows one); the band ratios."""
    stats, median = measured["stats"], statistics.median
    per_slice, paths = [], []
    for name, rows_ in stats.items():
        ppl = [math.expm1(r["ce_delta"]) for r in rows_]  # PPL_path / PPL_ref - 1
        kl = [r["kl_mean"] for r in rows_]
        per_slice += [{"path": name, "slice": s, "kl_mean": k, "ppl_delta": p}
                      for s, (k, p) in enumerate(zip(kl, ppl, strict=True))]  # fmt: skip
        at_flips = torch.cat([r["flip_margins"] for r in rows_])  # margins where top-1 differs
        paths.append({
            "path": name,
            "kl_mean": median(kl), "kl_mean_min": min(kl), "kl_mean_max": max(kl),
            "kl_p99": median(r["kl_p99"] for r in rows_),
            "top1": median(r["top1"] for r in rows_), "top1_min": min(r["top1"] for r in rows_),
            "ppl_delta": median(ppl), "ppl_delta_min": min(ppl), "ppl_delta_max": max(ppl),
            "flips": int(at_flips.numel()),
            "flip_margin": at_flips.median().item() if at_flips.numel() else None,
        })  # fmt: skip
    ratios = band_ratios(measured)
    ref_ppl = [math.exp(ce) for ce in measured["ref_ce"]]
    return {
        "slices": len(measured["ref_ce"]), "positions": measured["positions"],
        "ref_ppl": median(ref_ppl), "ref_ppl_min": min(ref_ppl), "ref_ppl_max": max(ref_ppl),
        "margin_median": measured["margins"].median().item(),
        "paths": paths, "per_slice": per_slice,
        "band": [{"path": name, **r} for name, r in ratios.items()],
    }  # fmt: skip


# --8<-- [end:summary]
