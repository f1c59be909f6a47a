"""The shared models (issue 22) on the CPU: the MoE model against Hugging Face transformers.

Tolerances as in tests/snippets/test_qwen3_fusion.py: 1e-12 in fp64 (both run the same
operations), 2 * gamma_n * ||ref|| in fp32 with n the longest reduction of the config;
transformers computes its losses in fp32, so those compare with fp32's gamma.
"""

import dataclasses

import pytest
import torch

from snippets.common.device import ON_GPU
from snippets.common.models import qwen3 as q3
from snippets.common.models import qwen3_moe as qm

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")


def gamma(n, u):
    return n * u / (1 - n * u)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ------------------------------------------------------------------------------ the MoE model

MOE_TOL = {torch.float64: 1e-12, torch.float32: 2 * gamma(qm.TINY_MOE.vocab_size, 2.0**-24)}


def hf_moe(cfg):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Qwen3MoeConfig(
        **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, attention_dropout=0.0
    )
    hf_cfg._experts_implementation = "eager"  # the per-expert loop (grouped_mm has no fp64)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # random norms too: HF initialises them to ones
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def hf_tiny_moe():
    return hf_moe(qm.TINY_MOE)


def logits_and_grads(model, ids, is_hf):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits if is_hf else model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("seq", [33, 2], ids=["33-tokens", "2-tokens"])
def test_moe_matches_transformers(hf_tiny_moe, dtype, seq):
    """Logits and every gradient. With two tokens (top 2 of 8) at least four experts per layer
    get no token: their gradients are zero, as in transformers."""
    hf = hf_tiny_moe.to(dtype)
    ours = qm.Qwen3MoeForCausalLM(qm.TINY_MOE).to(dtype)
    ours.load_state_dict(hf.state_dict(), strict=True)  # same parameter names and shapes
    ids = torch.randint(0, 1000, (2, seq), generator=torch.Generator().manual_seed(1))
    if seq == 2:
        ids = ids[:1]
    hf_logits, hf_grads = logits_and_grads(hf, ids, is_hf=True)
    our_logits, our_grads = logits_and_grads(ours, ids, is_hf=False)
    assert rel(our_logits, hf_logits) <= MOE_TOL[dtype]
    assert set(our_grads) == set(hf_grads)
    for name, g in hf_grads.items():
        if g.norm() == 0:
            assert our_grads[name].norm() == 0, name
        else:
            assert rel(our_grads[name], g) <= MOE_TOL[dtype], name
    if seq == 2:
        for layer in range(qm.TINY_MOE.num_hidden_layers):
            up = our_grads[f"model.layers.{layer}.mlp.experts.gate_up_proj"]
            assert (up.flatten(1).norm(dim=1) == 0).sum() >= 4


def test_moe_loss_with_router_loss_matches_transformers(hf_tiny_moe):
    """Next-token loss + router_aux_loss_coef * load balancing (transformers: fp32 losses)."""
    hf = hf_tiny_moe.to(torch.float64)
    ours = qm.Qwen3MoeForCausalLM(qm.TINY_MOE).to(torch.float64)
    ours.load_state_dict(hf.state_dict())
    ids = torch.randint(0, 1000, (2, 33), generator=torch.Generator().manual_seed(2))
    expected = hf(ids, labels=ids, output_router_logits=True)
    _, aux = ours.losses(ids, ids)
    fp32 = 2 * gamma(qm.TINY_MOE.vocab_size, 2.0**-24)
    assert rel(aux, expected.aux_loss) <= fp32
    assert rel(ours(ids, labels=ids), expected.loss) <= fp32
    assert 1 <= aux.item() <= qm.TINY_MOE.num_experts_per_tok * qm.TINY_MOE.num_experts


def test_moe_parameter_counts_equal_the_model_card():
    """Qwen3-30B-A3B's model card: 30.5B parameters, 3.3B activated (we count 3.35B with both
    embedding matrices; the card's 3.3 is within 0.06 of it)."""
    counts = qm.count_parameters(qm.QWEN3_30B_A3B)
    assert counts == {"total": 30_532_122_624, "active": 3_353_032_704}
    assert round(counts["total"] / 1e9, 1) == 30.5 and abs(counts["active"] / 1e9 - 3.3) < 0.06


def test_moe_shares_the_dense_models_attention_and_norm_code():
    kernels = q3.Kernels(norm=lambda dim, eps: torch.nn.LayerNorm(dim, eps=eps))
    layer = qm.Qwen3MoeForCausalLM(qm.TINY_MOE, kernels).model.layers[0]
    assert type(layer.self_attn) is q3.Attention
    assert isinstance(layer.input_layernorm, torch.nn.LayerNorm)  # the swap point reaches it
