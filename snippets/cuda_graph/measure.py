"""Timing decode steps and training steps: eager, CUDA graph, torch.compile(reduce-overhead)."""

import statistics
import time
from dataclasses import replace

import torch

from snippets.cuda_graph.decode import StaticCache, decode_step
from snippets.cuda_graph.graphs import GraphedDecoder, captured_train_step
from snippets.qwen3_fusion.model import QWEN3_8B, Qwen3ForCausalLM

# --8<-- [start:configs]
SMALL = replace(  # Qwen3-0.6B's widths (hidden 1024, 16:8 heads of 128), 8 layers
    QWEN3_8B, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=8,
)  # fmt: skip
MID = replace(QWEN3_8B, num_hidden_layers=8)  # Qwen3-8B's widths, 8 layers
# --8<-- [end:configs]


def build(cfg, dtype, seed: int = 0):
    """Random weights, created on the GPU (an 8B-wide layer initialised on the CPU is slow)."""
    torch.manual_seed(seed)
    with torch.device("cuda"):
        return Qwen3ForCausalLM(cfg).to(dtype).eval()


# --8<-- [start:timing]
def wall_ms(fn, calls: int = 30, repeats: int = 5) -> float:
    """Median over `repeats` of the wall time of `calls` back-to-back calls, per call. Calls
    are not separated by synchronisation, as in a generation loop: CPU and GPU overlap."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times)


# --8<-- [end:timing]


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
    replayed CUDA graph, per batch size."""
    model = build(cfg, dtype)
    cache = StaticCache.empty(cfg, max(batches), max_len, dtype, "cuda")
    graphed = GraphedDecoder(model, cache, batches)
    rows = []
    for b in batches:
        tokens = torch.randint(0, cfg.vocab_size, (b,), device="cuda")
        at = torch.full((b,), pos, device="cuda")
        view = cache.rows(b)
        eager = wall_ms(lambda: decode_step(model, view, tokens, at))  # noqa: B023
        graph = wall_ms(lambda: graphed(tokens, at))  # noqa: B023
        rows.append({"batch": b, "eager_ms": eager, "graph_ms": graph, "speedup": eager / graph,
                     "tokens_per_s": b / graph * 1e3, "compile_ms": None})  # fmt: skip
    return rows


def compile_latency(cfg, rows, batches, dtype, max_len: int = 512, pos: int = 256):
    """Adds reduce-overhead's latency, first-call time and whether it skipped CUDA graphs to
    the rows of `batches`. Run after all eager timings: its compile workers use the CPU."""
    model = build(cfg, dtype)
    counters = torch._dynamo.utils.counters["inductor"]
    by = {r["batch"]: r for r in rows}
    for b in batches:
        tokens = torch.randint(0, cfg.vocab_size, (b,), device="cuda")
        at = torch.full((b,), pos, device="cuda")
        step = reduce_overhead_step(model, StaticCache.empty(cfg, b, max_len, dtype, "cuda"))
        skips = counters["cudagraph_skips"]
        t0 = time.perf_counter()
        step(tokens, at)
        by[b]["compile_s"] = time.perf_counter() - t0
        by[b]["compile_ms"] = wall_ms(lambda: step(tokens, at))  # noqa: B023
        by[b]["cudagraph_skipped"] = counters["cudagraph_skips"] > skips


# --8<-- [end:decode]


# --8<-- [start:train]
def train_step_times(cfg, batch: int, seq: int, dtype) -> dict:
    """One training step (forward, backward, fused AdamW) eager and as a replayed graph."""
    model = build(cfg, dtype).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")

    def eager():
        opt.zero_grad(set_to_none=True)
        model(ids, labels=ids).backward()
        opt.step()

    eager_ms = wall_ms(eager, calls=5, repeats=3)
    graph, _ = captured_train_step(model, opt, ids)
    graph_ms = wall_ms(graph.replay, calls=5, repeats=3)
    return {"eager_ms": eager_ms, "graph_ms": graph_ms, "speedup": eager_ms / graph_ms}


# --8<-- [end:train]
