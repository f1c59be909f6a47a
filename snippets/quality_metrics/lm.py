"""Cross-entropy, perplexity and bits per byte, kept as sums and counts.

A corpus's cross-entropy is its total negative log-likelihood over its total number of scored
tokens: batches add their sums and counts, and the division happens once (a mean of per-batch
means weights short batches too much, and a batch with no scored token has no mean at all).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100  # PyTorch's nn.CrossEntropyLoss default; Hugging Face masks labels with it


# --8<-- [start:nll]
@dataclass(frozen=True)
class NLL:
    """Summed negative log-likelihood in nats over `tokens` scored targets. Batches add."""

    nats: float
    tokens: int

    def __add__(self, other: NLL) -> NLL:
        return NLL(self.nats + other.nats, self.tokens + other.tokens)

    def mean(self) -> float:
        """Cross-entropy per token (nats)."""
        if self.tokens == 0:
            raise ValueError("no scored token (every target is ignore_index): a mean over "
                             "zero tokens is undefined; add this NLL to the others', then "
                             "divide once")  # fmt: skip
        return self.nats / self.tokens

    def perplexity(self) -> float:
        return math.exp(self.mean())

    def bits(self) -> float:
        return self.nats / math.log(2)

    def bits_per(self, units: int) -> float:
        """Bits per byte (units = UTF-8 bytes) or per character: the tokenizer cancels out."""
        if units <= 0:
            raise ValueError(f"bits per unit needs a positive number of units, got {units}")
        return self.bits() / units


def check_targets(shape, vocab: int, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """The mask of scored targets, for logits of shape [*shape, vocab]; every target that is
    not ignore_index must be a vocabulary id."""
    if tuple(shape) != tuple(targets.shape):
        raise ValueError(f"logits {(*shape, vocab)} need targets of shape {tuple(shape)}, "
                         f"got {tuple(targets.shape)}")  # fmt: skip
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise TypeError(f"targets are token ids (an integer dtype), got {targets.dtype}")
    scored = targets != ignore_index
    bad = scored & ((targets < 0) | (targets >= vocab))
    if bad.any():
        where = tuple(int(i) for i in bad.nonzero()[0])
        raise IndexError(f"target {int(targets[where])} at {where} is neither a token id in "
                         f"[0, {vocab}) nor ignore_index ({ignore_index})")  # fmt: skip
    return scored


def token_nll(logits, targets, ignore_index: int = IGNORE_INDEX) -> torch.Tensor:
    """-log p(target) per position, 0 where ignored. log_softmax in at least fp32: logits in
    bf16 / fp16 are upcast first, as Hugging Face's ForCausalLMLoss does."""
    scored = check_targets(logits.shape[:-1], logits.shape[-1], targets, ignore_index)
    logp = (logits if logits.dtype == torch.float64 else logits.float()).log_softmax(-1)
    picked = logp.gather(-1, torch.where(scored, targets, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(scored, -picked, 0.0)


def nll(logits, targets, ignore_index: int = IGNORE_INDEX) -> NLL:
    per_token = token_nll(logits, targets, ignore_index)
    return NLL(per_token.double().sum().item(), int((targets != ignore_index).sum()))


def group_by_token(unit_nats: torch.Tensor, token_lengths: torch.Tensor) -> torch.Tensor:
    """-log p of each token from -log p of each of its units (bytes), by the chain rule: the
    same probability of the text, counted in fewer, larger units."""
    if int(token_lengths.sum()) != unit_nats.numel() or bool((token_lengths < 1).any()):
        raise ValueError(f"token lengths (>= 1 each) must add up to the {unit_nats.numel()} "
                         f"units, they add up to {int(token_lengths.sum())}")  # fmt: skip
    cum = unit_nats.cumsum(0)[token_lengths.cumsum(0) - 1]
    return torch.diff(cum, prepend=cum.new_zeros(1))


# --8<-- [end:nll]


# --8<-- [start:chunked]
def chunked_token_nll(hidden, weight, targets, *, token_chunk: int = 1024,
                      vocab_chunk: int = 8192, ignore_index: int = IGNORE_INDEX):  # fmt: skip
    """token_nll(hidden @ weight.T, targets) without the [tokens, vocab] logits: for each chunk
    of tokens, an online log-sum-exp over chunks of the vocabulary (a running maximum and a
    sum rescaled whenever the maximum grows) and the target's logit, taken from the chunk that
    holds it. The largest intermediate is [token_chunk, vocab_chunk]."""
    if token_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"chunks must be >= 1, got {token_chunk} and {vocab_chunk}")
    n, v = hidden.shape[0], weight.shape[0]
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    scored = check_targets((n,), v, targets, ignore_index)
    out = torch.zeros(n, dtype=acc, device=hidden.device)
    for t0 in range(0, n, token_chunk):
        h = hidden[t0 : t0 + token_chunk].to(acc)
        tgt = torch.where(scored[t0 : t0 + token_chunk], targets[t0 : t0 + token_chunk], 0)
        run_max = torch.full((h.shape[0],), -math.inf, dtype=acc, device=h.device)
        run_sum = torch.zeros_like(run_max)
        picked = torch.zeros_like(run_max)
        for v0 in range(0, v, vocab_chunk):
            z = h @ weight[v0 : v0 + vocab_chunk].to(acc).T
            new_max = torch.maximum(run_max, z.amax(-1))
            run_sum = run_sum * (run_max - new_max).exp() + (z - new_max[:, None]).exp().sum(-1)
            run_max = new_max
            here = (tgt >= v0) & (tgt < v0 + z.shape[1])
            at = (tgt - v0).clamp(0, z.shape[1] - 1)
            picked = torch.where(here, z.gather(-1, at[:, None]).squeeze(-1), picked)
        lse = run_max + run_sum.log()
        out[t0 : t0 + token_chunk] = torch.where(scored[t0 : t0 + token_chunk], lse - picked, 0.0)
    return out


# --8<-- [end:chunked]
