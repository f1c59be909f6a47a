"""Unit tests for snippets/kv_cache/: formulas against published figures and hand counts, the
block manager's invariants under random operation sequences, prefix caching and its LRU, and the
paged decode-attention kernel against dense attention (its byte model and benchmark code too)."""

from __future__ import annotations

import math
import random
import re

import pytest
import torch

from snippets.common.device import DEVICE, ON_GPU
from snippets.common.models.kv_configs import KVDataError, kv_config, load_kv_configs
from snippets.common.models.kv_presets import load_kv_presets
from snippets.common.results import Stat
from snippets.kv_cache.calculators import kv_calculator, model_presets, shown
from snippets.kv_cache.formulas import (
    bytes_per_element,
    decode_floor_s,
    elements_per_token_layer,
    kv_budget,
    kv_bytes_per_sequence,
    kv_bytes_per_token,
    layer_windows,
    max_sequences,
    max_tokens,
)
from snippets.kv_cache.fragmentation import Contiguous, Paged, Request, make_trace, simulate
from snippets.kv_cache.paged import BlockManager, OutOfBlocks, check_invariants
from snippets.kv_cache.prefix import PrefixCache, block_hashes
from snippets.metrics.qwen3 import qwen3_params
from snippets.triton_kernels.numerics import within

# ------------------------------------------------------------------ formulas


def test_mha_gqa_mqa_differ_only_by_kv_heads():
    base = {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}
    mha = kv_bytes_per_token(base)
    gqa = kv_bytes_per_token(dict(base, num_key_value_heads=2))
    mqa = kv_bytes_per_token(dict(base, num_key_value_heads=1))
    assert mha == 2 * 2 * 512 * 2  # layers x (K, V) x heads x head_dim x bf16
    assert (mha / gqa, mha / mqa) == (4, 8)


def test_explicit_head_dim_wins_over_hidden_over_heads():
    gemma = kv_config("gemma-2-9b")  # 3584 / 16 = 224, but head_dim is 256
    assert elements_per_token_layer(gemma) == 2 * 8 * 256


def test_mla_caches_latent_plus_rope_key_for_v2_and_v3():
    for name, layers in (("deepseek-v2", 60), ("deepseek-v3", 61)):
        assert kv_bytes_per_token(kv_config(name), "bf16") == layers * (512 + 64) * 2


def test_vllm_opt13b_figures():
    """arXiv:2309.06180 §3: 2 x 5120 x 40 x 2 bytes = 800 KB per token; 2048 tokens: 1.6 GB."""
    opt = kv_config("opt-13b")
    assert kv_bytes_per_token(opt, "fp16") == 2 * 5120 * 40 * 2 == 800 * 2**10
    assert round(kv_bytes_per_sequence(opt, 2048, "fp16") / 2**30, 1) == 1.6


def test_deepseek_v2_reduction_needs_6_bits_against_bf16():
    v2, d67 = kv_config("deepseek-v2"), kv_config("deepseek-llm-67b")
    assert f"{1 - kv_bytes_per_token(v2, 6) / kv_bytes_per_token(d67):.1%}" == "93.3%"
    assert f"{1 - kv_bytes_per_token(v2) / kv_bytes_per_token(d67):.1%}" != "93.3%"


def test_sliding_windows_per_layer():
    mistral, gemma = kv_config("mistral-7b-v0.1"), kv_config("gemma-2-9b")
    assert set(layer_windows(mistral)) == {4096}
    windows = layer_windows(gemma)  # transformers' Gemma2: layer_idx % 2 == 0 slides
    assert windows[0::2] == [4096] * 21 and windows[1::2] == [None] * 21
    assert kv_bytes_per_sequence(mistral, 100) == 100 * kv_bytes_per_token(mistral)
    assert kv_bytes_per_sequence(mistral, 10**6) == kv_bytes_per_sequence(mistral, 4096)
    assert kv_bytes_per_sequence(gemma, 0) == 0


def test_quantized_formats_and_scale_overhead():
    assert bytes_per_element("fp8") == bytes_per_element("int8") == 1
    assert bytes_per_element("int4", group=64) == 0.5 + 2 / 64
    assert bytes_per_element("int4", group=32, scale_bytes=4) == 0.5 + 4 / 32
    for bad in ("fp7", 0, -4, True):
        with pytest.raises(ValueError, match="unknown KV format"):
            bytes_per_element(bad)
    with pytest.raises(ValueError, match="group must be"):
        bytes_per_element("int4", group=0)
    with pytest.raises(ValueError, match="tokens must be"):
        kv_bytes_per_sequence(kv_config("opt-13b"), -1)


