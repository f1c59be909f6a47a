"""Unit tests for snippets/speculative_decoding/: the formulas against the paper and against
brute force, the sampling rule and its edge cases, the lossless property (exactly, and by a
statistical test with a derived bound that two wrong samplers fail), the decoder against the
model's own forward, speculative greedy decoding against target-only greedy decoding for every
drafter (fp64, where the two must agree token for token), tree verification against
sequential verification, EAGLE-3's training-time test against the head's inference path, and
the GPU benchmark's code path on the CPU with tiny models and a stand-in timer."""

import math
from dataclasses import replace

import pytest
import torch

from snippets.common.device import ON_GPU
from snippets.common.models import qwen3 as q3
from snippets.common.models.fp64 import FP64
from snippets.common.results import Stat
from snippets.speculative_decoding import engine as E
from snippets.speculative_decoding import lossless as L
from snippets.speculative_decoding import theory as th
from snippets.speculative_decoding import tree as tr
from snippets.speculative_decoding.bench import Sizes, measure
from snippets.speculative_decoding.calculators import speculative_calculator
from snippets.speculative_decoding.eagle import (
    TAPS,
    EagleHead,
    HeadConfig,
    HeadRunner,
    HeadTraining,
    target_features,
    train_heads,
    ttt_loss,
    ttt_mask,
)
from snippets.speculative_decoding.measure import acceptance, prompts, run, speedup_row
from snippets.speculative_decoding.runner import Runner, Tree
from snippets.speculative_decoding.sampling import emitted, residual, sample, verify

cpu_only = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")
gpu = pytest.mark.gpu
V = 40  # the tiny models' vocabulary


def tiny(cfg, seed: int, std: float = 0.5, dtype=torch.float64):
    """A random model with an fp64-exact norm (FP64): large weights, so that its
    distributions are far from uniform and depend on the context."""
    torch.manual_seed(seed)
    model = q3.Qwen3ForCausalLM(cfg, FP64).to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, std) if p.ndim > 1 else p.normal_(1.0, 0.2)
    return model


TARGET = replace(q3.TINY, vocab_size=V, tie_word_embeddings=True)
DRAFT = replace(TARGET, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=1)  # fmt: skip


@pytest.fixture(scope="module")
def models():
    target = tiny(TARGET, 1)
    runner = Runner(target, torch.float64, 96, TAPS)
    head = EagleHead(HeadConfig.for_target(TARGET), runner.embed).double().init_from(runner, 0)
    return {"target": target, "runner": runner, "draft": Runner(tiny(DRAFT, 2), torch.float64, 96),
            "self": Runner(tiny(TARGET, 1), torch.float64, 96), "head": head,
            "head_runner": HeadRunner(head, runner)}  # fmt: skip


# ----------------------------------------------------------------------------- theory


@cpu_only
def test_expected_tokens_edges_and_errors():
    assert th.expected_tokens(0.0, 5) == 1.0  # nothing accepted: the target's own token
    assert th.expected_tokens(1.0, 5) == 6.0
    assert th.expected_tokens(0.7, 0) == 1.0
    # eq. 1 is the mean of a geometric count capped at gamma, plus one
    alpha, gamma = 0.6, 4
    mean = sum(min(k, gamma) * (1 - alpha) * alpha**k for k in range(200)) + 1
    assert th.expected_tokens(alpha, gamma) == pytest.approx(mean, rel=1e-12)
    for bad in ((1.1, 2), (-0.1, 2), (0.5, -1), (0.5, 1.5)):
        with pytest.raises(ValueError):
            th.expected_tokens(*bad)
    with pytest.raises(ValueError, match="cost ratio"):
        th.walltime_speedup(0.5, 2, -0.1)


@cpu_only
def test_optimal_gamma_is_the_brute_force_maximum_and_corollary_39_holds():
    for alpha in (0.3, 0.55, 0.8, 0.95):
        for c in (0.01, 0.1, 0.4):
            _, speedup = th.optimal_gamma(alpha, c)
            assert speedup == max(th.walltime_speedup(alpha, g, c) for g in range(1, 65))
            if alpha > c:  # Corollary 3.9: at least (1 + alpha) / (1 + c) > 1
                assert speedup >= (1 + alpha) / (1 + c) - 1e-12 > 1 - 1e-12
            else:
                assert speedup < 1 + 1e-12


@cpu_only
def test_leviathan_reproductions():
    assert all(r["reproduced"] for r in th.table1)
    assert all(r["reproduced"] for r in th.table4)
    assert th.bigram == pytest.approx(1.248)
    # §3.6: with c = 0 the speedup approaches, and never passes, 1 / (1 - alpha)
    assert th.walltime_speedup(0.8, 60, 0.0) == pytest.approx(5.0, rel=1e-5)
    assert all(th.walltime_speedup(0.8, g, 0.0) < 5.0 for g in range(1, 60))


