"""Unit tests for snippets/moe_training/: the configs and their accounting against the published
counts and the shared model; the reference layer against the shared Qwen3-MoE block and
DeepSeek-V3's official gate; capacity and dropping; the balancing losses and the bias update;
the Triton permutation and grouped GEMM against the reference (forward and backward, empty
experts); expert parallelism over gloo against the single-process layer; the communication
model; the benchmark code at tiny shapes."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from snippets.common.models.qwen3 import Kernels
from snippets.common.models.qwen3_moe import (
    QWEN3_30B_A3B,
    TINY_MOE,
    SparseMoeBlock,
    count_parameters,
    load_balancing_loss,
)
from snippets.moe_training.accounting import (
    MODELS,
    moe_activation_elems,
    parameters,
    shape_of,
)
from snippets.moe_training.balance import (
    max_over_mean,
    router_z_loss,
    sequence_aux_loss,
    switch_aux_loss,
    update_bias,
)
from snippets.moe_training.configs import MoeDataError, load_moe_models, parse_printed
from snippets.moe_training.layer import MoeConfig, MoeLayer, capacity, expert_load, keep_mask, route

F64 = torch.float64


# ------------------------------------------------------------------ configs and accounting
def _qwen_model(cfg):
    from snippets.moe_training.configs import MoeModel

    fields = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
              "num_hidden_layers": cfg.num_hidden_layers,
              "num_attention_heads": cfg.num_attention_heads,
              "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
              "num_experts": cfg.num_experts, "num_experts_per_tok": cfg.num_experts_per_tok,
              "moe_intermediate_size": cfg.moe_intermediate_size,
              "norm_topk_prob": cfg.norm_topk_prob,
              "tie_word_embeddings": cfg.tie_word_embeddings}  # fmt: skip
    return MoeModel("x", "qwen3_moe", fields, {}, (), 1)


@pytest.mark.parametrize(
    "cfg", [QWEN3_30B_A3B, TINY_MOE, replace(TINY_MOE, tie_word_embeddings=True)]
)
def test_qwen3_layout_equals_the_shared_model_built_on_meta(cfg):
    # two independent counts: our closed form, and the shared model's parameters (meta device)
    ours = parameters(shape_of(_qwen_model(cfg)))
    theirs = count_parameters(cfg)
    assert ours["total"] == theirs["total"] and ours["active"] == theirs["active"]


def test_data_file_matches_the_shared_qwen3_config():
    c = MODELS["qwen3-30b-a3b"].config
    for ours, shared in [("hidden_size", "hidden_size"), ("num_experts", "num_experts"),
                         ("moe_intermediate_size", "moe_intermediate_size"),
                         ("num_hidden_layers", "num_hidden_layers"), ("head_dim", "head_dim"),
                         ("vocab_size", "vocab_size")]:  # fmt: skip
        assert c[ours] == getattr(QWEN3_30B_A3B, shared)


def test_every_published_figure_is_reproduced_to_its_last_digit():
    for model in MODELS.values():
        ours = parameters(shape_of(model))
        for figure, pub in model.published.items():
            assert abs(ours[figure] - pub.value) < pub.unit, (model.id, figure)


def test_deepseek_v3_layer_by_layer():
    s = shape_of(MODELS["deepseek-v3"])
    # MLA weights of one layer, from the official inference/model.py shapes
    attn = 7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 16384 * 7168
    assert s.attn_params == attn
    p = parameters(s)
    assert p["routed_experts"] == 58 * 256 * 3 * 7168 * 2048
    # shared expert: every token; 8 routed + 1 shared = 9 experts of 2048 per MoE layer
    assert p["total"] - p["active"] == 58 * 248 * 3 * 7168 * 2048


def test_parse_printed():
    assert parse_printed("30.5B") == (30.5e9, 1e8)
    assert parse_printed("671B") == (671e9, 1e9)
    for bad in ("30.5", "3.3M", "B", "1,2B"):
        with pytest.raises(ValueError):
            parse_printed(bad)


GOOD = """models:
  m:
    family: mixtral
    config:
      vocab_size: 10
      hidden_size: 8
      num_hidden_layers: 2
      num_attention_heads: 2
      num_key_value_heads: 1
      num_local_experts: 4
      num_experts_per_tok: 2
      intermediate_size: 16
      tie_word_embeddings: false
    published:
      total: {value: 1B, source: "https://example.org"}
      active: {value: 1B, source: "https://example.org"}
    sources: ["https://example.org"]
