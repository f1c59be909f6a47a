"""The shared trained models (issue 22) on the CPU: the corpus pin, the tokenizer, the MoE model
against Hugging Face transformers, and the trainer at tiny sizes.

Most tests use a toy pin built here: a wheel of this repository's snippets/ files, with the
pin's hashes measured from it, so that every error path is exercised in milliseconds. One test
rebuilds the real pin of data/trained_models.yaml (the sympy wheel, from .whl/ or downloaded by
pip into the cache) and retrains the real tokenizer against its hash.

Tolerances of the MoE comparison as in tests/snippets/test_qwen3_fusion.py: 1e-12 in fp64 (both
run the same operations), 2 * gamma_n * ||ref|| in fp32 with n the longest reduction of the
config; transformers computes its losses in fp32, so those compare with fp32's gamma.
"""

import dataclasses
import itertools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from snippets.common import corpus as cp
from snippets.common import train as tr
from snippets.common.device import ON_GPU
from snippets.common.models import qwen3 as q3
from snippets.common.models import qwen3_moe as qm
from snippets.common.models.trained_configs import (
    MOE_FIELDS,
    TRAIN_FIELDS,
    TrainedDataError,
    load_trained_models,
)

pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")
ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data" / "trained_models.yaml"


def gamma(n, u):
    return n * u / (1 - n * u)


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ------------------------------------------------------------------------------ the toy pin

TOY_TRAIN = dict(seed=0, steps=30, batch_size=8, seq_len=32, lr=1.0e-2, min_lr_ratio=0.1,
                 warmup_steps=5, weight_decay=0.1, beta1=0.9, beta2=0.95, grad_clip=1.0,
                 init_std=0.02, eval_tokens=2048)  # fmt: skip
TOY_DENSE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, rms_norm_eps=1.0e-06, rope_theta=10000.0,
                 tie_word_embeddings=True)  # fmt: skip
TOY_MOE = {k: v for k, v in TOY_DENSE.items() if k != "intermediate_size"} | dict(
    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
    router_aux_loss_coef=0.01)  # fmt: skip


def toy_wheel(folder: Path, extra: dict | None = None) -> Path:
    """A wheel of this repository's snippets/*.py (the toy corpus), plus `extra` members."""
    path = folder / "toy-1.0-py3-none-any.whl"
    files = sorted((ROOT / "snippets").rglob("*.py"))
    with zipfile.ZipFile(path, "w") as z:
        for f in files:
            z.writestr(zipfile.ZipInfo(f.relative_to(ROOT).as_posix()), f.read_bytes())
        for name, text in (extra or {}).items():
            z.writestr(zipfile.ZipInfo(name), text)
        z.writestr(zipfile.ZipInfo("toy-1.0.dist-info/METADATA"), "Name: toy\n")
    return path


def yaml_value(v) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    return f"{v:.6e}" if isinstance(v, float) else str(v)  # 1.000000e-06: PyYAML reads a float


def flow(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {yaml_value(v)}" for k, v in d.items()) + "}"


def write_spec(folder: Path, corpus: dict, tokenizer_sha: str) -> Path:
    lines = ["corpus:"] + [f"  {k}: {v}" for k, v in corpus.items()]
    lines += ["tokenizer:", "  library: tokenizers", f'  version: "{cp_version()}"',
              "  kind: byte-level-bpe", "  vocab_size: 512", "  min_frequency: 2",
              '  eos: "<|endoftext|>"', f"  sha256: {tokenizer_sha}",
              f"training: {flow(TOY_TRAIN)}", "models:"]  # fmt: skip
    for name, kind, config in (("dense", "dense", TOY_DENSE), ("moe", "moe", TOY_MOE)):
        lines += [f"  {name}:", f"    kind: {kind}", f"    config: {flow(config)}",
                  "    train: {}", "    seeds: 1", "    max_heldout_loss: null",
                  "    cpu: {train: {steps: 8}}"]  # fmt: skip
    path = folder / "trained_models.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def cp_version():
    import tokenizers

    return tokenizers.__version__


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """(spec, its folder): a toy pin whose hashes are measured from the toy wheel."""
    folder = tmp_path_factory.mktemp("toy")
    wheel = toy_wheel(folder)
    corpus = {"package": "toy", "version": '"1.0"', "wheel": wheel.name,
              "sha256": cp.sha256_file(wheel), "url": "https://example.org/toy",
              "prefix": "snippets/", "suffix": ".py", "exclude_dirs": "[models]",
              "heldout_modulus": 8}  # fmt: skip
    zeros = '"' + "0" * 64 + '"'  # placeholders until measured
    spec = load_trained_models(write_spec(folder, corpus | {"files": 2, "heldout_files": 1,
                               "bytes": 1, "files_sha256": zeros, "content_sha256": zeros},
                               zeros))  # fmt: skip
    measured = cp.measure(cp.read_wheel(wheel, spec.corpus))
    spec = load_trained_models(write_spec(folder, corpus | measured, zeros))
    tok = cp.train_tokenizer(cp.read_wheel(wheel, spec.corpus).split(False), spec.tokenizer)
    path = write_spec(folder, corpus | measured, cp.tokenizer_json_sha256(tok))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cp.WHEELS_ENV, str(folder))
        mp.setenv(cp.CACHE_ENV, str(folder / "cache"))
        yield load_trained_models(path), folder