@cpu_only
def test_acceptance_is_one_minus_total_variation():
    gen = torch.Generator().manual_seed(0)
    p = torch.rand(100, 7, generator=gen, dtype=torch.float64).softmax(-1)
    q = torch.rand(100, 7, generator=gen, dtype=torch.float64).softmax(-1)
    beta = th.acceptance(p, q)
    assert torch.allclose(beta, 1 - 0.5 * (p - q).abs().sum(-1), rtol=0, atol=1e-15)
    assert torch.equal(th.acceptance(p, p), p.sum(-1))
    with pytest.raises(ValueError, match="differ in shape"):
        th.acceptance(p, q[:, :5])


@cpu_only
def test_tree_formula_generalizes_the_chain_and_rejects_bad_trees():
    for alpha, gamma in ((0.7, 4), (0.3, 1)):
        chain = th.tree_expected_tokens([-1, *range(gamma - 1)], [alpha] * gamma)
        assert chain == pytest.approx(th.expected_tokens(alpha, gamma), rel=1e-14)
    # two exclusive children at depth 1 (0.5 and 0.3), each with a child accepted w.p. 0.6
    assert th.tree_expected_tokens([-1, -1, 0, 1], [0.5, 0.3, 0.6, 0.6]) == pytest.approx(
        1 + 0.5 + 0.3 + 0.5 * 0.6 + 0.3 * 0.6
    )
    with pytest.raises(ValueError, match="total probability"):
        th.tree_expected_tokens([-1, -1], [0.7, 0.6])
    with pytest.raises(ValueError, match="earlier node"):
        th.tree_expected_tokens([-1, 2, 0], [0.1, 0.1, 0.1])


@cpu_only
def test_calculator_matches_the_theory():
    out = speculative_calculator(0.75, 7, 0.02, 0.02)
    assert out["speedup"] == th.walltime_speedup(0.75, 7, 0.02)
    assert (out["best_gamma"], out["best_speedup"]) == th.optimal_gamma(0.75, 0.02)
    assert speculative_calculator(1.0, 3, 0.1, 0.1)["free_draft"] is None
    with pytest.raises(ValueError, match="whole number"):
        speculative_calculator(0.5, 2.5, 0.1, 0.1)


# ----------------------------------------------------------------------------- sampling


@cpu_only
def test_sample_draws_in_proportion_and_never_a_zero_weight():
    gen = torch.Generator().manual_seed(0)
    w = torch.tensor([[0.0, 1.0, 3.0, 0.0]], dtype=torch.float64).expand(40000, 4)
    counts = torch.bincount(sample(w, gen), minlength=4).double() / 40000
    assert counts[0] == counts[3] == 0
    # a binomial share: 5 standard deviations of sqrt(0.25 * 0.75 / 40000) = 0.0022
    assert abs(counts[2].item() - 0.75) < 5 * math.sqrt(0.75 * 0.25 / 40000)


@cpu_only
def test_residual_edge_cases():
    p = torch.tensor([[0.5, 0.5, 0.0]])
    assert torch.equal(residual(p, p), p)  # nothing to correct: stays a distribution
    assert torch.equal(residual(p, torch.tensor([[0.0, 0.0, 1.0]])), p)  # disjoint: p itself
    assert torch.allclose(
        residual(p, torch.tensor([[0.7, 0.3, 0.0]])), torch.tensor([[0.0, 1.0, 0.0]])
    )


