"""Unit tests for snippets/gradient_checkpointing/ beyond the page's own checks.

Everything runs on the CPU, where the saved-tensor accounting is exact and the kernels are
deterministic: checkpointing reruns the same ops on the same inputs, so gradients must be
bitwise equal to the run without checkpointing, in fp32 and in bf16 alike. Nothing here needs
CUDA, so on the GPU (nox -s gpu_docs) the module is skipped: the CPU suite has run it.
"""

import dataclasses
import itertools
import random
import re
from pathlib import Path

import pytest
import torch

from snippets.common import results as res
from snippets.common.device import ON_GPU
from snippets.common.models.qwen3 import (
    QWEN3_8B,
    TINY,
    DecoderLayer,
    Kernels,
    Qwen3ForCausalLM,
    lm_loss,
    rope_tables,
)
from snippets.common.results import Stat
from snippets.gradient_checkpointing import accounting as acc
from snippets.gradient_checkpointing.measure import (
    LiveMemory,
    MatmulFlops,
    OpNames,
    autograd_saved,
    is_attention,
)
from snippets.gradient_checkpointing.pareto import (
    RUN_TO_RUN,
    faster,
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
from snippets.gradient_checkpointing.runner import CpuMeter, analyze, measure, per_layer_costs

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")
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


def stand_in_ms(ms: float) -> Stat:
    """A timing as python_ms returns it, around ms: seven repeats within 1 %."""
    return Stat.of([ms * (1 + 0.01 * k / 3) for k in range(-3, 4)], "python")


def test_analyze_end_to_end_on_the_cpu(monkeypatch):
    """bench_gpu.py's pipeline on the TINY model: CpuMeter for the allocator, a stand-in timer
    whose times grow with the recomputed FLOPs; the values must be recordable as they are."""
    cfg = dataclasses.replace(TINY, num_hidden_layers=4)
    model, ids, dy = model_and_inputs(cfg, torch.float32, batch=1, seq=32)
    rows = []
    for policy in POLICIES:
        row = measure(model, policy, ids, dy, CpuMeter())
        row["peak_half"] = measure(model, policy, ids[:, :16], dy[:, :16], CpuMeter())["peak"]
        modes = policy.modes(4)
        row["ms"] = stand_in_ms(1 + sum(acc.recompute_flops(cfg, 1, 32, m) for m in modes) / 1e6)
        rows.append(row)
    scenario = {"layers": 36, "fixed": 1e6, "budget": 2e7, "micro_batches": (1, 2, 4),
                "head": acc.head_per_token(cfg, 4)}  # fmt: skip
    measured, deep, picks = analyze(rows, POLICIES, cfg, 32, 4, 4, scenario)
    assert all(r["kept_gib"] == r["kept_formula_gib"] for r in measured)
    assert [r["policy"] for r in measured] == [p.key for p in POLICIES]
    front = pareto_front(rows)
    assert [r["policy"] for r in measured if r["front"]] == [
        p.key for p, r in zip(POLICIES, rows, strict=True) if any(r is f for f in front)
    ]
    assert sum(r["recommended"] for r in measured) == 1
    pick = next(r for r in measured if r["recommended"])
    assert pick["front"] and pick["peak_gib"] <= measured[0]["peak_gib"] / 2
    assert measured[0]["vs_none"] == 1.0 and measured[0]["flop_ratio"] == 1.0
    by_name = {r["policy"]: r for r in measured}
    assert by_name["full"]["vs_none"].lo > 1  # the stand-in makes recomputation cost time
    assert by_name["sac_all_but_down_proj"]["flop_ratio"] == 1.0  # nothing recomputed counts
    deep_by = {d["policy"]: d for d in deep}
    assert deep_by["full"]["max_sequences"] > deep_by["none"]["max_sequences"]
    assert deep_by["none"]["gib_per_sequence"] > deep_by["sac_attention"]["gib_per_sequence"]
    assert [p["sequences"] for p in picks] == [1, 2, 4]
    assert all(p["policy"] is None or p["policy"] in deep_by for p in picks)
    # what write_result would store: keys are words, timings raw or derived, all finite
    monkeypatch.setattr(res, "provenance", lambda *a, **k: {})
    runner = ROOT / "snippets" / "gradient_checkpointing" / "runner.py"
    pareto = {"policies": measured, "saved_cuda_bytes": 1, "saved_formula_bytes": 1,
              "attention_kernel": "k", "head_peak_bytes": 1, "head_formula_bytes": 1,
              "head_slack_bytes": 1}  # fmt: skip
    res.build_record("measured", "gradient-checkpointing", "checkpoint-pareto", pareto, runner)
    budget = {"fixed_gb": 1.0, "head_gib_per_sequence": 1.0, "policies": deep, "picks": picks}
    res.build_record("measured", "gradient-checkpointing", "checkpoint-budget", budget, runner)


def random_points(rng, n, spread=0.0):
    """Points with integer peaks and times; with spread > 0 the times are Stats of that width."""
    points = []
    for i in range(n):
        peak, ms = rng.randint(1, 30), rng.randint(10, 40)
        t = Stat(ms, ms * (1 - spread), ms * (1 + spread), 7) if spread else ms
        points.append({"name": i, "peak": peak, "ms": t})
    return points


def classic_front(points):
    """Textbook Pareto front of plain numbers: no point is no worse in both and better in one."""

    def dominates(a, b):
        no_worse = a["peak"] <= b["peak"] and a["ms"] <= b["ms"]
        return no_worse and (a["peak"] < b["peak"] or a["ms"] < b["ms"])

    return [p for p in points if not any(dominates(q, p) for q in points)]


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_of_plain_numbers_is_the_textbook_one(seed):
    """Without spread, the front is the classic one (of two identical points it keeps one)."""
    rng = random.Random(seed)
    points = random_points(rng, rng.randint(1, 25))
    front = pareto_front(points)
    classic = classic_front(points)
    assert {(p["peak"], p["ms"]) for p in front} == {(p["peak"], p["ms"]) for p in classic}
    assert len(front) == len({(p["peak"], p["ms"]) for p in classic})


@pytest.mark.parametrize("seed", range(20))
def test_pareto_front_with_spread(seed):
    """Each front point is faster beyond the spread than the one before; every point off the
    front needs no less memory than a front point it is not measurably faster than."""
    rng = random.Random(seed)
    points = random_points(rng, rng.randint(1, 25), spread=0.05)
    front = pareto_front(points)
    for a, b in itertools.pairwise(front):
        assert a["peak"] <= b["peak"] and faster(b, a)
    for p in points:
        if not any(p is f for f in front):
            assert any(f["peak"] <= p["peak"] and not faster(p, f) for f in front)


def test_a_point_within_the_spread_of_a_cheaper_one_is_off_the_front():
    """The SAC case: 1 % faster at the median, but within the spread: the cheaper one stays."""
    cheap = {"peak": 4.2, "ms": Stat(109.3, 108.2, 110.4, 7)}
    dear = {"peak": 7.4, "ms": Stat(108.5, 107.4, 109.6, 7)}
    assert pareto_front([dear, cheap]) == [cheap]
    assert recommend([dear, cheap], budget=10) is cheap
    clearly = {"peak": 7.4, "ms": Stat(100.0, 99.0, 101.0, 7)}
    assert pareto_front([clearly, cheap]) == [cheap, clearly]
    assert recommend([clearly, cheap], budget=10) is clearly


def test_the_front_does_not_flip_between_two_runs_of_one_commit():
    """H200, two full runs of one commit: all_but_last beat sac_attention beyond the repeats'
    range in one run and not in the other (medians 0.8 % and 1.6 % apart). Within RUN_TO_RUN
    they tie, so the front is the same in both; without the margin it differed."""
    runs = [  # (median, lo, hi) of sac_attention (2.595 GiB), all_but_last (2.655 GiB)
        ((115.78, 114.00, 116.28), (114.86, 114.33, 116.49)),
        ((116.61, 115.33, 116.98), (114.71, 113.06, 114.80)),
    ]
    fronts = []
    for sac, abl in runs:
        a = {"peak": 2.595, "ms": Stat(*sac, 7)}
        b = {"peak": 2.655, "ms": Stat(*abl, 7)}
        fronts.append([p["peak"] for p in pareto_front([a, b])])
    assert runs[1][1][2] < runs[1][0][1]  # run 2: all_but_last's hi below sac_attention's lo
    assert fronts == [[2.595], [2.595]]
    near = {"peak": 7.4, "ms": Stat(107.0, 106.9, 107.1, 7)}  # beyond the range, within 2 %
    cheap = {"peak": 4.2, "ms": Stat(109.3, 108.2, 110.4, 7)}
    assert near["ms"].hi < cheap["ms"].lo and not faster(near, cheap)
    assert faster(near, cheap) == (near["ms"].hi < cheap["ms"].lo * (1 - RUN_TO_RUN))


@pytest.mark.parametrize("spread", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(20))
def test_recommend_on_synthetic_points(seed, spread):
    rng = random.Random(seed)
    points = random_points(rng, rng.randint(1, 25), spread)
    front = pareto_front(points)
    assert recommend(points, min(p["peak"] for p in points) - 1) is None
    previous = None
    for budget in range(0, 32):
        pick = recommend(points, budget)
        if pick is None:
            continue
        fits = [p for p in points if p["peak"] <= budget]
        assert pick["peak"] <= budget and any(pick is f for f in front)
        assert not any(faster(p, pick) for p in fits)  # nothing that fits is measurably faster
        if not spread:
            assert pick["ms"] == min(p["ms"] for p in fits)
        assert previous is None or not faster(previous, pick)  # more memory, never slower
        previous = pick


def test_recommend_prefers_less_memory_on_a_tie():
    points = [{"peak": 5, "ms": 2}, {"peak": 3, "ms": 2}, {"peak": 1, "ms": 9}]
    assert recommend(points, 10) == {"peak": 3, "ms": 2}
    assert pareto_front(points) == [{"peak": 1, "ms": 9}, {"peak": 3, "ms": 2}]


def test_scale_to_and_max_tokens():
    per_layer = {"none": (100.0, 2.0), "full": (10.0, 3.0)}
    model = scale_to(["full", "full", "none"], per_layer, working=50.0, fixed=1000.0, head=20.0)
    assert model == {"fixed": 1000.0, "bytes_per_token": 170.0, "ms_per_token": 8.0}
    headed = scale_to(["full", "full", "none"], per_layer, working=50.0, fixed=1000.0, head=80.0)
    assert headed["bytes_per_token"] == 200.0  # the LM head and loss's peak is the larger
    assert max_tokens(model, 1000 + 170 * 99.5) == 99
    assert max_tokens(model, 1000 + 170 * 99.5, multiple=8) == 96
    assert max_tokens(model, 999) == 0


def test_helpers_see_the_attention_kernel():
    q = torch.randn(1, 2, 4, 8)
    with OpNames() as ops:
        torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert any(is_attention(name) for name in ops.names)
    assert not is_attention(torch.ops.aten.mm.default)


def loss_peak_on_the_cpu(dtype, tokens, hidden, vocab):
    """lm_loss's forward + backward: peak bytes beyond its inputs, and the storages autograd
    saves beyond them (nbytes, dtype)."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(vocab, hidden, dtype=dtype))
    h = torch.randn(1, tokens, hidden, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with LiveMemory() as mem:
        lm_loss(h, weight, labels).backward()
    _, saved = autograd_saved(lambda x: lm_loss(x, weight, labels), h, model_state=[weight])
    inputs = {(h.nbytes, h.dtype), (labels.nbytes, labels.dtype)}
    return mem.peak, sorted((n, d.itemsize) for n, d in saved if (n, d) not in inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(("tokens", "hidden", "vocab"), [(40, 16, 300), (7, 8, 97), (64, 64, 1000)])
def test_loss_peak_is_what_eager_cross_entropy_allocates(dtype, tokens, hidden, vocab):
    """12 t V + 8 bytes at the peak, whatever the model dtype: the saved fp32 log-probabilities,
    the gradient nll_loss hands back and the one log_softmax returns; of these autograd saves
    only the first (with nll_loss's total_weight)."""
    cfg = dataclasses.replace(TINY, hidden_size=hidden, vocab_size=vocab)
    peak, saved = loss_peak_on_the_cpu(dtype, tokens, hidden, vocab)
    want = acc.loss_peak(cfg, tokens, dtype.itemsize)
    assert peak == sum(s.bytes for s in want) == 12 * tokens * vocab + 8
    kept = [(s.bytes, s.itemsize) for s in want if "saved for backward" in s.tensor]
    assert saved == sorted(kept)


def test_loss_peak_moves_to_the_lm_head_matmuls_below_its_token_bound():
    """With t < e h / (12 - e) tokens the LM head's dW (e V h) outgrows the loss's buffers: the
    formula is a lower bound there, which the docstring states."""
    cfg = dataclasses.replace(TINY, hidden_size=64, vocab_size=50)
    peak, _ = loss_peak_on_the_cpu(torch.float32, 2, 64, 50)
    assert 2 < 4 * 64 / (12 - 4) and peak > sum(s.bytes for s in acc.loss_peak(cfg, 2, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_a_full_step_peaks_in_the_loss(dtype):
    """model(ids, labels).backward() on one sequence: the peak is what the forward kept, the
    final hidden states and the loss's buffers, to the byte, for every policy; the stack
    without the head (all the budget model measured before) peaks lower."""
    cfg, seq = dataclasses.replace(TINY, num_hidden_layers=4), 64
    model, ids, dy = model_and_inputs(cfg, dtype, batch=1, seq=seq)
    model(ids, labels=ids).backward()  # the LM head's gradient exists too
    for policy in POLICIES:
        apply_policy(model, policy)
        with LiveMemory() as mem:
            model(ids, labels=ids).backward()
        modes = policy.modes(4)
        assert mem.peak == acc.step_peak(cfg, seq, dtype.itemsize, modes), policy.name
        assert mem.peak > measure(model, policy, ids, dy, CpuMeter())["peak"], policy.name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_budget_model_predicts_a_full_step(dtype):
    """analyze()'s model of a deep stack, built from the stack's measurements and the head's
    formula, at the stack's own depth, against a full step measured on the CPU. It charges the
    loss for seq tokens (one more than the step) and the stack's fitted constant (a weight's
    gradient at the stack's peak, gone at the loss's), and leaves out the RoPE table and two
    loss scalars: within 12 V + 8 s d bytes once the constant is taken off. Without the head
    (the model before the LM head was counted) it misses by far more."""
    cfg, seq, e = dataclasses.replace(TINY, num_hidden_layers=4), 64, dtype.itemsize
    model, ids, dy = model_and_inputs(cfg, dtype, batch=1, seq=seq)
    model(ids, labels=ids).backward()
    rows, steps = [], []
    for policy in POLICIES:
        row = measure(model, policy, ids, dy, CpuMeter())
        half = ids[:, : seq // 2], dy[:, : seq // 2]
        row["peak_half"] = measure(model, policy, *half, CpuMeter())["peak"]
        row["ms"] = 1.0
        rows.append(row)
        with LiveMemory() as mem:
            model(ids, labels=ids).backward()
        steps.append(mem.peak)
    bound = 12 * cfg.vocab_size + 8 * seq * cfg.head_dim
    costs = per_layer_costs(rows, POLICIES, 4, seq)
    scenario = {"layers": 4, "fixed": 0, "budget": 1e12, "micro_batches": (1,),
                "head": acc.head_per_token(cfg, e)}  # fmt: skip
    _, deep, _ = analyze(rows, POLICIES, cfg, seq, 4, e, scenario)
    for d, row, policy, step_peak in zip(deep, rows, POLICIES, steps, strict=True):
        predicted = d["gib_per_sequence"] * 2**30  # per token x tokens; the constant is apart
        assert abs(predicted - step_peak) <= bound, policy.name
        slope = (row["peak"] - row["peak_half"]) / (seq - seq // 2)
        old = scale_to(policy.types(4), costs, slope - row["kept"] / seq, 0, head=0)
        assert step_peak - old["bytes_per_token"] * seq > 10 * bound, policy.name
