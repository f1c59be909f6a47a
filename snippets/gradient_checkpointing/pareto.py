"""The memory-time Pareto front of checkpointing policies, and picking one for a memory budget."""

import math


# --8<-- [start:front]
def dominates(a: dict, b: dict, time: str = "ms") -> bool:
    """a needs no more memory and no more time than b, and strictly less of one."""
    no_worse = a["peak"] <= b["peak"] and a[time] <= b[time]
    return no_worse and (a["peak"] < b["peak"] or a[time] < b[time])


def pareto_front(points: list[dict], time: str = "ms") -> list[dict]:
    """The points no other point dominates, from the least memory to the most."""
    front = [p for p in points if not any(dominates(q, p, time) for q in points)]
    return sorted(front, key=lambda p: (p["peak"], p[time]))


def recommend(points: list[dict], budget: float, time: str = "ms") -> dict | None:
    """The fastest point whose peak fits the budget (ties: less memory); None if none fits.
    It is always on the front: a point that dominated it would also fit and be no slower."""
    fits = [p for p in points if p["peak"] <= budget]
    return min(fits, key=lambda p: (p[time], p["peak"])) if fits else None


# --8<-- [end:front]


# --8<-- [start:budget]
def scale_to(types: list[str], per_layer: dict, working: float, fixed: float) -> dict:
    """Predicted peak and time, per token, of a stack whose layer i is of types[i].

    per_layer[type] = (bytes kept per token, ms per token), measured on a short stack;
    working = bytes per token that backward needs on top of what the forward kept (measured
    too; it does not grow with depth: the peak holds one layer's recomputation or backward,
    never two); fixed = bytes that do not depend on the tokens (parameters, gradients,
    optimizer states).
    """
    kept = sum(per_layer[t][0] for t in types)
    ms = sum(per_layer[t][1] for t in types)
    return {"fixed": fixed, "bytes_per_token": kept + working, "ms_per_token": ms}


def max_tokens(model: dict, budget: float, multiple: int = 1) -> int:
    """Most tokens per micro-batch with fixed + tokens x bytes_per_token <= budget, rounded
    down to a multiple (a whole number of sequences)."""
    room = budget - model["fixed"]
    if room <= 0:
        return 0
    return math.floor(room / model["bytes_per_token"] / multiple) * multiple


# --8<-- [end:budget]
