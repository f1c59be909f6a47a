"""Measure what backward keeps alive: saved-tensor hooks, live storages, recomputed FLOPs.

All three work on any device; the page runs them on the CPU, where they are exact and
deterministic, and the GPU benchmark cross-checks against torch.cuda.memory_allocated().
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


# --8<-- [start:hooks]
def autograd_saved(fn, *args, model_state=()):
    """Run fn(*args) and list the storages autograd saves for backward, in the order first saved,
    as (nbytes, dtype). One entry per storage; storages of model_state (parameters) are skipped.
    Every saved storage stays alive until backward, so no two of them share an address."""
    skip = {p.untyped_storage().data_ptr() for p in model_state}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved.setdefault(storage.data_ptr(), (storage.nbytes(), tensor.dtype))
        return tensor  # keep what autograd would keep: the graph is unchanged

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = fn(*args)
    return out, list(saved.values())


# --8<-- [end:hooks]


# --8<-- [start:live]
class LiveMemory(TorchDispatchMode):
    """Bytes of the storages that ops allocate while this mode is active and that are still
    alive: now, at the highest point so far, and at named marks.

    It sees every aten op, including those checkpointing reruns in backward. Views and in-place
    results share a storage with an input and are not new; scratch memory inside a kernel is
    invisible, so the peak is at op granularity.
    """

    def __init__(self):
        super().__init__()
        self._live = {}  # data_ptr -> (weak reference to the storage, nbytes)
        self.peak = 0
        self.marks = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            x.untyped_storage().data_ptr()
            for x in tree_leaves((args, kwargs))
            if isinstance(x, torch.Tensor)
        }
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor) and x.untyped_storage().data_ptr() not in inputs:
                self._add(x.untyped_storage())
        self.peak = max(self.peak, self.now())
        return out

    def _add(self, storage):
        ref, _ = self._live.get(storage.data_ptr(), (None, 0))
        if ref is None or ref() is None:  # a freed storage's address can be reused
            self._live[storage.data_ptr()] = (weakref.ref(storage), storage.nbytes())

    def now(self) -> int:
        return sum(n for ref, n in self._live.values() if ref() is not None)

    def mark(self, name):
        self.marks[name] = self.now()


# --8<-- [end:live]


# --8<-- [start:flops]
def is_attention(op) -> bool:
    """Any SDPA kernel (flash, efficient, cuDNN, the CPU one), forward or backward."""
    return "scaled_dot_product" in str(op)


class MatmulFlops(TorchDispatchMode):
    """FLOPs of every matmul (2mkn) and every attention forward that runs, backward included.
    Attention is counted causal, as in qwen3_fusion.accounting: 2 x 2 x b x n_q x (s^2 / 2) x d."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default:
            (m, k), n = args[0].shape, args[1].shape[1]
            self.flops += 2 * m * k * n
        elif is_attention(func) and "backward" not in str(func):
            b, nq, s, d = args[0].shape
            self.flops += 2 * 2 * b * nq * s * s * d // 2
        return func(*args, **(kwargs or {}))


# --8<-- [end:flops]


class OpNames(TorchDispatchMode):
    """Names of the aten ops that run, in order (e.g. to see which kernel SDPA picked)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