def test_capacity_and_decode_floor():
    qwen3 = kv_config("qwen3-8b")  # 36 x 2 x 8 x 128 x 2 = 147456 bytes per token
    budget = kv_budget(100e9, 16e9, 4e9, utilization=1.0)
    assert budget == 80e9
    assert max_tokens(budget, qwen3, block=16) == 80e9 // (16 * 147456) * 16
    assert max_sequences(budget, qwen3, 1000) == int(80e9 // (1000 * 147456))
    assert max_tokens(budget, qwen3, "fp8") >= 2 * max_tokens(budget, qwen3) - 16
    assert decode_floor_s(10.0, [5.0, 5.0], bandwidth=4.0) == 5.0
    with pytest.raises(ValueError, match="no room for a KV cache"):
        kv_budget(10e9, 9e9, 1e9)


def test_unknown_model_lists_known_ones():
    with pytest.raises(KeyError, match=r"opt-13b.*qwen3-8b"):
        kv_config("llama-9")


V2_MLA = "      hidden_size: 5120\n      kv_lora_rank: 512\n      qk_rope_head_dim: 64\n"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("      hidden_size: 5120\n", "      hidden_size: '5120'\n", "expected a positive int"),
        ("      hidden_size: 5120\n", "      hidden_sise: 5120\n", "unknown field"),
        (V2_MLA, V2_MLA.replace("      qk_rope_head_dim: 64\n", ""), "give all or none"),
        ("      num_hidden_layers: 40\n", "", "'num_hidden_layers': missing"),
        ("      num_hidden_layers: 40\n", "      num_hidden_layers: [40\n", "malformed YAML"),
        ("      - https://huggingface.co/facebook", "      - http://huggingface.co/facebook", "https://"),
    ],
)  # fmt: skip
def test_bad_data_names_file_line_and_field(tmp_path, old, new, message):
    from snippets.common.models.kv_configs import DEFAULT_PATH

    text = DEFAULT_PATH.read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "kv_models.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(KVDataError, match=message) as err:
        load_kv_configs(path)
    assert str(err.value).startswith(f"{path}:")


# ------------------------------------------------------------------ the page's calculator
# Its form against the Python side: tests/test_calculators.py and tests/e2e/test_calculators.py.


@pytest.mark.parametrize("preset", model_presets(), ids=lambda p: p["id"])
def test_calculator_presets_give_the_formulas_bytes_of_each_model(preset):
    """The form's fields turn back into the model's config: the same bytes as kv_config's."""
    cfg = next(p.config for p in load_kv_presets() if p.id == preset["id"])
    form = {**preset["values"], "kv_format": "int4", "group": 64, "context": 16384, "batch": 3,
            "gpus": 8, "memory_gb": 141, "bandwidth_tb_s": 4.8, "weight_bytes": 1,
            "workspace_gb": 4, "utilization": 0.9}  # fmt: skip
    shown = kv_calculator(**form)
    assert shown["per_token"] == kv_bytes_per_token(cfg, "int4", 64)
    assert shown["per_seq"] == kv_bytes_per_sequence(cfg, 16384, "int4", 64)
    assert shown["max_seqs"] == max_sequences(shown["budget"], cfg, 16384, "int4", 64)


def test_calculator_presets_are_the_data_files_models():
    presets = {p["id"]: p for p in model_presets()}
    assert {"qwen3-8b", "qwen3-32b", "llama-3-8b", "llama-3-70b", "opt-13b", "mistral-7b-v0.1",
            "gemma-2-9b", "deepseek-v3"} <= set(presets)  # fmt: skip
    assert presets["opt-13b"]["values"]["kv_heads"] == kv_config("opt-13b")["num_attention_heads"]
    assert presets["deepseek-v3"]["values"] | {"params_b": 0, "read_b": 0} == {
        "layers": 61, "kv_heads": 0, "head_dim": 0, "kv_lora_rank": 512, "rope_dim": 64,
        "window": 0, "window_pattern": 0, "params_b": 0, "read_b": 0}  # fmt: skip
    assert (
        presets["deepseek-v3"]["values"]["params_b"],
        presets["deepseek-v3"]["values"]["read_b"],
    ) == (671, 37)
    q = qwen3_params(kv_config("qwen3-8b"))
    assert presets["qwen3-8b"]["values"]["read_b"] * 1e9 == pytest.approx(q["matmul"], rel=1e-15)
    assert presets["gemma-2-9b"]["values"]["window_pattern"] == 2


def test_calculator_reproduces_section_4s_example():
    """Qwen3-8B on one H200 in bf16, 8192 tokens: the page's record (results/kv-cache/formulas)."""
    import json
    from pathlib import Path

    record = json.loads(
        (Path(__file__).parents[2] / "results/kv-cache/formulas.json").read_text("utf-8")
    )["values"]["qwen3"]
    assert shown["max_seqs"] == record["seqs_8k"]
    assert shown["budget"] / 2**30 == pytest.approx(record["budget_gib"], rel=1e-12)
    step = next(r["ms"] for r in record["step_ms"] if r["batch"] == 32)
    assert shown["step_ms"] == pytest.approx(step, rel=1e-12)


@pytest.mark.parametrize(
    ("change", "message"),
    [({"context": 0}, "context must be a whole number"), ({"batch": 2.5}, "batch must be"),
     ({"gpus": 0}, "gpus must be"), ({"head_dim": 0}, "give kv_heads and head_dim"),
     ({"kv_format": "fp4"}, "unknown KV format")],
)  # fmt: skip
def test_calculator_rejects_bad_input(change, message):
    form = {**model_presets()[0]["values"], "kv_format": "bf16", "group": 0, "context": 8,
            "batch": 1, "gpus": 1, "memory_gb": 80, "bandwidth_tb_s": 3.35, "weight_bytes": 2,
            "workspace_gb": 4, "utilization": 0.9}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        kv_calculator(**{**form, **change})


