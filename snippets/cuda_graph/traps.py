"""The traps of CUDA Graphs, each as a small function: what goes wrong, and the fix.

Each function returns what it observed; the page prints it and the tests assert it. They need
a CUDA device (capture exists only there).
"""

import gc

import torch

from snippets.cuda_graph.graphs import capture

CUDA = "cuda"


# --8<-- [start:shapes]
def dynamic_shapes() -> dict:
    """A graph replays the shapes it recorded. A shorter batch goes into the static buffer, and
    whatever the buffer held before is still there unless the rest is padded."""
    static = torch.ones(8, device=CUDA)  # the last batch had 8 values
    graph, total = capture(lambda: static.sum())
    new = torch.arange(1.0, 7.0, device=CUDA)  # 6 values, sum 21
    try:
        static.copy_(new)
        wrong_shape = "accepted"
    except RuntimeError:
        wrong_shape = "RuntimeError"  # 6 values do not fit an 8-value buffer
    static[:6].copy_(new)
    graph.replay()
    stale = total.item()  # 21 + the 2 old ones
    static[6:].zero_()  # pad with the operation's neutral element
    graph.replay()
    return {"copy_of_other_shape": wrong_shape, "stale": stale, "padded": total.item()}


# --8<-- [end:shapes]


# --8<-- [start:cpu_values]
def cpu_values() -> dict:
    """A Python number used inside capture becomes a constant of the graph."""
    x = torch.ones(4, device=CUDA)
    lr = 2.0
    graph, out = capture(lambda: x * lr)
    lr = 3.0  # the graph never sees this
    graph.replay()
    baked = out[0].item()
    lr_t = torch.tensor(2.0, device=CUDA)  # fix: a device tensor, updated in place
    graph, out = capture(lambda: x * lr_t)
    lr_t.fill_(3.0)
    graph.replay()
    return {"python_float": baked, "device_tensor": out[0].item()}


# --8<-- [end:cpu_values]


# --8<-- [start:sync]
def host_sync() -> dict:
    """Anything that waits for the GPU (.item(), .cpu(), printing a tensor, a data-dependent
    shape such as nonzero()) is not allowed on a capturing stream: the capture fails."""
    x = torch.ones(4, device=CUDA)
    try:
        capture(lambda: x / x.sum().item())
        error = None
    except RuntimeError as exc:  # raised again at the end of capture; the first error is the cause
        while exc.__context__ is not None:
            exc = exc.__context__
        error = str(exc).splitlines()[0]
    graph, out = capture(lambda: x / x.sum())  # fix: keep the value on the device
    graph.replay()
    return {"error": error, "fixed": out[0].item()}


# --8<-- [end:sync]


# --8<-- [start:rng]
def rng() -> dict:
    """Random numbers: the default CUDA generator is registered with every capture, so each
    replay draws new numbers. A generator of your own must be registered by you."""
    graph, out = capture(lambda: torch.rand(4, device=CUDA))
    graph.replay()
    first = out.clone()
    graph.replay()
    default_fresh = not torch.equal(first, out)
    gen = torch.Generator(device=CUDA).manual_seed(0)
    try:
        graph, out = capture(lambda: torch.rand(4, device=CUDA, generator=gen))
        graph.replay()
        first = out.clone()
        graph.replay()
        own = "fresh" if not torch.equal(first, out) else "repeated"
    except RuntimeError as exc:
        own = "RuntimeError: " + str(exc).splitlines()[0]
    graph, out = capture(
        lambda: torch.rand(4, device=CUDA, generator=gen), generators=(gen,)
    )  # fix: register the generator before capture
    graph.replay()
    first = out.clone()
    graph.replay()
    return {"default_fresh": default_fresh, "own_generator": own,
            "registered_fresh": not torch.equal(first, out)}  # fmt: skip


# --8<-- [end:rng]


# --8<-- [start:pool]
def output_overwritten() -> dict:
    """A graph's output lives in the graph's memory pool; the next replay writes over it."""
    x = torch.ones(4, device=CUDA)
    graph, out = capture(lambda: x * 2)
    graph.replay()
    kept, copied = out, out.clone()  # a reference, and a copy
    x.fill_(5.0)
    graph.replay()
    return {"reference": kept[0].item(), "clone": copied[0].item()}


def pool_bytes(shared: bool, sizes=(1, 2, 4, 8, 16, 32), width: int = 1 << 20) -> int:
    """Memory held by one small graph per size, each with a temporary of size x width floats:
    separate pools keep every graph's blocks; one shared pool lets them reuse the same blocks."""
    inputs = [torch.ones(n, width, device=CUDA) for n in reversed(sizes)]
    gc.collect()
    torch.cuda.empty_cache()  # cached blocks of earlier work would blur the difference
    before = torch.cuda.memory_reserved()
    pool = torch.cuda.graph_pool_handle() if shared else None
    graphs = [capture(lambda x=x: (x * 2).sum(), pool=pool) for x in inputs]
    torch.cuda.empty_cache()  # the warm-ups' blocks; the graphs' pools stay reserved
    held = torch.cuda.memory_reserved() - before
    del graphs
    return held


# --8<-- [end:pool]


# --8<-- [start:inplace]
def rebinding() -> dict:
    """The graph reads the tensor it captured. Rebinding the Python name to a new tensor
    changes nothing for the graph; copy_ into the captured tensor does."""
    x = torch.ones(4, device=CUDA)
    graph, out = capture(lambda: x * 2)
    captured = x
    x = torch.full((4,), 5.0, device=CUDA)  # a new tensor under the old name
    graph.replay()
    rebound = out[0].item()
    captured.copy_(x)  # fix: write into the captured tensor
    graph.replay()
    return {"rebound": rebound, "copied": out[0].item()}


def mutation_in_graph() -> dict:
    """An in-place update inside the graph runs again on every replay (a KV cache wants
    exactly that; a counter that should move once does not)."""
    count = torch.zeros(1, device=CUDA)
    graph, _ = capture(lambda: count.add_(1), warmup=0)
    for _ in range(3):
        graph.replay()
    return {"after_3_replays": count.item()}


# --8<-- [end:inplace]


# --8<-- [start:control]
def control_flow() -> dict:
    """Python control flow runs once, at capture: the graph keeps the branch taken then."""
    x = torch.ones(4, device=CUDA)
    warm = torch.tensor(True, device=CUDA)  # e.g. "still in learning-rate warm-up"
    flag = True
    graph, out = capture(lambda: x * 0.1 if flag else x)
    flag = False
    graph.replay()
    python_branch = out[0].item()
    graph, out = capture(lambda: torch.where(warm, x * 0.1, x))  # fix: the branch on the GPU
    warm.fill_(False)
    graph.replay()
    return {"python_branch": python_branch, "device_branch": out[0].item()}


# --8<-- [end:control]
