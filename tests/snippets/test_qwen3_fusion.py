"""The shared Qwen3 model against Hugging Face transformers, its parameter count, its swap points.

Tolerances: both implementations run the same operations, so in fp64 they agree to rounding
of fp64 (asserted <= 1e-12 norm-wise). In fp32 we allow 2 * gamma_n * ||ref|| with
gamma_n = n u / (1 - n u), u = 2^-24 and n = 192, the longest reduction of the TINY config
(the MLP width): a different summation order inside one reduction stays below it, while a
real difference (RoPE layout, cast placement, GQA grouping) is orders of magnitude larger.

Everything here runs on the CPU; on the GPU (nox -s gpu_docs) the module is skipped, before
transformers is even imported: the CPU suite has run it.
"""

import dataclasses

import pytest
import torch

from snippets.common.device import ON_GPU
from snippets.common.models import qwen3 as q3
from snippets.common.models.qwen3_configs import (
    DEFAULT_PATH,
    FIELDS,
    Qwen3DataError,
    load_qwen3_configs,
)
from snippets.common.results import Stat

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")


def gamma(n, u):
    return n * u / (1 - n * u)


TOL = {torch.float64: 1e-12, torch.float32: 2 * gamma(q3.TINY.intermediate_size, 2.0**-24)}


def hf_model(cfg):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.Qwen3Config(
        **{f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}, attention_dropout=0.0
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # random norms too: HF initialises them to ones
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.05 * torch.randn_like(p))
    return model


def grads_and_logits(model, ids, is_hf):
    model.zero_grad(set_to_none=True)
    logits = model(ids).logits if is_hf else model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return logits.detach(), {n: p.grad for n, p in model.named_parameters()}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_logits_and_grads_match_transformers(dtype):
    hf = hf_model(q3.TINY).to(dtype)
    ours = q3.Qwen3ForCausalLM(q3.TINY).to(dtype)
    ours.load_state_dict(hf.state_dict(), strict=True)  # same parameter names
    ids = torch.randint(0, q3.TINY.vocab_size, (2, 33), generator=torch.Generator().manual_seed(1))
    hf_logits, hf_grads = grads_and_logits(hf, ids, is_hf=True)
    our_logits, our_grads = grads_and_logits(ours, ids, is_hf=False)
    assert rel(our_logits, hf_logits) <= TOL[dtype]
    assert set(our_grads) == set(hf_grads)
    for name, g in hf_grads.items():
        assert rel(our_grads[name], g) <= TOL[dtype], name


def test_loss_with_labels_matches_transformers():
    """The shifted next-token loss; vocab-long logsumexp: 2 * gamma_V, V = 1000."""
    hf = hf_model(q3.TINY)
    ours = q3.Qwen3ForCausalLM(q3.TINY)
    ours.load_state_dict(hf.state_dict())
    ids = torch.randint(0, q3.TINY.vocab_size, (2, 33), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, 20:] = -100  # padding is ignored by both
    expected = hf(ids, labels=labels).loss
    assert rel(ours(ids, labels=labels), expected) <= 2 * gamma(q3.TINY.vocab_size, 2.0**-24)


def test_parameter_count_equals_the_model_card():
    """Qwen3-8B model card: 8.2B parameters, 6.95B non-embedding (printed to 0.1B / 0.01B)."""
    counts = q3.count_parameters(q3.QWEN3_8B)
    assert abs(counts["total"] / 1e9 - 8.2) <= 0.05
    assert abs(counts["non_embedding"] / 1e9 - 6.95) <= 0.005
    assert counts == {"total": 8_190_735_360, "non_embedding": 6_946_075_648}


def test_tied_head_matches_transformers():
    """tie_word_embeddings: one matrix, as in transformers; its gradient sums both uses."""
    cfg = dataclasses.replace(q3.TINY, tie_word_embeddings=True)
    hf = hf_model(cfg).to(torch.float64)
    ours = q3.Qwen3ForCausalLM(cfg).to(torch.float64)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight  # still one tensor after .to()
    ours.load_state_dict(hf.state_dict(), strict=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 33), generator=torch.Generator().manual_seed(3))
    hf_logits, hf_grads = grads_and_logits(hf, ids, is_hf=True)
    our_logits, our_grads = grads_and_logits(ours, ids, is_hf=False)
    assert rel(our_logits, hf_logits) <= TOL[torch.float64]
    assert set(our_grads) == set(hf_grads) and "lm_head.weight" not in our_grads
    for name, g in hf_grads.items():
        assert rel(our_grads[name], g) <= TOL[torch.float64], name


