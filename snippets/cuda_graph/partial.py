"""Partial-network capture with torch.cuda.make_graphed_callables: each decoder layer's forward
and backward become CUDA graphs, while the embedding, the final norm, the LM head, the loss and
the optimizer step stay eager. Checked against an eager twin that trains on the same batches.

Both twins compute in fp64 (FP64 kernels: the norms too), so the comparison can use an fp64
tolerance. The graphs replay the kernels the eager twin launches, on the same shapes, so the
expected difference is zero; a reduction that runs in another order (another cuBLAS algorithm,
atomics) changes a result by at most 2 * gamma_n relative to the sum of its terms' magnitudes,
gamma_n = n u / (1 - n u), u = 2^-53. The longest reduction here is over the vocabulary
(n = 1000): about 2e-13. RTOL = 1e-10 leaves three orders of magnitude for the growth through
two layers and a few SGD steps, while one SGD step moves the parameters by more than 1e-3 of
their largest entry (tests/snippets/test_cuda_graph.py checks it on the CPU), so a missed,
doubled or wrong step shows up far above it.
"""

import torch

from snippets.common.models.fp64 import FP64
from snippets.common.models.qwen3 import TINY, Qwen3ForCausalLM, rope_tables

RTOL = 1e-10
LR = 0.1  # plain SGD: the update is lr * grad, so a gradient error stays an error of its size


# --8<-- [start:graph_layers]
def graph_layers(model, batch: int, seq: int):
    """Turn every decoder layer of `model` into a graphed callable, in place: one forward graph
    and one backward graph per layer, all in one memory pool, captured in the order the layers
    run. A graphed layer copies its real input into its sample input and replays, so each layer
    gets a sample tensor of its own (requires_grad=True like the real input); cos and sin do
    not require grad, and every layer gets the same ones."""
    cfg, w = model.config, model.lm_head.weight
    cos, sin = rope_tables(cfg, seq, w.device)
    layers = tuple(model.model.layers)

    def sample():
        shape = (batch, seq, cfg.hidden_size)
        return torch.randn(shape, dtype=w.dtype, device=w.device, requires_grad=True), cos, sin

    torch.cuda.make_graphed_callables(layers, tuple(sample() for _ in layers))
    return model


# --8<-- [end:graph_layers]


# --8<-- [start:train]
def train(model, batches, lr: float = LR):
    """Plain SGD on each batch in turn; returns the losses. The same code trains the eager twin
    and the graphed model: the layers' forward and backward are graph replays in the latter."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for ids in batches:
        opt.zero_grad(set_to_none=True)  # the graphed backward hands its pool's gradients over
        loss = model(ids, labels=ids)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


def twins(seed: int = 0, device="cuda"):
    """Two fp64 TINY models with the same weights."""
    torch.manual_seed(seed)
    eager = Qwen3ForCausalLM(TINY, FP64).to(device, torch.float64)
    graphed = Qwen3ForCausalLM(TINY, FP64).to(device, torch.float64)
    graphed.load_state_dict(eager.state_dict())
    return eager, graphed


def rel(a, b) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


def graphed_training(steps: int = 5, batch: int = 2, seq: int = 16, seed: int = 0) -> dict:
    """Train an eager model and its graphed twin on the same batches (one fixed batch: the loss
    must fall); report whether losses and final parameters agree within RTOL."""
    eager, graphed = twins(seed)
    graph_layers(graphed, batch, seq)
    ids = torch.randint(0, TINY.vocab_size, (batch, seq), device="cuda")
    eager_losses = train(eager, [ids] * steps)
    graph_losses = train(graphed, [ids] * steps)
    params = max(rel(g, e) for g, e in zip(graphed.parameters(), eager.parameters(), strict=True))
    return {
        "same": max(rel(graph_losses, eager_losses), params) <= RTOL,
        "trains": bool(graph_losses[-1] < graph_losses[0]),
    }


# --8<-- [end:train]
