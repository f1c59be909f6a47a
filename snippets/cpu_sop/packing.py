"""Sequence packing: documents laid end to end in fixed-length rows instead of one padded row
each. The attention mask must then stop at document boundaries (block-diagonal causal), and the
position ids restart at each document; otherwise tokens attend to the previous document."""

from __future__ import annotations

import itertools
import random

import torch

from snippets.common.results import computed_result


# --8<-- [start:pack]
def pack(lengths: list[int], seq: int) -> list[list[tuple[int, int]]]:
    """Rows of (document, tokens) pieces, filled greedily in order; a document longer than
    what is left of a row continues in the next one (pretraining-style packing)."""
    if seq <= 0 or any(n <= 0 for n in lengths):
        raise ValueError(f"pack: seq and every length must be positive (seq={seq})")
    rows, row, free = [], [], seq
    for doc, n in enumerate(lengths):
        while n:
            take = min(n, free)
            row.append((doc, take))
            n, free = n - take, free - take
            if free == 0:
                rows.append(row)
                row, free = [], seq
    return rows + ([row] if row else [])


def row_ids(row: list[tuple[int, int]], seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: which piece it belongs to (-1 for padding), and its position in that piece."""
    doc = torch.full((seq,), -1)
    pos = torch.zeros(seq, dtype=torch.long)
    at = 0
    for k, (_, n) in enumerate(row):
        doc[at : at + n], pos[at : at + n] = k, torch.arange(n)
        at += n
    return doc, pos


def block_causal(doc: torch.Tensor) -> torch.Tensor:
    """mask[i, j]: token i may attend to token j (same piece, j <= i)."""
    same = doc[:, None] == doc[None, :]
    causal = torch.ones(len(doc), len(doc), dtype=torch.bool).tril()
    return same & causal & (doc[:, None] >= 0)


def cu_seqlens(row: list[tuple[int, int]]) -> torch.Tensor:
    """The same boundaries as cumulative lengths, the form variable-length attention kernels
    (flash_attn_varlen_func's cu_seqlens) take instead of a mask."""
    return torch.tensor([0] + [n for _, n in row]).cumsum(0).to(torch.int32)


# --8<-- [end:pack]


# --8<-- [start:mask]
def attention(q, k, v, mask):
    scores = (q @ k.T) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


def causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


row = [(0, 5), (1, 3), (2, 4)]  # three documents in one row of 12 tokens, no padding
doc, pos = row_ids(row, 12)
q, k, v = torch.randn(3, 12, 16, generator=torch.Generator().manual_seed(0))
bounds = cu_seqlens(row).tolist()
separate = torch.cat([attention(q[a:b], k[a:b], v[a:b], causal(b - a))
                      for a, b in itertools.pairwise(bounds)])  # fmt: skip
blocked = attention(q, k, v, block_causal(doc))
leaky = attention(q, k, v, causal(12))  # a plain causal mask over the packed row
print(pos.tolist(), bounds)
#> [0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3] [0, 5, 8, 12]
print("block-diagonal mask = documents apart:", torch.allclose(blocked, separate, atol=1e-6))
#> block-diagonal mask = documents apart: True
print("plain causal mask leaks across documents:", (leaky - separate).abs().max().item() > 1e-3)
#> plain causal mask leaks across documents: True
# --8<-- [end:mask]

# --8<-- [start:waste]
SEQ, BATCH = 2048, 8
rng = random.Random(0)
lengths = [min(SEQ, max(16, int(rng.lognormvariate(6.0, 1.0)))) for _ in range(4096)]
padded_to_seq = sum(SEQ - n for n in lengths) / (SEQ * len(lengths))
batches = [lengths[i : i + BATCH] for i in range(0, len(lengths), BATCH)]
slots = sum(max(b) * len(b) for b in batches)  # each batch padded to its longest
padded_to_longest = sum(max(b) * len(b) - sum(b) for b in batches) / slots
rows = pack(lengths, SEQ)
packed = (len(rows) * SEQ - sum(lengths)) / (len(rows) * SEQ)
shares = [f"{x:.1%}" for x in (padded_to_seq, padded_to_longest)] + [f"{packed:.2%}"]
print("padding share: to the row length, to the batch's longest, packed:", *shares)
#> padding share: to the row length, to the batch's longest, packed: 70.7% 61.1% 0.05%
# --8<-- [end:waste]

computed_result("cpu-sop", "packing", {
    "seq": SEQ, "batch": BATCH, "docs": len(lengths),
    "mean_len": sum(lengths) / len(lengths),
    "padded_to_seq": padded_to_seq, "padded_to_longest": padded_to_longest, "packed": packed,
    "rows": len(rows),
})  # fmt: skip
