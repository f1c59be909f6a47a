"""Unit tests for snippets/trained_models/: the card's counts against the models' own and the
metrics post's, and the GPU benchmark's functions on the CPU at tiny shapes with a stand-in
timer (the training run on the toy pin of tests/test_models_shared.py); on CUDA, that a post
gets the run's checkpoint back without training again."""

from dataclasses import asdict, replace

import pytest
import torch

from snippets.common import results as res
from snippets.common import train as tr
from snippets.common.device import ON_GPU
from snippets.common.models import qwen3 as q3
from snippets.common.models import qwen3_moe as qm
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.results import Stat
from snippets.metrics.qwen3 import qwen3_params
from snippets.metrics.training import flops_per_token_6n
from snippets.trained_models import card
from tests.test_models_shared import edited, line_of, toy  # noqa: F401  (the toy-pin fixture)

cpu_only = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")
BENCH = res.ROOT / "snippets" / "trained_models" / "bench_gpu.py"


def stand_in(ms: float) -> Stat:
    """A timing as graph_ms returns it: seven repeats within 1 % of ms."""
    return Stat.of([ms * (1 + 0.01 * k / 3) for k in range(-3, 4)], "gpu-graph")


@cpu_only
def test_counts_agree_with_the_models_and_the_metrics_post():
    """N of a dense model is the metrics post's `matmul` count plus the final norm's weight
    (an elementwise product, counted by make_step too); a MoE's is its active count less the
    untied input embedding."""
    dense = card.counts(q3.QWEN3_8B)
    assert dense["params"] == q3.count_parameters(q3.QWEN3_8B)["total"]
    assert dense["n_matmul"] == qwen3_params(asdict(q3.QWEN3_8B))["matmul"] + 4096
    tied = replace(q3.TINY, tie_word_embeddings=True)  # the head multiplies every token
    stored = q3.count_parameters(tied)["total"]
    assert card.counts(tied) == {"params": stored, "n_matmul": stored}
    moe = card.counts(qm.QWEN3_30B_A3B)
    active = qm.count_parameters(qm.QWEN3_30B_A3B)
    assert moe == {"params": active["total"], "n_matmul": active["active"] - 151_936 * 2048}


@cpu_only
def test_shape_rows_read_the_data_file():
    spec = load_trained_models()
    rows = {r["model"]: r for r in card.shape_rows(spec)}
    assert list(rows) == list(spec.models)
    for name, entry in spec.models.items():
        tc = entry.train
        assert rows[name]["tokens"] == tc["steps"] * tc["batch_size"] * tc["seq_len"]
        assert rows[name]["seeds"] == entry.seeds
        assert rows[name]["max_heldout_loss"] == entry.max_heldout_loss
    assert rows["moe"]["experts"] == 16 and rows["draft"]["experts"] == rows["draft"]["top_k"] == 1
    assert rows["moe"]["n_matmul"] < rows["moe"]["params"]  # 4 of 16 experts per token


@cpu_only
def test_the_estimates_model_is_no_larger_than_any_shared_model(toy):  # noqa: F811
    """max_heldout_loss is the loss of tr.ESTIMATE_CONFIG trained with a model's schedule: a
    larger model should do no worse only if the estimate's model is smaller in every dimension
    (a MoE's MLP width: the experts one token goes to)."""
    small = tr.ESTIMATE_CONFIG
    for name, entry in load_trained_models().models.items():
        cfg = entry.config
        width = cfg.get("intermediate_size") or cfg["num_experts_per_tok"] * cfg[
            "moe_intermediate_size"]  # fmt: skip
        assert small["hidden_size"] < cfg["hidden_size"], name
        assert small["intermediate_size"] < width, name
        for key in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim"):
            assert small[key] <= cfg[key], (name, key)
    spec, _ = toy
    stats = tr.estimate("dense", spec)  # the toy pin's schedule: 30 steps
    assert stats["steps"] == 30 and stats["heldout_loss"] < stats["heldout_loss_init"]


@cpu_only
def test_training_reads_its_clock_in_chunks(toy):  # noqa: F811
    """train() returns one time per step for each chunk of steps; the chunks add up to the
    loop's wall time."""
    spec, _ = toy
    assert tr.chunk_bounds(8) == list(range(9))
    assert tr.chunk_bounds(460) == list(range(0, 461, 10))  # STEP_CHUNKS = 46
    assert tr.chunk_bounds(3) == [0, 1, 2, 3]
    run = tr.train_new("dense", spec=spec)  # the CPU stand-in: 8 steps
    ms = run.stats["step_ms"]
    assert len(ms) == 8 and all(t > 0 for t in ms)
    assert sum(ms) / 1e3 == pytest.approx(run.stats["wall_s"], rel=1e-9)
    assert not run.path.exists()  # train_new caches nothing
    assert tr.save(run) == run.path and run.path.is_file()


FAST = [10.0, 10.1, 9.9, 10.0, 10.05, 9.95, 10.0, 10.02, 9.98, 10.0, 10.03, 9.97, 10.0, 10.0, 10.0]


def fake_stats(loss=2.5, device="NVIDIA H200", seed=1):
    # a chunk with the warm-up and the capture, then 45 chunks of replayed steps
    return {"step_ms": [30.0] + FAST * 3, "tokens": 100 * 8192, "steps": 100, "seed": seed,
            "heldout_loss_init": 9.0, "heldout_loss": loss, "device": device,
            "graphed": True}  # fmt: skip


