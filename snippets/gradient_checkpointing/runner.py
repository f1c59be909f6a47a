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
    """Table rows for the measured stack and for the scenario, and the values the page cites.

    rows: measure() results with "ms" (and optionally "peak_half", the peak at seq // 2 tokens)
    added, one per policy, "none" first, on a stack of n_layers layers of cfg and one sequence
    of seq tokens. scenario: {"layers", "fixed", "budget", "micro_batches"} for the
    extrapolation to a deep model; fixed and budget in bytes.
    """
    none = rows[0]
    step = n_layers * acc.step_flops(cfg, 1, seq)
    measured = []
    for i, (row, policy) in enumerate(zip(rows, policies, strict=True), 1):
        modes = policy.modes(n_layers)
        recompute = sum(acc.recompute_flops(cfg, 1, seq, m) for m in modes)
        measured.append(
            {
                "idx": i,
                "policy": policy.name,
                "kept_gib": row["kept"] / 2**30,
                "kept_predicted_gib": acc.kept_after_forward(cfg, 1, seq, itemsize, modes) / 2**30,
                "peak": row["peak"],
                "peak_gib": row["peak"] / 2**30,
                "ms": row["ms"],
                "ms_p20": row.get("ms_p20"),
                "ms_p80": row.get("ms_p80"),
                "slowdown": row["ms"] / none["ms"] - 1,
                "flop_slowdown": recompute / step,
            }
        )
    front = pareto_front(measured)
    budget = none["peak"] / 2  # the example: activation memory must be halved
    pick = recommend(measured, budget)
    for r in measured:
        r["front"] = r in front
        r["recommended"] = r is pick
        r["mark"] = ("✓" if r["front"] else "") + (" ★" if r["recommended"] else "")

    costs = per_layer_costs(rows, policies, n_layers, seq)
    deep = []
    for row, policy in zip(rows, policies, strict=True):
        # peak = offset + slope x tokens through the points at seq and seq // 2 tokens; the
        # offset does not grow with tokens (e.g. a weight's gradient before it is accumulated)
        if "peak_half" in row:
            slope = (row["peak"] - row["peak_half"]) / (seq - seq // 2)
        else:
            slope = row["peak"] / seq
        offset = row["peak"] - slope * seq
        working = slope - row["kept"] / seq  # kept is exactly proportional to the tokens
        model = scale_to(policy.types(scenario["layers"]), costs, working, scenario["fixed"])
        model["fixed"] += offset
        deep.append(
            {
                "policy": policy.name,
                "gib_per_sequence": model["bytes_per_token"] * seq / 2**30,
                "offset_gib": offset / 2**30,
                "max_sequences": max_tokens(model, scenario["budget"], seq) // seq,
                "ms_per_sequence": model["ms_per_token"] * seq,
                "ms": model["ms_per_token"] * seq,
                "model": model,
            }
        )
    picks = {}
    for n in scenario["micro_batches"]:
        points = [
            {"policy": d["policy"], "peak": peak_bytes(d["model"], n * seq), "ms": n * d["ms"]}
            for d in deep
        ]
        best = recommend(points, scenario["budget"])
        picks[str(n)] = best["policy"] if best else "—"
    values = {
        "front": [r["policy"] for r in front],
        "recommended": pick["policy"] if pick else "—",
        "budget_gib": budget / 2**30,
        "kept_error": max(abs(r["kept_gib"] / r["kept_predicted_gib"] - 1) for r in measured),
        "recommend": picks,
    }
    for d in deep:
        del d["model"], d["ms"]
    return measured, deep, values


# --8<-- [end:analyze]
