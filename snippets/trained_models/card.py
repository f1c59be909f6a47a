"""The shared trained models' card: their shapes and parameter counts (computed here from
data/trained_models.yaml, on any machine), and the functions that measure the rest on the GPU:
a training run's step time, tokens/s and MFU (the metrics post's formulas), and the target's
decode step against the time its weight bytes take at copy bandwidth.

bench_gpu.py runs the measurements on the H200 with the handbook's timers;
tests/snippets/test_trained_models.py runs them on the CPU at tiny shapes with a stand-in timer.
"""

import time

import torch

from snippets.common.models.qwen3_moe import Qwen3MoeConfig
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.results import Stat, computed_result
from snippets.common.train import build_model, model_config
from snippets.cuda_graph.decode import StaticCache, decode_step
from snippets.metrics.training import flops_per_token_6n, mfu, tgs


# --8<-- [start:shapes]
def counts(cfg) -> dict:
    """Parameters stored (a tied head is the embedding: counted once) and N, those one token
    is multiplied by: every layer's weights (of a MoE, only the k experts the token goes to)
    and the LM head, not the input embedding, a lookup (the metrics post's N for 6N)."""
    with torch.device("meta"):
        model = build_model(cfg)
    total = sum(p.numel() for p in model.parameters())
    embedding = model.model.embed_tokens.weight
    lookup = 0 if model.lm_head.weight is embedding else embedding.numel()
    idle = 0
    if isinstance(cfg, Qwen3MoeConfig):  # experts a token does not go to
        per_expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size
        idle = cfg.num_hidden_layers * (cfg.num_experts - cfg.num_experts_per_tok) * per_expert
    return {"params": total, "n_matmul": total - lookup - idle}


def shape_rows(spec) -> list[dict]:
    """One row per model: its shape (a dense MLP counts as one expert, always chosen), its
    counts, its training tokens per seed, its seeds and the held-out loss it must reach."""
    rows = []
    for name, entry in spec.models.items():
        cfg = model_config(entry.kind, entry.config, spec.tokenizer.vocab_size)
        moe = isinstance(cfg, Qwen3MoeConfig)
        tc = entry.train
        rows.append({
            "model": name, "layers": cfg.num_hidden_layers, "hidden": cfg.hidden_size,
            "heads": cfg.num_attention_heads, "kv_heads": cfg.num_key_value_heads,
            "experts": cfg.num_experts if moe else 1,
            "top_k": cfg.num_experts_per_tok if moe else 1,
            "mlp_width": cfg.moe_intermediate_size if moe else cfg.intermediate_size,
            **counts(cfg),
            "steps": tc["steps"], "tokens": tc["steps"] * tc["batch_size"] * tc["seq_len"],
            "seeds": entry.seeds, "max_heldout_loss": entry.max_heldout_loss,
        })  # fmt: skip
    return rows


SHAPES = shape_rows(load_trained_models())
computed_result("trained-models", "shapes", {"models": SHAPES})
print([(r["model"], round(r["params"] / 1e6, 1)) for r in SHAPES])  # millions of parameters
#> [('target', 721.4), ('draft', 16.3), ('moe', 44.6)]
# --8<-- [end:shapes]


# --8<-- [start:run]
def run_row(name: str, stats: dict, n_matmul: int, peak: float, run_s: float) -> dict:
    """One training run (the trainer's stats): its step time -- every chunk of steps but the
    first, which holds the warm-up and the graph capture, is a repeat -- and from it tokens/s
    and MFU by 6N against the datasheet peak; its held-out loss before and after training;
    whether its steps were a replayed CUDA graph; run_s, the run's whole wall time (model,
    evaluations, training, checkpoint), for the budget."""
    step_ms = Stat.of(stats["step_ms"][1:], "python")
    per_gpu = tgs(stats["tokens"] / stats["steps"], step_ms / 1e3, n_gpus=1)
    return {
        "model": name, "seed": stats["seed"], "step_ms": step_ms, "tokens_per_s": per_gpu,
        "mfu": mfu(per_gpu, flops_per_token_6n(n_matmul), 1, peak),
        "heldout_loss_init": stats["heldout_loss_init"], "heldout_loss": stats["heldout_loss"],
        "graphed": stats["graphed"], "run_s": run_s,
    }  # fmt: skip


# --8<-- [end:run]


# --8<-- [start:decode]
def weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: every parameter but the input embedding, of
    which it reads one row; a tied LM head is that matrix, read whole."""
    embedding = model.model.embed_tokens.weight
    read = [p for p in model.parameters() if p is not embedding or model.lm_head.weight is p]
    return sum(p.numel() * p.element_size() for p in read)


# compiled and eager logits agree to a few bf16 roundings (u = 2^-8): Inductor keeps a fused
# chain in fp32 where eager rounds each operator's output; a wrong compilation is far off
DECODE_TOL = 8 * 2.0**-8


def decode_times(model, timer, *, context: int = 256, max_len: int = 512,
                 compiler=torch.compile) -> dict:  # fmt: skip
    """One decode step of `model` (batch 1, at position `context` of a static cache of max_len
    slots, the cuda-graph post's decode_step), timed by `timer` (fn -> Stat) as it is and as
    compiled by `compiler`; the compiled step's logits are checked against the eager ones."""
    w = next(model.parameters())
    cache = StaticCache.empty(model.config, 1, max_len, w.dtype, w.device)
    cache.k.normal_(generator=torch.Generator(w.device).manual_seed(0))  # non-zero data
    cache.v.normal_(generator=torch.Generator(w.device).manual_seed(1))
    tokens = torch.zeros(1, dtype=torch.long, device=w.device)
    pos = torch.full((1,), context, device=w.device)
    compiled = compiler(decode_step)
    eager_logits = decode_step(model, cache, tokens, pos).float()
    started = time.perf_counter()
    compiled_logits = compiled(model, cache, tokens, pos).float()  # compiles
    compile_s = time.perf_counter() - started
    err = ((compiled_logits - eager_logits).norm() / eager_logits.norm()).item()
    if not err <= DECODE_TOL:
        raise AssertionError(f"compiled decode step: logits differ from eager by {err:.3g} "
                             f"(norm-wise), more than {DECODE_TOL:.3g}")  # fmt: skip
    return {"eager_ms": timer(lambda: decode_step(model, cache, tokens, pos)),
            "compiled_ms": timer(lambda: compiled(model, cache, tokens, pos)),
            "compile_s": compile_s}  # fmt: skip


def decode_row(times: dict, n_bytes: int, copy_bytes_per_s) -> dict:
    """Each way of running the step against the bound: its weight bytes read once at the copy
    bandwidth measured in the same run (the KV cache it reads too is left out of the bound)."""
    bound_ms = n_bytes / copy_bytes_per_s * 1e3
    steps = {k: v for k, v in times.items() if k.endswith("_ms")}
    return {
        "weight_gb": n_bytes / 1e9, "copy_tb_s": copy_bytes_per_s / 1e12, "bound_ms": bound_ms,
        "compile_s": times["compile_s"],
        "steps": [{"step": step.removesuffix("_ms"), "ms": ms, "of_bound": ms / bound_ms}
                  for step, ms in steps.items()],
    }  # fmt: skip


# --8<-- [end:decode]