"""


INTER = "      intermediate_size: 16\n"


@pytest.mark.parametrize("old,new,line,message", [
    ("num_local_experts: 4", "num_local_experts: '4'", 10, "'num_local_experts': expected a"),
    ("num_local_experts: 4", "num_local_experts: 0", 10, "expected a positive int, got '0'"),
    ("num_experts_per_tok: 2", "num_experts_per_tok: 5", 11, "only 4 experts"),
    (INTER, INTER + "      head_dim: 4\n", 13, "unknown field for mixtral"),
    (INTER, "", 5, "field 'intermediate_size': missing"),
    ("family: mixtral", "family: llama", 3, "field 'family': one of"),
    ("total: {value: 1B,", "total: {value: 1.5M,", 15, "'total': expected a count in"),
    ('source: "https://example.org"}\n    sources', 'source: "http://x"}\n    sources', 16,
     "an https:// URL"),
    ("tie_word_embeddings: false", "tie_word_embeddings: 0", 13, "expected true or false"),
    ("    sources:", "    source:", 17, "unknown field"),
    ("family: mixtral", "family: [mixtral", 3, "malformed YAML"),
])  # fmt: skip
def test_bad_data_names_file_and_line(tmp_path, old, new, line, message):
    path = tmp_path / "moe_models.yaml"
    path.write_text(GOOD.replace(old, new), encoding="utf-8")
    with pytest.raises(MoeDataError) as info:
        load_moe_models(path)
    text = str(info.value)
    assert text.startswith(f"{path}:") and message in text, text
    if "malformed" not in message:
        assert text.startswith(f"{path}:{line}:"), text


def test_good_data_loads(tmp_path):
    path = tmp_path / "moe_models.yaml"
    path.write_text(GOOD, encoding="utf-8")
    assert load_moe_models(path)["m"].config["num_local_experts"] == 4


def test_activation_formula_equals_what_autograd_saves():
    """Count the floating-point tensors the forward leaves for the backward (unique storages,
    neither parameters nor the layer's input): per token, exactly the formula."""
    torch.manual_seed(0)
    cfg = MoeConfig(hidden=32, experts=8, top_k=2, inter=16)
    for shared in (0, 24):
        layer = MoeLayer(replace(cfg, shared_inter=shared))
        x = torch.randn(64, 32, requires_grad=True)
        skip = {p.untyped_storage().data_ptr() for p in layer.parameters()}
        skip.add(x.untyped_storage().data_ptr())
        saved = {}

        def pack(t, saved=saved, skip=skip):
            st = t.untyped_storage()
            if t.is_floating_point() and st.data_ptr() not in skip:
                saved[st.data_ptr()] = st.nbytes() // t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            layer(x)
        from snippets.moe_training.accounting import MoeShape

        s = MoeShape(32, 10, 1, 0, 0, 8, 2, 16, shared, False, 0, 1, 1, 1, False)
        want = sum(moe_activation_elems(s).values())
        assert sum(saved.values()) == 64 * want


# ------------------------------------------------------------------ the reference layer
def _shared_block(seed=0, e=8, k=2, h=32, i=16):
    cfg = replace(TINY_MOE, hidden_size=h, num_experts=e, num_experts_per_tok=k,
                  moe_intermediate_size=i)  # fmt: skip
    torch.manual_seed(seed)
    block = SparseMoeBlock(cfg, Kernels()).double()
    for p in block.parameters():
        p.data.normal_(0, 0.3)
    return block


def test_softmax_layer_equals_the_shared_qwen3_block():
    block = _shared_block()
    ours = MoeLayer(MoeConfig(hidden=32, experts=8, top_k=2, inter=16)).double()
    ours.gate.weight.data.copy_(block.gate.weight.data)
    ours.gate_up_proj.data.copy_(block.experts.gate_up_proj.data)
    ours.down_proj.data.copy_(block.experts.down_proj.data)
    x = torch.randn(2, 20, 32, dtype=F64, requires_grad=True)
    want, logits = block(x)
    got, r, kept = ours(x)
    assert torch.equal(r.logits, logits) and kept.all()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-14)
    g = torch.randn_like(want)
    gw = torch.autograd.grad(want, [x, block.experts.gate_up_proj, block.gate.weight], g)
    gg = torch.autograd.grad(got, [x, ours.gate_up_proj, ours.gate.weight], g)
    for a, b in zip(gg, gw, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-13)


def test_softmax_topk_renormalised_is_mixtral_softmax_over_the_topk_logits():
    # Mixtral (arXiv:2401.04088 eq. 2): softmax over the top-k logits only
    logits = torch.randn(50, 8, dtype=F64)
    r = route(logits, MoeConfig(hidden=1, experts=8, top_k=2, inter=1))
    top = logits.topk(2, dim=-1)
    torch.testing.assert_close(r.weights, F.softmax(top.values, dim=-1))
    assert torch.equal(r.experts, top.indices)


def deepseek_gate(scores_logits, bias, topk, n_groups, topk_groups, route_scale):
    """The official DeepSeek-V3 Gate.forward (inference/model.py, sigmoid with a bias),
    transcribed for the test; batch of rows."""
    scores = scores_logits.sigmoid()
    original_scores = scores
    scores = scores + bias
    scores = scores.view(scores_logits.size(0), n_groups, -1)
    group_scores = scores.topk(2, dim=-1)[0].sum(dim=-1)
    indices = group_scores.topk(topk_groups, dim=-1)[1]
    mask = scores.new_ones(scores_logits.size(0), n_groups, dtype=bool).scatter_(1, indices, False)
    scores = scores.masked_fill_(mask.unsqueeze(-1), float("-inf")).flatten(1)
    indices = torch.topk(scores, topk, dim=-1)[1]
    weights = original_scores.gather(1, indices)
    weights /= weights.sum(dim=-1, keepdim=True)
    weights *= route_scale
    return weights, indices


