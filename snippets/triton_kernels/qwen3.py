"""The kernels in the shared Qwen3 model: through its swap points, and a forward that fuses
every residual add into the RMSNorm after it (without editing the model's code)."""

import torch

from snippets.common.device import DEVICE
from snippets.common.models.qwen3 import TINY, Kernels, Qwen3ForCausalLM, rope_tables
from snippets.triton_kernels.cross_entropy import linear_cross_entropy
from snippets.triton_kernels.numerics import gamma
from snippets.triton_kernels.rmsnorm import TritonRMSNorm, add_rms_norm
from snippets.triton_kernels.rope import apply_rope
from snippets.triton_kernels.swiglu import swiglu

# --8<-- [start:kernels]
TRITON = Kernels(norm=TritonRMSNorm, rope=apply_rope, mlp_act=swiglu, loss=linear_cross_entropy)
# --8<-- [end:kernels]


# --8<-- [start:fused]
def fused_hidden_states(model: Qwen3ForCausalLM, input_ids):
    """model.hidden_states, with each `x + sublayer(...)` fused into the next RMSNorm.

    The eager layer computes x = x + attn(norm1(x)), then norm2(x); here (x, h) =
    add_rms_norm(x, attn_out, w2) does the add and the norm in one pass, and the MLP's residual
    add joins the next layer's input norm (or the final norm).
    """
    eps = model.config.rms_norm_eps
    x = model.model.embed_tokens(input_ids)
    cos, sin = rope_tables(model.config, input_ids.shape[1], input_ids.device)
    delta = None  # the sublayer output still to be added to x
    for layer in model.model.layers:
        if delta is None:
            h = layer.input_layernorm(x)
        else:
            x, h = add_rms_norm(x, delta, layer.input_layernorm.weight, eps)
        x, h = add_rms_norm(x, layer.self_attn(h, cos, sin), layer.post_attention_layernorm.weight,
                            eps)  # fmt: skip
        delta = layer.mlp(h)
    return add_rms_norm(x, delta, model.model.norm.weight, eps)[1]


def fused_loss(model: Qwen3ForCausalLM, input_ids, labels):
    h = fused_hidden_states(model, input_ids)
    return model.kernels.loss(h[:, :-1], model.lm_head.weight, labels[:, 1:])


# --8<-- [end:fused]


# --8<-- [start:check]
def tiny_models(seed=0, dtype=torch.float32):
    """The same random weights (norm weights too) in an eager and a Triton TINY model."""
    torch.manual_seed(seed)
    eager = Qwen3ForCausalLM(TINY).to(DEVICE, dtype)
    with torch.no_grad():
        for name, p in eager.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    triton_model = Qwen3ForCausalLM(TINY, TRITON).to(DEVICE, dtype)
    triton_model.load_state_dict(eager.state_dict())
    return eager, triton_model


def loss_and_grads(model, ids, labels, forward=None):
    model.zero_grad(set_to_none=True)
    loss = model(ids, labels=labels) if forward is None else forward(model, ids, labels)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# Same math, different rounding: norm-wise differences stay below 2 gamma_n, n = 1000 the
# longest reduction of the TINY model (logsumexp over the vocabulary; dh sums over it too).
TOLERANCE = 2 * gamma(TINY.vocab_size)

eager, triton_model = tiny_models()
ids = torch.randint(0, TINY.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
ids = ids.to(DEVICE)
labels = ids.clone()
labels[1, 5:] = -100  # padding
ref_loss, ref_grads = loss_and_grads(eager, ids, labels)
for forward in (None, fused_loss):  # swap points only; then also add + norm fused
    loss, grads = loss_and_grads(triton_model, ids, labels, forward)
    worst = max(rel(grads[n], g) for n, g in ref_grads.items())
    print(rel(loss, ref_loss) <= TOLERANCE, worst <= TOLERANCE, len(grads))
    #> True True 25
    #> True True 25
# --8<-- [end:check]
