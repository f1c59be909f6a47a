"""How the work of a decode step grows with the number of layers: the ATen operations it
dispatches, counted on the CPU. On CUDA the same Python code dispatches the same operations,
and they decide which kernels are launched; views launch none and are left out."""

from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from snippets.common.models.qwen3 import TINY, Qwen3ForCausalLM
from snippets.cuda_graph.decode import StaticCache, decode_step


# --8<-- [start:count]
class CountOps(TorchDispatchMode):
    """Counts the ATen operations dispatched inside it, views (which launch nothing) left out."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def ops_per_step(layers: int, step=decode_step, batch: int = 2, max_len: int = 16) -> list[str]:
    """The non-view ATen operations of one decode step of TINY with `layers` layers."""
    cfg = replace(TINY, num_hidden_layers=layers)
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg)
    cache = StaticCache.empty(cfg, batch, max_len, torch.float32, "cpu")
    tokens, pos = torch.zeros(batch, dtype=torch.long), torch.arange(batch)
    with CountOps() as seen:
        step(model, cache, tokens, pos)
    return seen.ops


def same_ops_every_layer(layers=(1, 2, 4, 8), step=decode_step) -> bool:
    """True when, for every n in `layers`, a step of n layers dispatches prefix + n copies of
    one layer's operations + suffix, with the same prefix, block and suffix for all n."""
    ops = {n: ops_per_step(n, step) for n in layers}
    a, b = sorted(layers)[:2]
    per, rest = divmod(len(ops[b]) - len(ops[a]), b - a)
    if rest or per <= 0:
        return False
    for p in range(len(ops[a]) - per * a + 1):  # where the first layer starts
        pre, block, suf = ops[a][:p], ops[a][p : p + per], ops[a][p + per * a :]
        if all(ops[n] == pre + block * n + suf for n in layers):
            return True
    return False


# --8<-- [end:count]
