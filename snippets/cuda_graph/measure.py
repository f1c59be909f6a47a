"""Timing decode steps and training steps: eager, CUDA graph, torch.compile(reduce-overhead).

Every time is seen from Python, CPU overhead included, each step waited for (as a loop that
reads every token, or its loss every step). The steps that the host's speed can move -- every
decode step, the small model's training step -- are timed together, round by round, over one
window of seconds, each kept as the fastest of its repeats (hostbound.fastest_interleaved);
reduce-overhead by the fastest third after it compiles (step_ms), the GPU-bound 8B-wide
training step by all of its repeats.
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
# steps per timed repeat, each waited for; a repeat's value: its median step. A round of
# the window (all of them, one repeat each) takes ~90 ms: ~165 rounds in 15 s
DECODE_CALLS = {"eager": 2, "graph": 4}  # ~10-14 ms eager, ~4-7 ms replayed
TRAIN_CALLS = {"small": 1, "mid": 1}  # ~17 ms / ~9 ms (small), ~85 ms (mid)
COMPILED_CALLS, COMPILED_REPEATS = 4, 15  # reduce-overhead: the fastest 15 of 45 repeats
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


def decode_steps(cfg, batches, dtype, max_len: int = 512, pos: int = 256) -> dict:
    """One decode step at context position `pos` per batch size, eager and as a replayed CUDA
    graph (inputs copied into its static buffers included): {(batch, way): (step, calls)},
    for fastest_interleaved."""
    model = build(cfg, dtype)
    cache = random_cache(cfg, max(batches), max_len, dtype)
    graphed = GraphedDecoder(model, cache, batches)
    steps = {}
    for b in batches:
        tokens = torch.randint(0, cfg.vocab_size, (b,), device="cuda")
        at = torch.full((b,), pos, device="cuda")
        view = cache.rows(b)
        steps[b, "eager"] = (lambda v=view, t=tokens, p=at: decode_step(model, v, t, p),
                             DECODE_CALLS["eager"])  # fmt: skip
        steps[b, "graph"] = (lambda t=tokens, p=at: graphed(t, p), DECODE_CALLS["graph"])
    return steps


def latency_row(batch: int, eager, graph) -> dict:
    return {"batch": batch, "eager_ms": eager, "graph_ms": graph, "speedup": eager / graph,
            "tokens_per_s": batch / graph * 1e3}  # fmt: skip


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
    # the warm-up covers CUDA Graph Trees' own warm-up call and the call that records; the
    # fastest third: its replay runs Python around the graph, and at 15 repeats its time
    # spread ±13 % in one run (its fastest third of 45, ±0.3-0.5 % in four runs)
    ms = step_ms(lambda: step(tokens, at), calls=COMPILED_CALLS, warmup=8, settle_s=0.25,
                 repeats=COMPILED_REPEATS, fastest=True)  # fmt: skip
    return {"compile_ms": ms, "compile_s": compile_s,
            "cudagraph_skipped": counters["cudagraph_skips"] > skips}  # fmt: skip


# --8<-- [end:decode]


# --8<-- [start:train]
def train_step(cfg, batch: int, seq: int, dtype):
    """One training step (forward, backward, fused AdamW) eager, and the same step captured as
    a graph: (eager, graph.replay)."""
    model = build(cfg, dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    def eager():
        opt.zero_grad(set_to_none=True)
        model(ids, labels=ids).backward()
        opt.step()

    eager()  # the optimizer's state exists before capture
    graph, _ = captured_train_step(model, opt, ids)
    return eager, graph.replay


def train_row(eager, graph) -> dict:
    return {"eager_ms": eager, "graph_ms": graph, "speedup": eager / graph}


# --8<-- [end:train]
