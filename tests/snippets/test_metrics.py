"""Unit tests for snippets/metrics/: definitions pinned by hand-checked traces, and reproductions
of published numbers (PaLM, ZeRO, Megatron-LM, Korthikanti et al., DistServe, the Qwen3 card).

Tolerances come from the printed precision (snippets/metrics/reproduce.py, `Printed`): a number
printed with d decimals stands for +- half a unit of its last digit; inputs are propagated as
intervals, and a reproduction passes when the computed and the published intervals overlap.
"""

import json
import random
import shutil
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from snippets.common import results as res
from snippets.common.device import ON_GPU
from snippets.common.hardware import load_hardware, ridge_point
from snippets.common.models.qwen3 import TINY, count_parameters
from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.metrics import measure as ms
from snippets.metrics import reproduce as rp
from snippets.metrics.calculators import CALCULATORS, busbw_calculator, zero_calculator
from snippets.metrics.memory import (
    ADAM_MIXED_PRECISION,
    K,
    zero_model_state_bytes,
    zero_model_states,
)
from snippets.metrics.qwen3 import QWEN3_8B, qwen3_params
from snippets.metrics.roofline import (
    algbw,
    arithmetic_intensity,
    attainable_flops,
    bus_factor,
    busbw,
    matmul_bytes,
    matmul_flops,
)
from snippets.metrics.serving import (
    SLO,
    Request,
    disaggregated_goodput,
    duration,
    e2e,
    goodput,
    itls,
    meets,
    output_token_throughput,
    per_gpu_goodput,
    percentile,
    pooled_itls,
    request_throughput,
    slo_attainment,
    tpot,
    ttft,
)
from snippets.metrics.training import (
    flops_per_token,
    flops_per_token_6n,
    flops_per_token_palm,
    megatron_flops_per_iteration,
    megatron_params,
    mfu,
    tgs,
    tokens_per_second,
    training_days,
    utilization,
)
from tests import gate

# Formulas, reproductions, calculators and the GPU records' shape, all on the CPU or the meta
# device (stand-in timers): the GPU run measures and the gate checks what it wrote.
pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")

Printed, span, reproduces, point = rp.Printed, rp.span, rp.reproduces, rp.point
A100 = load_hardware()["a100-sxm-80gb"].bf16_dense_tflops * 1e12

# The hand-checked trace of the page (ms): A normal, B slow first token, C two tokens per chunk.
A = Request(sent=0, chunks=(200, 220, 240, 260, 280))
B = Request(sent=0, chunks=(900, 930, 960))
C = Request(sent=100, chunks=(400, 520, 640), output_tokens=5)
TRACE = [A, B, C]
NCCL_OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce")


# ----------------------------------------------------------------------- serving definitions


def test_ttft_and_e2e_by_hand():
    assert [ttft(r) for r in TRACE] == [200, 900, 300]
    assert [e2e(r) for r in TRACE] == [280, 960, 540]


def test_tpot_excludes_the_first_token():
    # A: 5 tokens, last at 280, first at 200 -> 4 gaps of 20 ms. E2E / n would say 56 ms.
    assert tpot(A) == 20
    assert tpot(B) == 30  # not (960 - 0) / 3 = 320: B's 900 ms queue is not a decode cost
    assert tpot(C) == 60  # (640 - 400) / (5 - 1), counted in tokens, not chunks
    assert tpot(A) != e2e(A) / A.n_out


def test_tpot_is_none_for_a_one_token_answer():
    assert tpot(Request(sent=0, chunks=(50,))) is None


def test_tpot_matches_vllm_formula_on_random_requests():
    """vllm/benchmarks/serve.py: tpot = (latency - ttft) / (output_len - 1)."""
    rng = random.Random(0)
    for _ in range(200):
        gaps = [rng.uniform(1, 50) for _ in range(rng.randint(2, 40))]
        sent, first = rng.uniform(0, 10), rng.uniform(10, 500)
        chunks = tuple(first + sum(gaps[:i]) for i in range(len(gaps) + 1))
        r = Request(sent=sent, chunks=chunks)
        latency, t1 = chunks[-1] - sent, chunks[0] - sent
        assert tpot(r) == pytest.approx((latency - t1) / (len(chunks) - 1), rel=1e-12)


def test_itl_is_one_sample_per_gap_not_per_request():
    assert itls(A) == [20, 20, 20, 20]
    assert itls(C) == [120, 120]  # per chunk: C's chunks carry 2 tokens, so ITL != TPOT
    pool = pooled_itls(TRACE)
    assert len(pool) == 4 + 2 + 2
    assert sum(pool) / len(pool) == 47.5  # gap-weighted
    assert sum(tpot(r) for r in TRACE) / 3 == pytest.approx(110 / 3)  # request-weighted