@cpu_only
def test_run_row_times_the_chunks_after_the_first():
    row = card.run_row("draft", fake_stats(), n_matmul=10**7, peak=1e15, run_s=4.0)
    # the warm-up chunk left out: 45 repeats
    assert row["step_ms"].n == 45 and row["step_ms"].median == 10.0
    assert row["step_ms"].clock == "python" and row["step_ms"].extremes[1] < 30.0
    assert row["tokens_per_s"].median == pytest.approx(8192 / 10e-3)
    assert row["mfu"].median == pytest.approx(8192 / 10e-3 * flops_per_token_6n(10**7) / 1e15)
    assert row["mfu"].lo < row["mfu"].median < row["mfu"].hi  # the range carries over
    assert (row["seed"], row["heldout_loss"], row["graphed"], row["run_s"]) == (1, 2.5, True, 4.0)


@cpu_only
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_decode_times_and_the_bound(tied):
    cfg = replace(q3.TINY, tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = q3.Qwen3ForCausalLM(cfg).eval()
    timed = []

    def timer(fn):
        fn()
        timed.append(fn)
        return stand_in(2.0 + len(timed))

    times = card.decode_times(model, timer, compiler=lambda f: f)  # eager stands in for compiled
    assert list(times) == ["eager_ms", "compiled_ms", "compile_s"]
    assert [times[k].median for k in ("eager_ms", "compiled_ms")] == [3.0, 4.0]
    assert 0 < times["compile_s"] < 10
    embedding = cfg.vocab_size * cfg.hidden_size
    n_bytes = card.weight_bytes(model)
    stored = q3.count_parameters(cfg)["total"]
    assert n_bytes == 4 * (stored if tied else stored - embedding)  # fp32 weights
    row = card.decode_row(times, n_bytes, stand_in(1e9))
    assert row["bound_ms"].median == pytest.approx(n_bytes / 1e9 * 1e3)
    assert [s["step"] for s in row["steps"]] == ["eager", "compiled"]
    assert row["compile_s"] == times["compile_s"]
    assert row["steps"][1]["of_bound"].median == pytest.approx(4.0 / row["bound_ms"].median)


@cpu_only
def test_a_wrong_compiled_step_is_caught():
    model = q3.Qwen3ForCausalLM(q3.TINY).eval()

    def wrong(step):
        return lambda *args: step(*args) * 1.1

    with pytest.raises(AssertionError, match=r"logits differ from eager by 0\.1 "):
        card.decode_times(model, stand_in, compiler=wrong)


@cpu_only
def test_the_records_are_recordable(monkeypatch):
    """What write_result would store: keys are words, timings Stats, nothing else."""
    monkeypatch.setattr(res, "provenance", lambda *a, **k: {})
    row = card.run_row("draft", fake_stats(), n_matmul=10**7, peak=1e15, run_s=4.0)
    times = {"eager_ms": stand_in(3.0), "compiled_ms": stand_in(1.0), "compile_s": 20.0}
    decode = card.decode_row(times, 10**9, stand_in(4e12))
    res.build_record("measured", "trained-models", "training", {"runs": [row]}, BENCH)
    res.build_record("measured", "trained-models", "decode", decode, BENCH)


@cpu_only
def test_a_missed_loss_fails_naming_the_data_line(toy, tmp_path):  # noqa: F811
    spec, _ = toy
    path = edited(spec.path, "max_heldout_loss: null", "max_heldout_loss: 3.0")
    spec = load_trained_models(path)
    tr.check_loss("dense", fake_stats(loss=2.9), spec)  # reached
    tr.check_loss("dense", fake_stats(loss=3.5, device="cpu"), spec)  # a CPU stand-in: no limit
    with pytest.raises(tr.TrainingError) as err:
        tr.check_loss("dense", fake_stats(loss=3.5), spec)
    assert str(err.value) == (
        f"{path}:{line_of(path, 'max_heldout_loss: 3.0')}: model 'dense' (seed 1): held-out "
        "loss 3.5000 after 100 steps is above its max_heldout_loss 3.0"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
def test_posts_get_the_runs_checkpoint_back(monkeypatch):
    """After the page's run (or a first call here), trained() loads the draft from the run's
    cache, on the GPU, without training."""
    first = tr.trained("draft")
    monkeypatch.setattr(tr, "train", lambda *a, **k: pytest.fail("trained again"))
    again = tr.trained("draft")
    assert again.path == first.path and again.stats == first.stats
    assert next(again.model.parameters()).is_cuda
    state = again.model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in first.model.state_dict().items())


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("name", ["draft", "moe"])
def test_graphed_training_computes_what_eager_does(name):
    """The trainer's replayed CUDA graph against the same steps run eagerly, from the same
    weights on the same batches (the CPU stand-in's shape and schedule, on the GPU): the same
    kernels on the same data (the MoE's experts padded to the token count in the graph), so
    the loss curves agree to a bf16 rounding (2^-8) and the graph was really used."""
    spec = load_trained_models()
    entry = spec.models[name]
    config, train_fields = entry.resolved(False)  # the CPU stand-in's
    cfg, tc = (
        tr.model_config(entry.kind, config, spec.tokenizer.vocab_size),
        tr.TrainConfig(**train_fields),
    )
    streams = tr.token_streams(spec)
    curves = {}
    for graph in (True, False):
        with torch.device("cuda"):
            model = tr.build_model(cfg)
        tr.init_weights(model, tc.init_std, tc.seed)
        stats = tr.train(model, *streams, tc, graph=graph)
        assert stats["graphed"] is graph and stats["graph_error"] is None
        curves[graph] = torch.tensor(stats["train_loss"])
    assert ((curves[True] - curves[False]).abs() / curves[False]).max() <= 2.0**-8
