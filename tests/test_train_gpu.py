"""On CUDA: the shared trainer's deterministic mode makes cuDNN's attention backward, SDPA's
pick for the shared models on the H200, bitwise reproducible (snippets/common/train.py)."""

import pytest
import torch

from snippets.common.train import deterministic

pytestmark = pytest.mark.gpu


def test_cudnn_attention_backward_is_bitwise_reproducible_in_deterministic_mode():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(8, 16, 2048, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
               for _ in range(3))  # fmt: skip
    grad = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    def grads():
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        with deterministic(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
            out.backward(grad)
        return [t.grad for t in leaves]

    first = grads()
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(first, grads(), strict=True))
