"""Timing decode steps and training steps: eager, CUDA graph, torch.compile(reduce-overhead).

Every time is seen from Python, CPU overhead included: a decode step by step_ms (each step
waited for, as a loop that reads every token; the median step of each repeat; eager, which is
CPU-bound, by the fastest third of its repeats), a training step likewise (each step waited
for, as a loop that reads its loss every step; the CPU-bound small one by the fastest third).
"""

import time
from dataclasses import replace

import torch

from snippets.common.bench import step_ms
from snippets.common.models.qwen3 import QWEN3_8B, Qwen3ForCausalLM
from snippets.cuda_graph.decode import StaticCache, decode_step
from snippets.cuda_graph.graphs import GraphedDecoder, captured_train_step

# --8<-- [start:configs]
SMALL = replace(  # Qwen3-0.6B's widths (hidden 1024, 16:8 heads of 128), 4 layers
    QWEN3_8B, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
    num_attention_heads=16, num_key_value_heads=8,
)  # fmt: skip
MID = replace(QWEN3_8B, num_hidden_layers=4)  # Qwen3-8B's widths, 4 layers
CALLS = 8  # decode steps per timed repeat, each waited for; a repeat's value: its median step
EAGER_REPEATS, EAGER_CALLS = 15, 4  # eager: the fastest 15 of 45 repeats of 4 steps
# (step_ms(fastest=True)); at 10 of 30 repeats of 8 steps one row spread ±12 %: the host
# was fast for less than a third of the timing
# eager settles 1 s, the process's first eager timing 3 s: the host was slow longer after
# the first models were built (the first row spread ±6.7 %, the others ±1 %)
EAGER_SETTLE_S = iter([3.0])
# --8<-- [end:configs]


def build(cfg, dtype, device="cuda", seed: int = 0):
    """Random weights, created on the device (an 8B-wide layer initialised on the CPU is slow)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return Qwen3ForCausalLM(cfg).to(dtype).eval()


def random_cache(cfg, batch: int, max_len: int, dtype, device="cuda") -> StaticCache:
    """A static cache full of random keys and values: timings are taken on non-zero data."""
    cache = StaticCache.empty(cfg, batch, max_len, dtype, device)
    cache.k.normal_()
    cache.v.normal_()
    return cache


# --8<-- [start:decode]
def reduce_overhead_step(model, cache: StaticCache):
    """torch.compile's CUDA-graph mode for the same step. The cache is mutated in place, so
    its tensors are marked static; otherwise the compiled step skips CUDA graphs."""
    for t in (cache.k, cache.v):
        torch._dynamo.mark_static_address(t)
    compiled = torch.compile(decode_step, mode="reduce-overhead")

    def step(tokens, pos):
        torch.compiler.cudagraph_mark_step_begin()  # outputs of the last call may be overwritten
        return compiled(model, cache, tokens, pos)

    return step


def decode_latency(cfg, batches, dtype, max_len: int = 512, pos: int = 256) -> list[dict]:
    """Per-token latency of one decode step at context position `pos`, eager and as a
    replayed CUDA graph (inputs copied into its static buffers included), per batch size."""
    model = build(cfg, dtype)
    cache = random_cache(cfg, max(batches), max_len, dtype)
    graphed = GraphedDecoder(model, cache, batches)
    rows = []
    for b in batches:
        tokens = torch.randint(0, cfg.vocab_size, (b,), device="cuda")
        at = torch.full((b,), pos, device="cuda")
        view = cache.rows(b)
        eager = step_ms(lambda: decode_step(model, view, tokens, at), calls=EAGER_CALLS,  # noqa: B023
                        repeats=EAGER_REPEATS, fastest=True,
                        settle_s=next(EAGER_SETTLE_S, 1.0))  # fmt: skip
        # a shorter settling time: a replay is mostly GPU time; still the fastest third: on a
        # slow host 3 of 15 repeats ran 6 % slow (the input copies and the sync are host work)
        graph = step_ms(lambda: graphed(tokens, at), calls=CALLS, settle_s=0.25,  # noqa: B023
                        fastest=True)  # fmt: skip
        rows.append({"batch": b, "eager_ms": eager, "graph_ms": graph, "speedup": eager / graph,
                     "tokens_per_s": b / graph * 1e3})  # fmt: skip
    return rows


def compiled_latency(cfg, batch: int, dtype, max_len: int = 512, pos: int = 256,
                     device="cuda") -> dict:  # fmt: skip
    """reduce-overhead at one batch size: the first call's time (compiling, in seconds), the
    per-token latency after it, and whether it skipped CUDA graphs. Run it after every eager
    timing: torch.compile's workers use the CPU."""
    model = build(cfg, dtype, device)
    tokens = torch.randint(0, cfg.vocab_size, (batch,), device=device)
    at = torch.full((batch,), pos, device=device)
    step = reduce_overhead_step(model, random_cache(cfg, batch, max_len, dtype, device))
    counters = torch._dynamo.utils.counters["inductor"]
    skips = counters["cudagraph_skips"]
    t0 = time.perf_counter()
    step(tokens, at)
    compile_s = time.perf_counter() - t0
    # the warm-up covers CUDA Graph Trees' own warm-up call and the call that records
    # the fastest third, as eager: CUDA Graph Trees' replay runs Python around the graph, and
    # at 15 repeats its time spread ±13 % in one run (eager's, taken so, ±1-2 %)
    ms = step_ms(lambda: step(tokens, at), calls=EAGER_CALLS, warmup=CALLS, settle_s=0.25,
                 repeats=EAGER_REPEATS, fastest=True)  # fmt: skip
    return {"compile_ms": ms, "compile_s": compile_s,
            "cudagraph_skipped": counters["cudagraph_skips"] > skips}  # fmt: skip


# --8<-- [end:decode]


# --8<-- [start:train]
def train_step_times(cfg, batch: int, seq: int, dtype, calls: int, fastest: bool) -> dict:
    """One training step (forward, backward, fused AdamW) eager and as a replayed graph, each
    step waited for, `calls` steps per repeat; eager by the fastest third where it is bound by
    the CPU (`fastest`), as the eager decode step."""
    model = build(cfg, dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    def eager():
        opt.zero_grad(set_to_none=True)
        model(ids, labels=ids).backward()
        opt.step()

    eager_ms = step_ms(eager, calls=calls, fastest=fastest)
    graph, _ = captured_train_step(model, opt, ids)
    graph_ms = step_ms(graph.replay, calls=calls, settle_s=0.25)
    return {"eager_ms": eager_ms, "graph_ms": graph_ms, "speedup": eager_ms / graph_ms}


# --8<-- [end:train]