def test_sigmoid_routing_equals_deepseek_v3_gate():
    cfg = MoeConfig(hidden=1, experts=64, top_k=8, inter=1, scoring="sigmoid",
                    routed_scaling=2.5, n_group=8, topk_group=4)  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(200, 64, generator=gen, dtype=torch.float32)
    bias = 0.1 * torch.randn(64, generator=gen)
    w, idx = deepseek_gate(logits.clone(), bias, 8, 8, 4, 2.5)
    r = route(logits, cfg, bias)
    assert torch.equal(r.experts.sort(-1).values, idx.sort(-1).values)
    torch.testing.assert_close(r.weights.sort(-1).values, w.sort(-1).values)
    # group-limited: every token's experts lie in at most topk_group groups
    assert all(torch.unique(row // 8).numel() <= 4 for row in r.experts)
    assert torch.allclose(r.weights.sum(-1), torch.full((200,), 2.5))


def test_bias_changes_the_choice_not_the_weights():
    cfg = MoeConfig(hidden=1, experts=4, top_k=1, inter=1, scoring="sigmoid", norm_topk_prob=False)
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    r = route(logits, cfg, torch.tensor([0.0, 0.0, 0.0, 5.0]))
    assert r.experts.item() == 3 and math.isclose(
        r.weights.item(), torch.sigmoid(torch.tensor(-1.0)).item(), rel_tol=1e-6
    )


def test_capacity_and_dropping():
    cfg = MoeConfig(hidden=4, experts=4, top_k=2, inter=3, capacity_factor=1.0)
    assert capacity(10, cfg) == 5  # ceil(1.0 * 10 * 2 / 4)
    assert capacity(10, replace(cfg, capacity_factor=1.25)) == 7
    assert capacity(10, replace(cfg, capacity_factor=None)) is None
    # every token picks expert 0 first, expert 1 second: capacity 2 keeps the first two of each
    experts = torch.tensor([[0, 1]] * 5)
    kept = keep_mask(experts, 2)
    assert kept.tolist() == [
        [True, True],
        [True, True],
        [False, False],
        [False, False],
        [False, False],
    ]
    # first choices are served before second choices
    experts = torch.tensor([[1, 0], [0, 1], [0, 1]])
    # rank 0 fills expert 0 (tokens 1, 2); token 0's second choice (0) is dropped, token 2's (1)
    # comes after token 1's and is dropped too
    assert keep_mask(experts, 2).tolist() == [[True, False], [True, True], [True, False]]


def test_dropped_slots_contribute_nothing_and_dropless_drops_none():
    torch.manual_seed(1)
    cfg = MoeConfig(hidden=16, experts=4, top_k=2, inter=8, capacity_factor=0.5)
    layer = MoeLayer(cfg).double()
    x = torch.randn(40, 16, dtype=F64)
    out, r, kept = layer(x)
    assert not kept.all() and kept.sum() <= 4 * capacity(40, cfg)
    assert expert_load(r.experts, 4, kept).max() <= capacity(40, cfg)
    # reference: sum over kept slots of w * expert(x)
    ref = torch.zeros_like(x)
    for t in range(40):
        for q in range(2):
            if kept[t, q]:
                e = r.experts[t, q]
                h = F.linear(x[t], layer.gate_up_proj[e])
                g, u = h.chunk(2)
                ref[t] += r.weights[t, q] * F.linear(F.silu(g) * u, layer.down_proj[e])
    torch.testing.assert_close(out, ref)
    layer.cfg = replace(cfg, capacity_factor=None)
    assert layer(x)[2].all()


def test_shared_experts_add_a_dense_swiglu():
    torch.manual_seed(2)
    cfg = MoeConfig(hidden=16, experts=4, top_k=2, inter=8, shared_inter=12)
    layer = MoeLayer(cfg).double()
    x = torch.randn(10, 16, dtype=F64)
    with_shared, _, _ = layer(x)
    g, u = layer.shared_gate_up(x).chunk(2, -1)
    shared = layer.shared_down(F.silu(g) * u)
    layer.cfg = replace(cfg, shared_inter=0)
    routed, _, _ = layer(x)
    torch.testing.assert_close(with_shared, routed + shared)


def test_bad_configs():
    for kwargs, match in [({"scoring": "relu"}, "scoring"), ({"top_k": 9}, "top_k"),
                          ({"n_group": 3}, "n_group"), ({"capacity_factor": 0.0}, "capacity"),
                          ({"n_group": 4, "topk_group": 1, "top_k": 3}, "fewer experts")
                          ]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            MoeConfig(**({"hidden": 4, "experts": 8, "top_k": 2, "inter": 4} | kwargs))
    with pytest.raises(ValueError, match="router logits have 5"):
        route(torch.randn(3, 5), MoeConfig(hidden=4, experts=8, top_k=2, inter=4))


# ------------------------------------------------------------------ balancing
def test_switch_loss_is_the_shared_model_loss_over_k():
    logits = torch.randn(64, 8, dtype=F64)
    r = route(logits, MoeConfig(hidden=1, experts=8, top_k=2, inter=1))
    shared = load_balancing_loss([logits], 8, 2)
    # the shared model computes in fp32 (logits.float()): compare at fp32 resolution
    ours = switch_aux_loss(r.scores, r.experts) * 2
    torch.testing.assert_close(ours.double(), shared.double(), rtol=1e-6, atol=0)


def test_balance_losses_are_one_when_uniform_and_grow_with_skew():
    e, k, t = 8, 2, 64
    experts = torch.arange(t * k).view(t, k) % e  # every expert equally often
    uniform = torch.full((t, e), 1 / e, dtype=F64)
    assert math.isclose(switch_aux_loss(uniform, experts).item(), 1.0)
    assert math.isclose(sequence_aux_loss(uniform, experts, 16).item(), 1.0)
    skewed = torch.zeros(t, e, dtype=F64)
    skewed[:, :2] = 0.5
    to_two = torch.tensor([[0, 1]] * t)
    assert math.isclose(switch_aux_loss(skewed, to_two).item(), e / 2)  # E * (1/2 * 1/2) * 2
    assert sequence_aux_loss(skewed, to_two, 16).item() > 1
    with pytest.raises(ValueError, match="whole number of sequences"):
        sequence_aux_loss(uniform, experts, 10)


def test_sequence_loss_sees_imbalance_that_the_batch_hides():
    # two sequences, each sending every token to one half of the experts: the batch is
    # balanced, each sequence is not (the point of a sequence-wise loss, DeepSeek-V3 §2.1.2)
    e, n = 4, 8
    experts = torch.tensor([[0], [1]] * (n // 2) + [[2], [3]] * (n // 2))
    scores = torch.zeros(2 * n, e, dtype=F64)
    scores[:n, :2], scores[n:, 2:] = 0.5, 0.5
    assert math.isclose(switch_aux_loss(scores, experts).item(), 1.0)
    assert math.isclose(sequence_aux_loss(scores, experts, n).item(), 2.0)


def test_router_z_loss():
    logits = torch.tensor([[0.0, 0.0], [1.0, 3.0]], dtype=F64)
    want = (math.log(2) ** 2 + math.log(math.e + math.e**3) ** 2) / 2
    assert math.isclose(router_z_loss(logits).item(), want)
    # shifting all logits of a row up by c leaves the softmax alone but grows the z-loss
    assert router_z_loss(logits + 10) > router_z_loss(logits)


def test_bias_update_moves_toward_balance():
    bias = torch.zeros(4)
    update_bias(bias, torch.tensor([10, 2, 4, 4]), gamma=0.001)
    assert bias.tolist() == pytest.approx([-0.001, 0.001, 0.001, 0.001])  # mean load 5
    assert max_over_mean(torch.tensor([10, 2, 4, 4])) == pytest.approx(2.0)
    # a skewed router: repeated updates bring max/mean down
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(512, 8, generator=gen) + torch.linspace(0, 2, 8)
    cfg = MoeConfig(hidden=1, experts=8, top_k=2, inter=1, scoring="sigmoid")
    bias = torch.zeros(8)
    first = max_over_mean(expert_load(route(logits, cfg).experts, 8))
    for _ in range(300):
        update_bias(bias, expert_load(route(logits, cfg, bias).experts, 8), gamma=0.01)
    last = max_over_mean(expert_load(route(logits, cfg, bias).experts, 8))
    # fixed-size sign steps keep oscillating around balance; the excess over 1 must shrink 4x
    assert first > 1.5 and last - 1 < (first - 1) / 4


# ------------------------------------------------------------------ Triton: permute, grouped GEMM
# The CPU runs these in Triton's interpreter (TRITON_INTERPRET=1) in fp32 and fp16 (it computes
# garbage for bf16); on the GPU the same tests run in bf16. Each result is compared with the fp32
# computation of the same low-precision inputs, element by element, within a bound derived from
# where the kernel rounds (see assert_rounded). The fast layer's fp32 test: on the GPU an fp32
# tl.dot runs in TF32 (10 mantissa bits, each product 2^-11 relative): 5e-3 covers a 48-term sum.
from snippets.common.device import DEVICE, ON_GPU  # noqa: E402
from snippets.moe_training.fast import moe_forward_fast  # noqa: E402
from snippets.moe_training.grouped_gemm import (  # noqa: E402
    group_offsets,
    grouped_linear,
    grouped_mm,
    grouped_mm_dw,
    grouped_mm_dx,
    grouped_mm_loop,
    tile_schedule,
)
from snippets.moe_training.permute import (  # noqa: E402
    permute,
    permute_reference,
    routing_map,
    unpermute,
    unpermute_reference,
)

DTYPES = [torch.bfloat16] if ON_GPU else [torch.float32, torch.float16]
UNIT = {torch.float32: 2**-24, torch.float16: 2**-11, torch.bfloat16: 2**-8}  # unit roundoff u
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-5}}
TF32 = {"rtol": 5e-3, "atol": 5e-3}


def assert_rounded(got, exact, mag, dtype, roundings, terms, grows=1.0):
    """got (the kernel, in `dtype`) against exact (fp32 from the same `dtype` inputs), per element:

        |got - exact| <= u |exact| + (roundings u + terms 2^-23) mag
                         + (roundings terms grows + 1) eta

    u |exact|: the final rounding to `dtype`; roundings u mag: each term of the sum was rounded to
    `dtype` that many times before the fp32 sum (error u |term| each, so the sum of |terms| = mag
    bounds it, whatever the signs and the order); terms 2^-23 mag: the fp32 sum of `terms` terms in
    any order (tensor cores may truncate: a whole fp32 ulp, 2^-23, per addition); eta: below the
    smallest normal a rounding errs by up to half the subnormal spacing (fp16: 2^-25) instead,
    and what multiplies a term after its rounding (at most `grows`) scales that. mag is the same
    computation on the absolute values of the inputs. The u^2 terms are far inside the bound."""
    assert got.dtype == dtype, f"{got.dtype} != {dtype}"
    u, eta = UNIT[dtype], torch.finfo(dtype).tiny * torch.finfo(dtype).eps / 2
    bound = u * exact.abs() + (roundings * u + terms * 2**-23) * mag
    bound += (roundings * terms * grows + 1) * eta
    err = (got.float() - exact).abs()
    worst = int((err - bound).argmax())
    assert (err <= bound).all(), (
        f"{int((err > bound).sum())} of {err.numel()} elements off; worst at {worst}: "
        f"{got.flatten()[worst].item()} vs {exact.flatten()[worst].item()}, "
        f"bound {bound.flatten()[worst].item():.3g}"
    )


def _routing(t, k, e, empty=(), seed=0):
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(e) if i not in empty])
    picks = [allowed[torch.randperm(len(allowed), generator=gen)[:k]] for _ in range(t)]
    return torch.stack(picks).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("drop", [False, True])