def edited(path: Path, old: str, new: str) -> Path:
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    out = path.with_name(f"edited-{abs(hash((old, new)))}.yaml")
    out.write_text(text.replace(old, new, 1), encoding="utf-8")
    return out


def line_of(path: Path, needle: str) -> int:
    return next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if needle in ln)


# ------------------------------------------------------------------------ the data file


def test_data_file_loads_and_its_field_lists_match_the_dataclasses():
    spec = load_trained_models()
    assert set(spec.models) == {"target", "draft", "moe"}
    assert {m.kind for m in spec.models.values()} == {"dense", "moe"}
    dense_fields = {f.name for f in dataclasses.fields(q3.Qwen3Config)}
    moe_own = {f.name for f in dataclasses.fields(qm.Qwen3MoeConfig)} - dense_fields
    assert moe_own == set(MOE_FIELDS)
    assert {f.name for f in dataclasses.fields(tr.TrainConfig)} == set(TRAIN_FIELDS)
    for entry in spec.models.values():  # both shapes build (on the meta device)
        for on_gpu in (True, False):
            config, train = entry.resolved(on_gpu)
            cfg = tr.model_config(entry.kind, config, spec.tokenizer.vocab_size)
            tr.TrainConfig(**train)
            with torch.device("meta"):
                tr.build_model(cfg)


@pytest.mark.parametrize(
    "old, new, needle, message",
    [
        ("      hidden_size: 512\n", '      hidden_size: "512"\n', 'hidden_size: "512"',
         "model 'draft' config: field 'hidden_size': expected int, got '512'"),
        ("    kind: moe", "    kind: sparse", "kind: sparse", "dense or moe"),
        ("  heldout_modulus: 16", "  heldout_modulus: 0", "heldout_modulus: 0",
         "field 'heldout_modulus': must be positive"),
        ("  vocab_size: 8192", "  vocab_size: 8192\n  merges: 100", "merges: 100",
         "tokenizer: field 'merges': unknown field"),
    ],
    ids=["type", "kind", "zero", "unknown"],
)  # fmt: skip
def test_data_file_errors_name_file_and_line(tmp_path, old, new, needle, message):
    bad = tmp_path / "trained_models.yaml"
    bad.write_text(DATA.read_text(encoding="utf-8").replace(old, new, 1), encoding="utf-8")
    with pytest.raises(TrainedDataError) as err:
        load_trained_models(bad)
    assert f"trained_models.yaml:{line_of(bad, needle)}: " in str(err.value)
    assert message in str(err.value)


# ------------------------------------------------------------------------------ the corpus pin


def test_the_real_pin_rebuilds_corpus_and_tokenizer():
    """data/trained_models.yaml: the sympy wheel's files, split and hashes, and the tokenizer
    trained on its training files hashes as pinned."""
    spec = load_trained_models()
    corpus = cp.load_corpus(spec)  # raises on any mismatch
    assert len(corpus.paths) == spec.corpus.files and list(corpus.paths) == sorted(corpus.paths)
    assert not any("/tests/" in p for p in corpus.paths)
    tok = cp.train_tokenizer(corpus.split(heldout=False), spec.tokenizer)
    assert cp.tokenizer_json_sha256(tok) == spec.tokenizer.sha256
    heldout = corpus.split(heldout=True)
    ids = tok.encode_batch(heldout[:5])
    assert [tok.decode(e.ids) for e in ids] == heldout[:5]
    assert sum(len(t.encode()) for t in heldout[:5]) / sum(len(e.ids) for e in ids) > 3


