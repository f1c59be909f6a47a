"""Capturing decode and training steps as CUDA graphs."""

import torch

from snippets.cuda_graph.decode import StaticCache, decode_step


# --8<-- [start:capture]
def capture(fn, warmup: int = 3, pool=None, generators=()):
    """Run fn a few times on a side stream (lazy initialisation, cuBLAS workspaces, the
    allocator's first blocks), then record it. Returns the graph and fn's output, whose
    memory belongs to the graph: every replay writes the new result into it. Generators
    other than the default one must be registered before capture (section 4.4)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    for generator in generators:
        graph.register_generator_state(generator)
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


# --8<-- [end:capture]


# --8<-- [start:buckets]
def bucket_for(n: int, buckets) -> int:
    """The smallest captured batch size that holds n sequences."""
    for b in sorted(buckets):
        if b >= n:
            return b
    raise ValueError(f"batch {n} is larger than the largest captured bucket {max(buckets)}")


class GraphedDecoder:
    """One graph per batch bucket over one static cache; all graphs share one memory pool.
    A batch of n sequences is padded to its bucket: rows n.. compute garbage that is dropped."""

    def __init__(self, model, cache: StaticCache, buckets, shared_pool: bool = True):
        self.buckets = sorted(buckets)
        self.cache = cache  # the graphs hold its addresses, not a reference: keep it alive
        big = self.buckets[-1]
        device = cache.k.device
        self.tokens = torch.zeros(big, dtype=torch.long, device=device)  # static inputs
        self.pos = torch.zeros(big, dtype=torch.long, device=device)
        pool = torch.cuda.graph_pool_handle() if shared_pool else None
        self.graphs, self.logits = {}, {}
        for b in reversed(self.buckets):  # largest first: the smaller ones fit in its pool
            view = cache.rows(b)

            def step(b=b, view=view):
                return decode_step(model, view, self.tokens[:b], self.pos[:b])

            self.graphs[b], self.logits[b] = capture(step, pool=pool)

    def __call__(self, tokens, pos):
        n = tokens.shape[0]
        b = bucket_for(n, self.buckets)
        self.tokens[:n].copy_(tokens)  # copy into the captured tensors: never rebind them
        self.pos[:n].copy_(pos)
        self.tokens[n:b].zero_()  # padding: a valid token at position 0
        self.pos[n:b].zero_()
        self.graphs[b].replay()
        return self.logits[b][:n]  # a view into the graph's output: read it before the next call


# --8<-- [end:buckets]


# --8<-- [start:train]
def captured_train_step(model, optimizer, ids):
    """The whole step (forward, backward, optimizer) as one graph over the static batch `ids`.
    The optimizer must be capturable (its step count on the GPU). The warm-up runs are real
    steps: they train the model. Returns (graph, loss)."""

    def step():
        optimizer.zero_grad(set_to_none=True)  # in capture: the gradients go to the graph's pool
        loss = model(ids, labels=ids)
        loss.backward()
        optimizer.step()
        return loss

    return capture(step)


# --8<-- [end:train]
