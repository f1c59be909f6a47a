"""The kernels against fp64 attention, within the bounds of numerics.py: three head mappings,
lengths that are not multiples of any block. bf16 on the GPU, fp32 in the CPU interpreter."""

import torch

from snippets.common.device import ON_GPU
from snippets.flash_attention.attention import compile_in_background
from snippets.flash_attention.numerics import check_attention

if ON_GPU:  # the fp16 test (tests/snippets/test_flash_attention.py) finds its kernels compiled
    compile_in_background(torch.float16, 64)

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
