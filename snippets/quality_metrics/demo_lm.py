"""Token-level cross-entropy over batches, ignore_index, and the chunked cross-entropy."""

import torch
import torch.nn.functional as F

from snippets.common.models.qwen3_configs import load_qwen3_configs
from snippets.quality_metrics.lm import IGNORE_INDEX, chunked_token_nll, nll, token_nll
from snippets.quality_metrics.synthetic import hashed_logits

# --8<-- [start:batches]
logits = hashed_logits(12, 50, seed=3).view(2, 6, 50)  # two batches of 6 positions, 50 tokens
targets = torch.tensor([[3, 7, 1, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX],  # 3 scored
                        [5, 2, 9, 4, 8, 6]])  # 6 scored  # fmt: skip
batches = [nll(logits[b], targets[b]) for b in range(2)]
corpus = batches[0] + batches[1]  # sums and counts add
mean_of_means = (batches[0].mean() + batches[1].mean()) / 2
print(corpus.tokens, f"{corpus.mean():.4f} {mean_of_means:.4f}")
#> 9 7.9156 7.5518

padding_only = torch.full((4,), IGNORE_INDEX)
print(F.cross_entropy(logits[0, :4], padding_only).item())  # PyTorch: 0 / 0
#> nan
empty = nll(logits[0, :4], padding_only)
print(empty, (corpus + empty).mean() == corpus.mean())
#> NLL(nats=0.0, tokens=0) True
try:
    empty.mean()
except ValueError as err:
    print("ValueError:", str(err).split(":")[0])
    #> ValueError: no scored token (every target is ignore_index)
# --8<-- [end:batches]

# --8<-- [start:chunked]
# Qwen3's vocabulary, 64 positions: the full logits would be 64 x 151,936 values; the chunked
# pass holds 16 x 16384 at a time
VOCAB = load_qwen3_configs()["qwen3-8b"].fields["vocab_size"]
hidden = hashed_logits(64, 16, seed=6) / 4
weight = hashed_logits(VOCAB, 16, seed=7) / 4
labels = hashed_logits(1, 64, seed=8).abs().mul(VOCAB / 12).long().view(-1)  # token ids
labels[::7] = IGNORE_INDEX
full = F.cross_entropy(hidden @ weight.T, labels, reduction="none")  # fp64
chunked = chunked_token_nll(hidden, weight, labels, token_chunk=16, vocab_chunk=16384)
print((chunked - full).abs().max().item() < 1e-12, 64 * VOCAB // (16 * 16384))
#> True 37

# in fp32 the two orders of summation differ; each stays within 64 fp32 roundings of fp64
full32 = token_nll(hidden.float() @ weight.float().T, labels)
chunked32 = chunked_token_nll(
    hidden.float(), weight.float(), labels, token_chunk=16, vocab_chunk=16384
)
bound = 64 * 2**-24 * full.abs()
print(all(((x.double() - full).abs() <= bound).all() for x in (full32, chunked32)))
#> True
# --8<-- [end:chunked]
