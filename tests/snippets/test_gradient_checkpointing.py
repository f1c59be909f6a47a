"""Unit tests for snippets/gradient_checkpointing/ beyond the page's own checks.

Everything runs on the CPU, where the saved-tensor accounting is exact and the kernels are
deterministic: checkpointing reruns the same ops on the same inputs, so gradients must be
bitwise equal to the run without checkpointing, in fp32 and in bf16 alike.
"""

import dataclasses
import itertools
import random
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from snippets.gradient_checkpointing import accounting as acc
from snippets.gradient_checkpointing.measure import (
    LiveMemory,
    MatmulFlops,
    OpNames,
    autograd_saved,
    is_attention,
)
from snippets.gradient_checkpointing.pareto import (
    dominates,
    max_tokens,
    pareto_front,
    recommend,
    scale_to,
)
from snippets.gradient_checkpointing.policies import (
    POLICIES,
    Checkpointed,
    Policy,
    apply_policy,
    every,
    layer_type,
)
from snippets.gradient_checkpointing.runner import CpuMeter, analyze, measure
from snippets.qwen3_fusion.model import (
    QWEN3_8B,
    TINY,
    DecoderLayer,
    Kernels,
    Qwen3ForCausalLM,
    rope_tables,
)
from tests.hooks import fake_page, load_hook

ROOT = Path(__file__).resolve().parents[2]
# A second shape: other head counts (GQA 6:2), head_dim 8, an MLP width that is not a multiple
# of the hidden size.
ODD = dataclasses.replace(
    TINY, hidden_size=48, intermediate_size=80, num_attention_heads=6, num_key_value_heads=2,
    head_dim=8, vocab_size=97, num_hidden_layers=3,
)  # fmt: skip


