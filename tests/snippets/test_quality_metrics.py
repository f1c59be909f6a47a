"""Unit tests for snippets/quality_metrics/: each metric against an independent computation
(PyTorch, exact fractions, jiwer on its own documented examples), its stated properties, its
edge cases and its errors on bad input."""

import math
import random
import statistics
import unicodedata
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F

from snippets.common.device import ON_GPU
from snippets.quality_metrics import accelerated
from snippets.quality_metrics.calculators import CASES, JIWER_DOCS, wer_calculator
from snippets.quality_metrics.divergence import (
    forward_kl,
    gaussian_moments,
    js,
    k1,
    k2,
    k3,
    kl,
    renormalized_topk_kl,
    reverse_kl,
    top1_agreement,
    top2_margin,
    topk_kl,
)
from snippets.quality_metrics.lm import (
    IGNORE_INDEX,
    NLL,
    chunked_token_nll,
    group_by_token,
    nll,
    token_nll,
)
from snippets.quality_metrics.pass_at_k import (
    expected,
    pass_at_k,
    pass_at_k_exact,
    pass_at_k_floats,
    pass_at_k_plugin,
)
from snippets.quality_metrics.synthetic import hashed_logits
from snippets.quality_metrics.wer import (
    WIDE,
    Alignment,
    align,
    cer,
    chars,
    corpus_rate,
    display_width,
    measures,
    render,
    wer,
    words,
)

F64 = torch.float64


@pytest.fixture(scope="module")
def jiwer():
    return pytest.importorskip("jiwer", reason="the cross-check needs jiwer (pyproject: test)")


def random_logits(rows, vocab, seed, scale=3.0, dtype=F64):
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(rows, vocab, generator=gen, dtype=F64)).to(dtype)


# ------------------------------------------------------------------------------ WER / CER


def jiwer_counts(out):
    return out.substitutions, out.deletions, out.insertions, out.hits


def counts(a: Alignment):
    return a.substitutions, a.deletions, a.insertions, a.hits


