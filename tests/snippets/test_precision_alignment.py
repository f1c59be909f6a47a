"""Unit tests for snippets/precision_alignment/: the metrics, the sources, the three gates, the
GPU run's code at CPU sizes, and the acceptance test: each planted bug is caught by the gate
the page says catches it (and, where the page says so, missed by the others).

On the CPU the Triton kernels run in the interpreter in fp32 and fp16 (the interpreter mangles
bf16). On the GPU every test here is skipped: the page itself runs the planted-bug checks in
bf16 there (sections 3.1, 3.2 and 4 print their verdicts, and the GPU run's claims judge the
gates at scale), and repeating the fp32 / fp16 variants would only compile every kernel again.
Tolerances are the gates' own: elementwise bounds from snippets/triton_kernels/numerics.py (op
gate), 2 err(eager) + u_p against fp64 (model gate), the band of perturbed eager runs (end-to-end
gate).
"""

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from snippets.common import results as res
from snippets.common.device import DEVICE, LOW_PRECISION, ON_GPU
from snippets.common.models.fp64 import FP64
from snippets.common.models.qwen3 import TINY, Kernels
from snippets.precision_alignment import collect, planted, sources
from snippets.precision_alignment import e2e_gate as e2e
from snippets.precision_alignment import op_gate as og
from snippets.precision_alignment.metrics import bound_ratio, cosine, ulp_distance
from snippets.precision_alignment.model_gate import model_gate, trace
from snippets.triton_kernels.numerics import gamma
from snippets.triton_kernels.qwen3 import TRITON, fused_loss
from tests import gate

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    ON_GPU, reason="the CPU suite's (nox -s tests); on the GPU the page runs the bf16 checks"
)


# Metrics ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_ulp_distance_counts_representable_steps(dtype):
    x = torch.tensor([1.0, -3.5, 1e-3, 0.0], dtype=dtype)
    up = torch.nextafter(x, torch.full_like(x, float("inf")))
    assert ulp_distance(up, x).tolist() == [1, 1, 1, 1]
    two_up = torch.nextafter(up, torch.full_like(x, float("inf")))
    assert ulp_distance(two_up, x).tolist() == [2, 2, 2, 2]
    zeros = torch.tensor([0.0, -0.0], dtype=dtype)
    assert ulp_distance(zeros[:1], zeros[1:]).item() == 0  # +0 and -0 are the same value
    tiny = torch.tensor([torch.finfo(dtype).smallest_normal], dtype=dtype)
    assert ulp_distance(tiny, -tiny).item() == 2 * ulp_distance(tiny, zeros[:1]).item()


def test_cosine_is_blind_to_scale_and_bound_ratio_is_not():
    x = torch.randn(100, generator=torch.Generator().manual_seed(0))
    assert cosine(3 * x, x) == pytest.approx(1.0, abs=1e-12)
    assert bound_ratio(3 * x, x, 1e-3 * x.abs().double() + 1e-12) > 1000


# Sources ---------------------------------------------------------------------------------------


def test_hashed_inputs_are_exact_in_fp32_and_fixed():
    x = sources.hashed_uniform(1000, seed=5)
    assert torch.equal(x.float().double(), x)
    assert x.min() >= -1 and x.max() < 1 and x.abs().mean() > 0.4  # spread over [-1, 1)
    assert torch.equal(x, sources.hashed_uniform(1000, seed=5))
    assert not torch.equal(x, sources.hashed_uniform(1000, seed=6))


def test_summation_orders_stay_in_their_bounds():
    x = sources.hashed_uniform(1024, seed=9).float()
    exact, mag = x.double().sum(), x.double().abs().sum()
    assert torch.equal(sources.split_sum(x, 1), sources.sequential_sum(x))
    for s, steps in ((sources.sequential_sum(x), 1023), (sources.pairwise_sum(x), 10),
                     (sources.split_sum(x, 32), 31 + 31)):  # fmt: skip
        assert (s.double() - exact).abs() <= gamma(steps) * mag
    orders = [sources.hashed_uniform(32, seed=k).argsort().tolist() for k in range(8)]
    assert len({sources.split_sum(x, 32, o).item() for o in orders}) > 1


def test_accumulate_stagnates_where_the_format_runs_out_of_bits():
    assert sources.accumulate(torch.ones(600), torch.bfloat16).item() == 256
    assert sources.accumulate(torch.ones(3000), torch.float16).item() == 2048
    assert sources.accumulate(torch.ones(3000), torch.float32).item() == 3000