def test_toy_pin_reads_back(toy):
    spec, _ = toy
    corpus = cp.load_corpus(spec)
    assert 0 < sum(corpus.heldout) < len(corpus.paths)
    assert not any("/models/" in p for p in corpus.paths)  # exclude_dirs: [models]
    assert all(cp.is_heldout(p, 8) == h for p, h in zip(corpus.paths, corpus.heldout, strict=True))


def test_a_changed_file_list_fails_naming_the_data_file(toy, tmp_path):
    spec, _ = toy
    wheel = toy_wheel(tmp_path, {"snippets/extra.py": "x = 1\n"})
    with pytest.raises(cp.CorpusError) as err:
        cp.check_corpus(cp.read_wheel(wheel, spec.corpus), spec.corpus, wheel.name)
    line = line_of(spec.path, "files_sha256:")
    assert str(err.value).startswith(f"{spec.path}:{line}: corpus: field 'files_sha256': ")
    assert "the file list changed: the rule (prefix 'snippets/'" in str(err.value)
    assert f"selects {spec.corpus.files + 1} files" in str(err.value)


def test_a_changed_selection_rule_fails_naming_the_data_file(toy):
    spec, _ = toy
    path = edited(spec.path, "exclude_dirs: [models]", "exclude_dirs: [models, triton_kernels]")
    with pytest.raises(cp.CorpusError, match=r"\.yaml:\d+: corpus: field "
                       r"'files_sha256': the file list changed"):  # fmt: skip
        cp.load_corpus(load_trained_models(path))


def test_a_wrong_content_hash_fails_naming_its_line(toy):
    spec, _ = toy
    path = edited(spec.path, spec.corpus.content_sha256, "f" * 64)
    with pytest.raises(cp.CorpusError) as err:
        cp.load_corpus(load_trained_models(path))
    assert f"{path.name}:{line_of(path, 'content_sha256:')}: corpus: field 'content_sha256': " \
        in str(err.value)  # fmt: skip
    assert spec.corpus.content_sha256 in str(err.value)


def test_a_wheel_with_other_bytes_fails_on_its_sha256(toy, tmp_path):
    spec, _ = toy
    other = toy_wheel(tmp_path, {"snippets/zz/README": "not selected, but in the zip\n"})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cp.WHEELS_ENV, str(tmp_path))
        with pytest.raises(cp.CorpusError) as err:
            cp.find_wheel(spec.corpus)
    assert f":{line_of(spec.path, '  sha256:')}: corpus: field 'sha256': {other}" in str(err.value)


def test_a_missing_wheel_says_what_to_carry(toy, tmp_path):
    spec, _ = toy
    path = edited(spec.path, 'version: "1.0"\n  wheel: toy-1.0', 'version: "1.1"\n  wheel: toy-1.1')
    pin = load_trained_models(path).corpus
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(cp.WHEELS_ENV, str(tmp_path))
        mp.setenv(cp.CACHE_ENV, str(tmp_path / "cache"))
        with pytest.raises(cp.CorpusError) as err:
            cp.find_wheel(pin, download=False)
    assert f":{line_of(path, 'wheel:')}: corpus: field 'wheel': toy-1.1-py3-none-any.whl " \
        in str(err.value)  # fmt: skip
    assert "carry it into the repository's .whl/corpus/" in str(err.value)


# ------------------------------------------------------------------------------ the tokenizer


def test_tokenizer_round_trips_any_text(toy):
    spec, _ = toy
    tok = cp.load_tokenizer(spec)
    assert tok.get_vocab_size() == 512 and tok.id_to_token(cp.EOS_ID) == "<|endoftext|>"
    odd = ["训推加速手册：字节级 BPE 能编码任何文本 🚀\r\n\tx = 1  \n", "\x00\x7f ÿ", ""]
    texts = [*cp.load_corpus(spec).split(heldout=True), *odd]
    for text in texts:
        ids = tok.encode(text).ids
        assert cp.EOS_ID not in ids
        assert tok.decode(ids) == text
    stream = cp.encode(tok, texts[:2])
    assert stream.dtype == torch.int32 and (stream == cp.EOS_ID).sum() == 2


def test_tokenizer_training_is_deterministic_across_processes(toy):
    """Another process, another hash seed, one thread: the same JSON."""
    spec, _ = toy
    code = ("import sys; from snippets.common import corpus as cp; "
            "from snippets.common.models.trained_configs import load_trained_models as load; "
            "s = load(sys.argv[1]); c = cp.load_corpus(s); "
            "tok = cp.train_tokenizer(c.split(False), s.tokenizer); "
            "print(cp.tokenizer_json_sha256(tok))")  # fmt: skip
    env = os.environ | {"PYTHONHASHSEED": "123", "RAYON_NUM_THREADS": "1",
                        "PYTHONPATH": str(ROOT)}  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, str(spec.path)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == spec.tokenizer.sha256


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


