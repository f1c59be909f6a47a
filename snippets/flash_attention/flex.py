"""FlexAttention (torch.nn.attention.flex_attention): a score_mod rewrites each score, a mask_mod
turned into a BlockMask says which blocks of the score matrix to compute at all. Here: causal
(against this post's kernel), packed variable-length documents (against attention over each
document alone), and a tanh soft cap on the scores. On the CPU flex_attention runs its eager
reference, which materializes the scores; torch.compile(flex_attention) generates the fused
kernel on the GPU (measure.py times that one)."""

import math
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from snippets.common.device import DEVICE, ON_GPU
from snippets.flash_attention.attention import flash_attention

warnings.filterwarnings("ignore", "flex_attention called without torch.compile", UserWarning)


# --8<-- [start:mods]
def causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def documents(doc_ids: torch.Tensor):
    """mask_mod of packed sequences: a token sees earlier tokens of its own document only."""

    def mask(b, h, q_idx, kv_idx):
        return (doc_ids[q_idx] == doc_ids[kv_idx]) & (q_idx >= kv_idx)

    return mask


def soft_cap(cap: float):
    """score_mod: cap * tanh(score / cap), bounded scores (Gemma 2 caps attention logits)."""

    def mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    return mod


# --8<-- [end:mods]

# --8<-- [start:check]
g = torch.Generator().manual_seed(0)
dtype = torch.bfloat16 if ON_GPU else torch.float32  # the CPU interpreter mangles bf16
atol = 2e-2 if ON_GPU else 1e-5  # two bf16 implementations differ by their roundings
lengths = [37, 11, 64, 16]  # four documents packed into one row of 128 tokens
n, heads, d = sum(lengths), 2, 128
q, k, v = (torch.randn(1, heads, n, d, generator=g).to(DEVICE, dtype) for _ in range(3))

mask = create_block_mask(causal, None, None, n, n, device=DEVICE, BLOCK_SIZE=32)
ours = flash_attention(q, k, v, causal=True)
print(torch.allclose(flex_attention(q, k, v, block_mask=mask), ours, atol=atol))
#> True

doc_ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(DEVICE)
packed = create_block_mask(documents(doc_ids), None, None, n, n, device=DEVICE, BLOCK_SIZE=32)
out = flex_attention(q, k, v, block_mask=packed)
pieces = zip(*(t.split(lengths, dim=2) for t in (q, k, v)), strict=True)  # document by document
alone = torch.cat([F.scaled_dot_product_attention(*p, is_causal=True) for p in pieces], dim=2)
print(torch.allclose(out, alone, atol=atol))
#> True
# blocks of 32 x 32 that hold at least one visible pair: the kernel skips all the others
print(f"{packed.sparsity():.1f}% of the blocks skipped (causal alone: {mask.sparsity():.1f}%)")
#> 50.0% of the blocks skipped (causal alone: 37.5%)

capped = flex_attention(q, k, v, score_mod=soft_cap(20.0))
q32, k32, v32 = (t.float() for t in (q, k, v))
s = 20.0 * torch.tanh(q32 @ k32.transpose(-1, -2) / math.sqrt(d) / 20.0)
print(torch.allclose(capped.float(), torch.softmax(s, -1) @ v32, atol=atol))
#> True
# --8<-- [end:check]
