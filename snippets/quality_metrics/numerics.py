"""What bf16 does to the numbers a quality metric is computed from, on the CPU.

The model's logits are fp32 (made by integer arithmetic, synthetic.py); the reference is their
log_softmax in fp64. Two roundings are separated: of the logits before log_softmax (a bf16
model's output), and of the log-probabilities after it (a metric stored or computed in bf16).
Both are conversions between IEEE formats, correctly rounded on every machine, so the record is
the same everywhere; PyTorch's own kernels are measured too, and checked against bounds.
"""

import torch

from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.common.results import computed_result
from snippets.quality_metrics.divergence import kl, top1_agreement, top2_margin
from snippets.quality_metrics.synthetic import hashed_logits

U = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}  # unit roundoff

# --8<-- [start:roundings]
VOCAB = load_qwen3_configs()["qwen3-8b"].fields["vocab_size"]  # 151,936
logits = hashed_logits(8, VOCAB, seed=1).float()  # the model's fp32 output: 8 positions
ref = logits.double().log_softmax(-1)  # the reference log-probs, fp64
p = ref.exp()


def roundings(fmt: torch.dtype) -> dict:
    """Round the logits (input) or the log-probs (output) to `fmt`; how far each moves the
    log-probs (max over every token), and KL(reference || rounded) per position."""
    logp_in = logits.to(fmt).double().log_softmax(-1)  # logits rounded, then exact
    logp_out = ref.to(fmt).double()  # exact log-probs, then rounded
    kl_out = (p * (ref - logp_out)).sum(-1)  # no longer a KL: logp_out does not normalize
    return {"format": str(fmt).removeprefix("torch."),
            "input_max": (logp_in - ref).abs().max().item(),
            "input_kl": kl(ref, logp_in).max().item(),
            "output_max": (logp_out - ref).abs().max().item(),
            "output_kl": kl_out.abs().max().item(),
            "output_kl_negative": bool((kl_out < 0).any())}  # fmt: skip


rows = [roundings(fmt) for fmt in (torch.float32, torch.float16, torch.bfloat16)]
for r in rows:
    moved = f"{r['input_max']:.1e} {r['input_kl']:.0e} {r['output_max']:.1e} {r['output_kl']:.0e}"
    print(f"{r['format']:9}", moved, r["output_kl_negative"])
    #> float32   0.0e+00 0e+00 9.2e-07 3e-07 True
    #> float16   4.0e-03 2e-06 7.8e-03 5e-05 True
    #> bfloat16  3.2e-02 1e-04 6.2e-02 4e-04 True
# --8<-- [end:roundings]

# --8<-- [start:kernels]
# PyTorch's CPU kernels on the same logits: their error stays inside the rounding bounds, and
# the fp32 kernel's error is far below what one bf16 rounding does.
fp32_kernel = (logits.log_softmax(-1).double() - ref).abs().max().item()
bf16_kernel = logits.bfloat16().log_softmax(-1).double()  # bf16 in, bf16 out
bf16_bound = U[torch.bfloat16] * (2 * logits.abs().amax(-1, keepdim=True) + 2 * ref.abs())
inside = bool(((bf16_kernel - ref).abs() <= bf16_bound).all())
print(fp32_kernel * 100 < rows[2]["output_max"], inside)
#> True True
# --8<-- [end:kernels]

# --8<-- [start:agreement]
# top-1 agreement between fp32 logits and their bf16 rounding, over 1024 positions: a flip can
# only happen where the reference's top-2 margin is within the two logits' rounding errors
many = hashed_logits(1024, 4096, seed=2).float()
rounded = many.bfloat16().float()
flips = many.argmax(-1) != rounded.argmax(-1)
top2 = many.topk(2, dim=-1).values
reach = U[torch.bfloat16] * top2.abs().sum(-1)  # |rounding of z1| + |rounding of z2| at most
agreement = top1_agreement(many, rounded)
print(f"{agreement:.4f}", bool((top2_margin(many)[flips] <= reach[flips]).all()))
#> 0.9707 True
# --8<-- [end:agreement]

computed_result(
    "quality-metrics",
    "numerics",
    {"vocab": VOCAB, "rows": rows, "agreement_bf16": agreement, "flips_bf16": int(flips.sum()),
     "positions": many.shape[0]},
)  # fmt: skip
