"""Gate 2, the model gate: the Qwen3 model with fused kernels against eager PyTorch, site by
site (each layer's attention and MLP inputs and outputs, their gradients, every parameter's
gradient), both measured against the same model in fp64.

Rule per site (in the spirit of FlashAttention's tests, which bound a kernel's error by twice
that of a PyTorch implementation in the same precision):
    err(fused) <= 2 err(eager) + u_p,   err(a) = ||a - a_fp64|| / ||a_fp64||,
u_p the unit roundoff of the model's dtype (a floor for sites where eager happens to be exact).
The report names the first site that breaks the rule: in forward order for activations, in
backward order for gradients (a backward-only bug shows up where the gradient first goes wrong).
"""

import copy
from dataclasses import dataclass

import torch

from snippets.triton_kernels.numerics import unit_roundoff


# --8<-- [start:trace]
@dataclass
class Trace:
    acts: dict  # site -> activation, in forward order
    grads: dict  # site -> d loss / d activation
    params: dict  # parameter name -> gradient
    loss: torch.Tensor


def trace(model, input_ids, labels, forward=None) -> Trace:
    """One forward and backward, recording each layer's attention and MLP inputs and outputs
    (forward hooks) and their gradients (tensor hooks). Both the eager layer and the fused
    forward call these two sub-modules, so the same sites exist in both."""
    acts, grads, hooks = {}, {}, []

    def record(site):
        def hook(module, args, out):
            for name, t in ((f"{site}_in", args[0]), (f"{site}_out", out)):
                acts[name] = t.detach()
                t.register_hook(lambda g, name=name: grads.__setitem__(name, g.detach()))

        return hook

    for i, layer in enumerate(model.model.layers):
        hooks.append(layer.self_attn.register_forward_hook(record(f"{i}.attn")))
        hooks.append(layer.mlp.register_forward_hook(record(f"{i}.mlp")))
    try:
        model.zero_grad(set_to_none=True)
        if forward is None:
            loss = model(input_ids, labels=labels)
        else:
            loss = forward(model, input_ids, labels)
        loss.backward()
    finally:
        for h in hooks:
            h.remove()
    unused = torch.zeros_like  # a parameter the forward never touched has a zero gradient
    params = {n: unused(p) if p.grad is None else p.grad for n, p in model.named_parameters()}
    return Trace(acts, grads, params, loss.detach())


# --8<-- [end:trace]


# --8<-- [start:gate]
def rel(a, ref) -> float:
    return ((a.double() - ref.double()).norm() / ref.double().norm()).item()


@dataclass
class Site:
    name: str
    kind: str  # "activation", "loss", "gradient", "parameter gradient"
    eager: float  # relative error of eager vs fp64
    fused: float  # relative error of the fused model vs fp64
    bound: float  # 2 eager + u_p

    @property
    def ok(self) -> bool:
        return self.fused <= self.bound


@dataclass
class ModelReport:
    sites: list

    @property
    def passed(self) -> bool:
        return all(s.ok for s in self.sites)

    def first_failure(self, kind) -> str | None:
        return next((s.name for s in self.sites if s.kind == kind and not s.ok), None)


def model_gate(eager, fused, input_ids, labels, fused_forward=None, factor=2.0) -> ModelReport:
    """eager and fused hold the same weights in the same dtype; the reference is eager in fp64."""
    reference = copy.deepcopy(eager).double()
    ref = trace(reference, input_ids, labels)
    low = trace(eager, input_ids, labels)
    fus = trace(fused, input_ids, labels, fused_forward)
    u = unit_roundoff(next(eager.parameters()).dtype)

    def site(name, kind, a, b, r):
        e, f = rel(a, r), rel(b, r)
        return Site(name, kind, e, f, factor * e + u)

    sites = [site(k, "activation", low.acts[k], fus.acts[k], ref.acts[k]) for k in ref.acts]
    sites.append(site("loss", "loss", low.loss, fus.loss, ref.loss))
    for k in reversed(list(ref.acts)):  # backward order
        sites.append(site(k, "gradient", low.grads[k], fus.grads[k], ref.grads[k]))
    for k in ref.params:
        sites.append(site(k, "parameter gradient", low.params[k], fus.params[k], ref.params[k]))
    return ModelReport(sites)


# --8<-- [end:gate]