def test_tf32_emulation_keeps_ten_mantissa_bits():
    x = sources.hashed_uniform(500, seed=1).float() * 1000
    t = sources.tf32_inputs(x)
    assert ((t.view(torch.int32) & 0x1FFF) == 0).all()
    assert ((x - t).abs() <= 2.0**-10 * x.abs()).all() and (t.abs() <= x.abs()).all()


def test_tf32_setting_is_restored():
    before = torch.backends.cuda.matmul.fp32_precision
    with sources.fp32_matmul("tf32"):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32"
    assert torch.backends.cuda.matmul.fp32_precision == before
    assert torch.get_float32_matmul_precision() == "highest"  # the legacy API still answers


def test_index_add_on_the_cpu_is_deterministic_either_way():
    assert sources.index_add_distinct("cpu", False, runs=3, n=4096) == 1
    assert sources.index_add_distinct("cpu", True, runs=3, n=4096) == 1
    assert not torch.are_deterministic_algorithms_enabled()  # restored


# Op gate ---------------------------------------------------------------------------------------


def test_parity_threshold_is_derived_and_absent_in_fp32():
    assert og.parity_allowed(4096, torch.float32) is None
    assert og.parity_allowed(256, torch.float16) == pytest.approx(2 * gamma(264) * 2**11)
    assert og.parity_allowed(256, torch.bfloat16) < 0.01


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_our_kernels_pass_the_op_gate_at_other_shapes(dtype):
    cases = [
        og.rmsnorm_case(37, 300, dtype, seed=3),  # a tail of rows, H not a power of two
        og.rmsnorm_case(1, 64, dtype, seed=4, residual=True),
        og.swiglu_case(3, 1030, dtype, seed=5),  # two column blocks
        og.rope_case(1, 3, 1, 7, 12, dtype, seed=6),  # MQA, half-dim 6
        og.cross_entropy_case(13, 32, 130, dtype, seed=7),
    ]
    for case in cases:
        report = og.op_gate(case, og.OURS[case.name])
        assert report.passed, (case.name, report)
        if dtype == torch.float16 and "rmsnorm" in case.name:
            assert report.parity and all(m <= a for m, _, a in report.parity.values())


# The planted bugs: each caught by the gate the page names ---------------------------------------


@pytest.mark.slow  # the Triton interpreter: seconds
def test_bug1_low_precision_dw_is_caught_by_the_op_gate_at_production_rows_per_program():
    """Page §3.1 and the table in §3.4: missed at 4 rows per program, caught at 128; the
    accuracy check catches it (dW), not the parity check (the forward is untouched)."""
    case = og.rmsnorm_case(128, 64, torch.float16)
    small = og.op_gate(case, planted.rms_norm_lowp_dw(4))
    large = og.op_gate(case, planted.rms_norm_lowp_dw(128))
    assert small.passed
    assert not large.passed and large.ratios["dw"] > 2
    assert large.ratios["y"] <= 1 and large.ratios["dx"] <= 1
    assert all(m <= a for m, _, a in large.parity.values())
    ours = og.op_gate(case, og.OURS["rmsnorm"])  # the original kernel, same launch shape
    assert ours.passed


def test_bug2_cast_after_the_weight_is_caught_only_by_parity():
    """Page §2.3 and §3.1: as accurate as the original against fp64, but it rounds
    differently from Hugging Face's RMSNorm on far more elements than two correct
    implementations can."""
    case = og.rmsnorm_case(32, 256, torch.float16)
    report = og.op_gate(case, planted.rms_norm_weight_first)
    assert all(r <= 1 for r in report.ratios.values())
    mismatch, _, allowed = report.parity["y"]
    assert mismatch > 3 * allowed and not report.passed


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_bug3_miswired_fused_forward_is_located_by_the_model_gate(dtype):
    ids = e2e.sequences(1, 7, TINY.vocab_size, seed=2).to(DEVICE)
    eager = e2e.initial_model(TINY, None, dtype, DEVICE)
    fused = e2e.initial_model(TINY, TRITON, dtype, DEVICE)
    report = model_gate(eager, fused, ids, ids, planted.fused_loss_miswired)
    assert report.first_failure("activation") == "1.mlp_in"
    sites = {s.name: s for s in report.sites if s.kind == "activation"}
    assert all(sites[k].ok for k in ("0.attn_in", "0.attn_out", "0.mlp_in", "0.mlp_out",
                                     "1.attn_in", "1.attn_out"))  # fmt: skip
    unused = "model.layers.1.post_attention_layernorm.weight"  # the bug never reads it
    assert not next(s for s in report.sites if s.name == unused).ok


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_bug4_bf16_rope_tables_are_caught_by_the_op_gate(dtype):
    """The op gate hands the kernel correct fp32 tables; this RoPE builds its own in bf16."""
    report = og.op_gate(og.rope_case(2, 4, 2, 5, 16, dtype), planted.rope_bf16_tables(1e6))
    assert not report.passed and all(r > 1 for r in report.ratios.values())