PUBLISHED = load_qwen3_configs()  # data/qwen3.yaml


def printed_as(x: float, text: str) -> bool:
    """x rounds to the printed text: within half a unit of its last digit."""
    return abs(x - float(text)) <= 0.5 * 10.0 ** -len(text.partition(".")[2]) + 1e-12


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_parameter_counts_of_the_published_configs_equal_their_model_cards(model):
    """Built on the meta device: a tied config shares one matrix, and the count matches the card
    (an untied Qwen3-4B would have 4.41B parameters, not the card's 4.0B)."""
    pub = PUBLISHED[model]
    with torch.device("meta"):
        model = q3.Qwen3ForCausalLM(pub.config)
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    assert tied == pub.config.tie_word_embeddings
    total = sum(p.numel() for p in model.parameters())
    counts = q3.count_parameters(pub.config)
    assert counts["total"] == total
    assert printed_as(total / 1e9, pub.card["total_b"])
    assert printed_as(counts["non_embedding"] / 1e9, pub.card["non_embedding_b"])


def test_the_data_schema_is_the_config_dataclass():
    assert {f.name: f.type for f in dataclasses.fields(q3.Qwen3Config)} == FIELDS


def test_the_published_configs_tie_the_small_models_and_match_the_shared_8b():
    tied = {name for name, pub in PUBLISHED.items() if pub.config.tie_word_embeddings}
    assert tied == {"qwen3-0.6b", "qwen3-1.7b", "qwen3-4b"}
    assert PUBLISHED["qwen3-8b"].config == q3.QWEN3_8B  # the model file's copy stays untied
    cited = [pub.sources[0] for pub in PUBLISHED.values()]
    assert all(url.startswith("https://huggingface.co/Qwen/") for url in cited)


def edit_in(text: str, model: str, old: str, new: str) -> tuple[str, int]:
    """Replace the first `old` inside `model`'s entry; return the text and the 1-based line."""
    start = text.index(f"  {model}:\n")
    at = text.index(old, start)
    return text[:at] + new + text[at + len(old) :], text.count("\n", 0, at) + 1


BAD_DATA = {  # case: (model, old, new, the error after "model '<id>': ", line offset)
    "string-int": ("qwen3-4b", "hidden_size: 2560", 'hidden_size: "2560"',
                   "field 'hidden_size': expected int, got '2560'", 0),
    "yaml-1e-06": ("qwen3-8b", "rms_norm_eps: 1.0e-06", "rms_norm_eps: 1e-06",
                   "field 'rms_norm_eps': expected float, got '1e-06'", 0),
    "int-bool": ("qwen3-1.7b", "tie_word_embeddings: true", "tie_word_embeddings: 1",
                 "field 'tie_word_embeddings': expected bool, got 1", 0),
    "missing": ("qwen3-0.6b", "      head_dim: 128\n", "",
                "field 'head_dim': missing field", -7),  # the entry's config: line
    "unquoted-card": ("qwen3-4b", 'total_b: "4.0"', "total_b: 4.0",
                      "field 'card.total_b': a number as printed", 0),
    "http": ("qwen3-8b", "- https://huggingface.co/Qwen/Qwen3-8B/blob",
             "- http://huggingface.co/Qwen/Qwen3-8B/blob", "field 'sources': need a list", -1),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_model_data_names_file_line_model_and_field(tmp_path, case):
    model, old, new, message, offset = BAD_DATA[case]
    text, line = edit_in(DEFAULT_PATH.read_text(encoding="utf-8"), model, old, new)
    path = tmp_path / "qwen3.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(Qwen3DataError) as err:
        load_qwen3_configs(path)
    assert str(err.value).startswith(f"{path}:{line + offset}: model '{model}': {message}")


def test_every_swap_point_is_used():
    calls = {"norm": 0, "rope": 0, "mlp_act": 0, "loss": 0}

    class CountingNorm(q3.RMSNorm):
        def forward(self, x):
            calls["norm"] += 1
            return super().forward(x)

    def counted(name, fn):
        def wrapper(*args):
            calls[name] += 1
            return fn(*args)

        return wrapper

    kernels = q3.Kernels(
        norm=CountingNorm,
        rope=counted("rope", q3.apply_rope),
        mlp_act=counted("mlp_act", q3.swiglu),
        loss=counted("loss", q3.lm_loss),
    )
    torch.manual_seed(0)
    model = q3.Qwen3ForCausalLM(q3.TINY, kernels)
    ids = torch.randint(0, q3.TINY.vocab_size, (1, 8))
    model(ids, labels=ids)
    layers = q3.TINY.num_hidden_layers
    assert calls == {"norm": 4 * layers + 1, "rope": layers, "mlp_act": layers, "loss": 1}


def test_rmsnorm_casts_before_the_weight():
    """HF numerics: normalise in fp32, round to the input dtype, then multiply by the weight."""
    torch.manual_seed(0)
    norm = q3.RMSNorm(64, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.rand(64))
    x = torch.randn(4, 64).to(torch.bfloat16)
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).bfloat16()
    expected = norm.weight * normed  # bf16 * fp32 weight -> fp32
    assert torch.equal(norm(x), expected)