def test_permute_and_unpermute_match_the_reference(dtype, drop):
    t, k, e, h = 29, 3, 8, 72
    experts = _routing(t, k, e, empty=(2, 5))
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    kept = (torch.rand(t, k, generator=gen, device=DEVICE) > 0.25) if drop else None
    x = torch.randn(t, h, device=DEVICE, dtype=dtype, generator=gen, requires_grad=True)
    w = torch.rand(t, k, device=DEVICE, dtype=dtype, generator=gen, requires_grad=True)
    rmap = routing_map(experts, e, kept)
    assert rmap.counts[2] == 0 and rmap.counts[5] == 0  # experts that receive no tokens
    xp = permute(x, rmap)
    ref, order = permute_reference(x, experts, kept)
    assert torch.equal(rmap.order, order) and torch.equal(xp, ref)  # a gather is exact
    assert torch.equal(rmap.offsets[1:].long(), rmap.counts.cumsum(0))
    out = unpermute(xp * 3, w, rmap)
    g = torch.randn(t, h, device=DEVICE, dtype=dtype, generator=gen)
    got = (out, *torch.autograd.grad(out, [x, w], g))

    def reference(x, w, g):  # fp32, from the same low-precision inputs
        x, w = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
        y = unpermute_reference(permute_reference(x, experts, kept)[0] * 3, w, order, t)
        return (y.detach(), *torch.autograd.grad(y, [x, w], g.float()))

    exact, mag = reference(x, w, g), reference(x.abs(), w.abs(), g.abs())
    # Where the kernels round to `dtype` before their fp32 sums: out sums w * (3x), 3x rounded
    # once (xp * 3); dx sums 3 * (w * g) over the k choices, both products rounded (the unpermute
    # backward's gather, then the * 3 backward); dw sums g * (3x) over the hidden size, 3x once.
    # After its rounding a term is multiplied by w <= 1 (out), 3 (dx), or g (dw).
    grows = (1.0, 3.0, g.abs().max().item())
    for a, b, m, r, n, f in zip(got, exact, mag, (1, 2, 1), (k, k, h), grows, strict=True):
        assert_rounded(a, b, m, dtype, roundings=r, terms=n, grows=f)
    if drop:  # a dropped slot gets no gradient for its weight
        assert (got[2][~kept] == 0).all()