def test_calculator_without_room_fits_nothing():
    form = {**model_presets()[0]["values"], "kv_format": "bf16", "group": 0, "context": 8,
            "batch": 1, "gpus": 1, "memory_gb": 16, "bandwidth_tb_s": 3.35, "weight_bytes": 2,
            "workspace_gb": 4, "utilization": 0.9}  # fmt: skip
    shown = kv_calculator(**form)
    assert (shown["budget"], shown["max_seqs"]) == (0, 0) and shown["tokens_per_s"] > 0


@pytest.mark.parametrize(
    ("old", "new", "message", "at"),
    [
        ('    params_b: "13"\n', "    params_b: 13\n", "'params_b': a number as printed", None),
        ('    params_b: "13"\n', "", "'params_b': needed, with the source", "  opt-13b:"),
        ("  opt-13b:  # MHA", "  opt-14b:  # MHA", "no such model in kv_models.yaml", None),
        ("  qwen3-8b: {}", '  qwen3-8b: {params_b: "8"}', "counted from config", None),
    ],
)  # fmt: skip
def test_bad_preset_data_names_file_line_and_field(tmp_path, old, new, message, at):
    from snippets.common.models import kv_configs, kv_presets, qwen3_configs

    text = kv_presets.DEFAULT_PATH.read_text(encoding="utf-8")
    assert old in text
    for shared in (kv_configs.DEFAULT_PATH, qwen3_configs.DEFAULT_PATH):
        (tmp_path / shared.name).write_text(shared.read_text("utf-8"), encoding="utf-8")
    path = tmp_path / "kv_presets.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(KVDataError, match=message) as err:
        load_kv_presets(path)
    line = text[: text.index(at or old)].count("\n") + 1
    assert str(err.value).startswith(f"{path}:{line}:")


def test_a_menu_model_s_config_is_checked_in_kv_models(tmp_path):
    """The menu's models live in data/kv_models.yaml; a bad config there names that file's line."""
    from snippets.common.models import kv_configs, kv_presets, qwen3_configs

    for source in (kv_presets.DEFAULT_PATH, qwen3_configs.DEFAULT_PATH):
        (tmp_path / source.name).write_text(source.read_text("utf-8"), encoding="utf-8")
    text = kv_configs.DEFAULT_PATH.read_text(encoding="utf-8")
    llama = text.index("  llama-3-8b:")
    old = "      num_key_value_heads: 8\n"
    at = text.index(old, llama)
    path = tmp_path / "kv_models.yaml"
    path.write_text(text[:at] + "      num_key_value_heads: x\n" + text[at + len(old) :], "utf-8")
    line = text[:at].count("\n") + 1
    with pytest.raises(KVDataError, match="a positive int") as err:
        load_kv_presets(tmp_path / "kv_presets.yaml")
    assert str(err.value).startswith(f"{path}:{line}: model 'llama-3-8b': "), err.value


def test_structure_check_reports_a_broken_preset_file(tmp_path):
    from snippets.common.models import kv_presets
    from tests.structure import data_errors

    (tmp_path / "data").mkdir()
    text = kv_presets.DEFAULT_PATH.read_text(encoding="utf-8")
    (tmp_path / "data" / "kv_presets.yaml").write_text(
        text.replace('    active_b: "37"', "    active_b: 37"), encoding="utf-8"
    )
    for shared in ("kv_models.yaml", "qwen3.yaml"):
        (tmp_path / "data" / shared).write_text(
            (kv_presets.DEFAULT_PATH.parent / shared).read_text("utf-8"), encoding="utf-8"
        )
    line = text[: text.index('    active_b: "37"')].count("\n") + 1
    assert data_errors(tmp_path) == [
        f"data/kv_presets.yaml:{line}: preset 'deepseek-v3': field 'active_b': "
        'a number as printed, quoted: "37"'
    ]


# ------------------------------------------------------------------ paged block manager


def test_fork_shares_and_append_copies_on_write():
    m = BlockManager(num_blocks=4, block_size=4)
    m.add(0, 4)  # one full block
    m.fork(0, 1)
    m.append(1)  # the shared block is full: a new block, no copy
    assert m.copies == [] and m.tables == {0: [0], 1: [0, 1]}
    m.append(0)
    m.append(0)
    assert m.copies == [] and m.tables[0] == [0, 2]
    m.fork(0, 2)
    m.append(2)  # block 2 is shared and half full: copy it
    assert m.copies == [(2, 3)] and m.tables[2] == [0, 3]
    check_invariants(m)
    m.append(0)  # block 2 is sequence 0's alone again: written in place
    m.append(0)
    assert m.copies == [(2, 3)] and m.lengths[0] == 8
    with pytest.raises(OutOfBlocks):
        m.append(0)  # the next token needs a fifth block
    check_invariants(m)


def test_out_of_blocks_and_misuse_give_clear_errors():
    m = BlockManager(num_blocks=2, block_size=4)
    with pytest.raises(OutOfBlocks, match="needs 3 blocks, 2 free"):
        m.add(0, 9)
    assert m.allocator.free == [1, 0] and not m.tables  # all or nothing
    m.add(0, 8)
    with pytest.raises(OutOfBlocks, match="all 2 blocks are in use"):
        m.append(0)
    with pytest.raises(ValueError, match="already exists"):
        m.add(0, 1)
    m.free(0)
    with pytest.raises(ValueError, match="double free"):
        m.allocator.release(0)
    with pytest.raises(ValueError, match="num_blocks must be positive"):
        BlockManager(0)


