"""On CUDA: what the shared trainer's strict deterministic mode does to attention
(snippets/common/train.py). PyTorch keeps cuDNN out of SDPA's choice there
(check_cudnn_deterministic in sdp_utils.cpp), SDPA takes its flash kernel, and the flash
backward runs its deterministic variant: gradients bitwise equal from call to call."""

from contextlib import nullcontext

import pytest
import torch

from snippets.common.train import deterministic

pytestmark = pytest.mark.gpu


def _inputs():
    """One attention call at the shared target's shape (32 heads, 8 KV heads, d 128, rows of
    512 tokens) with a batch of 8 rows."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(8, 32, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(8, 8, 512, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))  # fmt: skip
    grad = torch.randn(q.shape, device="cuda", dtype=torch.bfloat16, generator=gen)
    return (q, k, v), grad


def _grads(inputs, grad, backends=None):
    from torch.nn.attention import sdpa_kernel

    leaves = [t.detach().requires_grad_() for t in inputs]
    chosen = sdpa_kernel(backends) if backends else nullcontext()
    with deterministic(), chosen:
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True,
                                                               enable_gqa=True)  # fmt: skip
        out.backward(grad)
    return [t.grad for t in leaves]


def test_strict_mode_keeps_cudnn_attention_out_of_sdpa():
    from torch.nn.attention import SDPBackend

    inputs, grad = _inputs()
    with pytest.raises(RuntimeError, match="No available kernel"):
        _grads(inputs, grad, [SDPBackend.CUDNN_ATTENTION])
    _grads(inputs, grad, [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION])  # runs


def test_strict_mode_attention_backward_is_flash_and_bitwise_reproducible():
    from torch.nn.attention import SDPBackend

    inputs, grad = _inputs()
    default = _grads(inputs, grad)  # SDPA's own choice, as in the trainer
    flash = _grads(inputs, grad, [SDPBackend.FLASH_ATTENTION])
    assert all(torch.equal(a, b) for a, b in zip(default, flash, strict=True))
    for _ in range(3):
        assert all(torch.equal(a, b) for a, b in zip(default, _grads(inputs, grad), strict=True))