def test_tile_schedule_covers_every_row_once():
    counts = torch.tensor([5, 0, 37, 1, 17, 0, 32])
    offsets = group_offsets(counts)
    group, first, num = tile_schedule(offsets, int(counts.sum()), 16)
    n = int(num)
    assert n == sum(-(-c // 16) for c in counts.tolist())
    assert len(group) >= n  # the grid's bound: ceil(M / BM) + G
    covered = []
    for g, r in zip(group[:n].tolist(), first[:n].tolist(), strict=True):
        end = int(offsets[g + 1])
        covered += list(range(r, min(r + 16, end)))
        assert int(offsets[g]) <= r < end
    assert covered == list(range(int(counts.sum())))


def test_tiny_problems_skip_autotuning():
    import triton

    from snippets.moe_training.grouped_gemm import DW_SHAPES, _small_first

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk}) for bm, bn, bk, *_ in DW_SHAPES]
    assert _small_first(configs, {"N": 1536}, K=2048) == configs  # the benchmark's shape
    (only,) = _small_first(configs, {"N": 32}, K=2048)  # a test's shape: one compile
    assert only.kwargs["BN"] * only.kwargs["BK"] == min(bn * bk for _, bn, bk, *_ in DW_SHAPES)


def test_dw_takes_tma_configs_only_where_dy_and_x_can_be_described():
    import triton

    from snippets.moe_training.grouped_gemm import DW_SHAPES, _dw_prune

    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "TMA": t})
               for bm, bn, bk, _, _, t in DW_SHAPES]  # fmt: skip
    assert {c.kwargs["TMA"] for c in configs} == {True, False}  # autotuning picks a path
    assert _dw_prune(configs, {"N": 1536, "K": 2048}, CAN_TMA=True) == configs
    kept = _dw_prune(configs, {"N": 1536, "K": 2048}, CAN_TMA=False)
    assert kept and not any(c.kwargs["TMA"] for c in kept)
    (small,) = _dw_prune(configs, {"N": 24, "K": 32}, CAN_TMA=True)  # a test's shape
    assert small.kwargs["TMA"]  # the TMA path is what the GPU tests then run
    # fp32: one pointer config whose stages fit the 232,448 bytes of shared memory a block may
    # have on sm_90 (the bf16 tiles' fp32 stages need 294,912: an H200 run failed on them)
    fp32 = {"DY": torch.empty(0, dtype=torch.float32), "N": 1536, "K": 2048}
    (only,) = _dw_prune(configs, fp32, CAN_TMA=False)
    bm, bn, bk = only.kwargs["BM"], only.kwargs["BN"], only.kwargs["BK"]
    assert not only.kwargs["TMA"] and only.num_stages * (bm * bn + bm * bk) * 4 <= 232448