@pytest.mark.parametrize("seed", range(20))
def test_random_operations_never_leak_or_share_wrongly(seed):
    """Property test with seeded random operation sequences: after every operation each
    block's count equals the tables holding it, the free list is exactly the unheld blocks,
    and a shared block is never written (every append lands in a block its sequence owns)."""
    rng = random.Random(seed)
    m = BlockManager(num_blocks=rng.randint(4, 40), block_size=rng.choice([1, 2, 4, 16]))
    next_id = 0
    for _ in range(300):
        op = rng.choice(["add", "append", "append", "fork", "free"])
        seqs = list(m.tables)
        try:
            if op == "add" or not seqs:
                m.add(next_id, rng.randint(0, 40))
                next_id += 1
            elif op == "append":
                seq = rng.choice(seqs)
                m.append(seq)
                if m.lengths[seq] % m.block_size != 0 or m.block_size == 1:
                    assert m.allocator.refs[m.tables[seq][-1]] == 1  # written block is private
            elif op == "fork":
                m.fork(rng.choice(seqs), next_id)
                next_id += 1
            else:
                m.free(rng.choice(seqs))
        except OutOfBlocks:
            pass
        check_invariants(m)
    for seq in list(m.tables):
        m.free(seq)
    assert sorted(m.allocator.free) == list(range(len(m.allocator.refs)))


# ------------------------------------------------------------------ fragmentation


def test_trace_is_reproducible_and_bounded():
    trace = make_trace(200, max_len=512, seed=3)
    assert trace == make_trace(200, max_len=512, seed=3)
    assert all(1 <= r.prompt <= 256 and r.output >= 1 and r.final <= 512 for r in trace)


def test_shares_add_up_and_exact_reservation_wastes_nothing_inside():
    trace = [Request(10, 20), Request(30, 5), Request(7, 7)] * 20
    for pool in (Contiguous(128, lambda r: r.final), Paged(128, block_size=1)):
        run = simulate(trace, pool, 128)
        assert run["internal"] == 0
        assert run["used"] + run["reserved"] + run["external"] <= 1
    paged = simulate(trace, Paged(128, block_size=1), 128)
    assert paged["reserved"] == 0  # blocks of one token: allocated only when written


def test_max_length_reservation_wastes_more_than_paging():
    trace = make_trace(100, max_len=256, seed=1)
    contiguous = simulate(trace, Contiguous(1024, lambda r: 256), 1024)
    paged = simulate(trace, Paged(1024, block_size=8), 1024)
    assert contiguous["used"] < paged["used"] and contiguous["steps"] > paged["steps"]


# ------------------------------------------------------------------ prefix caching


