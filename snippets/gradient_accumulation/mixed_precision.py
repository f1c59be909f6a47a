"""Mixed precision with accumulation: where 1/k goes, and unscaling before clipping."""

import torch

from snippets.common.device import DEVICE

# --8<-- [start:underflow]
K = 8
# Gradient magnitudes an fp16 activation may carry (1e-7 .. 1e-3), one per element.
g = torch.logspace(-7, -3, 4001, dtype=torch.float64).to(DEVICE)
g16 = g.half()  # every one of them is representable in fp16 (min subnormal 2^-24 ~ 6e-8)


def fp16_grad(scale):
    """The fp16 gradient that backward produces for loss = scale * sum(h * g) / K."""
    h = torch.ones_like(g16, requires_grad=True)  # stands for an fp16 activation
    (scale * (h * g16).sum() / K).backward()
    return h.grad  # fp16, value scale * g / K


for scale in (1.0, 2.0**16):
    grad = fp16_grad(scale).double() / scale  # unscale in higher precision
    lost = (grad == 0).float().mean().item()
    err = ((grad * K - g16.double()).abs() / g16.double()).max().item()
    print(f"scale={scale:>7}: {lost:.1%} flushed to zero, worst relative error {err:.0%}")
    #> scale=    1.0: 10.7% flushed to zero, worst relative error 100%
    #> scale=65536.0: 0.0% flushed to zero, worst relative error 0%
# --8<-- [end:underflow]


# --8<-- [start:clip]
def train_step(unscale_first, k=4, max_norm=0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(DEVICE.type, init_scale=2.0**16)
    x, y = torch.randn(32, 16).to(DEVICE), torch.randn(32, 1).to(DEVICE)
    for xb, yb in zip(x.chunk(k), y.chunk(k), strict=True):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        scaler.scale(loss / k).backward()  # grads stay scaled by 2^16 until unscale_
    if unscale_first:
        scaler.unscale_(opt)  # divide .grad by the scale, once, at the window's end
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(opt)  # unscales first if unscale_ was not called; skips on inf/nan
    scaler.update()  # the scale changes only between windows
    return torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]).item()


right, wrong = train_step(unscale_first=True), train_step(unscale_first=False)
print(round(right / wrong))  # the gradient the optimizer applied, right vs wrong order
#> 65536
# --8<-- [end:clip]


# --8<-- [start:bf16_grad]
k = 16
gen = torch.Generator().manual_seed(0)
grads = (torch.randn(k, 4096, generator=gen, dtype=torch.float64) + 1) / k  # k micro-batches
arrived = grads.to(DEVICE, torch.bfloat16)  # the bf16 copy's backward hands each over in bf16
exact = arrived.double().sum(0)  # exact: these bf16 numbers add up in fp64 without rounding
in_bf16 = torch.zeros_like(arrived[0])  # the .grad of a bf16 parameter
in_fp32 = torch.zeros_like(arrived[0], dtype=torch.float32)  # an fp32 accumulator
for g in arrived:
    in_bf16 += g  # rounded to bf16's 8 significant bits after every add
    in_fp32 += g.float()
for name, acc in (("bf16", in_bf16), ("fp32", in_fp32)):
    rel = (acc.double() - exact).abs() / exact.abs()
    print(f"{name}: median relative error {rel.median():.0e}, worst {rel.max():.0e}")
    #> bf16: median relative error 3e-03, worst 2e-02
    #> fp32: median relative error 0e+00, worst 5e-08
# --8<-- [end:bf16_grad]