def _random_case(b, gamma, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(b, gamma, vocab, generator=gen, dtype=torch.float64).softmax(-1)
    p = torch.rand(b, gamma + 1, vocab, generator=gen, dtype=torch.float64).softmax(-1)
    draft = sample(q, gen)
    return draft, q, p, gen


@cpu_only
def test_gamma_zero_is_plain_sampling():
    p = torch.tensor([[[0.2, 0.8]]], dtype=torch.float64).expand(20000, 1, 2)
    v = verify(torch.zeros(20000, 0, dtype=torch.long), None, p,
               generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert v.accepted.eq(0).all()
    assert abs(v.token.double().mean().item() - 0.8) < 5 * math.sqrt(0.16 / 20000)
    greedy = verify(torch.zeros(1, 0, dtype=torch.long), None, p[:1], greedy=True)
    assert (greedy.accepted.item(), greedy.token.item()) == (0, 1)


@cpu_only
def test_every_draft_rejected_when_supports_are_disjoint():
    """q puts all its mass on token 0, p none: every first draft is rejected, and the token
    comes from the residual, which is p itself."""
    n = 20000
    q = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64).expand(n, 3, 3)
    p = torch.tensor([0.0, 0.25, 0.75], dtype=torch.float64).expand(n, 4, 3)
    v = verify(
        torch.zeros(n, 3, dtype=torch.long), q, p, generator=torch.Generator().manual_seed(2)
    )
    assert v.accepted.eq(0).all() and v.token.ne(0).all()
    assert abs((v.token == 2).double().mean().item() - 0.75) < 5 * math.sqrt(0.1875 / n)


@cpu_only
def test_greedy_is_the_rule_with_one_hot_distributions():
    draft, q, p, _ = _random_case(64, 3, 5, 3)
    draft[::2] = p[::2, :3].argmax(-1)  # half the rows: the drafts the target would pick
    fast = verify(draft, q, p, greedy=True)
    one_hot = torch.nn.functional.one_hot
    slow = verify(draft, one_hot(draft, 5).double(), one_hot(p.argmax(-1), 5).double(),
                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert torch.equal(fast.accepted, slow.accepted) and torch.equal(fast.token, slow.token)
    assert fast.accepted[::2].eq(3).all()  # all accepted, then the bonus token
    assert torch.equal(fast.token[::2], p[::2, 3].argmax(-1))


@cpu_only
def test_rows_with_different_accepted_lengths():
    """Row i is built to accept exactly i drafts (p >= q at the drafts before, p = 0 at the
    i-th) and to correct to token 3 (the residual is one-hot), or, when all 4 are accepted, to
    add the bonus token 5: one batch returns each row's own count and token."""
    gamma, vocab = 4, 6
    draft = torch.ones(gamma + 1, gamma, dtype=torch.long)
    q = torch.zeros(gamma + 1, gamma, vocab, dtype=torch.float64)
    q[..., 1] = q[..., 2] = 0.5
    p = torch.zeros(gamma + 1, gamma + 1, vocab, dtype=torch.float64)
    for i in range(gamma + 1):
        p[i, :i, 1] = 1.0  # accepted: p(1) = 1 >= q(1)
        p[i, i:, 3] = 1.0  # rejected: p(1) = 0; the residual is all on token 3
    p[gamma, gamma] = torch.nn.functional.one_hot(torch.tensor(5), vocab)
    v = verify(draft, q, p, generator=torch.Generator().manual_seed(0))
    assert v.accepted.tolist() == [0, 1, 2, 3, 4] and v.token.tolist() == [3, 3, 3, 3, 5]
    out = emitted(draft, v)
    for i in range(gamma + 1):
        assert out[i, : i + 1].tolist() == [1] * i + [v.token[i].item()]


@cpu_only
def test_deterministic_drafts_are_a_one_hot_q():
    draft, _, p, _ = _random_case(256, 2, 4, 5)
    q = torch.nn.functional.one_hot(draft, 4).double()
    a = verify(draft, None, p, generator=torch.Generator().manual_seed(7))
    b = verify(draft, q, p, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a.accepted, b.accepted) and torch.equal(a.token, b.token)


@cpu_only
def test_verify_rejects_a_wrong_shape():
    draft, q, p, _ = _random_case(2, 3, 4, 6)
    with pytest.raises(ValueError, match=r"p must be \[2, 4, V\]"):
        verify(draft, q, p[:, :3])


# ----------------------------------------------------------------------------- lossless


@cpu_only
@pytest.mark.parametrize(("gamma", "k", "sharpness"), [(1, 3, 1.0), (2, 3, 3.0), (3, 4, 1.0)])
def test_exact_distribution_equals_the_targets(gamma, k, sharpness):
    """fp64 enumeration: every sequence's probability under speculative decoding equals the
    target's. Each is a sum of at most 3^(gamma + 1) (gamma + 1) products of at most
    2 gamma + 2 factors: rounding stays below 1e-13 (a few hundred roundings of 2^-53)."""
    p, q = L.Toy(k + gamma + 1, 10 + gamma, sharpness), L.Toy(k + gamma + 1, 20 + gamma, sharpness)
    seqs = L.outcomes(k)
    exact = {s: L.target_probability(p, s) for s in seqs}
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-13)
    for s in seqs:
        assert abs(L.speculative_probability(p, q, gamma, s) - exact[s]) < 1e-13, s


@cpu_only
def test_outcomes_are_every_way_a_generation_can_start():
    seqs = L.outcomes(2)
    assert seqs == [(0,), (1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]
    assert len(L.outcomes(3)) == 1 + 2 + 4 * 3


@cpu_only
@pytest.mark.slow  # three samplers x 20000 rows on the CPU: about two seconds
def test_statistical_test_passes_the_rule_and_fails_two_wrong_ones():
    k, gamma, n = 3, 3, 20000
    p, q = L.Toy(k + gamma + 1, 31), L.Toy(k + gamma + 1, 32)
    exact = {s: L.target_probability(p, s) for s in L.outcomes(k)}
    bound = L.l1_bound(len(exact), n, 1e-6)
    seqs, accepted = L.generate(p, q, gamma, k, n, seed=5)
    assert L.l1_distance(seqs, exact) < bound
    assert accepted.unique().numel() == gamma + 1  # every branch was taken
    for wrong in (L.resample_from_target, L.ratio_upside_down):
        assert L.l1_distance(L.generate(p, q, gamma, k, n, seed=5, rule=wrong)[0], exact) > bound


@cpu_only
def test_l1_distance_refuses_an_impossible_sequence():
    with pytest.raises(AssertionError, match="no target can produce"):
        L.l1_distance(torch.tensor([[0, 1, -1]]), {(0,): 1.0})


# ----------------------------------------------------------------------------- decoder


@cpu_only
def test_runner_is_the_models_forward(models):
    target, runner = models["target"], models["runner"]
    ids = torch.randint(0, V, (3, 12), generator=torch.Generator().manual_seed(0))
    ref = target(ids)
    cache = runner.cache(3)
    zero = torch.zeros(3, dtype=torch.long)
    hidden, taps = runner.forward(cache, ids, zero, Tree.chain(12))
    assert (runner.logits(hidden) - ref).abs().max() < 1e-10  # fp64 throughout: round-off only
    assert len(taps) == 3 and taps[-1].shape == (3, 12, TARGET.hidden_size)
    cache = runner.cache(3, 24)  # prefill 8, then one token at a time at each row's position
    hidden, _ = runner.forward(cache, ids[:, :8], zero, Tree.chain(8))
    steps = [runner.logits(hidden)]
    for t in range(8, 12):
        hidden, _ = runner.forward(cache, ids[:, t : t + 1], torch.full((3,), t), Tree.chain(1))
        steps.append(runner.logits(hidden))
    assert (torch.cat(steps, 1) - ref).abs().max() < 1e-10


@cpu_only
def test_runner_and_tree_reject_bad_input(models):
    with pytest.raises(ValueError, match="in the order"):
        Runner(models["target"], torch.float64, 16, ((1, "mlp"), (0, "attn")))
    with pytest.raises(ValueError, match="points"):
        Runner(models["target"], torch.float64, 16, ((2, "mlp"),))
    with pytest.raises(ValueError, match="parent -1"):
        Tree.of([0, 0])
    with pytest.raises(ValueError, match="this Runner has 96"):
        models["runner"].cache(1, 200)
    with pytest.raises(ValueError, match="3 tokens for a tree of 2"):
        models["runner"].forward(models["runner"].cache(1), torch.zeros(1, 3, dtype=torch.long),
                                 torch.zeros(1, dtype=torch.long), Tree.chain(2))  # fmt: skip


def _prompts(b=5, n=12, seed=0):
    p = torch.randint(0, V, (b, n), generator=torch.Generator().manual_seed(seed))
    p[:, n // 2 :] = p[:, : n - n // 2]  # repeated text: the n-gram drafter finds matches
    return p


def _generate(runner, kind, gamma, rounds, greedy=True, eos=None, prompt=None):
    e = E.Engine(runner, kind, 5, gamma, greedy=greedy, eos=eos, max_len=96)
    e.prefill(_prompts() if prompt is None else prompt)
    for _ in range(rounds):
        e.round()
    return e


def _drafters(models):
    return {"draft": E.draft_model(models["draft"]), "eagle3": E.eagle(models["head_runner"]),
            "ngram": E.ngram(), "self": E.draft_model(models["self"])}  # fmt: skip


@cpu_only
def test_greedy_speculative_decoding_is_target_greedy(models):
    """fp64: whatever the drafter, the text is the target's own greedy text; the target
    drafting for itself has every draft accepted (and then the bonus token)."""
    plain = _generate(models["runner"], None, 0, 24)
    cases = [(name, kind, 2) for name, kind in _drafters(models).items()]
    cases += [("self", _drafters(models)["self"], g) for g in (1, 5)]
    for name, kind, gamma in cases:
        e = _generate(models["runner"], kind, gamma, 6 if name != "self" else 24 // (gamma + 1))
        n = min(int(e.generated().min()), 24)
        assert n >= 6
        assert torch.equal(e.seq[:, 12 : 12 + n], plain.seq[:, 12 : 12 + n]), (name, gamma)
        if name == "self":
            assert e.hist.tolist() == [0] * gamma + [5 * (24 // (gamma + 1))]


@cpu_only
def test_eos_inside_the_drafts_stops_the_row(models):
    """With an end token, each row stops right after the target's first EOS, even when the
    EOS was an accepted draft followed by more accepted drafts."""
    plain = _generate(models["runner"], None, 0, 40)
    first = plain.seq[0, 12 + 5].item()  # row 0's sixth greedy token becomes "EOS"
    e = _generate(models["runner"], E.draft_model(models["self"]), 3, 8, eos=first)
    for row in range(5):
        text = plain.seq[row, 12:52].tolist()
        stop = text.index(first) + 1 if first in text else None
        got = e.seq[row, 12 : e.length[row]].tolist()
        if stop is None:
            assert got == text[: len(got)] and not e.done[row]
        else:
            assert got == text[:stop] and e.done[row]
    assert e.done[0]


@cpu_only
def test_engine_rejects_bad_settings(models):
    with pytest.raises(ValueError, match="drafts gamma >= 1"):
        E.Engine(models["runner"], None, 1, 2, greedy=True)
    with pytest.raises(ValueError, match=r"need \[5, >= 5\]"):
        E.Engine(models["runner"], E.ngram(), 5, 3, greedy=True).prefill(_prompts(n=4))
    with pytest.raises(ValueError, match="min_n <= max_n"):
        E.Engine(models["runner"], E.ngram(3, 1), 5, 3, greedy=True)
    e = E.Engine(models["runner"], E.ngram(), 5, 3, greedy=True, max_len=40)
    e.prefill(_prompts())
    with pytest.raises(ValueError, match="overflow 40 slots"):
        run(e, 10)


@cpu_only
def test_ngram_proposes_the_continuation_of_the_longest_earliest_match(models):
    e = E.Engine(models["runner"], E.ngram(1, 3), 1, 3, greedy=True, max_len=32)
    e.prefill(torch.tensor([[7, 1, 2, 3, 9, 1, 2, 3, 5, 1, 2]]))
    draft, q = e.drafter.propose()  # suffix "1 2": its earliest occurrence is followed by 3 9 1
    assert draft.tolist() == [[3, 9, 1]] and q is None
    e.prefill(torch.tensor([[7, 8, 4, 6, 5, 1, 2, 3, 5, 1, 3]]))
    assert e.drafter.propose()[0].tolist() == [[5, 1, 3]]  # only "3" recurs: continue after it
    e.prefill(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]))
    assert e.drafter.propose()[0].tolist() == [[11, 11, 11]]  # no match: the last token


@cpu_only
@pytest.mark.slow  # four drafters x 4000 rows of a tiny model: a few seconds
def test_sampled_engine_keeps_the_targets_distribution(models):
    """The engine end to end at temperature 1: the first two generated tokens of 4000 rows
    from one prompt, against the target's exact probabilities of all 16 pairs (a 4-token
    model), within the Bretagnolle-Huber-Carol bound at 1e-6 (0.12: a wrong position or a
    wrong q in the engine moves whole distributions, far more than that)."""
    cfg = q3.Qwen3Config(vocab_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                         tie_word_embeddings=True)  # fmt: skip
    target = tiny(cfg, 3, std=0.7)
    runner = Runner(target, torch.float64, 16, TAPS)
    head = EagleHead(HeadConfig.for_target(cfg), runner.embed).double().init_from(runner, 1)
    small = Runner(tiny(replace(cfg, num_hidden_layers=1), 4), torch.float64, 16)
    kinds = {"target": None, "draft": E.draft_model(small),
             "eagle3": E.eagle(HeadRunner(head, runner)), "ngram": E.ngram()}  # fmt: skip
    prompt = torch.tensor([[1, 2, 3, 1, 2, 0]])
    pairs = torch.cartesian_prod(torch.arange(4), torch.arange(4))
    with torch.no_grad():
        logp = target(torch.cat([prompt.expand(16, -1), pairs], 1)).log_softmax(-1)
    exact = logp[:, 5:7].gather(-1, pairs[..., None])[..., 0].sum(1).exp()
    n = 4000
    bound = L.l1_bound(16, n, 1e-6)
    for name, kind in kinds.items():
        torch.manual_seed(0)
        e = E.Engine(runner, kind, n, 0 if kind is None else 2, greedy=False)
        e.prefill(prompt.expand(n, -1).contiguous())
        for _ in range(2):
            e.round()
        got = torch.bincount(e.seq[:, 6] * 4 + e.seq[:, 7], minlength=16).double() / n
        assert (got - exact).abs().sum().item() < bound, name


# ----------------------------------------------------------------------------- tree


@cpu_only
def test_tree_pass_equals_sequential_verification(models):
    target, runner = models["target"], models["runner"]
    parents = tr.topk_tree([3, 2, 1])
    assert parents == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9]
    tree = Tree.of(parents)
    b, n0 = 3, 8
    prompt = torch.randint(0, V, (b, n0), generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(0, V, (b, tree.n), generator=torch.Generator().manual_seed(2))
    tokens[:, 0] = prompt[:, -1]
    # row 0: the path 0 -> 2 -> 7 -> 13 carries the target's greedy continuation
    text = prompt[0].tolist()
    for node in (2, 7, 13):
        with torch.no_grad():
            nxt = target(torch.tensor([text])).argmax(-1)[0, -1].item()
        tokens[0, node] = nxt
        for sibling in (i for i, p in enumerate(parents) if p == parents[node] and i != node):
            tokens[0, sibling] = (nxt + 1 + sibling) % V  # siblings carry other tokens
        text.append(nxt)
    cache = runner.cache(b, 40)
    zero = torch.zeros(b, dtype=torch.long)
    runner.forward(cache, prompt[:, :-1], zero, Tree.chain(n0 - 1))
    pos0 = torch.full((b,), n0 - 1)
    logits = tr.tree_logits(runner, cache, tokens, pos0, tree)
    for i in range(tree.n):  # each node's logits are those of its root-to-node path
        path, j = [], i
        while j > 0:
            path.append(j)
            j = parents[j]
        seq = torch.cat([prompt, tokens[:, path[::-1]]], 1)
        assert (target(seq)[:, -1] - logits[:, i]).abs().max() < 1e-10, i
    on_path, accepted, token, last = tr.accept_greedy(tokens, logits, tree)
    assert accepted[0] == 3 and last[0] == 13 and on_path[0, [0, 2, 7, 13]].all()
    with torch.no_grad():
        assert token[0] == target(torch.tensor([text])).argmax(-1)[0, -1]
    # after compaction the cache holds the accepted text: the next token's logits match
    tr.compact(cache, pos0, on_path, tree)
    a = int(accepted[0])
    nxt, _ = runner.forward(cache, token[:, None], pos0 + accepted + 1, Tree.chain(1))
    full = torch.tensor([[*text, token[0].item()]])
    assert (runner.logits(nxt)[0, -1] - target(full)[0, -1]).abs().max() < 1e-10
    assert a == 3


@cpu_only
def test_topk_tree_rejects_an_empty_level():
    with pytest.raises(ValueError, match="at least one child"):
        tr.topk_tree([2, 0])


# ----------------------------------------------------------------------------- EAGLE-3


@cpu_only
def test_ttt_mask_is_causal_then_diagonal():
    m = ttt_mask(3, 2)
    assert m.shape == (3, 9)
    assert torch.equal(m[:, :3], torch.ones(3, 3, dtype=torch.bool).tril())
    assert torch.equal(m[:, 3:6], torch.eye(3, dtype=torch.bool))
    assert torch.equal(m[:, 6:], torch.eye(3, dtype=torch.bool))


def _ttt_logits(head, feats, ids, target_logits, steps):
    """The head's logits at every training-time-test step (the loss's inputs)."""
    out = []
    real = head.lm_head.forward

    def keep(x):
        y = real(x)
        out.append(y)
        return y

    head.lm_head.forward = keep
    try:
        ttt_loss(head, feats, ids, target_logits, steps)
    finally:
        head.lm_head.forward = real
    return out


@cpu_only
def test_training_time_test_is_what_inference_computes(models):
    """Step s of training-time test at position t gives the logits the head gives at
    inference after reading the true features up to t and drafting s tokens of its own."""
    runner = models["runner"]
    head = EagleHead(HeadConfig.for_target(TARGET), runner.embed).double().init_from(runner, 5)
    with torch.no_grad():  # away from fc = [0 0 I]: every input matters
        gen = torch.Generator().manual_seed(5)
        for p in head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    hr = HeadRunner(head, runner)
    ids = torch.randint(0, V, (2, 14), generator=torch.Generator().manual_seed(3))
    feats, logits = target_features(runner, ids)
    steps = 4
    per_step = _ttt_logits(head, feats, ids, logits, steps)
    t = 6  # a position: the head reads pairs 0..t, then drafts
    cache = hr.cache(2, 40)
    zero = torch.zeros(2, dtype=torch.long)
    o, lg = hr.forward(
        cache, ids[:, 1 : t + 2], hr.fuse(feats[:, : t + 1]), zero, Tree.chain(t + 1)
    )
    o, lg = o[:, -1:], lg[:, -1]
    assert (lg - per_step[0][:, t]).abs().max() < 1e-9
    for s in range(1, steps):  # feed the true next token (training reads the text, not a draft)
        tok = ids[:, t + 1 + s : t + 2 + s]
        o, lg = hr.forward(cache, tok, o, torch.full((2,), t + s), Tree.chain(1))
        lg = lg[:, -1]
        assert (lg - per_step[s][:, t]).abs().max() < 1e-9, s


@cpu_only
@pytest.mark.slow  # two heads, eight AdamW steps each (and AdamW's first import): seconds
def test_heads_train_and_ttt_needs_room(monkeypatch):
    import snippets.speculative_decoding.eagle as eagle_mod

    stream = torch.randint(0, V, (2000,), generator=torch.Generator().manual_seed(0))
    runner = Runner(tiny(TARGET, 1, dtype=torch.float32), torch.float32, 64, TAPS)
    tc = HeadTraining(steps=8, batch_size=2, seq_len=16, lr=3e-3, warmup_steps=2, ttt_steps=(3, 1))
    seen = []
    steps = eagle_mod._train_steps

    def spy(*args):  # the steps run in the shared trainer's strict deterministic mode
        seen.append(torch.are_deterministic_algorithms_enabled()
                    and not torch.is_deterministic_algorithms_warn_only_enabled())  # fmt: skip
        return steps(*args)

    monkeypatch.setattr(eagle_mod, "_train_steps", spy)
    runs = train_heads(runner, stream, tc)
    assert seen == [True] and not torch.are_deterministic_algorithms_enabled()
    assert [r["ttt_steps"] for r in runs] == [3, 1]
    for r in runs:
        assert len(r["loss"]) == 8 and r["loss"][-1] < r["loss"][0]
    feats = torch.zeros(1, 3, 3 * TARGET.hidden_size)
    with pytest.raises(ValueError, match="leave nothing for 3 TTT steps"):
        ttt_loss(
            runs[0]["head"], feats, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, V), 3
        )


# ----------------------------------------------------------------------------- measurement


def stand_in(fn) -> Stat:
    """A timer as graph_ms returns it, without a clock: the call runs once, and the time is
    the same fixed seven repeats every time (deterministic records)."""
    fn()
    return Stat.of([1.0, 1.01, 0.99, 1.0, 1.0, 1.02, 0.98], "gpu-graph")


@cpu_only
def test_acceptance_statistics_from_a_run(models):
    e = E.Engine(models["runner"], E.draft_model(models["self"]), 5, 3, greedy=True, max_len=96)
    e.prefill(_prompts())
    stats = acceptance(e, 4)
    assert stats["hist"] == [0, 0, 0, 20] and stats["per_position"] == [1.0, 1.0, 1.0]
    assert stats["alpha"] == 1.0 and stats["tokens_per_round"] == 4.0 == stats["predicted_tokens"]
    e = E.Engine(models["runner"], E.draft_model(models["draft"]), 5, 2, greedy=False, max_len=96)
    e.prefill(_prompts())
    stats = acceptance(e, 6)
    assert stats["rounds"] == 30 and 0 <= stats["expected_alpha"] <= 1
    judged = sum(stats["hist"]) + sum(stats["hist"][1:])
    assert stats["bound"] == pytest.approx(math.sqrt(2 * math.log(2e6) / judged))


@cpu_only
def test_speedup_row_arithmetic():
    stats = {"gamma": 4, "alpha": 0.8, "tokens_per_round": 3.0, "predicted_tokens": 3.3616}
    one = lambda x: Stat(x, x * 0.99, x * 1.01, 7, "gpu-graph")  # noqa: E731
    row = speedup_row(stats, one(2.0), one(1.0), one(0.4))
    assert row["speedup"].median == pytest.approx(1.5) and row["c"].median == pytest.approx(0.1)
    assert row["predicted"].median == pytest.approx(th.walltime_speedup(0.8, 4, 0.1))
    assert row["predicted"].lo < row["predicted"].median < row["predicted"].hi
    assert row["predicted_verify"].median == pytest.approx(3.3616 / 2.0)


@cpu_only
def test_prompts_are_spread_over_the_stream():
    s = torch.arange(100)
    assert prompts(s, 3, 10).tolist()[1][:2] == [30, 31]
    with pytest.raises(ValueError, match="no 20 prompts of 90"):
        prompts(s, 20, 90)


@cpu_only
def test_the_gpu_benchmark_runs_on_the_cpu():
    """measure() end to end with tiny fp32 models, random token streams and the stand-in
    timer: every record bench_gpu.py writes, with the fields the page reads."""
    gen = torch.Generator().manual_seed(0)
    train, held = (
        torch.randint(0, V, (4000,), generator=gen),
        torch.randint(0, V, (4000,), generator=gen),
    )
    sizes = Sizes(prompt=10, stats_batch=3, stats_rounds=3, gammas=(1, 3), sampled_gamma=3,
                  batches=(1, 2, 3), sampled_batches=(1, 3), batch_gamma=3, compare=3,
                  agreement_rows=4, agreement_batch=2,
                  training=HeadTraining(steps=2, batch_size=2, seq_len=16, warmup_steps=1),
                  dtype=torch.float32)  # fmt: skip
    timings = []

    def counted(fn):
        timings.append(fn)
        return stand_in(fn)

    records = measure(tiny(TARGET, 1, dtype=torch.float32), tiny(DRAFT, 2, dtype=torch.float32),
                      train, held, sizes, counted, 1e9)  # fmt: skip
    assert set(records) == {"verify", "acceptance", "speedup", "batch", "eagle"}
    assert [r["n"] for r in records["verify"]["rows"]] == [1, 2, 4]  # 1 and gamma + 1
    runs = records["acceptance"]["runs"]
    drafters = {(r["drafter"], r["mode"], r["gamma"]) for r in runs}
    assert ("eagle3", "sampled", 3) in drafters and ("eagle3-ttt1", "greedy", 1) in drafters
    assert all("bound" in r for r in runs if r["mode"] == "sampled")
    assert len(records["speedup"]["rows"]) == 3 * 3 and len(records["speedup"]["match"]) == 3
    # batches x modes x drafters: temperature 1 only at sampled_batches
    batch = records["batch"]["rows"]
    assert [(r["batch"], r["mode"]) for r in batch[::3]] == [
        (1, "greedy"),
        (1, "sampled"),
        (2, "greedy"),
        (3, "greedy"),
        (3, "sampled"),
    ]
    # batch 1 is not timed again: its rows hold the batch-1 timings themselves
    speed = {(r["drafter"], r["mode"]): r for r in records["speedup"]["rows"] if r["gamma"] == 3}
    step, verify = records["verify"]["step_ms"], records["verify"]["rows"]
    for r in batch[:6]:
        assert r["round_ms"] is speed[r["drafter"], r["mode"]]["round_ms"]
        assert r["step_ms"] is step[r["mode"]]
    # every timing, once: the target's two steps, its passes over n = 1..3 tokens, a round and
    # a draft per drafter x (gamma, mode), then batches 2 (greedy) and 3 (both modes): a pass,
    # a step per mode and a round per drafter and mode
    assert len(verify) == 3 and len(timings) == 2 + 3 + 3 * 3 * 2 + (1 + 1 + 3) + (1 + 2 + 6)
    assert [a["step"] for a in records["eagle"]["agreement"]] == [1, 2, 3, 4, 5] * 2


# ----------------------------------------------------------------------------- CUDA


@gpu
def test_graph_replayed_rounds_equal_eager_rounds():
    """On CUDA: the rounds the benchmark replays from a CUDA graph give the text eager rounds
    give (greedy, fp32 tiny models), for every drafter."""
    dev = torch.device("cuda")
    target = tiny(TARGET, 1, dtype=torch.float32).to(dev)
    runner = Runner(target, torch.float32, 96, TAPS)
    head = (
        EagleHead(HeadConfig.for_target(TARGET), runner.embed.float()).to(dev).init_from(runner, 0)
    )
    small = Runner(tiny(DRAFT, 2, dtype=torch.float32).to(dev), torch.float32, 96)
    kinds = {"draft": E.draft_model(small), "eagle3": E.eagle(HeadRunner(head, runner)),
             "ngram": E.ngram()}  # fmt: skip
    for name, kind in kinds.items():
        texts = []
        for graph in (False, True):
            e = E.Engine(runner, kind, 5, 3, greedy=True, max_len=96)
            e.prefill(_prompts().to(dev))
            if graph:
                run(e, 6)
            else:
                for _ in range(6):
                    e.round()
            texts.append((e.length.clone(), e.seq.clone()))
        assert torch.equal(texts[0][0], texts[1][0]), name
        n = int(texts[0][0].min())
        assert torch.equal(texts[0][1][:, :n], texts[1][1][:, :n]), name
