"""FlashAttention：tiling 与 online softmax (flash-attention) snippets."""
