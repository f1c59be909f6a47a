"""Measure policies on a layer stack and turn the measurements into a front and a budget table.

Device-generic: bench_gpu.py reads the CUDA caching allocator on the H200; the CPU tests run the
same functions on the TINY model with LiveMemory, where every byte can be predicted exactly.
"""

import itertools

import torch

from snippets.gradient_checkpointing import accounting as acc
from snippets.gradient_checkpointing.measure import LiveMemory
from snippets.gradient_checkpointing.pareto import max_tokens, pareto_front, recommend, scale_to
from snippets.gradient_checkpointing.policies import apply_policy


# --8<-- [start:meters]
class CudaMeter:
    """Bytes allocated since entering, and their peak, from the caching allocator's counters."""

    def __enter__(self):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        self.base = torch.cuda.memory_allocated()
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize()

    def now(self) -> int:
        return torch.cuda.memory_allocated() - self.base

    def peak(self) -> int:
        return torch.cuda.max_memory_allocated() - self.base


class CpuMeter:
    """The same readings on the CPU, from LiveMemory: storages allocated since entering."""

    def __enter__(self):
        self.live = LiveMemory().__enter__()
        return self

    def __exit__(self, *exc):
        self.live.__exit__(*exc)

    def now(self) -> int:
        return self.live.now()

    def peak(self) -> int:
        return self.live.peak


# --8<-- [end:meters]


# --8<-- [start:measure]
def measure(model, policy, ids, dy, meter) -> dict:
    """One forward and backward of model.hidden_states(ids) under a policy. Bytes are counted
    from just before the forward: kept = what the forward leaves for backward (its output
    excluded); layers[i] = what layer i + 1 adds (layer 0 also pays for the embedding);
    peak = the highest point of forward and backward together."""
    apply_policy(model, policy)
    marks = []
    hooks = [
        layer.register_forward_hook(lambda *_: marks.append(meter.now()))
        for layer in model.model.layers
    ]
    with meter:
        hidden = model.hidden_states(ids)
        kept = meter.now() - hidden.untyped_storage().nbytes()
        for hook in hooks:
            hook.remove()
        hidden.backward(dy)
        del hidden
    layers = [b - a for a, b in itertools.pairwise(marks)]
    return {"policy": policy.name, "kept": kept, "peak": meter.peak(), "layers": layers}


# --8<-- [end:measure]


# --8<-- [start:analyze]
def peak_bytes(model: dict, tokens: int) -> float:
    return model["fixed"] + tokens * model["bytes_per_token"]


def per_layer_costs(rows, policies, n_layers: int, tokens: int) -> dict:
    """{layer type: (bytes kept per token, ms per token)} from the policies whose layers are
    all of one type: the last layer's increment, and the step time shared by the layers."""
    costs = {}
    for row, policy in zip(rows, policies, strict=True):
        types = set(policy.types(n_layers))
        if len(types) == 1:
            costs[types.pop()] = (row["layers"][-1] / tokens, row["ms"] / n_layers / tokens)
    return costs


def analyze(rows, policies, cfg, seq: int, n_layers: int, itemsize: int, scenario: dict):
    """Rows for the measured stack and for the scenario, and the scenario's picks.

    rows: measure() results with "ms" (a Stat on the GPU, a number in the CPU tests) and
    "peak_half" (the peak at seq // 2 tokens) added, one per policy, "none" first, on a stack
    of n_layers layers of cfg and one sequence of seq tokens. scenario: {"layers", "fixed",
    "budget", "micro_batches", "head"} for the extrapolation to a deep model with its LM head
    and loss; fixed and budget in bytes, head in bytes per token (accounting.head_per_token).
    """
    none = rows[0]
    step = n_layers * acc.step_flops(cfg, 1, seq)
    front = [id(r) for r in pareto_front(rows)]
    pick = recommend(rows, none["peak"] / 2)  # the example: activation memory must be halved
    measured = []
    for i, (row, policy) in enumerate(zip(rows, policies, strict=True), 1):
        modes = policy.modes(n_layers)
        recompute = sum(acc.recompute_flops(cfg, 1, seq, m) for m in modes)
        measured.append(
            {
                "idx": i,
                "policy": policy.key,
                "kept_gib": row["kept"] / 2**30,
                "kept_formula_gib": acc.kept_after_forward(cfg, 1, seq, itemsize, modes) / 2**30,
                "peak_gib": row["peak"] / 2**30,
                "ms": row["ms"],
                "vs_none": 1.0 if row is none else row["ms"] / none["ms"],  # a ratio, not a gap
                "flop_ratio": 1 + recompute / step,  # the same ratio from matmul + attention FLOPs
                "front": id(row) in front,
                "recommended": row is pick,
            }
        )

    costs = per_layer_costs(rows, policies, n_layers, seq)
    deep, models = [], []
    for row, policy in zip(rows, policies, strict=True):
        # peak = offset + slope x tokens through the points at seq and seq // 2 tokens; the
        # offset does not grow with tokens (e.g. a weight's gradient before it is accumulated)
        slope = (row["peak"] - row["peak_half"]) / (seq - seq // 2)
        offset = row["peak"] - slope * seq
        working = slope - row["kept"] / seq  # kept is exactly proportional to the tokens
        types = policy.types(scenario["layers"])
        model = scale_to(types, costs, working, scenario["fixed"] + offset, scenario["head"])
        models.append((policy.key, model))
        deep.append(
            {
                "policy": policy.key,
                "gib_per_sequence": model["bytes_per_token"] * seq / 2**30,
                "offset_gib": offset / 2**30,
                "max_sequences": max_tokens(model, scenario["budget"], seq) // seq,
                "ms_per_sequence": model["ms_per_token"] * seq,
            }
        )
    picks = []
    for n in scenario["micro_batches"]:
        points = [
            {"policy": key, "peak": peak_bytes(m, n * seq), "ms": n * seq * m["ms_per_token"]}
            for key, m in models
        ]
        best = recommend(points, scenario["budget"])
        picks.append({"sequences": n, "policy": best["policy"] if best else None})
    return measured, deep, picks


# --8<-- [end:analyze]