def drawn(text: str) -> list[list[str]]:
    """jiwer's visualize_alignment output as [REF, HYP, marks] blocks, trailing spaces cut."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    return [lines[i : i + 3] for i, ln in enumerate(lines) if ln.startswith("REF:")]


def test_jiwer_documented_examples_same_alignment_counts_and_measures(jiwer):
    """jiwer's docs/usage.md: the two-sentence word example, drawn and summed, and the CER
    example: the same drawing line for line, the same counts and measures."""
    refs, hyps = [r for r, _ in JIWER_DOCS[:2]], [h for _, h in JIWER_DOCS[:2]]
    out = jiwer.process_words(refs, hyps)
    ours = [align(words(r), words(h)) for r, h in zip(refs, hyps, strict=True)]
    assert drawn(jiwer.visualize_alignment(out)) == [render(a).splitlines() for a in ours]
    both = Alignment(ours[0].ops + ours[1].ops)
    assert counts(both) == jiwer_counts(out) == (2, 2, 4, 5)
    for name, value in measures(both).items():
        assert value == pytest.approx(getattr(out, name), abs=1e-15)
    refs, hyps = [r for r, _ in JIWER_DOCS[2:]], [h for _, h in JIWER_DOCS[2:]]
    out = jiwer.process_characters(refs, hyps)
    ours = [align(chars(r), chars(h)) for r, h in zip(refs, hyps, strict=True)]
    assert drawn(jiwer.visualize_alignment(out)) == [render(a, "").splitlines() for a in ours]
    assert corpus_rate(ours) == out.cer == jiwer.cer(refs, hyps)


def test_jiwer_multi_sentence_example_is_a_corpus_rate(jiwer):
    refs, hyps = ["hello world", "i like monthy python"], ["hello duck", "i like python"]
    ours = [align(words(r), words(h)) for r, h in zip(refs, hyps, strict=True)]
    assert corpus_rate(ours) == jiwer.wer(refs, hyps) == 2 / 6
    assert wer(refs[0], hyps[0]) == jiwer.wer(refs[0], hyps[0]) == 0.5


def test_random_pairs_same_error_count_as_jiwer(jiwer):
    """Any optimal alignment has the same S + D + I (the Levenshtein distance); the split may
    differ between tools when several are optimal, the rate never does."""
    rng = random.Random(0)
    vocab = ["a", "b", "c", "d", "是", "的"]
    same_split = 0
    for _ in range(300):
        ref = " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 9)))
        hyp = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 9)))
        a, out = align(words(ref), words(hyp)), jiwer.process_words(ref, hyp)
        theirs = out.substitutions + out.deletions + out.insertions
        assert a.errors == theirs and a.ref_len == out.hits + out.substitutions + out.deletions
        assert a.rate() == out.wer == wer(ref, hyp)
        assert cer(ref, hyp) == jiwer.cer(ref, hyp)
        same_split += counts(a) == jiwer_counts(out)
    assert same_split > 250  # the tie-breaking agrees with rapidfuzz's most of the time


def brute_force_distance(r, h):
    if not r or not h:
        return len(r) + len(h)
    return min(brute_force_distance(r[1:], h[1:]) + (r[0] != h[0]),
               brute_force_distance(r[1:], h) + 1, brute_force_distance(r, h[1:]) + 1)  # fmt: skip


def test_alignment_is_optimal_and_spells_both_sides():
    rng = random.Random(1)
    for _ in range(200):
        r = [rng.choice("xyz") for _ in range(rng.randint(0, 6))]
        h = [rng.choice("xyz") for _ in range(rng.randint(0, 6))]
        a = align(r, h)
        assert [t for _, t, _ in a.ops if t is not None] == r
        assert [t for _, _, t in a.ops if t is not None] == h
        assert a.errors == brute_force_distance(r, h)
        assert a.deletions - a.insertions == len(r) - len(h)
        assert a.errors <= max(len(r), len(h))  # so WER <= max(N, N_hyp) / N (Morris 2004)
        assert all((k == "=") == (x == y) for k, x, y in a.ops if k in "=S")


def test_error_rate_edge_cases():
    assert wer("the cat sat", "the cat sat") == 0.0
    assert wer("the cat sat", "") == 1.0  # all deleted
    assert wer("yes", "yes yes yes no") == 3.0  # insertions: no upper bound
    assert words("  a  b\tc\n") == ["a", "b", "c"] and chars("  a b\n") == ["a", " ", "b"]
    assert chars("👍 ok") == ["👍", " ", "o", "k"]  # one code point, one character
    for ref in ("", "   \n"):
        with pytest.raises(ValueError, match="the reference is empty"):
            wer(ref, "something")
        with pytest.raises(ValueError, match="the reference is empty"):
            wer_calculator(ref, "something")
    with pytest.raises(ValueError, match="every reference is empty"):
        corpus_rate([align([], [])])


def test_calculator_outputs_agree_with_the_functions():
    for ref, hyp in CASES:
        out = wer_calculator(ref, hyp)
        assert out["word_rate"] == wer(ref, hyp) and out["char_rate"] == cer(ref, hyp)
        a = align(words(ref), words(hyp))
        assert out["word_alignment"] == render(a) and out["word_hits"] == a.hits


def test_wide_characters_follow_unicode_and_line_up():
    for lo, hi in WIDE:  # every assigned code point in the table is East Asian Wide or Full
        for code in range(lo, min(hi, lo + 4096) + 1):
            ch = chr(code)
            if unicodedata.category(ch) != "Cn":
                assert unicodedata.east_asian_width(ch) in "WF", hex(code)
    assert display_width("训练ok，") == 8
    lines = render(align(chars("我用 GPU 训练。"), chars("我用GPU训练"))).splitlines()
    assert display_width(lines[0]) == display_width(lines[1])  # columns line up


# ------------------------------------------------------------------------------ CE / PPL / BPB


def test_token_nll_matches_pytorch_and_ignores_targets():
    logits = random_logits(10, 33, seed=0)
    targets = torch.randint(0, 33, (10,), generator=torch.Generator().manual_seed(1))
    targets[[2, 5]] = IGNORE_INDEX
    ours = token_nll(logits, targets)
    assert torch.allclose(ours, F.cross_entropy(logits, targets, reduction="none"), atol=1e-14)
    total = nll(logits, targets)
    assert total.tokens == 8 and total.mean() == pytest.approx(
        F.cross_entropy(logits, targets).item(), rel=1e-14)  # fmt: skip
    assert total.perplexity() == pytest.approx(math.exp(total.mean()))
    assert total.bits() == pytest.approx(total.nats / math.log(2))


def test_low_precision_logits_are_upcast():
    logits = random_logits(4, 20, seed=2, dtype=torch.bfloat16)
    targets = torch.tensor([0, 3, IGNORE_INDEX, 19])
    ours = token_nll(logits, targets)
    assert ours.dtype == torch.float32
    assert torch.equal(ours, token_nll(logits.float(), targets))


def test_batches_add_and_all_ignored_batches_are_explicit():
    empty = NLL(0.0, 0)
    one = nll(random_logits(3, 5, seed=3), torch.tensor([1, 2, 3]))
    assert (one + empty) == one and (empty + one).mean() == one.mean()
    with pytest.raises(ValueError, match="no scored token"):
        nll(random_logits(2, 5, seed=3), torch.full((2,), IGNORE_INDEX)).mean()
    with pytest.raises(ValueError, match="positive number of units"):
        one.bits_per(0)


@pytest.mark.parametrize(
    ("targets", "error", "message"),
    [
        (torch.tensor([0, 7, 1]), IndexError,
         r"target 7 at \(1,\) is neither a token id in \[0, 5\)"),
        (torch.tensor([0, -1, 1]), IndexError, r"target -1 at \(1,\)"),
        (torch.tensor([0.0, 1.0, 2.0]), TypeError, "an integer dtype"),
        (torch.tensor([0, 1]), ValueError, r"need targets of shape \(3,\), got \(2,\)"),
    ],
    ids=["too-large", "negative", "float", "shape"],
)  # fmt: skip
def test_bad_targets_name_the_problem(targets, error, message):
    with pytest.raises(error, match=message):
        token_nll(random_logits(3, 5, seed=4), targets)


@pytest.mark.parametrize(
    ("token_chunk", "vocab_chunk"), [(37, 1), (1, 999), (5, 7), (64, 1000), (4, 4096)]
)
def test_chunked_cross_entropy_equals_the_full_one(token_chunk, vocab_chunk):
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(37, 16, generator=gen, dtype=F64)
    weight = torch.randn(1000, 16, generator=gen, dtype=F64)
    targets = torch.randint(0, 1000, (37,), generator=gen)
    targets[::4] = IGNORE_INDEX
    full = F.cross_entropy(hidden @ weight.T, targets, reduction="none")
    got = chunked_token_nll(hidden, weight, targets, token_chunk=token_chunk,
                            vocab_chunk=vocab_chunk)  # fmt: skip
    assert (got - full).abs().max() < 1e-12
    all_ignored = torch.full((37,), IGNORE_INDEX)
    assert not chunked_token_nll(hidden, weight, all_ignored, token_chunk=8).any()


def test_chunked_cross_entropy_bad_input():
    hidden, weight = torch.zeros(2, 4), torch.zeros(10, 4)
    with pytest.raises(ValueError, match="chunks must be >= 1"):
        chunked_token_nll(hidden, weight, torch.tensor([0, 1]), vocab_chunk=0)
    with pytest.raises(IndexError, match=r"target 10 at \(1,\)"):
        chunked_token_nll(hidden, weight, torch.tensor([0, 10]))


def test_bits_do_not_depend_on_how_the_bytes_are_grouped():
    """A random segmentation of the same bytes: the total is the same, the perplexity per
    unit is 2 ** (bits per byte x bytes per unit)."""
    gen = torch.Generator().manual_seed(6)
    byte_nats = torch.rand(1000, generator=gen, dtype=F64) * 5
    cuts = sorted(random.Random(6).sample(range(1, 1000), 299))
    lengths = torch.tensor([b - a for a, b in zip([0, *cuts], [*cuts, 1000], strict=True)])
    tokens = group_by_token(byte_nats, lengths)
    each = torch.stack([b.sum() for b in byte_nats.split(lengths.tolist())])  # token by token
    assert torch.allclose(tokens, each, rtol=0, atol=1e-12)
    per_byte, per_token = NLL(byte_nats.sum().item(), 1000), NLL(tokens.sum().item(), 300)
    assert per_token.bits() == pytest.approx(per_byte.bits(), rel=1e-13)
    bpb = per_byte.bits_per(1000)
    assert per_token.perplexity() == pytest.approx(2 ** (bpb * 1000 / 300), rel=1e-12)
    with pytest.raises(ValueError, match="must add up to the 1000 units"):
        group_by_token(byte_nats, lengths[:-1])
    merged = torch.cat([lengths[:-2], lengths[-2:].sum(0, keepdim=True), torch.tensor([0])])
    with pytest.raises(ValueError, match=r"\(>= 1 each\)"):  # right total, an empty token
        group_by_token(byte_nats, merged)


# ------------------------------------------------------------------------------ KL / JS


def test_kl_matches_pytorch_and_its_properties():
    logp = random_logits(6, 50, seed=7).log_softmax(-1)
    logq = random_logits(6, 50, seed=8).log_softmax(-1)
    torch_kl = F.kl_div(logq, logp, log_target=True, reduction="none").sum(-1)
    assert torch.allclose(kl(logp, logq), torch_kl, atol=1e-13)
    assert (kl(logp, logq) > 0).all() and kl(logp, logp).abs().max() == 0
    assert torch.equal(forward_kl(logp, logq), kl(logp, logq))
    assert torch.equal(reverse_kl(logp, logq), kl(logq, logp))
    assert not torch.allclose(kl(logp, logq), kl(logq, logp))  # not symmetric


def test_kl_zero_probabilities():
    p = torch.tensor([[0.5, 0.5, 0.0]], dtype=F64).log()
    q = torch.tensor([[0.25, 0.25, 0.5]], dtype=F64).log()
    assert kl(p, q).item() == pytest.approx(math.log(2))  # the p = 0 term is 0, not nan
    assert kl(q, p).item() == math.inf  # q puts mass where p has none


def test_kl_refuses_low_precision_and_mismatched_shapes():
    logp = random_logits(2, 8, seed=9).log_softmax(-1)
    with pytest.raises(TypeError, match="upcast the logits before log_softmax"):
        kl(logp.bfloat16(), logp)
    with pytest.raises(ValueError, match="differ in shape"):
        kl(logp, logp[:, :4])


def test_js_is_symmetric_bounded_and_matches_its_definition():
    logp = random_logits(5, 40, seed=10).log_softmax(-1)
    logq = random_logits(5, 40, seed=11).log_softmax(-1)
    m = ((logp.exp() + logq.exp()) / 2).log()
    assert torch.allclose(js(logp, logq), 0.5 * kl(logp, m) + 0.5 * kl(logq, m), atol=1e-14)
    assert torch.allclose(js(logp, logq), js(logq, logp), atol=1e-15)
    assert (js(logp, logq) <= math.log(2)).all() and js(logp, logp).abs().max() < 1e-15


def test_sample_estimators_are_unbiased_exactly():
    """Summed over the whole support instead of sampled: E_P[k1] = E_P[k3] = KL(P || Q), k3 is
    never negative, E_P[k2] is not the KL."""
    logp = random_logits(4, 30, seed=12, scale=1.0).log_softmax(-1)
    logq = random_logits(4, 30, seed=13, scale=1.0).log_softmax(-1)
    p, log_r = logp.exp(), logq - logp
    truth = kl(logp, logq)
    assert torch.allclose((p * k1(log_r)).sum(-1), truth, atol=1e-14)
    assert torch.allclose((p * k3(log_r)).sum(-1), truth, atol=1e-14)
    assert (k3(log_r) >= 0).all()
    assert not torch.allclose((p * k2(log_r)).sum(-1), truth, atol=1e-3)


def test_gaussian_closed_forms_reproduce_schulmans_table():
    """joschu.net/blog/kl-approx.html: bias/true and stdev/true for mu = 0.1 and mu = 1 (the
    blog's are sample estimates: k2's bias at mu = 0.1 is printed 0.002, the closed form is
    mu^2 / 4 = 0.0025)."""
    published = {0.1: {"k1": (0, 20), "k2": (0.002, 1.42), "k3": (0, 1.42)},
                 1.0: {"k1": (0, 2), "k2": (0.25, 1.73), "k3": (0, 1.7)}}  # fmt: skip
    for mu, table in published.items():
        got = gaussian_moments(mu)
        for name, (bias, std) in table.items():
            assert got[name]["bias"] == pytest.approx(bias, abs=6e-4)
            assert got[name]["std"] == pytest.approx(std, abs=0.005 if std < 5 else 1e-9)


def tail_worst_reference(logq, head, k):
    """A reference whose top-k probabilities are `head` and whose tail is the one topk_kl's
    upper bound assumes: as much as the cap allows on the test model's least likely tokens."""
    order = logq.argsort()  # least likely first
    p = torch.zeros_like(logq)
    top = order[-k:]
    p[top] = head
    m, cap = 1 - head.sum(), min(head.min().item(), 1 - head.sum().item())
    left = m
    for i in order[:-k]:
        take = min(cap, left)
        p[i] = take
        left -= take
        if left <= 0:
            break
    return p.log(), top


