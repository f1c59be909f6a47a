"""Unit tests for snippets/gradient_accumulation/ beyond the page's own demo."""

import pytest
import torch

from snippets.common.device import DEVICE
from snippets.gradient_accumulation.ddp_tokens import launch, micro_batch, reference
from snippets.gradient_accumulation.equivalence import (
    accumulated_grad,
    large_batch_grad,
    summation_bound,
    within,
)
from snippets.gradient_accumulation.token_loss import (
    IGNORE,
    global_token_mean,
    per_microbatch_mean,
)


def linear_problem(n, d, out, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g, dtype=torch.float64).to(DEVICE)
    y = torch.randn(n, out, generator=g, dtype=torch.float64).to(DEVICE)
    torch.manual_seed(seed)
    return x, y, torch.nn.Linear(d, out).to(DEVICE, torch.float64)


@pytest.mark.parametrize("k", [1, 2, 4, 16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_accumulation_within_rounding_bound(k, seed):
    x, y, model64 = linear_problem(64, 48, 3, seed)
    model32 = torch.nn.Linear(48, 3).to(DEVICE)
    model32.load_state_dict(model64.state_dict())
    exact = large_batch_grad(model64, x, y)
    acc = accumulated_grad(model32, x.float(), y.float(), k)
    bound = summation_bound(model64, x, y, 2.0**-24)
    for g, ref, tol in zip(acc, exact, bound, strict=True):
        assert ((g.double() - ref).abs() <= tol).all()


def test_bound_is_not_vacuous():
    """The bound must sit far below the gradient, or the check above proves nothing.

    Worst-case bounds grow with the sum of |terms| (here ~20x the cancelling sum), so require
    1e-3 of the largest gradient entry: a 0.1% scaling mistake on that entry is then caught.
    """
    x, y, model = linear_problem(64, 48, 3, 0)
    for g, tol in zip(
        large_batch_grad(model, x, y), summation_bound(model, x, y, 2.0**-24), strict=True
    ):
        assert tol.max() < 1e-3 * g.abs().max()


@pytest.mark.parametrize("wrong_k", [3, 5])
def test_bound_catches_an_off_by_one_k(wrong_k):
    """Dividing by k - 1 or k + 1 instead of k must fall outside the bound."""
    x, y, model64 = linear_problem(64, 48, 3, 0)
    exact = large_batch_grad(model64, x, y)
    model32 = torch.nn.Linear(48, 3).to(DEVICE)
    model32.load_state_dict(model64.state_dict())
    summed = accumulated_grad(model32, x.float(), y.float(), 4, divide=False)
    wrong = [g / wrong_k for g in summed]
    bound = summation_bound(model64, x, y, 2.0**-24)
    assert any(
        ((g.double() - r).abs() > t).any() for g, r, t in zip(wrong, exact, bound, strict=True)
    )


def test_token_mean_equals_big_batch_for_any_split():
    torch.manual_seed(0)
    vocab, seq = 30, 10
    model = torch.nn.Sequential(torch.nn.Embedding(vocab, 8), torch.nn.Linear(8, vocab))
    model = model.to(DEVICE, torch.float64)
    tokens = torch.randint(vocab, (6, seq)).to(DEVICE)
    labels = torch.randint(vocab, (6, seq)).to(DEVICE)
    for row, valid in enumerate([10, 1, 7, 3, 10, 2]):
        labels[row, valid:] = IGNORE
    reference = per_microbatch_mean(model, [(tokens, labels)])
    for sizes in ([3, 3], [1, 5], [2, 2, 2], [1, 1, 1, 1, 1, 1]):
        batches = list(zip(tokens.split(sizes), labels.split(sizes), strict=True))
        got = global_token_mean(model, batches)
        assert all(
            torch.allclose(a, b, rtol=1e-12, atol=0) for a, b in zip(got, reference, strict=True)
        )


def test_microbatch_mean_equals_big_batch_when_counts_are_equal():
    """With equal valid-token counts per micro-batch the naive loop is exact too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(20, 8), torch.nn.Linear(8, 20))
    model = model.to(DEVICE, torch.float64)
    tokens = torch.randint(20, (4, 6)).to(DEVICE)
    labels = torch.randint(20, (4, 6)).to(DEVICE)
    labels[:, 4:] = IGNORE
    batches = list(zip(tokens.split(2), labels.split(2), strict=True))
    naive = per_microbatch_mean(model, batches)
    reference = per_microbatch_mean(model, [(tokens, labels)])
    assert all(
        torch.allclose(a, b, rtol=1e-12, atol=0) for a, b in zip(naive, reference, strict=True)
    )


@pytest.mark.slow  # two processes that import torch: nox -s tests and CI run it, check does not
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="gloo on the CPU: the CPU suite covers it (nox -s tests)"
)
def test_ddp_token_mean_is_the_full_batch_mean_only_with_global_count_times_world():
    """Two gloo ranks, k = 3, 19 against 5 real tokens, one micro-batch without any.

    Every fp32 result must lie inside section 1.1's rounding bound around the fp64 full-batch
    token mean: DDP only reorders the one sum over tokens (micro-batch, .grad, all-reduce) and
    scales by W and 1/W, both exact for W = 2, so the bound's d + N + 6 roundings still cover it.
    """
    gen = torch.Generator().manual_seed(1)
    windows = [
        [micro_batch(gen, [8, 3]), micro_batch(gen, [5]), micro_batch(gen, [1, 1, 1])],
        [micro_batch(gen, [0, 0]), micro_batch(gen, [2]), micro_batch(gen, [3, 0, 0])],
    ]
    torch.manual_seed(1)
    model = torch.nn.Linear(16, 1)
    ranks = launch(windows, model)
    single, exact, bound = reference(windows, model)
    for tol, g in zip(bound, exact, strict=True):
        assert tol.max() < 1e-3 * g.abs().max()  # the bound is tight enough to mean something
    assert within(single, exact, bound)
    for grads in ranks:
        assert within(grads["global_times_w"], exact, bound)
        assert not within(grads["per_rank_mean"], exact, bound)
        for half, whole in zip(grads["global_only"], grads["global_times_w"], strict=True):
            assert torch.equal(2 * half, whole)  # DDP's average: exactly 1/W of the right grad
    for a, b in zip(ranks[0]["global_times_w"], ranks[1]["global_times_w"], strict=True):
        assert torch.equal(a, b)
