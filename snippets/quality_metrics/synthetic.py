"""Logits made by integer arithmetic: the same numbers on every machine and torch version.

The records this post computes on the CPU must not depend on a random number generator's
implementation, so the inputs come from an integer hash (the one precision-alignment uses) and
every step up to the fp64 logits is exact.
"""

from __future__ import annotations

import torch


# --8<-- [start:logits]
def hashed_bits(n: int, seed: int = 0) -> torch.Tensor:
    """n 32-bit integers (in int64) from an integer hash of the index: no RNG involved."""
    h = torch.arange(n, dtype=torch.int64)
    h += seed * 0x9E3779B9
    h &= 0xFFFFFFFF
    for _ in range(2):
        h ^= h >> 16
        h *= 0x45D9F3B
        h &= 0xFFFFFFFF
    h ^= h >> 16
    return h


def hashed_logits(rows: int, vocab: int, seed: int = 0, scale: float = 3.0) -> torch.Tensor:
    """[rows, vocab] fp64 logits: scale x the sum of four uniforms on [-1, 1), each the 16-bit
    half of a hash; a bell shape with standard deviation scale x 1.155 (Irwin-Hall), computed
    in integers and divided by 2^15 once, so every value is exact."""
    a, b = hashed_bits(rows * vocab, 2 * seed), hashed_bits(rows * vocab, 2 * seed + 1)
    total = (a & 0xFFFF) + (a >> 16) + (b & 0xFFFF) + (b >> 16) - 4 * 2**15
    return (scale * total.double() / 2**15).view(rows, vocab)


# --8<-- [end:logits]