def test_block_hash_depends_on_the_whole_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7], 2)
    b = block_hashes([9, 2, 3, 4, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3  # only full blocks are hashed
    assert a[1] != b[1]  # same block tokens [3, 4], different parents
    assert block_hashes([1, 2, 3, 4], 2) == a[:2]


def test_hit_then_divergence_then_lru_eviction():
    cache = PrefixCache(num_blocks=4, block_size=2)
    first, hit = cache.allocate([1, 2, 3, 4, 5])
    assert hit == 0 and len(first) == 3
    cache.release(first)
    second, hit = cache.allocate([1, 2, 3, 4, 9, 9])
    assert hit == 4 and second[:2] == first[:2]
    third, hit = cache.allocate([1, 2, 7, 7])  # shares block 0 while `second` holds it
    assert hit == 2 and cache.refs[first[0]] == 2
    cache.release(second)
    cache.release(third)
    # evictable, least recently released first: [9, 9], [3, 4], [7, 7], [1, 2]
    fresh, hit = cache.allocate([5, 5, 6, 6])  # no empty block left: evicts the two oldest
    assert hit == 0 and sorted(fresh) == sorted([second[2], second[1]])
    cache.release(fresh)
    assert cache.allocate([1, 2, 7, 7])[1] == 4  # [1, 2] and [7, 7] survived
    assert cache.allocate([1, 2, 3, 4])[1] == 2  # [3, 4] was evicted: recomputed
    with pytest.raises(OutOfBlocks, match="referenced"):
        cache.allocate([0] * 9)
    assert sum(cache.refs) == 4  # the failed allocation returned what it took


def test_referenced_blocks_are_never_evicted():
    rng = random.Random(0)
    cache = PrefixCache(num_blocks=16, block_size=2)
    live = []
    for _ in range(500):
        if live and (rng.random() < 0.5 or len(live) > 4):
            cache.release(live.pop(rng.randrange(len(live))))
        else:
            tokens = [rng.randrange(3) for _ in range(rng.randint(1, 7))]
            try:
                live.append(cache.allocate(tokens)[0])
            except OutOfBlocks:
                continue
        held = [0] * 16
        for blocks in live:
            for b in blocks:
                held[b] += 1
        assert held == cache.refs
        assert all(cache.refs[b] == 0 for b in cache.evictable)
        assert all(cache.hash_of[b] in cache.by_hash for b in cache.hash_of)
    with pytest.raises(ValueError, match="double free"):
        cache.release([next(iter(cache.evictable))] if cache.evictable else [cache.empty[0]])


def test_structure_check_reports_a_broken_kv_data_file(tmp_path):
    from snippets.common.models.kv_configs import DEFAULT_PATH
    from tests.structure import data_errors

    text = DEFAULT_PATH.read_text(encoding="utf-8")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "kv_models.yaml").write_text(
        text.replace("      hidden_size: 5120\n", "      hidden_size: -1\n", 1), encoding="utf-8"
    )
    line = text[: text.index("      hidden_size: 5120\n")].count("\n") + 1
    assert data_errors(tmp_path) == [
        f"data/kv_models.yaml:{line}: model 'opt-13b': field 'hidden_size': "
        "expected a positive int, got '-1'"
    ]


# ------------------------------------------------------------------ paged decode attention
# On the CPU the kernel runs in the Triton interpreter in fp32 (it mangles bf16); on the GPU those
# tests are skipped (`cpu`) and bf16 / fp16 / FP8 run at Qwen3-8B's heads (`gpu`).
# Tolerances: decode_bound in snippets/kv_cache/paged_attention.py, the fp32 rounding-error bound
# of the kernel's arithmetic against fp64 attention over the same K and V values (for an FP8
# cache: the dequantized values, which the kernel reproduces exactly, so no FP8 term enters);
# fp8_error_bound, what e4m3's 3 mantissa bits allow per element (2^-4 relative, 2^-10 x scale
# among the subnormals), for the quantization itself.

gpu = pytest.mark.gpu  # CUDA-only: run by gpu_docs, with the post or among "the rest"
cpu = pytest.mark.skipif(ON_GPU, reason="the CPU suite covers it (nox -s tests)")


def attention_module():
    import snippets.kv_cache.paged_attention as pa

    return pa


def paged_case(lens, q_heads, kv_heads, d, block_size, dtype=torch.float32, seed=0, spare=3):
    """q and random K/V caches; each sequence's blocks scattered over the pool by a shuffled
    block table, `spare` blocks held by nobody."""
    g = torch.Generator().manual_seed(seed)
    pages = [-(-n // block_size) for n in lens]
    perm = torch.randperm(sum(pages) + spare, generator=g).to(torch.int32)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    at = 0
    for b, n in enumerate(pages):
        table[b, :n] = perm[at : at + n]
        at += n
    shape = (len(perm), block_size, kv_heads, d)
    k, v = (torch.randn(shape, generator=g) for _ in range(2))
    q = torch.randn(len(lens), q_heads, d, generator=g)
    lens = torch.tensor(lens, dtype=torch.int32)
    return [t.to(DEVICE, dtype) for t in (q, k, v)] + [table.to(DEVICE), lens.to(DEVICE)]


def kernel_within_bound(case, tile, splits, fp8=False):
    pa = attention_module()
    q, k, v, table, lens = case
    return pa.check_paged_decode(q, k, v, table, lens, tile, splits, fp8)


@cpu
@pytest.mark.parametrize(
    ("lens", "q_heads", "kv_heads", "d", "block_size", "tile", "splits"),
    [
        ([1, 17, 40], 4, 2, 64, 16, 16, None),  # GQA; length 1; lengths not block multiples
        ([33, 5], 4, 1, 64, 32, 16, 3),  # MQA; 3 splits of one tile: the short one's are empty
        ([23, 1], 2, 2, 128, 16, 32, 1),  # MHA; head_dim 128; a tile of two blocks
        ([70, 31, 1], 6, 2, 128, 32, 16, 4),  # 3 query heads per KV head (padded); 3 splits
        ([50], 4, 2, 64, 8, 16, 1),  # blocks of 8: each tile of 16 gathers two
    ],
    ids=["gqa", "mqa-split", "mha-d128", "gqa3-split-d128", "block8"],
)
def test_paged_decode_fp32(lens, q_heads, kv_heads, d, block_size, tile, splits):
    case = paged_case(lens, q_heads, kv_heads, d, block_size)
    assert kernel_within_bound(case, tile, splits)  # splits=None: the default, 1 on the CPU


@cpu
@pytest.mark.parametrize("splits", [1, 3])
def test_fp8_cache_against_the_dequantized_reference(splits):
    case = paged_case([45, 2, 16], 4, 2, 64, 16, seed=1)
    assert kernel_within_bound(case, 16, splits, fp8=True)


@cpu
def test_split_results_equal_unsplit_ones_to_rounding():
    """Splitting changes only the order of the sums: both within the bound of the same values."""
    pa = attention_module()
    q, k, v, table, lens = paged_case([64, 64], 4, 2, 64, 16, seed=2)
    one = pa.paged_decode(q, k, v, table, lens, tile=16, splits=1)
    four = pa.paged_decode(q, k, v, table, lens, tile=16, splits=4)
    exact, parts = pa.decode_reference(q, k, v, table, lens)
    bound = pa.decode_bound(parts, 64, torch.float32, torch.float32, 16, 4)
    assert within({"a": one, "b": four}, {"a": exact, "b": exact}, {"a": bound, "b": bound})
    assert not torch.equal(one, torch.zeros_like(one))


def test_fp8_quantization_error_is_three_mantissa_bits():
    """Per element |x~ - x| <= 2^-4 |x| + 2^-10 scale (e4m3), the bound nearly attained; e5m2's
    2 mantissa bits break it. One token's values span 2^-12..1 of its largest: subnormals too."""
    pa = attention_module()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(64, 4, 2, 128, generator=g) * torch.logspace(-3, 3, 64)[:, None, None, None]
    x[0, 0, 0] = torch.logspace(-12, 0, 128, base=2.0)
    q8, scale = pa.quantize_fp8(x)
    assert q8.dtype == torch.float8_e4m3fn and scale.shape == x.shape[:3]  # per (token, head)
    bound = pa.fp8_error_bound(x, scale)
    err = (pa.dequantize_fp8(q8, scale) - x.double()).abs()
    assert bool((err <= bound).all()) and (err / bound).max() > 0.9
    e5m2 = (x / scale[..., None]).to(torch.float8_e5m2).double() * scale.double()[..., None]
    assert not bool(((e5m2 - x.double()).abs() <= bound).all())


def test_bounds_are_not_vacuous_for_paging_bugs():
    """Outputs of typical bugs, computed with the reference, land outside the kernel's bound."""
    pa = attention_module()
    q, k, v, table, lens = paged_case([40, 9, 30], 4, 2, 64, 16, dtype=torch.float64, seed=4)
    exact, parts = pa.decode_reference(q, k, v, table, lens)
    bound = pa.decode_bound(parts, 64, torch.float32, torch.float32, 16, 1)

    def outside(out):
        return not within({"o": out}, {"o": exact}, {"o": bound})

    mixed = q.view(3, 2, 2, 64).transpose(1, 2).reshape(3, 4, 64)  # head h reads kv h % 2
    unmixed = pa.decode_reference(mixed, k, v, table, lens)[0]
    assert outside(unmixed.view(3, 2, 2, 64).transpose(1, 2).reshape(3, 4, 64))
    in_order = torch.arange(table.numel(), dtype=torch.int32).view(table.shape)  # no table
    assert outside(pa.decode_reference(q, k, v, in_order, lens)[0])
    assert outside(pa.decode_reference(q, k, v, table, lens - 1)[0])  # last token lost
    (k8, ks), (v8, vs) = pa.quantize_fp8(k), pa.quantize_fp8(v)
    exact8, parts8 = pa.decode_reference(q, k8, v8, table, lens, ks, vs)
    bound8 = pa.decode_bound(parts8, 64, torch.float32, torch.float32, 16, 1)
    wrong = pa.decode_reference(q, k8, v8, table, lens, ks.flip(-1), vs)[0]  # other head's scale
    assert not within({"o": wrong}, {"o": exact8}, {"o": bound8})


def test_split_plan():
    pa = attention_module()
    assert pa.split_plan(1, 8, 32768, 64, 132) == (16, 32)  # 256 programs on 132 SMs
    assert pa.split_plan(4, 8, 1024, 64, 132) == (2, 8)
    assert pa.split_plan(64, 8, 32768, 64, 132) == (512, 1)  # 512 programs without a split
    assert pa.split_plan(1, 8, 100, 64, 1) == (2, 1)  # CPU: one program per (sequence, head)
    assert pa.split_plan(1, 8, 70, 16, 1, splits=4) == (2, 3)  # 5 tiles: 2 + 2 + 1
    assert pa.split_plan(1, 1, 10**6, 64, 132, splits=1000)[1] <= pa.MAX_SPLITS


def test_launch_config_follows_the_split_regime():
    pa = attention_module()
    assert pa.launch_config(16, 8, False, 132) == (128, 4, 3)  # 128 pairs < 132 SMs: split
    assert pa.launch_config(64, 8, False, 132) == (64, 4, 2)  # 512 pairs: one program each
    assert pa.launch_config(64, 8, True, 132) == (128, 4, 2)  # FP8: one choice
    assert pa.launch_config(1, 8, False, 1)[0] == pa.TILE  # CPU: never split by default


def bad(case, **change):
    q, k, v, table, lens = case
    args = {"q": q, "k_cache": k, "v_cache": v, "block_table": table, "seq_lens": lens} | change
    return args


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"q": torch.zeros(2, 3, 64)}, "multiple of kv_heads"),
        ({"q": torch.zeros(2, 4, 48), "k_cache": torch.zeros(5, 16, 2, 48),
          "v_cache": torch.zeros(5, 16, 2, 48)}, "power of two"),
        ({"v_cache": torch.zeros(5, 16, 2, 32)}, "must match"),
        ({"block_table": torch.zeros(2, 3, dtype=torch.int64)}, "block_table must be int32"),
        ({"seq_lens": torch.ones(3, dtype=torch.int32)}, "seq_lens must be int32"),
        ({"k_cache": torch.zeros(5, 16, 2, 64, dtype=torch.float8_e4m3fn),
          "v_cache": torch.zeros(5, 16, 2, 64, dtype=torch.float8_e4m3fn)}, "needs k_scale"),
        ({"k_scale": torch.ones(5, 16, 2)}, "needs k_scale"),
        ({"seq_lens": torch.tensor([3, 49], dtype=torch.int32)}, "exceeds the block table"),
        ({"tile": 8}, "tile must be a power of two"),
    ],
)  # fmt: skip
def test_bad_inputs_name_the_problem(change, message):
    pa = attention_module()
    case = [torch.zeros(2, 4, 64), torch.zeros(5, 16, 2, 64), torch.zeros(5, 16, 2, 64),
            torch.zeros(2, 3, dtype=torch.int32), torch.ones(2, dtype=torch.int32)]  # fmt: skip
    with pytest.raises(ValueError, match=message):
        pa.paged_decode(**bad(case, **change))