def test_goodput_counts_only_requests_meeting_every_slo():
    slo = SLO(ttft=500, tpot=50)
    assert [meets(r, slo) for r in TRACE] == [True, False, False]  # B: TTFT, C: TPOT
    ttft_ok = sum(ttft(r) <= 500 for r in TRACE) / 3
    tpot_ok = sum(tpot(r) <= 50 for r in TRACE) / 3
    assert ttft_ok == tpot_ok == pytest.approx(2 / 3)
    attained = slo_attainment(TRACE, slo)
    assert attained == pytest.approx(1 / 3)
    assert attained != pytest.approx(ttft_ok * tpot_ok)  # 4/9: not a product of marginals
    seconds = duration(TRACE) / 1000
    assert seconds == 0.96
    assert goodput(TRACE, slo, seconds) == pytest.approx(1 / 0.96)
    assert request_throughput(TRACE, seconds) == pytest.approx(3 / 0.96)
    assert output_token_throughput(TRACE, seconds) == pytest.approx(13 / 0.96)


def test_slo_limits_are_inclusive_and_optional():
    assert meets(A, SLO(ttft=200, tpot=20, e2e=280))  # exactly at every limit
    assert not meets(A, SLO(e2e=279.9))
    assert meets(B, SLO())  # no objective, nothing to miss


def test_one_token_answer_cannot_miss_a_tpot_objective():
    assert meets(Request(sent=0, chunks=(10,)), SLO(tpot=0.001))


def test_per_gpu_goodput_is_the_highest_rate_meeting_the_goal():
    sweep = {1.0: 0.99, 2.0: 0.95, 3.0: 0.91, 4.0: 0.70, 5.0: 0.92}  # non-monotone on purpose
    assert per_gpu_goodput(sweep, n_gpus=2) == 2.5  # 5.0 req/s on 2 GPUs
    assert per_gpu_goodput(sweep, n_gpus=1, goal=0.99) == 1.0
    assert per_gpu_goodput({1.0: 0.5}, n_gpus=1) == 0.0


def test_disaggregated_goodput_is_limited_by_the_slower_phase():
    assert disaggregated_goodput(5.6, 2, 10, 1) == pytest.approx(10 / 3)
    assert disaggregated_goodput(5.6, 1, 10, 1) == pytest.approx(5.6 / 2)


# --------------------------------------------------------------------------- percentiles


def test_percentile_by_hand():
    gaps = [20, 20, 20, 20, 30, 30, 120, 120]
    assert percentile(gaps, 50) == 25  # h = 3.5: halfway between the 4th and 5th values
    assert percentile(gaps, 50, "nearest-rank") == 20  # ceil(8 x 0.5) = 4th value
    assert percentile([200, 900, 300], 90) == 780  # h = 1.8: 300 + 0.8 x 600
    assert percentile([200, 900, 300], 90, "nearest-rank") == 900
    assert percentile([5], 99) == percentile([5], 99, "nearest-rank") == 5
    assert percentile(gaps, 0) == percentile(gaps, 0, "nearest-rank") == 20
    assert percentile(gaps, 100) == percentile(gaps, 100, "nearest-rank") == 120


@pytest.mark.parametrize("seed", range(5))
def test_percentile_methods_match_numpy(seed):
    rng = np.random.default_rng(seed)
    xs = list(rng.exponential(size=int(rng.integers(1, 60))))
    for p in (0, 1, 10, 25, 50, 90, 95, 99, 99.9, 100):
        assert percentile(xs, p) == pytest.approx(np.percentile(xs, p), rel=1e-12)
        nearest = np.percentile(xs, p, method="inverted_cdf")
        assert percentile(xs, p, "nearest-rank") == pytest.approx(nearest, rel=1e-12)


def test_percentile_rejects_bad_input():
    for args in (([], 50), ([1.0], 101), ([1.0], -1)):
        with pytest.raises(ValueError):
            percentile(*args)
    with pytest.raises(ValueError, match="method"):
        percentile([1.0], 50, "midpoint")


# --------------------------------------------------------------------------- training


def test_qwen3_8b_parameter_count_by_hand():
    p = qwen3_params(QWEN3_8B)
    h, v = 4096, 151936
    attention = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 2 * 128  # q, k, v, o, q/k norms
    layer = attention + 3 * 4096 * 12288 + 2 * h
    assert p["layers"] == 36 * layer == 6_946_071_552
    assert p["non_embedding"] == 6_946_075_648
    assert p["total"] == p["non_embedding"] + 2 * v * h == 8_190_735_360
    assert p["matmul"] == p["layers"] + v * h == 7_568_401_408
    tied = qwen3_params({**QWEN3_8B, "tie_word_embeddings": True})
    assert tied["total"] == p["total"] - v * h  # the matrix is stored once...
    assert (tied["lm_head"], tied["matmul"]) == (p["lm_head"], p["matmul"])  # ...used twice


