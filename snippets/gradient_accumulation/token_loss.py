"""Variable-length sequences: average over all tokens of the window, not per micro-batch."""

import torch
import torch.nn.functional as F

from snippets.common.device import DEVICE

IGNORE = -100  # label of padding tokens, as in F.cross_entropy's default ignore_index


# --8<-- [start:loops]
def per_microbatch_mean(model, batches):
    """The naive loop: mean over each micro-batch's tokens, then / k."""
    model.zero_grad(set_to_none=True)
    for tokens, labels in batches:
        loss = F.cross_entropy(model(tokens).flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
        (loss / len(batches)).backward()
    return [p.grad.clone() for p in model.parameters()]


def global_token_mean(model, batches):
    """Sum token losses, divide by the token count of the whole accumulation window."""
    n_tokens = sum(int((labels != IGNORE).sum()) for _, labels in batches)
    model.zero_grad(set_to_none=True)
    for tokens, labels in batches:
        logits = model(tokens).flatten(0, 1)
        loss = F.cross_entropy(logits, labels.flatten(), ignore_index=IGNORE, reduction="sum")
        (loss / n_tokens).backward()
    return [p.grad.clone() for p in model.parameters()]


# --8<-- [end:loops]


# --8<-- [start:demo]
torch.manual_seed(0)
VOCAB, WIDTH, SEQ = 50, 16, 12
model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Linear(WIDTH, VOCAB))
model = model.to(DEVICE, torch.float64)


def micro_batch(rows, valid):
    """`rows` sequences whose first `valid` labels are real tokens, the rest padding."""
    tokens = torch.randint(VOCAB, (rows, SEQ)).to(DEVICE)  # drawn on the CPU: same data anywhere
    labels = torch.randint(VOCAB, (rows, SEQ)).to(DEVICE)
    labels[:, valid:] = IGNORE
    return tokens, labels


batches = [micro_batch(2, 12), micro_batch(2, 3)]  # 24 real tokens, then 6
whole = (torch.cat([t for t, _ in batches]), torch.cat([lab for _, lab in batches]))
reference = per_microbatch_mean(model, [whole])  # one big batch: mean over all 30 tokens

naive = per_microbatch_mean(model, batches)
fixed = global_token_mean(model, batches)
print(all(torch.allclose(a, b) for a, b in zip(fixed, reference, strict=True)))
#> True
print(all(torch.allclose(a, b) for a, b in zip(naive, reference, strict=True)))
#> False
# the naive loop weights each of the 6 short-batch tokens 4x as much as a long-batch token:
# 1/(2*6) versus 1/(2*24); the whole batch weights every token 1/30.
print(1 / (2 * 6) / (1 / 30), 1 / (2 * 24) / (1 / 30))
#> 2.5 0.625
# --8<-- [end:demo]
