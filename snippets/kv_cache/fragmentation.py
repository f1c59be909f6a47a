"""Where the KV memory goes: contiguous reservation versus paging, on one request trace."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass

from snippets.common.datafile import load_request_lengths
from snippets.common.results import computed_result
from snippets.kv_cache.paged import BlockManager, OutOfBlocks, check_invariants


# --8<-- [start:trace]
@dataclass
class Request:
    prompt: int
    output: int

    @property
    def final(self) -> int:
        return self.prompt + self.output


def geometric(rng: random.Random, mean: float) -> int:
    """A length >= 1 with the given mean, from the geometric distribution: of all distributions
    on 1, 2, 3, ... with that mean it has the largest entropy (it assumes the least), and the
    sources publish means only."""
    if mean < 1:
        raise ValueError(f"a mean length is at least 1 token, got {mean}")
    if mean == 1:
        return 1
    return max(1, math.ceil(math.log(1 - rng.random()) / math.log(1 - 1 / mean)))


def make_trace(n: int, max_len: int = 2048, seed: int = 0, workload: str = "sharegpt"):
    """Prompt and output lengths with the means of a published workload (data/
    request_lengths.yaml: ShareGPT by default, as the vLLM paper tokenized it), each drawn from
    the geometric distribution, cut so that prompt <= max_len / 2 and prompt + output <= max_len;
    fully reproducible."""
    means = load_request_lengths()[workload]
    rng = random.Random(seed)
    trace = []
    for _ in range(n):
        prompt = min(geometric(rng, means["mean_input_tokens"]), max_len // 2)
        output = min(geometric(rng, means["mean_output_tokens"]), max_len - prompt)
        trace.append(Request(prompt, output))
    return trace


# --8<-- [end:trace]


# --8<-- [start:contiguous]
class Contiguous:
    """Each request reserves one contiguous range of slots (first fit) for `reserve(r)` tokens."""

    def __init__(self, slots: int, reserve):
        self.slots, self.reserve, self.ranges = slots, reserve, {}  # id -> (start, size)

    def _place(self, size: int) -> int | None:
        at = 0
        for start, length in sorted(self.ranges.values()):
            if start - at >= size:
                return at
            at = start + length
        return at if self.slots - at >= size else None

    def admit(self, rid: int, r: Request, length: int) -> bool:
        start = self._place(self.reserve(r))
        if start is not None:
            self.ranges[rid] = (start, self.reserve(r))
        return start is not None

    def grow(self, rid: int, length: int) -> bool:
        return True  # the range was reserved for the whole request up front

    def release(self, rid: int) -> None:
        del self.ranges[rid]

    def allocated(self, rid: int) -> int:
        return self.ranges[rid][1]


# --8<-- [end:contiguous]


# --8<-- [start:paged]
class Paged:
    """Blocks on demand through the BlockManager; the whole pool is one list of blocks."""

    def __init__(self, slots: int, block_size: int = 16):
        self.m = BlockManager(slots // block_size, block_size)

    def admit(self, rid: int, r: Request, length: int) -> bool:
        try:
            self.m.add(rid, length)
        except OutOfBlocks:
            return False
        return True

    def grow(self, rid: int, length: int) -> bool:
        try:
            self.m.append(rid)
        except OutOfBlocks:
            return False
        return True

    def release(self, rid: int) -> None:
        self.m.free(rid)

    def allocated(self, rid: int) -> int:
        return len(self.m.tables[rid]) * self.m.block_size


# --8<-- [end:paged]


# --8<-- [start:simulate]
def simulate(trace: list[Request], pool, slots: int) -> dict:
    """Continuous batching, one token per running request per step, FIFO admission. A request
    that cannot grow is preempted (its blocks freed, re-queued first: vLLM's recomputation).
    Every step each allocated slot is one of: used (holds a token), reserved (filled later by
    its request), internal (never filled); free slots count as external fragmentation while
    the next request waits and fails to fit. The shares are averaged over the steps where a
    request waits (the pool is the bottleneck); steps and mean_batch cover the whole run."""
    queue = deque((i, r, r.prompt) for i, r in enumerate(trace))
    running: dict[int, list] = {}  # id -> [request, current length]
    totals = dict.fromkeys(("used", "reserved", "internal", "external"), 0)
    steps = batch = preempted = saturated = 0
    while queue or running:
        while queue and pool.admit(queue[0][0], queue[0][1], queue[0][2]):
            rid, r, length = queue.popleft()
            running[rid] = [r, length]
        blocked = bool(queue)
        for rid in list(running):
            r, length = running[rid]
            if length == r.final:  # done: its memory returns to the pool
                pool.release(rid)
                del running[rid]
            elif pool.grow(rid, length):
                running[rid][1] = length + 1
            else:  # out of blocks: preempt the request, recompute it later
                pool.release(rid)
                del running[rid]
                queue.appendleft((rid, r, length))
                preempted += 1
        allocated = 0
        steps, batch = steps + 1, batch + len(running)
        if not blocked:
            continue
        saturated += 1
        for rid, (r, length) in running.items():
            a = pool.allocated(rid)
            allocated += a
            totals["used"] += length
            totals["reserved"] += min(a, r.final) - length
            totals["internal"] += a - min(a, r.final)
        totals["external"] += slots - allocated
    shares = {k: v / (saturated * slots) for k, v in totals.items()}
    return {**shares, "steps": steps, "mean_batch": batch / steps, "preempted": preempted}


# --8<-- [end:simulate]

# --8<-- [start:run]
MAX_LEN, SLOTS = 2048, 32 * 2048  # OPT-13B's context; a pool of 32 max-length requests
trace = make_trace(1000, MAX_LEN)
schemes = {
    "max-length": Contiguous(SLOTS, lambda r: MAX_LEN),  # reserve the model's maximum
    "pow2": Contiguous(SLOTS, lambda r: r.prompt + 2 ** math.ceil(math.log2(r.output))),
    "paged": Paged(SLOTS, block_size=16),
}
runs = {name: simulate(trace, pool, SLOTS) for name, pool in schemes.items()}
check_invariants(schemes["paged"].m)
for name, run in runs.items():
    print(name, round(run["used"], 2), round(run["mean_batch"]))
    #> max-length 0.24 30
    #> pow2 0.38 46
    #> paged 0.98 89
# --8<-- [end:run]

computed_result(
    "kv-cache",
    "fragmentation",
    {
        "requests": len(trace),
        "mean_prompt": sum(r.prompt for r in trace) / len(trace),
        "mean_output": sum(r.output for r in trace) / len(trace),
        "schemes": [{"scheme": name, **run} for name, run in runs.items()],
    },
)