def test_moe_static_capacity_computes_the_same(monkeypatch):
    """Under CUDA-graph capture every expert's batch is padded to the token count (no host
    sync); the extra rows are zero and unread: logits and gradients as with the exact count."""
    model = qm.Qwen3MoeForCausalLM(qm.TINY_MOE).double()
    ids = torch.randint(0, 1000, (2, 33), generator=torch.Generator().manual_seed(2))
    exact = logits_and_grads(model, ids, is_hf=False)
    monkeypatch.setattr(qm, "static_capacity", lambda x: True)
    static = logits_and_grads(model, ids, is_hf=False)
    assert rel(static[0], exact[0]) <= 1e-12
    for name, g in exact[1].items():
        assert rel(static[1][name], g) <= 1e-12 if g.norm() > 0 else static[1][name].norm() == 0


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


# ------------------------------------------------------------------------------ the trainer


def test_lr_schedule_warms_up_then_decays_to_its_floor():
    tc = tr.TrainConfig(steps=100, warmup_steps=10, min_lr_ratio=0.1)
    factors = [tr.lr_factor(s, tc) for s in range(tc.steps)]
    assert factors[0] == 0.1 and factors[9] == 1.0 and factors[10] == 1.0
    assert all(a >= b for a, b in itertools.pairwise(factors[10:]))
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)


def toy_run(spec, kind):
    train_stream, heldout_stream = cp.token_streams(spec)
    entry = spec.models[kind]
    cfg = tr.model_config(kind, entry.config, spec.tokenizer.vocab_size)
    tc = tr.TrainConfig(**entry.train)
    model = tr.build_model(cfg)
    tr.init_weights(model, tc.init_std, tc.seed)
    stats = tr.train(model, train_stream, heldout_stream, tc)
    return model, stats


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_training_is_bitwise_deterministic_and_lowers_the_loss(toy, kind):
    spec, _ = toy
    model_a, stats_a = toy_run(spec, kind)
    model_b, stats_b = toy_run(spec, kind)
    assert stats_a["train_loss"] == stats_b["train_loss"]
    assert stats_a["heldout_loss"] == stats_b["heldout_loss"]
    state_b = model_b.state_dict()
    assert all(torch.equal(v, state_b[k]) for k, v in model_a.state_dict().items())
    assert stats_a["heldout_loss"] < stats_a["heldout_loss_init"] - 0.5  # nats
    losses = stats_a["train_loss"]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    assert (stats_a["router_loss"] is not None) == (kind == "moe")


def test_trained_trains_once_then_loads_from_the_cache(toy, monkeypatch):
    spec, folder = toy
    first = tr.trained("dense", spec=spec)
    assert first.path.parent == folder / "cache" and first.stats["steps"] == 8  # CPU stand-in
    seeded = tr.trained("dense", spec=spec, seed=1)  # another seed: another checkpoint
    assert seeded.path != first.path and seeded.train.seed == 1
    monkeypatch.setattr(tr, "train", lambda *a, **k: pytest.fail("trained again"))
    again = tr.trained("dense", spec=spec)
    assert again.path == first.path and again.stats == first.stats
    state = again.model.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in first.model.state_dict().items())
    with pytest.raises(KeyError, match=r"no model 'big'.*known: dense, moe"):
        tr.trained("big", spec=spec)


def test_training_runs_strictly_deterministic_and_restores_the_flags(toy):
    """warn_only=True left cuDNN's attention backward nondeterministic on the H200 (the
    target's held-out loss moved between runs); every trainer step runs with warn_only=False."""
    spec, _ = toy
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())  # fmt: skip
    with tr.deterministic():
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled()) == before  # fmt: skip
    entry = spec.models["dense"]
    cfg = tr.model_config("dense", entry.config, spec.tokenizer.vocab_size)
    tc = tr.TrainConfig(**entry.train)
    model = tr.build_model(cfg)
    seen = []

    def loss_fn(ids):  # what a loop on the trainer (RL, distillation) sees inside a step
        seen.append(not torch.is_deterministic_algorithms_warn_only_enabled()
                    and torch.are_deterministic_algorithms_enabled())  # fmt: skip
        lm, _ = tr.losses_of(model, ids)
        return lm, {}

    tr.Trainer(model, tc, loss_fn).step(0, torch.zeros(tc.batch_size, tc.seq_len, dtype=torch.long))
    assert seen == [True]