def test_topk_bracket_holds_and_narrows_with_k():
    zipf = -2 * torch.arange(2000, dtype=F64).log1p()
    for seed in range(3):
        ref = (zipf + random_logits(4, 2000, seed=20 + seed, scale=1.0)).log_softmax(-1)
        test = (ref + 0.3 * random_logits(4, 2000, seed=30 + seed, scale=1.0)).log_softmax(-1)
        exact, last_low = kl(ref, test), None
        for k in (1, 3, 10, 100, 1000, 2000):
            values, idx = ref.topk(k, dim=-1)
            low, high = topk_kl(values, idx, test)
            assert (low <= exact + 1e-14).all() and (exact <= high + 1e-14).all()
            if last_low is not None:
                assert (low >= last_low - 1e-14).all()  # a finer partition: never less KL
            last_low = low
        assert torch.allclose(low, exact, atol=1e-14) and torch.allclose(high, exact, atol=1e-14)


def test_topk_upper_bound_is_attained():
    logq = random_logits(1, 200, seed=40, scale=2.0).log_softmax(-1)[0]
    head = torch.tensor([0.5, 0.2, 0.1], dtype=F64)
    logp, top = tail_worst_reference(logq, head, 3)
    assert logp[top].min() >= logp.topk(3).values.min()  # a top-3 (the tail ties at 0.1)
    low, high = topk_kl(logp[top][None], top[None], logq[None])
    assert high.item() == pytest.approx(kl(logp[None], logq[None]).item(), rel=1e-12)
    assert low.item() < high.item()