def test_bug4_bf16_rope_tables_are_caught_by_the_model_and_end_to_end_gates():
    ids = e2e.sequences(2, 9, TINY.vocab_size, seed=1).to(DEVICE)
    eager = e2e.initial_model(TINY, None, torch.float32, DEVICE)
    bug = Kernels(rope=planted.rope_bf16_tables(TINY.rope_theta))
    report = model_gate(eager, e2e.initial_model(TINY, bug, torch.float32, DEVICE), ids, ids)
    assert report.first_failure("activation") == "0.attn_out"
    assert report.first_failure("gradient") is not None
    steps = e2e.batches(e2e.sequences(32, 8, TINY.vocab_size), 3, 2)
    run = e2e.e2e_gate(TINY, bug, steps, 3e-3, torch.float32, DEVICE)
    assert not run.passed and run.first_exceeded == 0


# Model gate ------------------------------------------------------------------------------------


@pytest.mark.slow  # the Triton interpreter: seconds
def test_trace_sees_the_same_sites_in_the_eager_and_the_fused_forward():
    ids = e2e.sequences(1, 5, TINY.vocab_size).to(DEVICE)
    model = e2e.initial_model(TINY, TRITON, torch.float32, DEVICE)
    eager, fused = trace(model, ids, ids), trace(model, ids, ids, fused_loss)
    names = [f"{i}.{p}_{d}" for i in range(2) for p in ("attn", "mlp") for d in ("in", "out")]
    assert list(eager.acts) == list(fused.acts) == names
    assert set(eager.grads) == set(fused.grads) == set(names)
    assert len(eager.params) == 25 and all(g is not None for g in fused.params.values())
    assert torch.allclose(eager.loss, fused.loss, rtol=2 * gamma(TINY.vocab_size))


@pytest.mark.slow  # the Triton interpreter: seconds
def test_model_gate_passes_our_kernels_in_fp32():
    ids = e2e.sequences(2, 6, TINY.vocab_size, seed=3).to(DEVICE)
    eager = e2e.initial_model(TINY, None, torch.float32, DEVICE)
    fused = e2e.initial_model(TINY, TRITON, torch.float32, DEVICE)
    report = model_gate(eager, fused, ids, ids, fused_loss)
    assert report.passed and report.first_failure("gradient") is None


# End-to-end gate -------------------------------------------------------------------------------


def test_permuting_hidden_dims_keeps_the_function():
    cfg = replace(TINY, num_hidden_layers=1)
    ids = e2e.sequences(2, 6, cfg.vocab_size).to(DEVICE)
    base = e2e.initial_model(cfg, FP64, torch.float64, DEVICE)  # fp64 norms too: rtol 1e-12 holds
    perm = e2e.permute_dims(e2e.initial_model(cfg, FP64, torch.float64, DEVICE), seed=1)
    assert not torch.equal(base.lm_head.weight, perm.lm_head.weight)
    assert torch.allclose(base(ids, labels=ids), perm(ids, labels=ids), rtol=1e-12)


def test_dither_moves_every_nonzero_weight_by_one_ulp():
    model = e2e.initial_model(TINY, None, torch.bfloat16, DEVICE)
    before = [p.detach().clone() for p in model.parameters()]
    e2e.dither(model, seed=0)
    for b, p in zip(before, model.parameters(), strict=True):
        assert (ulp_distance(p.detach(), b) == (b != 0).long()).all()


def test_band_rule():
    eager = torch.tensor([5.0, 4.0, 3.0], dtype=torch.float64)
    others = eager + torch.tensor([[1e-3, 0.0, 0.0], [0.0, -2e-3, 0.0]], dtype=torch.float64)
    eps = torch.finfo(torch.float32).eps
    expected = 2 * torch.tensor([1e-3, 2e-3, 2e-3], dtype=torch.float64) + 2 * eps * eager
    assert torch.allclose(e2e.band(eager, others), expected)


def test_eager_as_its_own_candidate_passes_with_zero_deviation():
    steps = e2e.batches(e2e.sequences(8, 6, TINY.vocab_size), 3, 2)
    run = e2e.e2e_gate(TINY, Kernels(), steps, 3e-3, torch.float32, DEVICE)
    assert run.passed and float(run.ratio.max()) == 0.0
    assert run.others.shape == (8, 3) and (run.band > 0).all()


def test_the_task_is_learnable():
    cfg = replace(TINY, vocab_size=32)
    steps = e2e.batches(e2e.sequences(64, 12, cfg.vocab_size), 60, 8)
    losses = e2e.train(e2e.initial_model(cfg, None, torch.float32, DEVICE), steps, 1e-2)
    assert losses[-5:].mean() < 0.6 * losses[:5].mean()