def test_loop_baseline_backward_writes_each_weight_once():
    # w[g] in a loop: each SelectBackward writes a zero tensor the size of all of w (G copies in
    # all, 102 ms a call at the benchmark's shape); unbind's backward stacks the G slices once
    w = torch.randn(4, 8, 16, requires_grad=True)
    y = grouped_mm_loop(torch.randn(10, 16), w, [3, 0, 5, 2])
    seen, todo = set(), [y.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and fn not in seen:
            seen.add(fn)
            todo += [f for f, _ in fn.next_functions]
    names = {type(fn).__name__ for fn in seen}
    assert "UnbindBackward0" in names and "SelectBackward0" not in names


def _record_paths(monkeypatch):
    """The kernels the forward and dX launch, in order: tma (descriptors) or ptr (fallback)."""
    import snippets.moe_training.grouped_gemm as gg

    paths = []
    for name in ("tma", "ptr"):
        real = getattr(gg, f"_launch_{name}")

        def spy(*args, real=real, name=name):
            paths.append(name)
            return real(*args)

        monkeypatch.setattr(gg, f"_launch_{name}", spy)
    return paths


GROUPS = [5, 0, 37, 1, 17, 0, 20]


# (K, N) -> whether the forward and dX can read through TMA descriptors (2-byte dtypes only):
# K 48 and N 40 -> both; N 19 -> dY [M, N] cannot be described, dX falls back; K 37 -> neither
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("counts,k,n,described", [
    (GROUPS, 48, 40, (True, True)), ([0, 0, 16], 48, 40, (True, True)),
    ([16, 16, 16, 16], 48, 40, (True, True)), (GROUPS, 48, 19, (True, False)),
    (GROUPS, 37, 40, (False, False)),
])  # fmt: skip
def test_grouped_gemm_forward_and_backward(monkeypatch, dtype, counts, k, n, described):
    counts_t = torch.tensor(counts, device=DEVICE)
    m, g = sum(counts), len(counts)
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(m, k, device=DEVICE, dtype=dtype, generator=gen, requires_grad=True)
    w = torch.randn(g, n, k, device=DEVICE, dtype=dtype, generator=gen, requires_grad=True)
    launched = _record_paths(monkeypatch)
    y = grouped_linear(x, w, group_offsets(counts_t))
    dy = torch.randn(m, n, device=DEVICE, dtype=dtype, generator=gen)
    dx, dw = torch.autograd.grad(y, [x, w], dy)
    paths = ["tma" if d and dtype.itemsize == 2 else "ptr" for d in described]
    assert launched == paths

    def reference(x, w, dy):  # fp32 from the same low-precision inputs, one matmul per group
        x, w = x.detach().float().requires_grad_(), w.detach().float().requires_grad_()
        y = grouped_mm_loop(x, w, counts)
        return (y.detach(), *torch.autograd.grad(y, [x, w], dy.float()))

    exact, mag = reference(x, w, dy), reference(x.abs(), w.abs(), dy.abs())
    # The outputs and gradients come in the inputs' dtype, as nn.Linear's and torch._grouped_mm's
    # do; the products of two fp16/bf16 values are exact in fp32 and summed there, so the only
    # rounding to `dtype` is the final one (roundings=0); the longest sum: K, N or a group's rows.
    for got, want, mg in zip((y, dx, dw), exact, mag, strict=True):
        assert_rounded(got, want, mg, dtype, roundings=0, terms=max(k, n, m))
    for e, c in enumerate(counts):
        if c == 0:  # an expert with no rows: a zero weight gradient, not garbage
            assert (dw[e] == 0).all()


def test_grouped_gemm_any_strides_and_no_rows(monkeypatch):
    dtype = DTYPES[-1]  # a 2-byte type: the TMA path
    counts, k, n = [9, 0, 23], 32, 24
    offsets = group_offsets(torch.tensor(counts, device=DEVICE))
    gen = torch.Generator(device=DEVICE).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=DEVICE, generator=gen).to(dtype)

    x = randn(32, 48)[:, :k]  # rows 48 apart: described as they are
    dy = randn(32, 48)[:, :n]
    padded = randn(3, n, 64)[..., :k]  # rows 64 apart: described as it is
    apart = randn(5, n, k)[::2]  # experts 2 N K apart: described as it is
    transposed = randn(3, k, n).transpose(1, 2)  # last stride N: copied contiguous

    def per_group(a, mats):  # fp32, one matmul per group
        return torch.cat([p @ q for p, q in zip(a.float().split(counts), mats, strict=True)])

    import snippets.moe_training.grouped_gemm as gg

    assert gg._describable_w(padded) is padded and gg._describable_w(apart) is apart
    launched = _record_paths(monkeypatch)
    for w in (padded, apart, transposed):
        ws = w.float().unbind(0)
        for got, a, mats in ((grouped_mm(x, w, offsets), x, [v.t() for v in ws]),
                             (grouped_mm_dx(dy, w, offsets), dy, ws)):  # fmt: skip
            mag = per_group(a.abs(), [v.abs() for v in mats])
            assert_rounded(got, per_group(a, mats), mag, dtype, roundings=0, terms=max(k, n))
    assert launched == ["tma"] * 6
    empty = group_offsets(torch.zeros(3, dtype=torch.int64, device=DEVICE))  # M == 0
    assert grouped_mm(x[:0], padded, empty).shape == (0, n)
    assert grouped_mm_dx(dy[:0], padded, empty).shape == (0, k)


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_grouped_gemm_keeps_an_experts_nan_or_inf_to_itself(poison):
    """N 24 is no multiple of the tiles' K step (16 on the CPU, 64 or more on the GPU): dX's last
    step over N reaches past expert 0's rows of W. Those must read as zeros, not as expert 1's
    rows, or 0 * inf = NaN lands in expert 0's dX."""
    dtype = DTYPES[-1]  # a 2-byte type: the TMA path
    counts, k, n = [16, 16, 16], 32, 24
    offsets = group_offsets(torch.tensor(counts, device=DEVICE))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(48, k, device=DEVICE, generator=gen).to(dtype)
    dy = torch.randn(48, n, device=DEVICE, generator=gen).to(dtype)
    w = torch.randn(3, n, k, device=DEVICE, generator=gen).to(dtype)
    w[1] = poison
    ws = w.float().unbind(0)
    for got, a, mats in ((grouped_mm(x, w, offsets), x, [v.t() for v in ws]),
                         (grouped_mm_dx(dy, w, offsets), dy, ws)):  # fmt: skip
        for e in (0, 2):
            rows = slice(16 * e, 16 * e + 16)
            want = a[rows].float() @ mats[e]
            mag = a[rows].float().abs() @ mats[e].abs()
            assert_rounded(got[rows], want, mag, dtype, roundings=0, terms=max(k, n))