def test_renormalized_topk_is_not_a_bound():
    zipf = -2 * torch.arange(500, dtype=F64).log1p()
    ref = (zipf + random_logits(64, 500, seed=50, scale=1.0)).log_softmax(-1)
    test = (ref + 0.5 * random_logits(64, 500, seed=51, scale=1.0)).log_softmax(-1)
    values, idx = ref.topk(8, dim=-1)
    renorm, exact = renormalized_topk_kl(values, idx, test), kl(ref, test)
    assert (renorm > exact).any() and (renorm < exact).any()


def test_agreement_and_margin():
    a = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0], [2.0, 2.0, 1.0]])
    b = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0], [2.0, 2.0, 0.0]])
    assert top1_agreement(a, b) == pytest.approx(2 / 3)  # ties: the first index on both sides
    assert top1_agreement(a, b, torch.tensor([False, True, True])) == 1.0
    assert top2_margin(a).tolist() == [1.0, 5.0, 0.0]
    with pytest.raises(ValueError, match="no scored position"):
        top1_agreement(a, b, torch.zeros(3, dtype=torch.bool))


# ------------------------------------------------------------------------------ pass@k


def test_pass_at_k_product_form_equals_the_binomials():
    for n in range(1, 31):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(float(pass_at_k_exact(n, c, k)),
                                                           abs=1e-14)  # fmt: skip
            assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-15)