@pytest.mark.parametrize("cfg", [TINY, ODD], ids=["tiny", "odd"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("batch", "seq"), [(1, 7), (3, 5)])
def test_saved_tensors_match_autograd_exactly(cfg, dtype, batch, seq):
    torch.manual_seed(0)
    layer = DecoderLayer(cfg, Kernels()).to(dtype)
    x = torch.randn(batch, seq, cfg.hidden_size, dtype=dtype, requires_grad=True)
    cos, sin = rope_tables(cfg, seq)
    _, got = autograd_saved(layer, x, cos, sin, model_state=list(layer.parameters()))
    want = acc.saved_tensors(cfg, batch, seq, dtype.itemsize)
    assert sorted((n, d.itemsize) for n, d in got) == sorted((s.bytes, s.itemsize) for s in want)


@pytest.mark.parametrize("cfg", [TINY, ODD, QWEN3_8B], ids=["tiny", "odd", "qwen3-8b"])
@pytest.mark.parametrize("e", [2, 4])
def test_per_token_formula_on_the_page(cfg, e):
    """(8 + 4e) h + (4 + 3e)(n_q + n_kv) d + 4e I + 4 (2 n_q + n_kv) + 8 bytes per token."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    per_token = (8 + 4 * e) * h + (4 + 3 * e) * (nq + nkv) * d + 4 * e * i + 4 * (2 * nq + nkv) + 8
    for batch, seq in [(1, 5), (3, 8)]:
        saved = acc.saved_tensors(cfg, batch, seq, e)
        by_token = sum(s.bytes for s in saved if s.tensor not in ("cos", "sin"))
        assert by_token == batch * seq * per_token


def test_a_storage_saved_twice_counts_once():
    x = torch.randn(5, requires_grad=True)
    _, saved = autograd_saved(lambda t: (t * t).sum(), x)  # mul saves x as self and as other
    assert saved == [(20, torch.float32)]
    w = torch.nn.Parameter(torch.randn(5))
    _, saved = autograd_saved(lambda t: (t * w).sum(), x, model_state=[w])
    assert saved == [(20, torch.float32)]  # x only: the parameter is model state


def model_and_inputs(cfg, dtype, batch=2, seq=32):
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=g)
    dy = torch.randn(batch, seq, cfg.hidden_size, generator=g).to(dtype)
    model.hidden_states(ids).backward(dy)  # gradients exist: later steps only move activations
    return model, ids, dy


def step(model, policy, ids, dy):
    apply_policy(model, policy)
    model.zero_grad(set_to_none=False)
    with MatmulFlops() as flops, LiveMemory() as mem:
        hidden = model.hidden_states(ids)
        kept = mem.now() - hidden.untyped_storage().nbytes()
        hidden.backward(dy)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return grads, kept, flops.flops


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_policy_gives_identical_gradients_and_the_predicted_costs(dtype):
    cfg = ODD
    model, ids, dy = model_and_inputs(cfg, dtype)
    batch, seq = ids.shape
    reference, _, base = step(model, POLICIES[0], ids, dy)
    for policy in POLICIES:
        grads, kept, flops = step(model, policy, ids, dy)
        unwrapped = {re.sub(r"\.layer\.", ".", n): g for n, g in grads.items()}  # wrapper prefix
        assert unwrapped.keys() == reference.keys(), policy.name
        assert all(torch.equal(g, reference[n]) for n, g in unwrapped.items()), policy.name
        modes = policy.modes(cfg.num_hidden_layers)
        assert kept == acc.kept_after_forward(cfg, batch, seq, dtype.itemsize, modes), policy
        recompute = sum(acc.recompute_flops(cfg, batch, seq, m) for m in modes)
        assert flops - base == recompute, policy.name


def test_a_custom_policy_and_layer_choice():
    """Any subset of outputs and of layers: costs still match the formulas exactly."""
    cfg = dataclasses.replace(TINY, num_hidden_layers=5)
    model, ids, dy = model_and_inputs(cfg, torch.float32, batch=1, seq=24)
    policy = Policy("v and up, layers 1 and 3", lambda i, n: i in (1, 3), frozenset({"v_proj"}))
    reference, _, base = step(model, POLICIES[0], ids, dy)
    grads, kept, flops = step(model, policy, ids, dy)
    assert all(torch.equal(g, reference[re.sub(r"\.layer\.", ".", n)]) for n, g in grads.items())
    modes = policy.modes(5)
    assert modes == [None, frozenset({"v_proj"}), None, frozenset({"v_proj"}), None]
    assert kept == acc.kept_after_forward(cfg, 1, 24, 4, modes)
    assert flops - base == 2 * acc.recompute_flops(cfg, 1, 24, frozenset({"v_proj"}))


def test_apply_policy_wraps_and_unwraps_in_place():
    model = Qwen3ForCausalLM(TINY)
    layers = list(model.model.layers)
    apply_policy(model, POLICIES[1])
    assert all(isinstance(m, Checkpointed) for m in model.model.layers)
    assert [m.layer for m in model.model.layers] == layers
    apply_policy(model, POLICIES[4])  # odd layers: re-wrapping starts from the bare layers
    assert [isinstance(m, Checkpointed) for m in model.model.layers] == [False, True]
    apply_policy(model, POLICIES[0])
    assert list(model.model.layers) == layers


def test_policy_names_and_types():
    assert len({p.name for p in POLICIES}) == len(POLICIES)
    assert POLICIES[0].types(3) == ["none"] * 3 and POLICIES[1].types(2) == ["full"] * 2
    assert layer_type(frozenset({"up_proj", "attention"})) == "sac: attention + up_proj"
    assert Policy("x", every, frozenset({"attention"})).modes(2) == [frozenset({"attention"})] * 2


def test_recompute_stops_before_down_proj():
    """Early stop: the last tensor backward needs is down_proj's input, so a full recompute
    reruns every matmul but down_proj, and saving down_proj's output saves no FLOPs."""
    everything = acc.recompute_flops(TINY, 1, 16, frozenset())
    assert everything == acc.recompute_flops(TINY, 1, 16, frozenset({"down_proj"}))
    ops = {f.name: f.flops for f, _ in acc.layer_ops(TINY, 1, 16)}
    rerun = ("q_proj", "k_proj", "v_proj", "attention", "o_proj", "gate_proj", "up_proj")
    assert everything == sum(ops[n] for n in rerun)


def test_per_layer_increments_are_the_per_layer_formula():
    cfg = dataclasses.replace(TINY, num_hidden_layers=4)
    model, ids, dy = model_and_inputs(cfg, torch.bfloat16, batch=1, seq=32)
    for policy in POLICIES:
        types = set(policy.types(4))
        row = measure(model, policy, ids, dy, CpuMeter())
        assert row["kept"] == acc.kept_after_forward(cfg, 1, 32, 2, policy.modes(4))
        if len(types) == 1:  # uniform: every layer adds exactly its share
            share = acc.kept_per_layer(cfg, 1, 32, 2, policy.modes(4)[0])
            assert row["layers"] == [share] * 3, policy.name
        assert row["peak"] >= row["kept"]


def test_analyze_end_to_end_on_the_cpu():
    cfg = dataclasses.replace(TINY, num_hidden_layers=4)
    model, ids, dy = model_and_inputs(cfg, torch.float32, batch=1, seq=32)
    rows = []
    for policy in POLICIES:
        row = measure(model, policy, ids, dy, CpuMeter())
        row["peak_half"] = measure(model, policy, ids[:, :16], dy[:, :16], CpuMeter())["peak"]
        modes = policy.modes(4)
        row["ms"] = 1 + sum(acc.recompute_flops(cfg, 1, 32, m) for m in modes) / 1e6
        rows.append(row)
    scenario = {"layers": 36, "fixed": 1e6, "budget": 2e7, "micro_batches": (1, 2, 4)}
    measured, deep, values = analyze(rows, POLICIES, cfg, 32, 4, 4, scenario)
    assert values["kept_error"] == 0
    assert values["front"] == [r["policy"] for r in pareto_front(measured)]
    assert set(values["recommend"]) == {"1", "2", "4"}
    assert sum(r["recommended"] for r in measured) == 1
    pick = next(r for r in measured if r["recommended"])
    assert pick["front"] and pick["peak"] <= rows[0]["peak"] / 2
    by_name = {d["policy"]: d for d in deep}
    assert by_name["full"]["max_sequences"] > by_name["none"]["max_sequences"]
    assert by_name["none"]["gib_per_sequence"] > by_name["sac: attention"]["gib_per_sequence"]


def random_points(rng, n):
    return [{"name": i, "peak": rng.randint(1, 30), "ms": rng.randint(1, 30)} for i in range(n)]


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_on_synthetic_points(seed):
    rng = random.Random(seed)
    points = random_points(rng, rng.randint(1, 25))
    front = pareto_front(points)
    assert front and all(not any(dominates(q, p) for q in points) for p in front)
    assert all(any(dominates(f, p) for f in front) for p in points if p not in front)
    for a, b in itertools.pairwise(front):  # less memory buys more time
        assert a["peak"] <= b["peak"] and a["ms"] >= b["ms"]


@pytest.mark.parametrize("seed", range(20))
def test_recommend_on_synthetic_points(seed):
    rng = random.Random(seed)
    points = random_points(rng, rng.randint(1, 25))
    front = pareto_front(points)
    assert recommend(points, min(p["peak"] for p in points) - 1) is None
    previous = None
    for budget in range(0, 32):
        pick = recommend(points, budget)
        if pick is None:
            continue
        assert pick["peak"] <= budget and pick in front
        assert pick["ms"] == min(p["ms"] for p in points if p["peak"] <= budget)
        assert previous is None or pick["ms"] <= previous["ms"]  # more memory, never slower
        previous = pick


def test_recommend_prefers_less_memory_on_a_tie():
    points = [{"peak": 5, "ms": 2}, {"peak": 3, "ms": 2}, {"peak": 1, "ms": 9}]
    assert recommend(points, 10) == {"peak": 3, "ms": 2}
    assert pareto_front(points) == [{"peak": 1, "ms": 9}, {"peak": 3, "ms": 2}]


def test_scale_to_and_max_tokens():
    per_layer = {"none": (100.0, 2.0), "full": (10.0, 3.0)}
    model = scale_to(["full", "full", "none"], per_layer, working=50.0, fixed=1000.0)
    assert model == {"fixed": 1000.0, "bytes_per_token": 170.0, "ms_per_token": 8.0}
    assert max_tokens(model, 1000 + 170 * 99.5) == 99
    assert max_tokens(model, 1000 + 170 * 99.5, multiple=8) == 96
    assert max_tokens(model, 999) == 0


def test_helpers_see_the_attention_kernel():
    q = torch.randn(1, 2, 4, 8)
    with OpNames() as ops:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert any(is_attention(name) for name in ops.names)
    assert not is_attention(torch.ops.aten.mm.default)


def test_scatter_plot_marks_the_front_and_the_recommendation():
    """hooks/results.py's "scatter" kind: linear axes, one labelled point per row, front
    points filled and joined, the highlighted row ringed; the SVG is well formed."""
    hook = load_hook("results")
    rows = [
        {"idx": 1, "gib": 8.0, "ms": 10.0, "front": True, "best": False},
        {"idx": 2, "gib": 2.0, "ms": 14.0, "front": True, "best": True},
        {"idx": 3, "gib": 6.0, "ms": 15.0, "front": False, "best": False},
    ]
    plot = {"kind": "scatter", "x": "gib", "y": "ms", "label": "idx", "front": "front",
            "highlight": "best", "x_label": "GiB", "y_label": "ms"}  # fmt: skip
    record = {"slug": "demo", "name": "n", "table": {"rows": rows}, "plot": plot, "provenance": {
        "gpu": "g", "driver": "d", "cuda": "c", "torch": "t", "triton": "t", "date": "x",
        "commit": "0"}}  # fmt: skip
    page = fake_page("posts/demo.md")
    (svg,) = re.findall(r"<svg.*?</svg>", hook.plot(record, page))
    ET.fromstring(svg)
    circles = re.findall(r"<circle [^>]*>", svg)
    assert len(circles) == 4  # three points and one ring
    assert sum('fill="none"' not in c for c in circles) == 2  # the front is filled
    (line,) = re.findall(r'<polyline points="([^"]*)"', svg)
    assert len(line.split()) == 2  # joins the two front points
    assert all(f">{i}</text>" in svg for i in (1, 2, 3))
