"""On the H200: every policy on a Qwen3-8B-shaped stack of 4 layers, bf16, one 8192-token
sequence: bytes kept, peak memory, step time; the front; the peak of the LM head and the loss
at Qwen3's vocabulary; what fits 36 layers and the head on one GPU."""

import dataclasses
import time

import torch

from snippets.common.bench import kernel_ms
from snippets.common.hardware import load_hardware
from snippets.common.models.qwen3 import (
    QWEN3_8B,
    Qwen3ForCausalLM,
    count_parameters,
    lm_loss,
    rope_tables,
)
from snippets.common.results import write_result
from snippets.gradient_checkpointing import accounting as acc
from snippets.gradient_checkpointing.measure import OpNames, autograd_saved, is_attention
from snippets.gradient_checkpointing.policies import POLICIES, apply_policy
from snippets.gradient_checkpointing.runner import CudaMeter, analyze, measure

# --8<-- [start:run]
LAYERS, SEQ, DTYPE = 4, 8192, torch.bfloat16
cfg = dataclasses.replace(QWEN3_8B, num_hidden_layers=LAYERS, vocab_size=1024)  # full width
torch.manual_seed(0)
with torch.device("cuda"):
    model = Qwen3ForCausalLM(cfg).to(DTYPE)


def inputs(seq):
    ids = torch.randint(0, cfg.vocab_size, (1, seq), device="cuda")
    return ids, torch.randn(1, seq, cfg.hidden_size, device="cuda", dtype=DTYPE)


def step():
    model.hidden_states(ids).backward(dy)


ids, dy = inputs(SEQ)
t0 = time.perf_counter()
while time.perf_counter() - t0 < 1.0:  # a second of steps takes the clocks out of idle
    step()
    torch.cuda.synchronize()
rows = []
for policy in POLICIES:
    apply_policy(model, policy)
    step()  # warm-up: gradients and library workspaces are allocated once, before measuring
    row = measure(model, policy, ids, dy, CudaMeter())
    row["ms"] = kernel_ms(step, calls=1, warmup=1)  # GPU time; ~0.1 s of kernels a step
    row["peak_half"] = measure(model, policy, *inputs(SEQ // 2), CudaMeter())["peak"]
    rows.append(row)
# --8<-- [end:run]

# --8<-- [start:saved]
apply_policy(model, POLICIES[0])  # one plain layer: what autograd saves on CUDA
layer = model.model.layers[0]
x = torch.randn(1, SEQ, cfg.hidden_size, device="cuda", dtype=DTYPE, requires_grad=True)
cos, sin = rope_tables(cfg, SEQ, "cuda")
with OpNames() as ops:
    out, saved = autograd_saved(layer, x, cos, sin, model_state=list(model.parameters()))
saved_cuda = sum(n for n, _ in saved)
saved_formula = sum(s.bytes for s in acc.saved_tensors(cfg, 1, SEQ, DTYPE.itemsize))
attention_kernel = next(name for name in ops.names if is_attention(name))
del out, x, cos, sin, saved  # and the graph that holds the saved tensors
# --8<-- [end:saved]

# --8<-- [start:head]
# The LM head and the loss at the real vocabulary, alone: Qwen3-8B's lm_head weight and the final
# hidden states of one SEQ-token sequence, bf16, through the model's own lm_loss.
weight = torch.randn(QWEN3_8B.vocab_size, cfg.hidden_size, device="cuda", dtype=DTYPE)
weight.requires_grad_()
hidden = torch.randn(1, SEQ, cfg.hidden_size, device="cuda", dtype=DTYPE, requires_grad=True)
labels = torch.randint(0, QWEN3_8B.vocab_size, (1, SEQ), device="cuda")
lm_loss(hidden, weight, labels).backward()  # warm-up: gradients and cuBLAS workspaces exist
with CudaMeter() as meter:  # the second pass: bytes beyond the inputs and their gradients
    lm_loss(hidden, weight, labels).backward()
head_peak = meter.peak()
loss_tensors = acc.loss_peak(QWEN3_8B, SEQ, DTYPE.itemsize)
head_formula = sum(s.bytes for s in loss_tensors)
# The caching allocator rounds a block up to 512 B and hands out an unsplit block that is at
# most 1 MiB (kSmallSize) larger than asked: under 2 MiB per tensor alive at the peak.
head_slack = len(loss_tensors) * 2 * 2**20
del weight, hidden, labels
# --8<-- [end:head]

# --8<-- [start:record]
scenario = {  # Qwen3-8B, 36 layers, one H200 of 8 in ZeRO-1 (bf16 weights and grads, Adam / 8)
    "layers": QWEN3_8B.num_hidden_layers,
    "fixed": (2 + 2 + 12 / 8) * count_parameters(QWEN3_8B)["total"],
    "budget": load_hardware()["h200-sxm"].memory_gb * 1e9,
    "micro_batches": (1, 2, 4, 8),
    "head": acc.head_per_token(QWEN3_8B, DTYPE.itemsize),  # LM head + loss, bytes per token
}
measured, deep, picks = analyze(rows, POLICIES, cfg, SEQ, LAYERS, DTYPE.itemsize, scenario)
write_result(
    "gradient-checkpointing",
    "checkpoint-pareto",
    {
        "policies": measured,
        "saved_cuda_bytes": saved_cuda,
        "saved_formula_bytes": saved_formula,
        "attention_kernel": attention_kernel,
        "head_peak_bytes": head_peak,
        "head_formula_bytes": head_formula,
        "head_slack_bytes": head_slack,
    },
)
write_result(
    "gradient-checkpointing",
    "checkpoint-budget",
    {
        "fixed_gb": scenario["fixed"] / 1e9,
        "head_gib_per_sequence": scenario["head"] * SEQ / 2**30,
        "policies": deep,
        "picks": picks,
    },
)
# --8<-- [end:record]