def test_pass_at_k_is_unbiased_exactly():
    """With exact fractions: averaged over c ~ Binomial(n, p), the estimator is the true
    pass@k = 1 - (1 - p)^k (Chen et al. 2021, §2.1); the plug-in estimator falls short."""
    n, p = 12, Fraction(1, 3)
    for k in range(1, n + 1):
        mean = sum(math.comb(n, c) * p**c * (1 - p) ** (n - c) * pass_at_k_exact(n, c, k)
                   for c in range(n + 1))  # fmt: skip
        assert mean == 1 - (1 - p) ** k
    assert expected(pass_at_k_plugin, 200, 0.02, 10) < 1 - 0.98**10
    assert pass_at_k_plugin(200, 5, 100) == pytest.approx(1 - (1 - 5 / 200) ** 100, rel=1e-15)
    assert pass_at_k_plugin(200, 5, 1) == pytest.approx(5 / 200, rel=1e-15)
    assert expected(pass_at_k, 200, 0.02, 10) == pytest.approx(1 - 0.98**10, rel=1e-12)


def test_pass_at_k_floats_overflow_and_bad_input():
    assert pass_at_k_floats(1029, 1, 514) == pytest.approx(pass_at_k(1029, 1, 514))
    with pytest.raises(OverflowError):
        pass_at_k_floats(1030, 1, 515)
    for args, error in (((5, 6, 1), ValueError), ((5, -1, 1), ValueError), ((5, 2, 6), ValueError),
                        ((5, 2, 0), ValueError), ((5.0, 2, 1), TypeError)):  # fmt: skip
        with pytest.raises(error):
            pass_at_k(*args)
    assert pass_at_k(10, 0, 3) == 0.0 and pass_at_k(10, 8, 3) == 1.0


# ------------------------------------------------------------------------------ numerics


def test_rounding_bounds_behind_the_numerics_record():
    """Rounding log-probs to a format moves each by at most u |log p|; rounding the logits
    moves each log-prob by at most u (|z_i| + max |z|)."""
    z = hashed_logits(4, 3000, seed=60).float()
    ref = z.double().log_softmax(-1)
    for fmt, u in ((torch.float16, 2.0**-11), (torch.bfloat16, 2.0**-8)):
        out = ref.to(fmt).double()
        assert ((out - ref).abs() <= u * ref.abs()).all()
        moved = z.to(fmt).double().log_softmax(-1) - ref
        assert (moved.abs() <= u * (z.abs() + z.abs().amax(-1, keepdim=True))).all()


def test_hashed_logits_are_exact_and_bell_shaped():
    z = hashed_logits(3, 10_000, seed=0)
    assert torch.equal(z, hashed_logits(3, 10_000, seed=0))
    assert torch.equal(z, (z * 2**15 / 3).round() * 3 / 2**15)  # on the grid: exact
    assert z.std().item() == pytest.approx(3 * (4 / 3) ** 0.5, rel=0.02)
    assert z.abs().max() < 12