# The GPU run's code, at CPU sizes ---------------------------------------------------------------


def stand_in_curves(steps: int, runs: int = 8) -> dict:
    """Runs shaped like e2e_runs' at `steps` steps (the CPU cannot train that long): a falling
    eager curve, perturbed curves around it, a candidate inside the band and a bug outside."""
    gen = torch.Generator().manual_seed(0)
    eager = torch.linspace(6.4, 0.3, steps, dtype=torch.float64)
    others = eager + 1e-3 * torch.randn(runs, steps, generator=gen, dtype=torch.float64)
    band = e2e.band(eager, others)
    report = e2e.E2EReport(eager, eager + 0.2 * band, others, band)
    bug = e2e.E2EReport(eager, eager + 0.5 * band, others, band)
    return {"fused": report, "bug": bug, "repeat": eager[:10].clone(), "other_seed": eager + 0.05}


@pytest.mark.slow  # the Triton interpreter: seconds
def test_the_gpu_run_fits_the_page(tmp_path, monkeypatch):
    """The GPU run's functions at CPU sizes (the end-to-end curves stand-ins at the GPU run's
    length, since the page reads its last step): every table, plot, number and claim on the
    page resolves against what they return, and every value they return is read. Whether the
    claims hold is the GPU run's to say."""
    plan = collect.CPU_SMOKE
    values = {
        "precision-sources": collect.source_values(plan, DEVICE),
        "precision-op-gate": collect.op_values(plan, LOW_PRECISION, DEVICE),  # parity: not fp32
        "precision-model-gate": collect.model_values(plan, torch.float32, DEVICE),
    }
    curves = stand_in_curves(collect.H200.e2e_steps)
    values["precision-e2e"] = collect.e2e_values(curves, collect.H200.every)
    assert [r["distinct"] for r in values["precision-sources"]["index_add"]] == [1, 1]  # CPU
    assert all(r["ratio"] <= 1 for r in values["precision-op-gate"]["tensors"])
    model = values["precision-model-gate"]
    assert all(s["of_bound"] <= 1 for s in model["sites"]) and len(model["sites"]) == 42
    assert [a["kernel"] for a in model["ablation"]] == ["norm", "rope", "mlp_act", "loss"]
    curve = values["precision-e2e"]["curve"]
    assert [r["step"] for r in curve] == [*range(0, 50, 5), 49]
    prov = dict.fromkeys(res.PROVENANCE["measured"], "stand-in") | {"dirty": True, "wall_s": 1.0}
    prov["commit"] = res.commit_and_dirty()[0]
    monkeypatch.setattr(res, "provenance", lambda *args, **kwargs: prov)
    bench = ROOT / "snippets" / "precision_alignment" / "bench_gpu.py"
    for name, v in values.items():
        record = res.build_record("measured", collect.SLUG, name, v, bench)
        path = tmp_path / collect.SLUG / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    slugs = {collect.SLUG}
    problems = [e for e in gate.page_errors(ROOT, tmp_path, slugs) if "does not hold" not in e]
    assert problems == []
    assert gate.unread_errors(ROOT, tmp_path, slugs) == []


@pytest.mark.slow  # the Triton interpreter: seconds
def test_the_gpu_run_code_runs_the_end_to_end_gate():
    plan = collect.CPU_SMOKE
    runs = collect.e2e_runs(plan, torch.float32, DEVICE)
    assert runs["fused"].passed and runs["fused"].others.shape == (plan.e2e_runs, plan.e2e_steps)
    assert not runs["bug"].passed  # fp32: the bf16 RoPE tables show at once
    values = collect.e2e_values(runs, plan.every)
    assert [r["step"] for r in values["curve"]] == [0, 2]
    assert values["repeat_max"] == 0.0 and values["seed_spread"] > 0
    assert values["worst_ratio"] <= 1 < values["bug_worst_ratio"]


def test_the_gpu_plan_uses_qwen3_8b_widths():
    shapes = {builder.__name__: args for builder, args, *_ in collect.H200.op_cases}
    assert shapes["rmsnorm_case"] == (4096, 4096) and shapes["swiglu_case"][1] == 12_288
    assert shapes["rope_case"][1:3] == (32, 8) and shapes["rope_case"][-1] == 128
    cfg = collect.H200.model  # both the model gate's and the end-to-end gate's
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.rope_theta == 1e6 and cfg.rms_norm_eps == 1e-6
    assert collect.H200.model_tokens[1] == 512  # bf16 RoPE tables show in bf16 only at length