def test_fp8_scales_must_be_per_token_and_head():
    pa = attention_module()
    k8 = torch.zeros(5, 16, 2, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match=r"one per token and KV head"):
        pa.paged_decode(torch.zeros(2, 4, 64), k8, k8, torch.zeros(2, 3, dtype=torch.int32),
                        torch.ones(2, dtype=torch.int32), k_scale=torch.ones(5, 2),
                        v_scale=torch.ones(5, 2))  # fmt: skip
    with pytest.raises(ValueError, match="at least one token"):
        pa.decode_reference(torch.zeros(1, 2, 16), torch.zeros(1, 4, 1, 16),
                            torch.zeros(1, 4, 1, 16), torch.zeros(1, 1, dtype=torch.int32),
                            torch.zeros(1, dtype=torch.int32))  # fmt: skip


def test_decode_byte_model_by_hand():
    from snippets.kv_cache.paged_measure import SCALE_BYTES, Heads, decode_bytes

    heads = Heads.of(kv_config("qwen3-8b"))
    assert heads == Heads(32, 8, 128)
    assert Heads.of(kv_config("opt-13b")) == Heads(40, 40, 128)  # MHA: no num_key_value_heads
    lens = [1000, 24]  # 63 + 2 blocks of 16
    kv = 2 * 1024 * 8 * 128 * 2  # K and V, bf16
    q_and_out = 2 * 2 * 32 * 128 * 2
    table = (63 + 2 + 2) * 4  # block-table entries and lengths, int32
    assert decode_bytes(lens, heads) == kv + q_and_out + table
    assert decode_bytes(lens, heads, paged=False) == kv + q_and_out
    fp8 = 2 * 1024 * 8 * (128 + 4)  # one byte per element, a float32 scale per token and head
    assert decode_bytes(lens, heads, kv_elem=1, scale_bytes=SCALE_BYTES) == fp8 + q_and_out + table