# ------------------------------------------------------------------------------ accelerated paths
# Section 8: the quantizers, the path models, the per-slice statistics and the band, on small
# inputs; then the whole measurement on the CPU stand-in of the shared target model (the
# Triton kernels in fp32: the interpreter mangles bf16), and its record against the page.


def e4m3_grid() -> torch.Tensor:
    """Every finite float8_e4m3fn value, sorted (from the 256 bit patterns)."""
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return values[torch.isfinite(values)].unique()


def test_fp8_quantize_picks_the_nearest_e4m3_value():
    """An independent rounding: the nearest of the enumerated E4M3 values to w / scale (a tie
    may go either way), normal and subnormal magnitudes alike; the row maximum maps to 448."""
    gen = torch.Generator().manual_seed(70)
    w = torch.randn(16, 300, generator=gen) * torch.logspace(-3, 1, 16)[:, None]
    w[3, :40] *= 1e-4  # reach the subnormals of a row whose maximum is ordinary
    grid = e4m3_grid()
    assert grid.max() == 448 and len(grid) == 253  # 126 magnitudes each side of 0
    for per in ("tensor", "row"):
        q, scale = accelerated.quantize(w, "fp8", per)
        assert q.dtype == torch.float8_e4m3fn
        assert scale.shape == ((16, 1) if per == "row" else (1, 1))
        x = (w.double() / scale.double()).flatten()
        dist = (grid[None, :] - x[:, None]).abs()
        nearest = dist.min(1).values
        got = (q.double().flatten() - x).abs()
        assert torch.all(got <= nearest * (1 + 1e-6) + 1e-30)
        amax = q.double().abs().amax(1 if per == "row" else None)
        assert torch.all(amax == 448)


def test_int8_quantize_rounds_to_the_grid_with_absmax_scales():
    gen = torch.Generator().manual_seed(71)
    w = torch.randn(8, 100, generator=gen) * torch.arange(1, 9)[:, None]
    for per in ("tensor", "row"):
        q, scale = accelerated.quantize(w, "int8", per)
        assert q.dtype == torch.int8 and int(q.abs().max()) == 127
        x = w.double() / scale.double()
        assert torch.all((q.double() - x).abs() <= 0.5 + 1e-6)
        if per == "row":  # every row uses its whole grid
            assert torch.all(q.abs().amax(1) == 127)
            assert torch.allclose(scale.flatten().double(), w.abs().amax(1).double() / 127)
    q_row, s_row = accelerated.quantize(w, "int8", "row")
    q_t, s_t = accelerated.quantize(w, "int8", "tensor")
    err_row = (w.double() - q_row.double() * s_row.double())[0].norm()
    err_t = (w.double() - q_t.double() * s_t.double())[0].norm()
    assert err_row < err_t / 4  # row 0 is 8x smaller than the largest: a finer grid


def test_quantize_zero_rows_and_bad_input():
    for fmt, row in (("fp8", [448.0, -0.5, 0.015625, 0.0, 2**-9]), ("int8", [127.0, -3, 0, 1, 64])):
        w = torch.zeros(3, 5)
        w[1] = torch.tensor(row)  # already on the grid, largest = qmax: scale 1, no loss
        q, scale = accelerated.quantize(w, fmt, "row")
        assert scale.flatten().tolist() == [1.0, 1.0, 1.0]  # zero rows keep scale 1
        assert not q[0].double().any() and not q[2].double().any()
        assert torch.equal(q.double()[1], w[1].double())
    for bad, match in (
        ((torch.zeros(4), "int8", "row"), r"\[out, in\]"),
        ((torch.zeros(2, 2, dtype=torch.int32), "int8", "row"), "float weight"),
        ((torch.tensor([[1.0, float("inf")]]), "fp8", "row"), "non-finite"),
        ((w, "int4", "row"), "format must be one of"),
        ((w, "fp8", "column"), "granularity"),
    ):
        with pytest.raises(ValueError, match=match):
            accelerated.quantize(*bad)


def test_quant_linear_is_the_linear_of_the_dequantized_weight():
    """In fp32 the only differences are rounding: within gamma_(K+2) |x| |W_q|, W_q = q scale."""
    from snippets.triton_kernels.numerics import gamma

    gen = torch.Generator().manual_seed(72)
    lin = torch.nn.Linear(96, 40, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(40, 96, generator=gen) * 0.05)
    x = torch.randn(3, 7, 96, generator=gen)
    for fmt in ("fp8", "int8"):
        for per in ("tensor", "row"):
            ql = accelerated.QuantLinear(lin, fmt, per)
            wq = ql.q.double() * ql.scale.double().t()
            exact = x.double() @ wq.t()
            bound = gamma(96 + 2) * (x.double().abs() @ wq.abs().t())
            assert torch.all((ql(x).double() - exact).abs() <= bound)
    with pytest.raises(ValueError, match="bias-free"):
        accelerated.QuantLinear(torch.nn.Linear(4, 4), "int8", "row")


