"""Gate 3, end to end: N training steps of a small Qwen3 on a learnable synthetic task, eager
against fused, with a loss-curve band measured from eager runs that differ from the eager run
only in rounding: half of them in the order of their reductions, half in the seed of a
one-ULP dither of the initial weights.

Reordered runs use an exact symmetry of the model: permuting the hidden dimension (every
weight that reads or writes the residual stream, and the RMSNorm weights) and the MLP's
intermediate dimension gives the same function, and AdamW, being elementwise, the same
trajectory in exact arithmetic; in floating point every reduction over those dimensions
(matmuls, norms) adds its terms in another order. Reordering leaves elementwise roundings as
they were, while a fused kernel also changes those (it rounds intermediates fewer times); the
dithered runs, every weight moved one ULP up or down at random, stand for "one rounding's worth
of difference everywhere".

Band rule, per step t, with L_0 the eager loss and L_k the K other eager runs:
    E(t) = max over s <= t and k of |L_k(s) - L_0(s)|          (running envelope)
    band(t) = 2 E(t) + 2 eps_32 |L_0(t)|                         (eps_32 = 2^-23)
and the candidate passes when |L(t) - L_0(t)| <= band(t) at every step. The factor 2 leaves
room for one more sample of the same noise; the last term is the resolution of an fp32 loss.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from snippets.common.models.qwen3 import Kernels, Qwen3ForCausalLM


# --8<-- [start:data]
def sequences(n: int, seq: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """n arithmetic sequences mod vocab (start random, stride 1-4): from the third token on,
    the next token follows from the previous two, so the loss can fall far below ln(vocab)."""
    gen = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=gen)
    stride = torch.randint(1, 5, (n, 1), generator=gen)
    return (start + stride * torch.arange(seq)) % vocab


def batches(data: torch.Tensor, steps: int, batch: int) -> list:
    n = data.shape[0]
    return [data[torch.arange(s * batch, (s + 1) * batch) % n] for s in range(steps)]


# --8<-- [end:data]


# --8<-- [start:model]
def initial_model(cfg, kernels: Kernels | None, dtype, device, seed: int = 0):
    """The same initial weights for every run (norm weights random too, so that every weight
    matters), in `dtype`, with `kernels` at the swap points."""
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
    out = Qwen3ForCausalLM(cfg, kernels)
    out.load_state_dict(model.state_dict())
    return out.to(device, dtype)


def permute_dims(model, seed: int):
    """Permute the hidden and MLP-intermediate dimensions in place: the same function (and
    the same AdamW trajectory in exact arithmetic), different reduction orders."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    ph = torch.randperm(cfg.hidden_size, generator=gen).to(model.lm_head.weight.device)
    sd = model.state_dict()
    for name, w in sd.items():
        if name.endswith(("embed_tokens.weight", "lm_head.weight", "q_proj.weight",
                          "k_proj.weight", "v_proj.weight", "gate_proj.weight",
                          "up_proj.weight")):  # fmt: skip
            sd[name] = w[:, ph]  # reads the residual stream
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            sd[name] = w[ph]  # writes it
        elif name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")) or (
            name == "model.norm.weight"
        ):
            sd[name] = w[ph]
    for i in range(cfg.num_hidden_layers):
        pi = torch.randperm(cfg.intermediate_size, generator=gen).to(ph.device)
        mlp = f"model.layers.{i}.mlp."
        sd[mlp + "gate_proj.weight"] = sd[mlp + "gate_proj.weight"][pi]
        sd[mlp + "up_proj.weight"] = sd[mlp + "up_proj.weight"][pi]
        sd[mlp + "down_proj.weight"] = sd[mlp + "down_proj.weight"][:, pi]
    model.load_state_dict(sd)
    return model


def dither(model, seed: int):
    """Move every nonzero weight one ULP up or down in magnitude (a random sign per weight)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            bits = {2: torch.int16, 4: torch.int32}[p.element_size()]
            step = torch.randint(0, 2, p.shape, generator=gen).to(p.device, bits) * 2 - 1
            p.data.view(bits).add_(torch.where(p != 0, step, 0).to(bits))  # sign-magnitude
    return model


# --8<-- [end:model]


# --8<-- [start:train]
def train(model, steps_data: list, lr: float, forward: Callable | None = None) -> torch.Tensor:
    """AdamW on fp32 master weights (the model itself may be bf16); returns the loss per step."""
    params = list(model.parameters())
    master = [p.detach().float().clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(master, lr=lr, weight_decay=0.0)
    losses = []
    for ids in steps_data:
        ids = ids.to(params[0].device)
        model.zero_grad(set_to_none=True)
        loss = model(ids, labels=ids) if forward is None else forward(model, ids, ids)
        loss.backward()
        for m, p in zip(master, params, strict=True):
            m.grad = p.grad.float()
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, params, strict=True):
                p.copy_(m)
        losses.append(loss.detach().float())
    return torch.stack(losses).double().cpu()


# --8<-- [end:train]


# --8<-- [start:gate]
def band(eager: torch.Tensor, others: torch.Tensor) -> torch.Tensor:
    envelope = (others - eager).abs().amax(0).cummax(0).values
    return 2 * envelope + 2 * torch.finfo(torch.float32).eps * eager.abs()


@dataclass
class E2EReport:
    eager: torch.Tensor  # [steps]
    fused: torch.Tensor  # [steps]
    others: torch.Tensor  # [K, steps]: the perturbed eager runs
    band: torch.Tensor  # [steps]

    @property
    def ratio(self) -> torch.Tensor:
        return (self.fused - self.eager).abs() / self.band

    @property
    def passed(self) -> bool:
        return bool((self.ratio <= 1).all())

    @property
    def first_exceeded(self) -> int | None:
        bad = (self.ratio > 1).nonzero()
        return int(bad[0]) if len(bad) else None


def eager_runs(cfg, steps_data, lr, dtype, device, runs: int = 8):
    """L_0 and the K = `runs` perturbed eager curves (half reordered, half dithered)."""

    def model():
        return initial_model(cfg, None, dtype, device)

    eager = train(model(), steps_data, lr)
    others = [permute_dims(model(), seed=k) for k in range(runs // 2)]
    others += [dither(model(), seed=k) for k in range(runs - runs // 2)]
    return eager, torch.stack([train(m, steps_data, lr) for m in others])


def e2e_gate(cfg, kernels, steps_data, lr, dtype, device, forward=None, runs=None) -> E2EReport:
    """`runs`: (eager, others) from eager_runs, when already measured for another candidate."""
    eager, others = runs or eager_runs(cfg, steps_data, lr, dtype, device)
    fused = train(initial_model(cfg, kernels, dtype, device), steps_data, lr, forward)
    return E2EReport(eager, fused, others, band(eager, others))


# --8<-- [end:gate]