def stand_in_each(calls, sessions):
    """kernel_ms_each for the CPU: each callable run once, a steady 1 ms for each."""

    def times(fns):
        sessions.append(len(fns))
        out = []
        for fn in fns:
            calls.append(fn())
            out.append(Stat.of([1.0] * 5, "gpu-kernels"))
        return out

    return times


@cpu
def test_measure_runs_at_tiny_shapes():
    from snippets.kv_cache.paged_measure import Heads, cache_bytes, decode_bytes, measure

    heads, calls, sessions, rotate = Heads(4, 2, 16), [], [], 10**5

    def need(batch, context):  # copies enough to hold `rotate` bytes, each with three caches
        copies = -(-rotate // decode_bytes([context] * batch, heads, 16, 4, 4))
        return copies * cache_bytes(batch, context, heads, 16, 4)

    shapes = [(2, 40), (1, 17), (64, 4096)]  # the last is over the memory limit: skipped
    limit = max(need(2, 40), need(1, 17))  # the first two do not fit together: two sessions
    rows = measure(shapes, heads, DEVICE, torch.float32, stand_in_each(calls, sessions), 1e9,
                   rotate_bytes=rotate, max_cache_bytes=limit)  # fmt: skip
    assert [(r["batch"], r["context"], r["splits"]) for r in rows] == [(2, 40, 1), (1, 17, 1)]
    assert sessions == [3, 3]
    columns = ("batch context splits tile fp8_tile ours_ms ours_of_copy fp8_ms fp8_of_copy "
               "fp8_speedup sdpa_ms sdpa_of_copy vs_sdpa")  # fmt: skip
    assert set(rows[0]) == set(columns.split())
    ours, fp8, sdpa = calls[:3]  # same values: the paged caches and the contiguous one agree
    assert ours.shape == sdpa.squeeze(2).shape == (2, 4, 16)
    assert torch.allclose(ours, sdpa.squeeze(2), atol=1e-5)
    assert torch.allclose(ours, fp8, atol=0.2)
    assert rows[0]["ours_of_copy"].median == decode_bytes([40, 40], heads, 16, 4, 4) / 1e-3 / 1e9
    assert rows[0]["vs_sdpa"].median == rows[0]["fp8_speedup"].median == 1.0


# GPU: bf16 and fp16 at Qwen3-8B's heads (nox -s gpu_docs) ------------------------------------


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(
    ("dtype", "block_size", "fp8"),
    [(torch.bfloat16, 16, False), (torch.float16, 32, False), (torch.bfloat16, 16, True)],
    ids=["bf16", "fp16-block32", "fp8-bf16"],
)
def test_paged_decode_gpu_qwen3_heads(dtype, block_size, fp8):
    from snippets.kv_cache.paged_measure import Heads

    heads = Heads.of(kv_config("qwen3-8b"))
    case = paged_case([1, 100, 1000, 4097], heads.q, heads.kv, heads.dim, block_size, dtype)
    assert kernel_within_bound(case, 64, splits=None, fp8=fp8)  # splits chosen for the GPU
    assert kernel_within_bound(case, 64, splits=1, fp8=fp8)
    assert kernel_within_bound(case, None, splits=None, fp8=fp8)  # launch_config's tile (128)


# ------------------------------------------------------------------ request lengths, links, offload


def test_geometric_lengths_have_the_published_means():
    from snippets.kv_cache.fragmentation import geometric

    rng = random.Random(0)
    draws = [geometric(rng, 161.31) for _ in range(20000)]
    assert min(draws) == 1
    mean = sum(draws) / len(draws)
    assert math.isclose(mean, 161.31, rel_tol=0.03), mean  # the sample mean's spread is ~0.7 %
    assert {geometric(rng, 1) for _ in range(10)} == {1}
    with pytest.raises(ValueError, match="at least 1 token"):
        geometric(rng, 0.5)


def test_structure_check_reports_a_broken_host_link(tmp_path):
    from snippets.common.datafile import HARDWARE
    from tests.structure import data_errors

    text = HARDWARE.read_text(encoding="utf-8")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "hardware.yaml").write_text(
        text.replace("total_gb_per_s: 128", "total_gb_per_s: fast", 1), encoding="utf-8"
    )
    line = text[: text.index("total_gb_per_s: 128")].count("\n") + 1
    assert data_errors(tmp_path) == [
        f"data/hardware.yaml:{line}: link 'pcie-gen5-x16': field 'total_gb_per_s': "
        "expected a positive number, got 'fast'"
    ]


