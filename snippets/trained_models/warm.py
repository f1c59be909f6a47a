"""Compiles the target's decode step once, in a process of its own, on a model of the target's
shape with untrained weights: what Inductor compiles depends on shapes and dtypes, not on
weight values, so this fills the run's Inductor and Triton caches (the environment's
TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR) while bench_gpu.py trains, and the compile that
bench_gpu.py times afterwards loads most of its work from them.
Run by bench_gpu.py as `python -m snippets.trained_models.warm`; exits non-zero on failure."""

import torch

from snippets.common.models.trained_configs import load_trained_models
from snippets.common.train import build_model, settings
from snippets.trained_models.card import decode_times

if __name__ == "__main__":
    _, cfg, _ = settings("target", load_trained_models())
    with torch.device("cuda"):
        model = build_model(cfg)
    model = model.to(torch.bfloat16).eval()  # as bench_gpu.py's decode model
    decode_times(model, lambda fn: None)  # compiles, checks the logits, times nothing
