"""One place that picks the device and dtypes, so the same snippet runs on CPU and GPU."""

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"
# Low-precision dtype for kernels: bf16 on the GPU; the CPU Triton interpreter mangles bf16.
LOW_PRECISION = torch.bfloat16 if ON_GPU else torch.float16
