"""The memory-time Pareto front of checkpointing policies, and picking one for a memory budget.

Memory is deterministic (a byte count); time is measured: a Stat with a range (lo..hi over the
repeats), or a plain number where it is a model (FLOPs) or a stand-in. One point is faster than
another only beyond that range and a run-to-run margin, so the front and the pick do not move
with the noise.
"""

import math

# --8<-- [start:front]
# Two full runs of one commit on the H200 moved each policy's median by up to 1.1 % while the
# repeats of one run spread less than that: a measured point must be faster by twice the drift.
RUN_TO_RUN = 0.02


def faster(a: dict, b: dict, time: str = "ms") -> bool:
    """a is faster than b beyond the spread: a's slowest repeat beats b's fastest by more than
    RUN_TO_RUN. A plain number (a model) is its own range with no margin: a < b."""
    ta, tb = a[time], b[time]
    if not hasattr(ta, "hi"):
        return ta < tb
    return ta.hi < tb.lo * (1 - RUN_TO_RUN)


def pareto_front(points: list[dict], time: str = "ms") -> list[dict]:
    """From the least memory up, a point joins the front when it is faster (beyond the spread)
    than the last point that joined; the others need more memory for no measurable time.
    Each front point is faster than every one before it and needs no less memory."""
    front = []
    for p in sorted(points, key=lambda p: (p["peak"], getattr(p[time], "median", p[time]))):
        if not front or faster(p, front[-1], time):
            front.append(p)
    return front


def recommend(points: list[dict], budget: float, time: str = "ms") -> dict | None:
    """The front point with the most memory that fits the budget (None if none fits): no point
    that fits is faster beyond the spread, and of points within the spread of each other it is
    the one that needs the least memory. A larger budget never picks a slower point."""
    fits = [p for p in pareto_front(points, time) if p["peak"] <= budget]
    return fits[-1] if fits else None


# --8<-- [end:front]


# --8<-- [start:budget]
def scale_to(types: list[str], per_layer: dict, working: float, fixed: float, head: float) -> dict:
    """Predicted peak and time, per token, of a model whose layer i is of types[i].

    per_layer[type] = (bytes kept per token, ms per token), measured on a short stack;
    working = bytes per token that the layers' backward needs on top of what the forward kept
    (measured too; it does not grow with depth: the peak holds one layer's recomputation or
    backward, never two); head = the same for the LM head and the loss, whose peak comes first,
    while all that the layers kept is alive; the peak is the larger of the two. fixed = bytes
    that do not depend on the tokens (parameters, gradients, optimizer states).
    """
    kept = sum(per_layer[t][0] for t in types)
    ms = sum(per_layer[t][1] for t in types)
    return {"fixed": fixed, "bytes_per_token": kept + max(working, head), "ms_per_token": ms}


def max_tokens(model: dict, budget: float, multiple: int = 1) -> int:
    """Most tokens per micro-batch with fixed + tokens x bytes_per_token <= budget, rounded
    down to a multiple (a whole number of sequences)."""
    room = budget - model["fixed"]
    if room <= 0:
        return 0
    return math.floor(room / model["bytes_per_token"] / multiple) * multiple


# --8<-- [end:budget]