def test_quantized_copy_swaps_exactly_the_decoder_linears():
    from dataclasses import replace

    from snippets.common.models.qwen3 import TINY, Qwen3ForCausalLM

    model = Qwen3ForCausalLM(replace(TINY, tie_word_embeddings=True)).to(torch.bfloat16)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copy_ = accelerated.quantized_copy(model, "int8", "row")
    swapped = [m for m in copy_.modules() if isinstance(m, accelerated.QuantLinear)]
    assert len(swapped) == 7 * TINY.num_hidden_layers
    assert copy_.lm_head.weight is copy_.model.embed_tokens.weight  # still tied, untouched
    assert torch.equal(copy_.lm_head.weight, model.lm_head.weight)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # original
    assert not any(isinstance(m, accelerated.QuantLinear) for m in model.modules())
    ids = torch.randint(0, TINY.vocab_size, (1, 6), generator=torch.Generator().manual_seed(3))
    assert copy_(ids).shape == (1, 6, TINY.vocab_size)


def test_heldout_slices_are_the_first_rows_in_order():
    stream = torch.arange(1000, dtype=torch.int32)
    got = accelerated.heldout_slices(stream, 10, accelerated.Plan(slices=3, rows_per_slice=4))
    assert got.shape == (3, 4, 10) and torch.equal(got.flatten(), stream[:120])
    with pytest.raises(ValueError, match="need 200 held-out rows of 10 tokens; the stream has 100"):
        accelerated.heldout_slices(stream, 10, accelerated.Plan(slices=20, rows_per_slice=10))


def test_slice_stats_against_independent_computations():
    gen = torch.Generator().manual_seed(73)
    ref = 3 * torch.randn(2, 9, 50, generator=gen)
    targets = torch.randint(0, 50, (2, 9), generator=gen)
    same = accelerated.slice_stats(ref, ref.clone(), targets)
    assert same["kl_mean"] == same["kl_p99"] == 0 and same["top1"] == 1
    assert same["ce_delta"] == 0 and same["flip_margins"].numel() == 0
    fast = (ref + 0.3 * torch.randn(2, 9, 50, generator=gen)).bfloat16()
    got = accelerated.slice_stats(ref, fast, targets)
    p, q = ref.double().softmax(-1), fast.double().softmax(-1)
    kl = (p * (p.log() - q.log())).sum(-1).flatten().tolist()
    assert got["kl_mean"] == pytest.approx(sum(kl) / len(kl), rel=1e-12)
    assert got["kl_p99"] == pytest.approx(
        statistics.quantiles(kl, n=100, method="inclusive")[98], rel=1e-12
    )
    ce = [F.cross_entropy(x.double().flatten(0, 1), targets.flatten()).item() for x in (fast, ref)]
    assert got["ce_delta"] == pytest.approx(ce[0] - ce[1], abs=1e-12)
    flipped = ref.argmax(-1) != fast.float().argmax(-1)
    assert got["top1"] == 1 - flipped.double().mean().item()
    top = ref.topk(2, -1).values
    assert torch.equal(got["flip_margins"], (top[..., 0] - top[..., 1])[flipped])


def band_case(**candidate):
    """Two slices; `round` and `bf16` as given below, one candidate path `x`."""

    def rows(kl, p99, top1, ce):
        return [{"kl_mean": a, "kl_p99": b, "top1": c, "ce_delta": d}
                for a, b, c, d in zip(kl, p99, top1, ce, strict=True)]  # fmt: skip

    stats = {
        "round": rows([1e-6, 2e-6], [4e-6, 5e-6], [1.0, 0.99], [1e-4, -2e-4]),
        "bf16": rows([3e-6, 5e-6], [9e-6, 8e-6], [0.98, 0.97], [-3e-4, 1e-4]),
        "x": rows(**candidate),
    }
    return {"stats": stats, "ref_ce": [4.0, 5.0], "positions": 100}


def test_band_ratios_by_hand():
    case = band_case(kl=[1e-5, 4e-5], p99=[3.6e-5, 1e-5], top1=[0.95, 0.96], ce=[-5e-4, 2e-4])
    got = accelerated.band_ratios(case)["x"]
    assert got["kl_ratio"] == pytest.approx(4e-5 / (4 * 5e-6))  # 2: four times the envelope
    assert got["p99_ratio"] == pytest.approx(3.6e-5 / (4 * 9e-6))  # 1: exactly on the band
    assert got["flip_ratio"] == pytest.approx(0.05 / (2 * 0.03 + 1 / 100))
    eps = torch.finfo(torch.float32).eps
    assert got["ce_ratio"] == pytest.approx(5e-4 / (2 * 3e-4 + 2 * eps * 5.0))
    assert set(accelerated.band_ratios(case)) == {"x"}  # no verdict on the band's own paths
    flat = band_case(kl=[0, 0], p99=[0, 0], top1=[1, 1], ce=[0, 0])
    for name in ("round", "bf16"):
        for r in flat["stats"][name]:
            r["kl_mean"] = r["kl_p99"] = 0.0
    with pytest.raises(ValueError, match="kl: the rounding-only paths changed nothing"):
        accelerated.band_ratios(flat)