def test_grouped_gemm_rejects_bad_shapes():
    x = torch.randn(10, 8, device=DEVICE)
    with pytest.raises(ValueError, match="do not fit"):
        grouped_mm(
            x,
            torch.randn(3, 4, 9, device=DEVICE),
            group_offsets(torch.tensor([5, 5, 0], device=DEVICE)),
        )
    with pytest.raises(ValueError, match="do not fit"):
        grouped_mm(
            x, torch.randn(3, 4, 8, device=DEVICE), group_offsets(torch.tensor([10], device=DEVICE))
        )


@pytest.mark.parametrize("cf", [None, 0.75])
def test_fast_layer_equals_the_reference_layer(cf):
    torch.manual_seed(3)
    cfg = MoeConfig(hidden=32, experts=8, top_k=2, inter=16, shared_inter=16, capacity_factor=cf)
    layer = MoeLayer(cfg).to(DEVICE)
    x = torch.randn(48, 32, device=DEVICE, requires_grad=True)
    want, _, _ = layer(x)
    got, _ = moe_forward_fast(layer, x)
    tol = TF32 if ON_GPU else TOL[torch.float32]
    torch.testing.assert_close(got, want, **tol)
    g = torch.randn_like(want)
    params = [x, layer.gate_up_proj, layer.down_proj, layer.gate.weight]
    for a, b in zip(
        torch.autograd.grad(got, params, g), torch.autograd.grad(want, params, g), strict=True
    ):
        torch.testing.assert_close(a, b, **tol)


# ------------------------------------------------------------------ FP8 and the benchmark code
from snippets.common.results import Stat  # noqa: E402
from snippets.moe_training.fp8 import (  # noqa: E402
    dequantize,
    grouped_mm_fp8,
    quantize_blocks,
    quantize_rows,
)
from snippets.moe_training.measure import (  # noqa: E402
    IMPLS,
    cases,
    measure_fp8,
    measure_grouped,
    ratios,
    zipf_counts,
)


def test_fp8_kernel_equals_the_dequantized_product():
    counts = [40, 0, 9, 23]
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(sum(counts), 256, device=DEVICE, generator=gen)
    w = torch.randn(4, 128, 256, device=DEVICE, generator=gen) * 256**-0.5
    xq, xs = quantize_rows(x)
    wq, ws = quantize_blocks(w)
    assert xs.shape == (72, 2) and ws.shape == (4, 1, 2)
    assert xq.float().abs().max() <= 448  # every tile scaled into e4m3's range
    y = grouped_mm_fp8(xq, xs, wq, ws, group_offsets(torch.tensor(counts, device=DEVICE)),
                       out_dtype=torch.float32)  # fmt: skip
    xd, wd = dequantize(xq, xs, wq, ws)
    want = grouped_mm_loop(xd, wd, counts)
    # same fp32 products of the same values, summed per 128-block then scaled: order only
    torch.testing.assert_close(y, want, **(TF32 if ON_GPU else {"rtol": 1e-5, "atol": 1e-5}))
    # e4m3 keeps 3 mantissa bits: each element within 2^-4 relative of x (half an ulp)
    assert ((xd - x).abs() <= x.abs() * 2**-4 + xs.repeat_interleave(128, 1) * 2**-9).all()


def test_fp8_rejects_shapes_off_the_128_grid():
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_rows(torch.randn(4, 100))
    with pytest.raises(ValueError, match="multiples of 128"):
        quantize_blocks(torch.randn(2, 64, 128))


def test_zipf_counts():
    assert zipf_counts(100, 4, 0.0) == [25, 25, 25, 25]
    c = zipf_counts(1000, 8, 1.0)
    assert sum(c) == 1000 and c == sorted(c, reverse=True) and c[0] > 2.5 * c[7]


def _stub_times(fns):
    return [(f(), Stat.of([1.0, 1.1, 1.0, 1.2, 1.0], "gpu-kernels"))[1] for f in fns]


# the page's GPU fence runs this code at full size; here its structure, at tiny shapes
@pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")
def test_benchmark_code_runs_at_tiny_shapes():
    skews = {"balanced": 0.0, "zipf-1": 1.0}
    rows, parts = measure_grouped(skews, 64, 4, 32, 32, DEVICE, torch.float32, _stub_times,
                                  skip=("torch_grouped_mm",))  # fmt: skip
    # the dW alone: at the first skew only, of the implementations not skipped
    assert [(r["skew"], r["impl"], r["pass"]) for r in parts] == [("balanced", "ours", "dw")]
    assert parts[0]["tflops"].median * 2 == pytest.approx(
        next(r for r in rows if r["impl"] == "ours" and r["pass"] == "backward")["tflops"].median
    )
    # ours and loop at each skew and pass; the dense GEMM (no groups) at the first skew only
    assert len(rows) == 2 * 2 * (len(IMPLS) - 2) + 2
    assert {r["skew"] for r in rows if r["impl"] == "dense"} == {"balanced"}
    assert {r["pass"] for r in rows} == {"forward", "backward"}
    r = ratios(rows)
    assert len(r) == 4 and all("of_dense" in x and "of_loop" in x for x in r)
    at = {(x["skew"], x["pass"], x["impl"]): x["tflops"] for x in rows}
    for x in r:  # every skew's ratio to the one dense measurement
        want = at[x["skew"], x["pass"], "ours"] / at["balanced", x["pass"], "dense"]
        assert x["of_dense"].median == want.median
    base = torch.bfloat16 if ON_GPU else torch.float32
    fp8 = measure_fp8({"balanced": 0.0}, 32, 2, 128, 128, DEVICE, _stub_times, base=base)
    errs = {x["format"]: x["rel_error"] for x in fp8}
    assert errs["base"] < (2**-8 if ON_GPU else 1e-5)  # bf16: one rounding; fp32: sum order
    assert 0.005 < errs["fp8"] < 0.1  # e4m3: 3 mantissa bits


