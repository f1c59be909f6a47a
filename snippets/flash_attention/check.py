"""The kernels against fp64 attention, within the bounds of numerics.py: three head mappings,
lengths that are not multiples of any block. bf16 on the GPU, fp32 in the CPU interpreter."""

import torch

from snippets.common.device import ON_GPU
from snippets.flash_attention import warm
from snippets.flash_attention.numerics import check_attention

if ON_GPU:  # what the page compiles, in worker processes side by side, and meanwhile here the
    warm.prepare_page()  # benchmark's cuDNN plans (warm.py): the kernels below load from cache

# --8<-- [start:cases]
dtype = torch.bfloat16 if ON_GPU else torch.float32  # the CPU interpreter mangles bf16
cases = [  # (batch, q heads, KV heads, length, head dim, causal)
    (2, 4, 4, 45, 128, False),  # MHA
    (1, 4, 2, 50, 128, True),  # GQA, 2 query heads per KV head
    (1, 3, 1, 33, 128, True),  # MQA
]
print([check_attention(*case, dtype) for case in cases])
#> [True, True, True]
# --8<-- [end:cases]