def stand_in(ms: float) -> Stat:
    """A timing as kernel_ms returns it: seven repeats within 1 % of ms."""
    return Stat.of([ms * (1 + 0.01 * k / 3) for k in range(-3, 4)], "gpu-kernels")


def test_measurement_code_runs_at_tiny_shapes():
    """The GPU benchmark's functions, on the CPU with a stand-in timer (1 ms per call)."""
    from snippets.qwen3_fusion import measure

    calls = []

    def timer(fns, kinds):  # as kernel_ms_each: callables in, one timing each out
        assert len(kinds) == len(fns)
        for fn, kind in zip(fns, kinds, strict=True):
            fn()
            calls.append(kind)
        return [stand_in(1.0) for _ in fns]

    ceilings = {"copy_bytes_per_s": stand_in(1e12), "bf16_matmul_flop_per_s": stand_in(1e15)}
    rows = measure.per_op_table(q3.TINY, 2, 8, "cpu", torch.float32, timer, ceilings)
    assert [r["idx"] for r in rows] == list(range(1, 15))  # the two residual adds once
    assert len({r["op"] for r in rows}) == 14
    assert len(calls) == 2 * len(rows) - 1  # forward and backward; the add's backward is none
    first = [measure.FIRST.index(k) if k in measure.FIRST else 9 for k in calls]
    assert first == sorted(first) and calls[0] == "matmul"  # power-hungry first, grouped
    by_name = {r["op"]: r for r in rows}
    assert (
        by_name["residual_add"]["bwd_ms"] is None and by_name["residual_add"]["bwd_of_copy"] is None
    )
    assert isinstance(by_name["q_proj"]["fwd_tflops"], Stat)
    ranked = measure.fusion_candidates(q3.TINY, 2, 8, by_name, stand_in(1e12), stand_in(20.0))
    saving = [(r["eager_ms"] - r["floor_ms"]).median for r in ranked]
    assert saving == sorted(saving, reverse=True)
    add_norm = next(r for r in ranked if r["fusion"] == "add_rmsnorm")
    assert add_norm["eager_ms"].median == 2 * (
        1.0 + 2.0
    )  # twice per layer: add fwd, norm fwd + bwd
    t, h = 16, q3.TINY.hidden_size
    assert add_norm["floor_ms"].median == pytest.approx(2 * 2 * 8 * t * h / 1e12 * 1e3)
    assert add_norm["eager_of_layer"].median == pytest.approx(6.0 / 20.0)
    assert {r["fusion"] for r in ranked} == {"rmsnorm", "add_rmsnorm", "qk_norm_rope", "swiglu"}


def test_measurements_are_recordable(monkeypatch):
    """What write_result would store: keys are words, timings Stats, nothing else."""
    from snippets.common import results as res
    from snippets.qwen3_fusion import measure

    monkeypatch.setattr(res, "provenance", lambda *a, **k: {})
    ceilings = {"copy_bytes_per_s": stand_in(1e12), "bf16_matmul_flop_per_s": stand_in(1e15)}
    timer = lambda fns, kinds: [stand_in(1.0) for _ in fns]  # noqa: E731
    rows = measure.per_op_table(q3.TINY, 2, 8, "cpu", torch.float32, timer, ceilings)
    by_name = {r["op"]: r for r in rows}
    ranked = measure.fusion_candidates(q3.TINY, 2, 8, by_name, stand_in(1e12), stand_in(20.0))
    bench = res.ROOT / "snippets" / "qwen3_fusion" / "bench_gpu.py"
    res.build_record("measured", "qwen3-fusion", "layer-ops", {"ops": rows}, bench)
    res.build_record("measured", "qwen3-fusion", "fusion-candidates", {"candidates": ranked}, bench)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "matmul"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32", "matmul"),
        ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", "attention"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add>",
            "memory",
        ),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "memory"),
    ],
)
def test_kernel_classes(name, kind):
    from snippets.qwen3_fusion.measure import kernel_class

    assert kernel_class(name) == kind