def test_trace_reads_its_workload_from_data():
    sharegpt, alpaca = make_trace(2000, seed=5), make_trace(2000, seed=5, workload="alpaca")
    mean = lambda trace, f: sum(getattr(r, f) for r in trace) / len(trace)  # noqa: E731
    assert mean(alpaca, "prompt") < 25 < 130 < mean(sharegpt, "prompt")  # means 19.31, 161.31
    with pytest.raises(KeyError, match="lmsys"):
        make_trace(1, workload="lmsys")


@pytest.mark.parametrize(
    ("file", "old", "new", "at", "message"),
    [
        ("hardware.yaml", "total_gb_per_s: 128", "total_gb_per_s: fast", "total_gb_per_s: fast",
         "link 'pcie-gen5-x16': field 'total_gb_per_s': expected a positive number, got 'fast'"),
        ("hardware.yaml", "    total_gb_per_s: 900\n", "", "  nvlink-c2c:",
         "link 'nvlink-c2c': field 'total_gb_per_s': missing"),
        ("hardware.yaml", "      - url: https://developer.nvidia.com/blog/nvidia-grace",
         "      - url: http://developer.nvidia.com/blog/nvidia-grace", "      - url: http://",
         "link 'nvlink-c2c': field 'sources': each url must be"),
        ("request_lengths.yaml", "mean_output_tokens: 58.45", "mean_output_tokens: -58.45",
         "-58.45", "workload 'alpaca': field 'mean_output_tokens': expected a positive number"),
        ("request_lengths.yaml", "    name: ShareGPT", "    nmae: ShareGPT", "nmae",
         "workload 'sharegpt': field 'nmae': unknown field"),
        ("request_lengths.yaml", "mean_input_tokens: 19.31", "mean_input_tokens: [19.31",
         None, "malformed YAML"),
    ],
)  # fmt: skip
def test_bad_published_data_names_file_line_and_field(tmp_path, file, old, new, at, message):
    from snippets.common.datafile import DATA, DataFileError, load_host_links, load_request_lengths

    text = (DATA / file).read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / file
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    load = load_host_links if file == "hardware.yaml" else load_request_lengths
    with pytest.raises(DataFileError, match=re.escape(message)) as err:
        load(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    line = next((n for n, text in enumerate(lines, 1) if at in text), None) if at else None
    assert str(err.value).startswith(f"{path}:{line}:" if line else f"{path}:"), err.value


def test_reload_and_recompute_by_hand():
    from snippets.kv_cache.offload import (
        break_even_tokens_per_s,
        prefill_flops,
        recompute_s,
        reload_s,
    )
    from snippets.metrics.qwen3 import qwen3_params

    assert reload_s(64e9, 64e9) == 1.0
    with pytest.raises(ValueError, match="positive bandwidth"):
        reload_s(1.0, 0)
    cfg = kv_config("qwen3-8b")
    # token t (0-based) scores and sums t + 1 keys: 4 d_h FLOPs per key, query head and layer
    heads = cfg["num_hidden_layers"] * cfg["num_attention_heads"]
    attention = sum(4 * cfg["head_dim"] * (t + 1) * heads for t in range(100))
    assert prefill_flops(cfg, 100) == 100 * 2 * qwen3_params(cfg)["layers"] + attention
    assert prefill_flops(cfg, 0) == 0
    with pytest.raises(ValueError, match="tokens"):
        prefill_flops(cfg, -1)
    # at the break-even throughput, recomputing a prefix takes as long as reloading it
    per_token, link = kv_bytes_per_token(cfg), 50e9
    rate = break_even_tokens_per_s(per_token, link)
    assert math.isclose(reload_s(8192 * per_token, link), recompute_s(8192, rate), rel_tol=1e-12)
