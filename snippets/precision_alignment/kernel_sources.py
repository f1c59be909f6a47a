"""Sources of difference that sit in the kernels themselves: where the casts are (RMSNorm), how
many times an intermediate is rounded (SwiGLU fused or not), and how the shape of a split
reduction changes the bits (RMSNorm's dW).

The kernels run on DEVICE; the low-precision dtype is fp16 in the CPU interpreter and bf16 on
the GPU. Only booleans are printed: the bits themselves differ between devices.
"""

import torch
import torch.nn.functional as F

from snippets.common.device import DEVICE, LOW_PRECISION
from snippets.precision_alignment.metrics import ulp_distance
from snippets.triton_kernels.numerics import rmsnorm_exact, swiglu_exact, unit_roundoff, within
from snippets.triton_kernels.rmsnorm import RMSNormFunction
from snippets.triton_kernels.swiglu import swiglu


# --8<-- [start:cast]
def rmsnorm_hf(x, w, eps):
    """Qwen3 in transformers: statistics in fp32, n rounded to x's dtype, then times w."""
    x32 = x.float()
    n = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * n.to(x.dtype)


def rmsnorm_weight_first(x, w, eps):
    """The other common order (flash-attn's Triton norm): times w in fp32, one rounding."""
    x32 = x.float()
    n = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (n * w.float()).to(x.dtype)


# --8<-- [end:cast]


# --8<-- [start:cast_demo]
gen = torch.Generator().manual_seed(0)
for dtype in (torch.float16, torch.bfloat16):  # eager PyTorch: bf16 is fine on the CPU
    x = torch.randn(64, 256, generator=gen).to(dtype)
    w = (0.5 + 1.5 * torch.rand(256, generator=gen)).to(dtype)  # trained weights are not 1
    exact, bound = rmsnorm_exact(x, w, torch.zeros_like(x), 1e-6)
    hf, first = rmsnorm_hf(x, w, 1e-6), rmsnorm_weight_first(x, w, 1e-6)
    both_accurate = within({"y": hf}, exact, bound) and within({"y": first}, exact, bound)
    agree = (hf == first).float().mean().item()
    print(dtype, both_accurate, agree < 0.9, ulp_distance(hf, first).max().item() <= 2)
    #> torch.float16 True True True
    #> torch.bfloat16 True True True
# --8<-- [end:cast_demo]


# --8<-- [start:fused]
def swiglu_eager(gate, up):
    """The model's code: silu(gate) is rounded to the dtype, then the product is rounded."""
    return F.silu(gate) * up


gen = torch.Generator().manual_seed(1)
gate, up = (torch.randn(4, 1024, generator=gen).to(DEVICE, LOW_PRECISION) for _ in range(2))
exact, bound = swiglu_exact(gate, up, torch.zeros_like(gate))  # bound: one rounding
u = unit_roundoff(LOW_PRECISION)
two_roundings = {"h": bound["h"] + (u + u * u) * exact["h"].abs()}
fused, eager = {"h": swiglu(gate, up)}, {"h": swiglu_eager(gate, up)}
print(within(fused, exact, bound), within(eager, exact, bound), within(eager, exact, two_roundings))
#> True False True
# --8<-- [end:fused]


# --8<-- [start:split]
gen = torch.Generator().manual_seed(2)
x, dy = (torch.randn(64, 100, generator=gen).to(DEVICE) for _ in range(2))
w = (1 + 0.1 * torch.randn(100, generator=gen)).to(DEVICE)
dws = []
for rows_per_program in (4, 16):  # 16 or 4 fp32 partial sums of dW, then their sum
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    RMSNormFunction.apply(xr, wr, 1e-6, None, rows_per_program).backward(dy)
    dws.append(wr.grad)
exact, bound = rmsnorm_exact(x, w, dy, 1e-6)
print(torch.equal(*dws), all(within({"dw": d}, exact, bound) for d in dws))
#> False True
# --8<-- [end:split]
