"""Why two tokenizers' perplexities cannot be compared, on the shared models' pinned corpus.

Two small models, fitted on the corpus's training files in a second, scored on its held-out
files (snippets/common/corpus.py): a byte-level bigram and a unigram over the pinned BPE's
tokens. The same text is scored per byte and per token, and converted to bits per byte.
"""

import math

import torch

from snippets.common.corpus import load_corpus, load_tokenizer
from snippets.common.results import computed_result
from snippets.quality_metrics.lm import NLL, group_by_token

# --8<-- [start:models]
corpus = load_corpus()  # the pinned wheel's files, hashes checked
bpe = load_tokenizer(corpus=corpus)  # the pinned byte-level BPE (8192 tokens)
train, heldout = corpus.split(heldout=False), corpus.split(heldout=True)
text = "".join(heldout)
data = torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def as_bytes(t: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(t.encode("utf-8")), dtype=torch.uint8).long()


# model A: p(byte | previous byte), add-one smoothing, fitted on every training byte
seen = as_bytes("\n".join(train))
pairs = torch.bincount(seen[:-1] * 256 + seen[1:], minlength=256 * 256).view(256, 256)
pairs = pairs.double()  # fp64 logs: fp32's differ by an ulp between CPU builds
bigram = (pairs + 1.0).log() - (pairs.sum(1, keepdim=True) + 256.0).log()
previous = torch.cat([torch.tensor([ord("\n")]), data[:-1]])  # the text starts after a newline
byte_nats = -bigram[previous, data]  # one value per byte

# model B: p(token), add-one smoothing, fitted on every eighth training file's BPE tokens
fitted = [i for e in bpe.encode_batch(train[::8]) for i in e.ids]
counts = torch.bincount(torch.tensor(fitted), minlength=bpe.get_vocab_size()).double()
unigram = (counts + 1).log() - (counts.sum() + counts.numel()).log()
ids = torch.tensor([i for t in heldout for i in bpe.encode(t).ids])
token_nats = -unigram[ids]  # one value per BPE token
# --8<-- [end:models]

# --8<-- [start:per_token]
# model A's probability of the text, grouped by the BPE's tokens: a token's -log p is the sum
# over its bytes (chain rule). Same probability, same total bits, fewer and larger units.
token_bytes = torch.tensor([len(bpe.id_to_token(i)) for i in ids.tolist()])  # 1 char = 1 byte
bigram_per_token = group_by_token(byte_nats, token_bytes)  # checks that they tile the bytes
# group_by_token differences a running sum: its rounding is at most n u of the total (u = 2^-53)
bound = byte_nats.numel() * 2.0**-53
assert math.isclose(bigram_per_token.sum().item(), byte_nats.sum().item(), rel_tol=bound)

n_bytes, n_tokens = data.numel(), ids.numel()
a_bytes = NLL(byte_nats.sum().item(), n_bytes)  # model A, per byte
a_tokens = NLL(bigram_per_token.sum().item(), n_tokens)  # model A, per BPE token
b_tokens = NLL(token_nats.sum().item(), n_tokens)  # model B, per BPE token
per_unit = a_bytes.perplexity() ** (n_bytes / n_tokens)  # PPL per token = PPL per byte ^ (B / T)
assert math.isclose(a_tokens.perplexity(), per_unit, rel_tol=1e-9)
print(n_bytes, n_tokens, f"{n_bytes / n_tokens:.2f} bytes per token")
#> 940887 296658 3.17 bytes per token
for name, nll in (("A per byte", a_bytes), ("A per token", a_tokens), ("B per token", b_tokens)):
    shown = f"PPL {nll.perplexity():7.1f}  bits {nll.bits():9.0f}  BPB {nll.bits_per(n_bytes):.3f}"
    print(f"{name:12}", shown)
    #> A per byte   PPL    13.0  bits   3485753  BPB 3.705
    #> A per token  PPL  3444.5  bits   3485753  BPB 3.705
    #> B per token  PPL   701.3  bits   2804595  BPB 2.981
# --8<-- [end:per_token]

computed_result(
    "quality-metrics",
    "bits",
    {
        "n_bytes": n_bytes,
        "n_tokens": n_tokens,
        "bytes_per_token": n_bytes / n_tokens,
        "fitted_tokens": len(fitted),
        "rows": [
            {"model": "bigram", "unit": "byte", "ppl": a_bytes.perplexity(),
             "bits": a_bytes.bits(), "bpb": a_bytes.bits_per(n_bytes)},
            {"model": "bigram", "unit": "token", "ppl": a_tokens.perplexity(),
             "bits": a_tokens.bits(), "bpb": a_tokens.bits_per(n_bytes)},
            {"model": "unigram", "unit": "token", "ppl": b_tokens.perplexity(),
             "bits": b_tokens.bits(), "bpb": b_tokens.bits_per(n_bytes)},
        ],
    },
)  # fmt: skip