PUBLISHED = load_qwen3_configs()  # data/qwen3.yaml: Qwen3-0.6B, 1.7B, 4B (tied) and 8B (untied)
# Exact totals: keras-hub's Qwen3 presets (keras-team/keras-hub,
# keras_hub/src/models/qwen3/qwen3_presets.py) for the tied three; Qwen3-8B as counted above.
EXACT_TOTAL = {
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_qwen3_params_of_the_published_configs(model):
    """The model card's totals; a tied head is stored once but still multiplies every token."""
    pub = PUBLISHED[model]
    p = qwen3_params(asdict(pub.config))
    head = pub.config.vocab_size * pub.config.hidden_size
    assert p["total"] == EXACT_TOTAL[model]
    assert reproduces(point(p["total"] / 1e9), Printed(pub.card["total_b"]))
    assert reproduces(point(p["non_embedding"] / 1e9), Printed(pub.card["non_embedding_b"]))
    stored = 1 if pub.config.tie_word_embeddings else 2  # embedding, and the head unless tied
    assert p["total"] == p["non_embedding"] + stored * head
    assert p["lm_head"] == head  # 2 V H FLOPs per token forward, tied or not
    assert p["matmul"] == p["layers"] + head


def test_a_tied_head_counts_in_the_flops_per_token():
    """Qwen3-4B: 6N and PaLM's count include the head's V x H matmul, and HFU/MFU sees it."""
    cfg = PUBLISHED["qwen3-4b"].config
    assert cfg.tie_word_embeddings
    p = qwen3_params(asdict(cfg))
    L, H, Q, T = cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, 4096
    head = cfg.vocab_size * cfg.hidden_size
    attention = 12 * L * H * Q * T
    model_f = flops_per_token(p["layers"], p["lm_head"], L, H, Q, T)
    assert model_f == 6 * (p["layers"] + head) + attention
    assert flops_per_token_palm(p["matmul"], L, H, Q, T) == model_f
    full = flops_per_token(p["layers"], p["lm_head"], L, H, Q, T, recompute="full")
    assert full == model_f + 2 * p["layers"] + 4 * L * H * Q * T  # the head is not recomputed


def test_throughput_tgs_mfu():
    assert tokens_per_second(4096 * 512, 2.0) == 1_048_576
    assert tgs(4096 * 512, 2.0, 64) == 16_384
    assert flops_per_token_6n(1e9) == 6e9
    assert flops_per_token_palm(1e9, 2, 3, 4, 5) == 6e9 + 12 * 2 * 3 * 4 * 5
    assert mfu(1000, 6e9, 4, 3e12) == pytest.approx(0.5)


GPT_SHAPES = [(24, 2304, 24), (96, 12288, 96), (105, 20480, 128), (128, 25600, 160)]


@pytest.mark.parametrize(("layers", "hidden", "heads"), GPT_SHAPES)
def test_megatron_model_flops_are_palm_flops_per_token(layers, hidden, heads):
    """72 B s l h^2 (1 + s/6h + V/12lh) = B s (6 N + 12 L H Q T) with N = 12 l h^2 + V h."""
    batch, seq, vocab = 8, 2048, 51200
    per_token = megatron_flops_per_iteration(batch, seq, layers, hidden, vocab) / (batch * seq)
    n = 12 * layers * hidden**2 + vocab * hidden  # the matmul weights of that GPT
    palm = flops_per_token_palm(n, layers, heads, hidden // heads, seq)
    assert per_token == pytest.approx(palm, rel=1e-12)


@pytest.mark.parametrize(("layers", "hidden", "heads"), GPT_SHAPES)
def test_full_recomputation_adds_one_forward_of_the_layers(layers, hidden, heads):
    batch, seq, vocab = 4, 2048, 51200
    none = megatron_flops_per_iteration(batch, seq, layers, hidden, vocab, "none")
    full = megatron_flops_per_iteration(batch, seq, layers, hidden, vocab, "full")
    forward = layers * (24 * batch * seq * hidden**2 + 4 * batch * seq**2 * hidden)
    assert full - none == pytest.approx(forward, rel=1e-12)  # the logit layer is not recomputed
    general = flops_per_token(
        12 * layers * hidden**2, vocab * hidden, layers, heads, hidden // heads, seq, "full"
    )
    assert full / (batch * seq) == pytest.approx(general, rel=1e-12)


def test_selective_recomputation_as_printed_doubles_the_attention_term():
    """Korthikanti eq. 8 minus eq. 7 is 12 B s^2 l h: 3x the 4 B s^2 l h of one extra forward."""
    b, s, l, h, v = 2, 2048, 10, 4096, 51200
    extra = megatron_flops_per_iteration(b, s, l, h, v, "selective")
    extra -= megatron_flops_per_iteration(b, s, l, h, v, "none")
    assert extra == pytest.approx(12 * b * s**2 * l * h, rel=1e-12)


def test_hfu_is_mfu_times_the_executed_over_the_required_flops():
    model = megatron_flops_per_iteration(8, 2048, 96, 12288, 51200, "none")
    hardware = megatron_flops_per_iteration(8, 2048, 96, 12288, 51200, "full")
    m, hw = utilization(model, 10.0, 64, A100), utilization(hardware, 10.0, 64, A100)
    assert hw / m == pytest.approx(hardware / model) and hw > m


def test_unknown_recompute_modes_raise():
    with pytest.raises(ValueError):
        megatron_flops_per_iteration(1, 1, 1, 1, 1, "partial")
    with pytest.raises(ValueError):
        flops_per_token(1, 1, 1, 1, 1, 1, "selective")


# --------------------------------------------------------------------------- hardware


def test_matmul_intensity_of_a_square_bf16_matmul_is_n_over_3():
    for n in (256, 4096):
        ai = arithmetic_intensity(matmul_flops(n, n, n), matmul_bytes(n, n, n))
        assert ai == pytest.approx(n / 3)


def test_roofline_meets_at_the_ridge_point():
    h200 = load_hardware()["h200-sxm"]
    peak, bw = h200.bf16_dense_tflops * 1e12, h200.hbm_tb_per_s * 1e12
    ridge = ridge_point(h200)
    assert ridge == pytest.approx(peak / bw)
    assert attainable_flops(ridge, peak, bw) == pytest.approx(peak)
    assert attainable_flops(ridge / 2, peak, bw) == pytest.approx(peak / 2)  # bandwidth-bound
    assert attainable_flops(ridge * 2, peak, bw) == peak  # compute-bound


@pytest.mark.parametrize("n", [1, 2, 3, 8, 72])
def test_bus_factors_are_the_nccl_tests_formulas(n):
    assert bus_factor("all_reduce", n) == 2 * (n - 1) / n
    for op in ("reduce_scatter", "all_gather", "all_to_all"):
        assert bus_factor(op, n) == (n - 1) / n
    assert bus_factor("broadcast", n) == bus_factor("reduce", n) == 1.0
    assert busbw(algbw(8e9, 0.1), n, "all_reduce") == pytest.approx(80e9 * 2 * (n - 1) / n)


def ring_all_reduce(arrays):
    """Ring reduce-scatter then ring all-gather; returns the results and bytes each rank sent."""
    n = len(arrays)
    chunks = [np.array_split(a.astype(np.float64), n) for a in arrays]
    sent = [0] * n
    for step in range(n - 1):  # reduce-scatter: rank r sends chunk (r - step) to r + 1
        msgs = [(r, (r - step) % n, chunks[r][(r - step) % n].copy()) for r in range(n)]
        for r, c, data in msgs:
            chunks[(r + 1) % n][c] += data
            sent[r] += data.nbytes
    for step in range(n - 1):  # all-gather: rank r forwards its complete chunk (r + 1 - step)
        msgs = [(r, (r + 1 - step) % n, chunks[r][(r + 1 - step) % n].copy()) for r in range(n)]
        for r, c, data in msgs:
            chunks[(r + 1) % n][c] = data
            sent[r] += data.nbytes
    return [np.concatenate(c) for c in chunks], sent


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_all_reduce_moves_2_n_minus_1_over_n_bytes_per_rank(n):
    """Why busbw = algbw x 2(n-1)/n: each rank's link carries S x 2(n-1)/n bytes."""
    rng = np.random.default_rng(n)
    arrays = [rng.standard_normal(n * 16) for _ in range(n)]
    results, sent = ring_all_reduce(arrays)
    for r in results:
        np.testing.assert_allclose(r, sum(arrays))
    size = arrays[0].astype(np.float64).nbytes
    assert sent == [size * bus_factor("all_reduce", n)] * n


# --------------------------------------------------------------------------- memory


def test_mixed_precision_adam_is_16_bytes_per_parameter():
    assert sum(ADAM_MIXED_PRECISION.values()) == 16 and K == 12


def test_zero_stages_shard_more_and_reduce_to_baseline_at_one_gpu():
    psi = 1e9
    for stage in range(4):
        assert zero_model_state_bytes(psi, 1, stage) == 16 * psi
    mem = [zero_model_state_bytes(psi, 16, stage) for stage in range(4)]
    assert mem == sorted(mem, reverse=True)
    assert zero_model_state_bytes(psi, 10**9, 1) == pytest.approx(4 * psi, rel=1e-6)  # 4x limit
    assert zero_model_state_bytes(psi, 10**9, 2) == pytest.approx(2 * psi, rel=1e-6)  # 8x limit
    with pytest.raises(ValueError):
        zero_model_state_bytes(psi, 8, 4)


# ------------------------------------------------------------ reproductions: the tolerance


def test_printed_intervals():
    assert Printed("46.2").interval == pytest.approx((46.15, 46.25))
    assert Printed("84").interval == (83.5, 84.5)
    assert Printed("4011", truncated=True).interval == (4010.5, 4012.0)
    assert reproduces((46.19, 46.21), Printed("46.2"))
    assert not reproduces((46.26, 46.3), Printed("46.2"))


def test_tolerance_is_not_vacuous():
    """Off-by-a-little formulas must fail: 46.3 instead of 46.2, K = 16 instead of 12."""
    lo_hi = span(lambda x: rp.palm_mfu(x, True), Printed("238.3"))
    assert not reproduces(lo_hi, Printed("46.3")) and not reproduces(lo_hi, Printed("46.1"))
    wrong_k = zero_model_state_bytes(7.5e9, 64, 1, k=16) / 1e9
    assert not reproduces(point(wrong_k), Printed("31.4", truncated=True))
    no_recompute = megatron_params(128, 25600, 51200, 2048) * 1.001 / 1e9  # 0.1 % off
    assert not reproduces(point(no_recompute), Printed("1008.0"))


# ------------------------------------------------------- reproduction 1: PaLM (App. B, Table 1)


@pytest.mark.parametrize(("attention", "published"), [(False, "45.7"), (True, "46.2")])
def test_palm_540b_mfu(attention, published):
    """PaLM arXiv:2204.02311 App. B: 238.3K tok/s on 6144 TPU v4 (275 TFLOP/s each);
    model per Table 1 (118 layers, 48 heads of size 256, sequence 2048)."""
    computed = span(lambda x: rp.palm_mfu(x, attention), Printed("238.3"))
    assert reproduces(computed, Printed(published))


# --------------------------------------- reproduction 2: ZeRO (§3.1, Figure 1 and Table 1)


@pytest.mark.parametrize(("psi", "nd", "stage", "cell"), rp.cells, ids=lambda x: str(x))
def test_zero_table1_cell(psi, nd, stage, cell):
    """arXiv:1910.02054 Table 1 (p. 10): every cell, rounded or truncated as printed."""
    assert reproduces(point(zero_model_state_bytes(psi, nd, stage) / 1e9), cell)


def test_zero_figure1_and_section_3_1():
    """Figure 1 (p. 3): 7.5B params, N_d = 64, K = 12: 120 GB -> 31.4, 16.6, 1.9 GB.
    §3.1: a 1.5B-parameter GPT-2 needs at least 24 GB of model states."""
    for stage, printed in enumerate(("120", "31.4", "16.6", "1.9")):
        gb = zero_model_state_bytes(7.5e9, 64, stage) / 1e9
        assert reproduces(point(gb), Printed(printed))
    assert zero_model_state_bytes(1.5e9, 1, 0) / 1e9 == 24


# --------------------- reproduction 3: Megatron-LM (Narayanan et al. 2021, eq. 2-4, Table 1)


@pytest.mark.parametrize(("printed", "layers", "hidden"), rp.MEGATRON_TABLE1)
def test_megatron_table1_parameter_counts(printed, layers, hidden):
    """arXiv:2104.04473 eq. 2 against Table 1's parameter column (V = 51200, s = 2048)."""
    assert reproduces(point(megatron_params(layers, hidden, 51200, 2048) / 1e9), Printed(printed))


MEGATRON_THROUGHPUT = [  # Table 1: GPUs, TFLOP/s per GPU, % of peak, aggregate PFLOP/s
    (32, "137", "44", "4.4"), (64, "138", "44", "8.8"), (128, "142", "46", "18.2"),
    (256, "135", "43", "34.6"), (512, "138", "44", "70.8"), (1024, "140", "45", "143.8"),
    (1536, "148", "47", "227.1"), (1920, "155", "50", "297.4"), (2520, "163", "52", "410.2"),
    (3072, "163", "52", "502.0"),
]  # fmt: skip


@pytest.mark.parametrize(("gpus", "per_gpu", "pct", "aggregate"), MEGATRON_THROUGHPUT)
def test_megatron_table1_peak_fraction_and_aggregate(gpus, per_gpu, pct, aggregate):
    """Percentage of peak = X / 312 TFLOP/s (A100, data/hardware.yaml); aggregate = n X."""
    share = span(lambda x: 100 * x * 1e12 / A100, Printed(per_gpu))
    assert reproduces(share, Printed(pct))
    total = span(lambda x: x * gpus / 1e3, Printed(per_gpu))
    assert reproduces(total, Printed(aggregate))


def test_megatron_training_time_estimates():
    """§5.1, eq. 4: GPT-3 175B, 300B tokens, 1024 GPUs at 140 TFLOP/s: 34 days; the 1T model,
    450B tokens, 3072 GPUs at 163 TFLOP/s: 84 days -- only with Table 1's P = 1008.0B."""
    gpt3 = span(lambda x: training_days(300e9, 175e9, 1024, x * 1e12), Printed("140"))
    assert reproduces(gpt3, Printed("34"))
    t1 = span(lambda x: training_days(450e9, 1008.0e9, 3072, x * 1e12), Printed("163"))
    assert reproduces(t1, Printed("84"))
    rounded = span(lambda x: training_days(450e9, 1e12, 3072, x * 1e12), Printed("163"))
    assert not reproduces(rounded, Printed("84"))


# -------------------- reproduction 4: Korthikanti et al. 2022 (Table 3, Table 5, eq. 7-8)


@pytest.mark.parametrize("name", list(rp.KORTHIKANTI))
def test_korthikanti_table5_mfu_and_hfu(name):
    """arXiv:2205.05198 Table 5 "Present Work": MFU from eq. 7, HFU from eq. 8, A100 peak."""
    l, h, batch, gpus, secs, mfu_pct, hfu_pct = rp.KORTHIKANTI[name]
    assert reproduces(span(rp.table5(l, h, batch, gpus, "none"), Printed(secs)), Printed(mfu_pct))
    hw = span(rp.table5(l, h, batch, gpus, "selective"), Printed(secs))
    assert reproduces(hw, Printed(hfu_pct))


def test_korthikanti_data_parallel_mfu():
    """§6.3: the 530B model at 8-way data parallelism (2240 GPUs): 39.15 s, MFU 54.2%."""
    mfu_dp = span(rp.table5(105, 20480, 2240, 2240, "none"), Printed("39.15"))
    assert reproduces(mfu_dp, Printed("54.2"))


def test_korthikanti_hfu_needs_eq8_as_printed():
    """One extra forward of QK^T and AV (the text) gives s/4.5h, and misses Table 5's 57.0%."""
    b, s, l, h, v = 280, 2048, 105, 20480, 51200
    flops = 72 * b * s * l * h**2 * (1 + s / (4.5 * h) + v / (12 * l * h))
    alt = span(lambda t: 100 * utilization(flops, t, 280, A100), Printed("37.83"))
    assert not reproduces(alt, Printed("57.0"))


# ------------------------------------------------------------- reproduction 5: DistServe §1


def test_distserve_disaggregation_example():
    """arXiv:2401.09670 §1: 2 prefill GPUs (5.6 rps each) + 1 decode GPU (10 rps): 3.3 rps per
    GPU, 2.1x the colocated 1.6 rps."""
    per_gpu = span(lambda p, d: disaggregated_goodput(p, 2, d, 1), Printed("5.6"), Printed("10"))
    assert reproduces(per_gpu, Printed("3.3"))
    gain = span(
        lambda p, d, c: disaggregated_goodput(p, 2, d, 1) / c,
        Printed("5.6"), Printed("10"), Printed("1.6"),
    )  # fmt: skip
    assert reproduces(gain, Printed("2.1"))


# ---------------------------------------------------- reproduction 6: the Qwen3-8B model card


def test_qwen3_8b_model_card_counts():
    p = qwen3_params(QWEN3_8B)
    assert reproduces(point(p["total"] / 1e9), Printed("8.2"))
    assert reproduces(point(p["non_embedding"] / 1e9), Printed("6.95"))


# ------------------------------------------------------------------------------- calculators
# The forms' own checks are generic (tests/test_calculators.py, tests/e2e/test_calculators.py).


def test_zero_states_add_up_and_shard_one_more_each_stage():
    psi, nd = 8_190_735_360, 8
    full = zero_model_states(psi, nd, 0)
    assert full == {"parameters": 2 * psi, "gradients": 2 * psi, "optimizer": K * psi}
    order = ["optimizer", "gradients", "parameters"]  # P_os, P_os+g, P_os+g+p
    for stage in range(4):
        states = zero_model_states(psi, nd, stage)
        assert [k for k in order if states[k] == full[k] / nd] == order[:stage]
        assert sum(states.values()) == zero_model_state_bytes(psi, nd, stage)


def test_zero_calculator_shows_the_pages_qwen3_figures():
    """The form's default (Qwen3-8B, 8 GPUs, one H200) gives results/metrics/qwen3-zero.json."""
    record = json.loads((ROOT / "results/metrics/qwen3-zero.json").read_text("utf-8"))
    model = next(m for m in CALCULATORS["zero"].presets["models"] if m["id"] == "qwen3-8b")
    shown = zero_calculator(**model["values"], data_parallel=8, k=K, memory_gb=141)
    for row in record["values"]["stages"]:
        assert shown[f"stage{row['stage']}_total"] / 1e9 == pytest.approx(row["gb"], rel=1e-12)
        assert shown[f"stage{row['stage']}_share"] == pytest.approx(row["of_h200"], rel=1e-12)


def test_calculator_presets_are_the_data_files():
    """Every preset number is computed from data/: the GPUs' peaks and memory, Qwen3 counts."""
    mfu_calc, zero_calc = CALCULATORS["mfu"], CALCULATORS["zero"]
    gpus = load_hardware()
    assert [g["id"] for g in mfu_calc.presets["gpus"]] == list(gpus)
    for g in mfu_calc.presets["gpus"]:
        assert g["values"] == {"peak_tflops": gpus[g["id"]].bf16_dense_tflops}
    for m in zero_calc.presets["models"]:
        assert m["values"]["params_b"] * 1e9 == pytest.approx(EXACT_TOTAL[m["id"]], rel=1e-15)
    labels = [m["label"] for m in mfu_calc.presets["models"]]
    assert labels == ["Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-4B", "Qwen3-8B"]


@pytest.mark.parametrize("bad", [{"op": "all-reduce"}, {"ranks": 0}])
def test_busbw_calculator_rejects_what_nccl_tests_does_not_define(bad):
    with pytest.raises((KeyError, ZeroDivisionError)):
        busbw_calculator(**{"op": "all_reduce", "ranks": 8, "size_gb": 1.0, "ms": 1.0, **bad})


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_hand_count_equals_the_shared_models_parameters(model):
    """qwen3_params counts from the config by formula; the shared model counts its tensors."""
    cfg = PUBLISHED[model].config
    counted = count_parameters(cfg)
    by_hand = qwen3_params(asdict(cfg))
    assert (by_hand["total"], by_hand["non_embedding"]) == (
        counted["total"],
        counted["non_embedding"],
    )


# ------------------------------------------- the GPU benchmarks, on the CPU with a stand-in timer

ROOT = Path(__file__).resolve().parents[2]
H200 = load_hardware()["h200-sxm"]
PEAK, BANDWIDTH = H200.bf16_dense_tflops * 1e12, H200.hbm_tb_per_s * 1e12


def fixed_timer(ms_per_call, clock="gpu-graph"):
    """A stand-in for graph_ms / python_ms: calls fn once, reports a steady timing."""

    def timer(fn):
        fn()
        return res.Stat.of([ms_per_call] * res.MIN_REPEATS, clock)

    return timer


CEILINGS = {  # what ceilings() returns: rates derived from timings
    "bf16_matmul_flop_per_s": 2 * 8192**3 / (res.Stat.of([1.5] * 5, "gpu-graph") * 1e-3),
    "copy_bytes_per_s": 2 * 2**30 / (res.Stat.of([0.5] * 5, "gpu-graph") * 1e-3),
}


def test_matmul_point_rates_a_timing_against_the_roofline():
    m, n, k = 4, 48, 32
    seen = []

    def timer(fn):
        seen.append(fn())
        return res.Stat.of([0.002] * 5, "gpu-graph")

    point = ms.matmul_point(m, n, k, timer, PEAK, BANDWIDTH, 500e12, device="cpu")
    assert seen[0].shape == (m, n) and seen[0].dtype == torch.bfloat16
    assert seen[0].abs().sum() > 0  # random data, not zeros
    achieved = 2 * m * n * k / 2e-6
    intensity = 2 * m * n * k / (2 * (m * k + k * n + m * n))
    assert point["intensity"] == pytest.approx(intensity)
    assert point["tflops"].median == pytest.approx(achieved / 1e12)
    assert point["of_roofline"].median == pytest.approx(achieved / (intensity * BANDWIDTH))
    assert point["of_matmul_ceiling"].median == pytest.approx(achieved / 500e12)


def test_matmul_sweep_rows_and_ceilings():
    shapes = {"square": (8, 16), "tokens": (1, 4), "mlp": (24, 16)}
    values = ms.matmul_sweep(fixed_timer(0.01), PEAK, BANDWIDTH, CEILINGS, "cpu", **shapes)
    rows = [(r["family"], r.get("n"), r.get("m")) for r in values["rows"]]
    assert rows == [("square", 8, None), ("square", 16, None), ("mlp", None, 1), ("mlp", None, 4)]
    mlp = values["rows"][2]
    assert mlp["tb_per_s"].median == pytest.approx(2 * (16 + 16 * 24 + 24) / 1e-5 / 1e12)
    assert "tb_per_s" not in values["rows"][0]
    assert values["matmul_ceiling_tflops"].median == pytest.approx(2 * 8192**3 / 1.5e-3 / 1e12)
    assert values["copy_tb_s"].median == pytest.approx(2 * 2**30 / 0.5e-3 / 1e12)


def test_training_step_runs_on_the_cpu_and_counts_n_without_the_input_embedding():
    step, n_matmul = ms.make_step(TINY, batch=2, seq=16, device="cpu")
    step()
    step()  # a second step: the optimizer state exists, grads were set to None and rebuilt
    embedding = TINY.vocab_size * TINY.hidden_size
    counts = qwen3_params(asdict(TINY))
    assert n_matmul == counts["total"] - embedding


@pytest.mark.parametrize("model", ["qwen3-4b", "qwen3-8b"])
def test_training_step_counts_the_lm_head_in_n_tied_or_not(model):
    """N for 6N at the real shapes (meta device): every matmul weight, the head's included."""
    cfg = PUBLISHED[model].config
    _, n_matmul = ms.make_step(cfg, batch=1, seq=8, device="meta")
    assert n_matmul == qwen3_params(asdict(cfg))["matmul"] + cfg.hidden_size  # + final norm


def test_a_tied_training_step_runs_on_the_cpu():
    cfg = replace(TINY, tie_word_embeddings=True)
    step, n_matmul = ms.make_step(cfg, batch=2, seq=16, device="cpu")
    step()
    step()
    assert n_matmul == qwen3_params(asdict(cfg))["matmul"] + cfg.hidden_size


def test_step_metrics_follow_the_page_formulas():
    cfg, seq, tokens, n = ms.STEP_CFG, ms.SEQ, ms.BATCH * ms.SEQ, 2_165_905_408
    step_ms = res.Stat.of([250.0, 252.0, 255.0, 251.0, 249.0], "python")
    values = ms.step_metrics(step_ms, tokens, n, cfg, seq, PEAK, 700e12)
    assert values["tgs"].median == pytest.approx(tokens / 0.251)
    by = {row["count"]: row for row in values["flops"]}
    palm = 6 * n + 12 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * seq
    assert by["6n"]["tflop_per_token"] == pytest.approx(6 * n / 1e12)
    assert by["palm"]["tflop_per_token"] == pytest.approx(palm / 1e12)
    assert by["palm"]["mfu"].median == pytest.approx(tokens / 0.251 * palm / PEAK)
    assert by["palm"]["of_matmul_ceiling"].median == pytest.approx(tokens / 0.251 * palm / 700e12)
    # interval arithmetic: the slowest repeat gives the lowest MFU
    assert by["6n"]["mfu"].lo == pytest.approx(tokens / 0.255 * 6 * n / PEAK)


def test_the_records_the_gpu_writes_fit_the_page(tmp_path, monkeypatch):
    """Both GPU records, built by the benchmarks' own functions at the real shapes (the matmuls
    on the meta device, the timings stand-ins): every table, plot, number and claim on the page
    resolves, and every stored value is read. Whether the claims hold is the GPU run's to say."""
    prov = dict.fromkeys(res.PROVENANCE["measured"], "stand-in") | {"dirty": True, "wall_s": 1.0}
    prov["commit"] = res.commit_and_dirty()[0]
    monkeypatch.setattr(res, "provenance", lambda *args, **kwargs: prov)
    matmuls = ms.matmul_sweep(fixed_timer(0.05), PEAK, BANDWIDTH, CEILINGS, device="meta")
    counts = count_parameters(ms.STEP_CFG)  # meta device: the 8-layer model, no memory
    n_matmul = counts["total"] - ms.STEP_CFG.vocab_size * ms.STEP_CFG.hidden_size
    step_ms = res.Stat.of([250.0] * 5, "python")
    ceiling = CEILINGS["bf16_matmul_flop_per_s"]
    step = ms.step_metrics(step_ms, ms.BATCH * ms.SEQ, n_matmul, ms.STEP_CFG, ms.SEQ, PEAK, ceiling)
    base = tmp_path / "results"
    records = {
        "matmul-roofline": (matmuls, "bench_matmul.py"),
        "qwen3-training-step": (step, "bench_training.py"),
    }
    for name, (values, bench) in records.items():
        measured_by = ROOT / "snippets" / "metrics" / bench
        record = res.build_record("measured", "metrics", name, values, measured_by)
        path = base / "metrics" / f"{name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, ensure_ascii=False, indent=1), encoding="utf-8")
    for computed in (ROOT / "results" / "metrics").glob("*.json"):
        if json.loads(computed.read_text(encoding="utf-8")).get("kind") == "computed":
            shutil.copy(computed, base / "metrics" / computed.name)
    problems = [e for e in gate.page_errors(ROOT, base, {"metrics"}) if "does not hold" not in e]
    assert problems == []
    assert gate.unread_errors(ROOT, base, {"metrics"}) == []
