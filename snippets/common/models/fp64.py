"""Kernels for an fp64 reference model (pages and tests compare against it): an RMSNorm that
computes in its input's dtype. The model's norm (like Hugging Face's) takes
statistics in fp32, which rounds fp64 input to fp32; with this norm an fp64 model is fp64
throughout, so that fp64 comparisons can use fp64 tolerances."""

import torch

from snippets.common.models.qwen3 import Kernels, RMSNorm


class NormInInputDtype(RMSNorm):
    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


FP64 = Kernels(norm=NormInInputDtype)