@pytest.fixture(scope="module")
def stand_in():
    """The measurement on the CPU stand-in of the shared target (trained in seconds)."""
    from snippets.common.corpus import token_streams
    from snippets.common.train import trained

    target = trained("target")
    _, heldout = token_streams()
    slices = accelerated.heldout_slices(heldout, target.train.seq_len, accelerated.CPU_PLAN)
    return accelerated.measure(target.model, slices, kernel_dtype=torch.float32)


@pytest.mark.slow  # the Triton interpreter: seconds per forward
@pytest.mark.skipif(ON_GPU, reason="on CUDA, bench_gpu.py measures the real target model")
def test_measure_on_the_cpu_stand_in(stand_in):
    stats = stand_in["stats"]
    plan = accelerated.CPU_PLAN
    assert list(stats) == list(accelerated.PATHS)
    assert all(len(rows_) == plan.slices for rows_ in stats.values())
    assert len(stand_in["margins"]) == plan.slices * stand_in["positions"]
    for name, rows_ in stats.items():
        for r in rows_:
            assert r["kl_mean"] >= 0 and r["kl_p99"] >= 0 and 0 <= r["top1"] <= 1
            assert math.isfinite(r["ce_delta"])
            if name != "triton":
                assert r["kl_mean"] > 0  # every other path changes the output
    # fp32 Triton kernels perturb the logits by ~ n 2^-24 |z| (n = 64, the widest reduction of
    # the stand-in), the bf16 rounding of `round` by ~ 2^-8 |z|: KL is quadratic, so the ratio
    # is ~ (64 2^-16)^2 ~ 1e-6; 1e-4 leaves two orders of magnitude of room
    for t, r in zip(stats["triton"], stats["round"], strict=True):
        assert t["kl_mean"] < 1e-4 * r["kl_mean"]
    ratios = accelerated.band_ratios(stand_in)
    assert all(v <= 1 for v in ratios["triton"].values())


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="on CUDA, bench_gpu.py measures the real target model")
def test_the_gpu_run_fits_the_page(stand_in, tmp_path, monkeypatch):
    """The stand-in's record in the GPU run's place: every table, plot, number and claim on the
    page resolves against it, and every value it holds is read. Whether the claims hold is
    the GPU run's to say; a claim reading the median margin at flipped positions cannot be
    judged where the stand-in flipped nothing (the record holds None there)."""
    import json
    from pathlib import Path

    from snippets.common import results as res
    from tests import gate

    values = accelerated.summarize(stand_in)
    assert [p["path"] for p in values["paths"]] == list(accelerated.PATHS)
    assert [b["path"] for b in values["band"]] == list(accelerated.CANDIDATES)
    assert len(values["per_slice"]) == len(accelerated.PATHS) * accelerated.CPU_PLAN.slices
    for p in values["paths"]:
        assert p["kl_mean_min"] <= p["kl_mean"] <= p["kl_mean_max"]
        assert p["ppl_delta_min"] <= p["ppl_delta"] <= p["ppl_delta_max"]
        assert (p["flip_margin"] is None) == (p["flips"] == 0)
    root = Path(__file__).resolve().parents[2]
    prov = dict.fromkeys(res.PROVENANCE["measured"], "stand-in") | {"dirty": True, "wall_s": 1.0}
    prov["commit"] = res.commit_and_dirty()[0]
    monkeypatch.setattr(res, "provenance", lambda *args, **kwargs: prov)
    bench = root / "snippets" / "quality_metrics" / "bench_gpu.py"
    record = res.build_record("measured", "quality-metrics", "accelerated", values, bench)
    folder = tmp_path / "quality-metrics"
    folder.mkdir()
    for other in (root / "results" / "quality-metrics").glob("*.json"):
        (folder / other.name).write_bytes(other.read_bytes())
    (folder / "accelerated.json").write_text(json.dumps(record, ensure_ascii=False, indent=1))
    slugs = {"quality-metrics"}
    problems = [e for e in gate.page_errors(root, tmp_path, slugs)
                if "does not hold" not in e and "None" not in e]  # fmt: skip
    assert problems == []
    assert gate.unread_errors(root, tmp_path, slugs) == []