def _dw_path(monkeypatch):
    """The read path of each dW launch (TMA or pointers), as the autotuner's pick."""
    import snippets.moe_training.grouped_gemm as gg

    paths, kernel = [], gg.grouped_mm_dw_kernel
    real = kernel.run

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        tma = kernel.best_config.kwargs["TMA"] and kwargs["CAN_TMA"]
        paths.append("tma" if tma else "ptr")
        return out

    monkeypatch.setattr(kernel, "run", spy)
    return paths


@pytest.mark.parametrize("poison", [math.nan, math.inf])
def test_dw_keeps_a_groups_nan_or_inf_rows_to_itself(monkeypatch, poison):
    """Group sizes no multiple of the row step (16 on the CPU): the last step of a group reads
    past its end. Those rows must read as zeros, not the next group's rows, on either path."""
    dtype = DTYPES[-1]
    counts, k, n = [9, 0, 23, 16], 32, 24
    offsets = group_offsets(torch.tensor(counts, device=DEVICE))
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    x = torch.randn(sum(counts), k, device=DEVICE, generator=gen).to(dtype)
    dy = torch.randn(sum(counts), n, device=DEVICE, generator=gen).to(dtype)
    x[9:32] = poison  # group 2's rows: right after group 0's and the empty group 1's
    paths = _dw_path(monkeypatch)
    for a, b in ((dy, x), (dy[:, 1:], x[:, 1:])):  # described, then not (2-byte offset base)
        dw = grouped_mm_dw(a, b, offsets)
        for e in (0, 3):
            rows = slice(int(offsets[e]), int(offsets[e + 1]))
            want = a[rows].float().t() @ b[rows].float()
            mag = a[rows].float().abs().t() @ b[rows].float().abs()
            assert_rounded(dw[e], want, mag, dtype, roundings=0, terms=counts[e])
        assert (dw[1] == 0).all()
    assert paths == (["tma", "ptr"] if dtype.itemsize == 2 else ["ptr", "ptr"])


def test_timed_dw_is_what_each_backward_returns():
    """The dW timed alone must be the dW each implementation's backward computes, or the
    backward minus it is not the dX: ours and torch._grouped_mm's, same values, same dtype."""
    dtype = DTYPES[-1]
    _, bwd, parts = cases([5, 0, 37, 22], 32, 48, DEVICE, dtype)
    for impl, dw in parts["dw"].items():
        _, want = bwd[impl]()
        got = dw()
        assert got.dtype == want.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=0)


# the page's GPU fence runs this code at full size; here its structure, at tiny shapes
@pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")
def test_balancing_experiment_runs_on_the_stand_in():
    from snippets.moe_training.balance_run import METHODS, curves, run, summarize

    runs = [run(m, 0, steps=3, eval_tokens=128) for m in METHODS]
    # the same initial weights: at step 0 the sigmoid runs see the same routing (bias 0)
    assert runs[1]["lm_loss"][0] == runs[2]["lm_loss"][0]
    assert runs[1]["max_over_mean"][0] == runs[2]["max_over_mean"][0]
    assert all(len(r["max_over_mean"]) == 3 and r["max_over_mean"][0] >= 1 for r in runs)
    s = summarize(runs, tail=2)
    assert [x["method"] for x in s] == list(METHODS)
    assert len(curves(runs, every=2)) == 2 * len(METHODS)


def test_trained_moe_load_on_the_stand_in():
    from snippets.common.corpus import token_streams
    from snippets.common.train import rows, trained
    from snippets.moe_training.balance_run import trained_load

    shared = trained("moe")
    held = rows(token_streams()[1], 32)[:8].to(DEVICE)
    load = trained_load(shared.model, held, 4)
    assert len(load) == shared.config.num_hidden_layers
    assert all(x["max_over_mean"] >= 1 >= x["min_over_mean"] >= 0 for x in load)


def test_routed_block_with_softmax_is_the_shared_block():
    from snippets.common.models.qwen3_moe import Qwen3MoeForCausalLM
    from snippets.moe_training.balance_run import with_routing

    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(TINY_MOE)
    x = torch.randn(2, 5, TINY_MOE.hidden_size)
    want, want_logits = model.model.layers[0].mlp(x)
    mlp = with_routing(model, "softmax")[0]
    got, logits = mlp(x)
    torch.testing.assert_close(got, want)  # the same weights, routing and expert code
    assert torch.equal(logits, want_logits)
    chosen = torch.softmax(logits, -1).topk(TINY_MOE.num_experts_per_tok, -1).indices
    assert torch.equal(
        mlp.load, torch.bincount(chosen.flatten(), minlength=mlp.cfg.experts).float()
    )
    mlp.bias[0] = 10.0  # the bias moves the choice, not the weights: expert 0 for every token
    _, _ = mlp(x)
    assert mlp.load[0] == x.shape[0] * x.shape[1]


def test_autotuned_configs_lists_the_picked_config_per_benchmark_shape():
    from types import SimpleNamespace

    import triton

    from snippets.moe_training.measure import autotuned_configs

    pick = triton.Config({"BM": 128, "BN": 256, "BK": 64}, num_warps=8, num_stages=4)
    small = triton.Config({"BM": 16, "BN": 16, "BK": 16}, num_warps=1, num_stages=1)
    kernel = SimpleNamespace(cache={(1536, 2048, "torch.bfloat16"): pick, (48, 32, "x"): small})
    assert autotuned_configs(kernel, "forward / dX") == [{
        "kernel": "forward / dX", "n_k": "1536 × 2048",
        "config": "BM 128, BN 256, BK 64, 8 warps, 4 stages"}]  # fmt: skip
