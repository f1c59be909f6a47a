"""The page's CPU checks: the accounting against autograd, the policies against the accounting.

Everything here runs on the CPU on purpose (fp32/bf16 kernels there are deterministic), so the
page prints the same numbers on a GPU machine.
"""

import dataclasses

import torch

from snippets.common.models.qwen3 import (
    QWEN3_8B,
    TINY,
    DecoderLayer,
    Kernels,
    Qwen3ForCausalLM,
    lm_loss,
    rope_tables,
)
from snippets.common.results import computed_result
from snippets.gradient_checkpointing import accounting as acc
from snippets.gradient_checkpointing.measure import LiveMemory, MatmulFlops, autograd_saved
from snippets.gradient_checkpointing.pareto import pareto_front, recommend
from snippets.gradient_checkpointing.policies import POLICIES, apply_policy

# --8<-- [start:table]
tiny = acc.saved_tensors(TINY, batch=2, seq=16, itemsize=4)  # fp32
big = acc.saved_tensors(QWEN3_8B, batch=1, seq=8192, itemsize=2)  # bf16
print(f"{'operator':<25}{'tensor':<32}{'bytes':<10}{'TINY B':>8}{'8B MiB':>9}")
#> operator                 tensor                          bytes       TINY B   8B MiB
for s, b in zip(tiny, big, strict=True):
    mib = b.bytes / 2**20
    print(f"{s.producer:<25}{s.tensor:<32}{s.formula:<10}{s.bytes:>8}{mib:>9.1f}")
    #> input_layernorm          x.float()                       4·t·h         8192    128.0
    #> input_layernorm          rstd                            4·t            128      0.0
    #> input_layernorm          (x·rstd).to(dtype)              e·t·h         8192     64.0
    #> input_layernorm          output (q/k/v_proj input)       e·t·h         8192     64.0
    #> q_norm + k_norm          x.float()                       4·t·n_q·d     8192    128.0
    #> q_norm + k_norm          rstd                            4·t·n_q        512      1.0
    #> q_norm + k_norm          (x·rstd).to(dtype)              e·t·n_q·d     8192     64.0
    #> q_norm + k_norm          x.float()                       4·t·n_kv·d    4096     32.0
    #> q_norm + k_norm          rstd                            4·t·n_kv       256      0.2
    #> q_norm + k_norm          (x·rstd).to(dtype)              e·t·n_kv·d    4096     16.0
    #> v_proj                   v                               e·t·n_kv·d    4096     16.0
    #> rope (q, k)              cos                             e·s·d         1024      2.0
    #> rope (q, k)              sin                             e·s·d         1024      2.0
    #> rope (q, k)              q rotated                       e·t·n_q·d     8192     64.0
    #> rope (q, k)              k rotated                       e·t·n_kv·d    4096     16.0
    #> attention                output (o_proj input)           e·t·n_q·d     8192     64.0
    #> attention                logsumexp                       4·t·n_q        512      1.0
    #> post_attention_layernorm x.float()                       4·t·h         8192    128.0
    #> post_attention_layernorm rstd                            4·t            128      0.0
    #> post_attention_layernorm (x·rstd).to(dtype)              e·t·h         8192     64.0
    #> post_attention_layernorm output (gate/up_proj input)     e·t·h         8192     64.0
    #> gate_proj                gate                            e·t·I        24576    192.0
    #> up_proj                  up                              e·t·I        24576    192.0
    #> silu(gate) * up          silu(gate)                      e·t·I        24576    192.0
    #> silu(gate) * up          silu(gate)·up (down_proj input) e·t·I        24576    192.0
# --8<-- [end:table]


# --8<-- [start:hooks]
def layer_check(cfg, batch, seq, dtype):
    """(storages saved, their bytes, equal to the formulas tensor by tensor) for one layer."""
    torch.manual_seed(0)
    layer = DecoderLayer(cfg, Kernels()).to(dtype)
    x = torch.randn(batch, seq, cfg.hidden_size, dtype=dtype, requires_grad=True)
    cos, sin = rope_tables(cfg, seq)
    _, got = autograd_saved(layer, x, cos, sin, model_state=list(layer.parameters()))
    want = acc.saved_tensors(cfg, batch, seq, dtype.itemsize)
    same = sorted((n, d.itemsize) for n, d in got) == sorted((s.bytes, s.itemsize) for s in want)
    return len(got), sum(n for n, _ in got), same


for dtype in (torch.float32, torch.bfloat16):
    print(dtype, *layer_check(TINY, batch=2, seq=16, dtype=dtype))
    #> torch.float32 25 200192 True
    #> torch.bfloat16 25 115200 True
# --8<-- [end:hooks]

# --8<-- [start:per_token]
one, two = (acc.saved_tensors(QWEN3_8B, batch=b, seq=8192, itemsize=2) for b in (1, 2))
per_token = (sum(s.bytes for s in two) - sum(s.bytes for s in one)) // 8192
h = QWEN3_8B.hidden_size
print(f"{per_token:,} B per token per layer = {per_token / h:.2f} h")
#> 215,336 B per token per layer = 52.57 h
layer = sum(s.bytes for s in one)
print(f"one layer at 8192 tokens: {layer / 2**30:.2f} GiB; 36 layers: {36 * layer / 2**30:.1f} GiB")
#> one layer at 8192 tokens: 1.65 GiB; 36 layers: 59.3 GiB
fp32_copies = sum(s.bytes for s in one if s.tensor == "x.float()")
print(f"fp32 copies of norm inputs: {fp32_copies / layer:.0%}")
#> fp32 copies of norm inputs: 25%
boundary = 2 * h  # a checkpointed layer keeps only its bf16 input
print(f"inside / boundary = {per_token / boundary:.1f}")
#> inside / boundary = 26.3
print(f"best segment length sqrt(L x 2h / M) = {(36 * boundary / per_token) ** 0.5:.2f} layers")
#> best segment length sqrt(L x 2h / M) = 1.17 layers
# --8<-- [end:per_token]

# --8<-- [start:operators]
print(f"{'operator':<25}{'kind':<12}{'MiB kept':>9}{'GFLOP':>8}{'FLOP/B':>9}")
#> operator                 kind         MiB kept   GFLOP   FLOP/B
rows = acc.by_operator(QWEN3_8B, batch=1, seq=8192, itemsize=2)
for r in rows:
    ratio = f"{r['flops'] / r['bytes']:>9.1f}" if r["bytes"] else f"{'—':>9}"
    mib, gflop = r["bytes"] / 2**20, r["flops"] / 1e9
    print(f"{r['op']:<25}{r['kind']:<12}{mib:>9.1f}{gflop:>8.1f}{ratio}")
    #> input_layernorm          norm            256.0     0.1      0.5
    #> q_proj                   matmul            0.0   274.9        —
    #> k_proj                   matmul            0.0    68.7        —
    #> v_proj                   matmul           16.0    68.7   4096.0
    #> q_norm + k_norm          norm            241.2     0.2      0.7
    #> rope (q, k)              elementwise      84.0     0.1      1.4
    #> attention                attention        65.0   549.8   8066.0
    #> o_proj                   matmul            0.0   274.9        —
    #> residual add             elementwise       0.0     0.0        —
    #> post_attention_layernorm norm            256.0     0.1      0.5
    #> gate_proj                matmul          192.0   824.6   4096.0
    #> up_proj                  matmul          192.0   824.6   4096.0
    #> silu(gate) * up          elementwise     384.0     0.5      1.2
    #> down_proj                matmul            0.0   824.6        —
cheap = sum(r["bytes"] for r in rows if r["kind"] in ("norm", "elementwise"))
print(f"held by norms and elementwise ops: {cheap / sum(r['bytes'] for r in rows):.0%}")
#> held by norms and elementwise ops: 72%
# --8<-- [end:operators]

# --8<-- [start:policies]
cfg = dataclasses.replace(TINY, num_hidden_layers=4)
torch.manual_seed(0)
model = Qwen3ForCausalLM(cfg)  # fp32 on the CPU: every kernel is deterministic
ids = torch.randint(0, cfg.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
dy = torch.randn(2, 64, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
model.hidden_states(ids).backward(dy)  # gradients exist from here on: only activations move


def run(policy):
    """Gradients, bytes kept after the forward, peak bytes, and matmul + attention FLOPs."""
    apply_policy(model, policy)
    model.zero_grad(set_to_none=False)
    with MatmulFlops() as flops, LiveMemory() as mem:
        hidden = model.hidden_states(ids)
        kept = mem.now() - hidden.untyped_storage().nbytes()
        hidden.backward(dy)
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return grads, kept, mem.peak, flops.flops


reference, _, _, base_flops = run(POLICIES[0])
peaks = {}
for policy in POLICIES:
    grads, kept, peaks[policy.name], counted = run(policy)
    modes = policy.modes(cfg.num_hidden_layers)
    predicted = acc.kept_after_forward(cfg, 2, 64, 4, modes)
    recompute = sum(acc.recompute_flops(cfg, 2, 64, m) for m in modes)
    identical = all(torch.equal(g, r) for g, r in zip(grads, reference, strict=True))
    checks = identical, kept == predicted, counted - base_flops == recompute
    print(f"{policy.name:<30}{kept:>9}{recompute / 1e6:>7.1f} MFLOP", *checks)
    #> none                            3244544    0.0 MFLOP True True True
    #> full                             205312   41.9 MFLOP True True True
    #> all but last                     965120   31.5 MFLOP True True True
    #> even layers                     1724928   21.0 MFLOP True True True
    #> odd layers                      1724928   21.0 MFLOP True True True
    #> sac: attention                   344576   37.7 MFLOP True True True
    #> sac: attention + q/k/v/o         737792   25.2 MFLOP True True True
    #> sac: attention + gate/up        1131008   12.6 MFLOP True True True
    #> sac: all matmuls + attention    1655296    0.0 MFLOP True True True
    #> sac: all but down_proj          1524224    0.0 MFLOP True True True
# --8<-- [end:policies]

# --8<-- [start:last_layer]
one_layer = acc.kept_per_layer(cfg, 2, 64, 4, None)  # what a layer saves when not checkpointed
odd_costs_more = peaks["odd layers"] - peaks["even layers"] > 0.5 * one_layer
last_saves_little = abs(peaks["full"] - peaks["all but last"]) < 0.2 * one_layer
print(odd_costs_more, last_saves_little)
#> True True
# --8<-- [end:last_layer]


# --8<-- [start:predicted]
def predicted_points(cfg, seq, n_layers):
    """Per policy: peak bytes (every layer's share, plus the full saved set of the layer being
    recomputed or differentiated) and FLOPs of a step (matmuls and attention only)."""
    saved = acc.kept_per_layer(cfg, 1, seq, 2, None)
    points = []
    for policy in POLICIES:
        modes = policy.modes(n_layers)
        kept = [acc.kept_per_layer(cfg, 1, seq, 2, m) for m in modes]
        last = saved + (kept[-1] if modes[-1] is not None else 0)
        recompute = sum(acc.recompute_flops(cfg, 1, seq, m) for m in modes)
        flops = n_layers * acc.step_flops(cfg, 1, seq) + recompute
        points.append({"name": policy.name, "peak": sum(kept[:-1]) + last, "flops": flops})
    return points


points = predicted_points(QWEN3_8B, seq=8192, n_layers=36)
front = pareto_front(points, time="flops")
none_flops = points[0]["flops"]
for p in points:
    mark = "front" if p in front else ""
    extra = p["flops"] / none_flops - 1
    print(f"{p['name']:<30}{p['peak'] / 2**30:>6.1f} GiB {extra:>+6.1%} FLOPs {mark}".rstrip())
    #> none                            59.3 GiB  +0.0% FLOPs
    #> full                             3.9 GiB +25.3% FLOPs
    #> all but last                     3.8 GiB +24.6% FLOPs front
    #> even layers                     30.8 GiB +12.7% FLOPs
    #> odd layers                      32.4 GiB +12.7% FLOPs
    #> sac: attention                   6.2 GiB +20.5% FLOPs front
    #> sac: attention + q/k/v/o        11.8 GiB +14.5% FLOPs front
    #> sac: attention + gate/up        19.7 GiB  +6.0% FLOPs front
    #> sac: all matmuls + attention    27.6 GiB  +0.0% FLOPs
    #> sac: all but down_proj          25.3 GiB  +0.0% FLOPs front
picks = {gib: recommend(points, gib * 2**30, time="flops")["name"] for gib in (40, 16, 8)}
print(picks)
#> {40: 'sac: all but down_proj', 16: 'sac: attention + q/k/v/o', 8: 'sac: attention'}
# --8<-- [end:predicted]


# --8<-- [start:head]
def loss_check(dtype, tokens=40, hidden=16, vocab=300):
    """lm_loss's forward + backward on the CPU: its peak beyond the inputs (LiveMemory), the
    formula, and the bytes autograd saves (saved_tensors_hooks) beyond the inputs."""
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(vocab, hidden, dtype=dtype))
    h = torch.randn(1, tokens, hidden, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (1, tokens))
    with LiveMemory() as mem:
        lm_loss(h, weight, labels).backward()
    cfg = dataclasses.replace(TINY, hidden_size=hidden, vocab_size=vocab)
    formula = sum(s.bytes for s in acc.loss_peak(cfg, tokens, dtype.itemsize))
    _, saved = autograd_saved(lambda x: lm_loss(x, weight, labels), h, model_state=[weight])
    return mem.peak, formula, sum(n for n, _ in saved) - h.nbytes - labels.nbytes


for dtype in (torch.float32, torch.bfloat16):
    peak, formula, saved = loss_check(dtype)
    print(dtype, peak, peak == formula, f"autograd saves {saved / peak:.0%} of it")
    #> torch.float32 144008 True autograd saves 33% of it
    #> torch.bfloat16 144008 True autograd saves 33% of it

seq1 = ids[:1]  # one sequence of 64 tokens: the shifted hidden states and labels are views
model(seq1, labels=seq1).backward()  # the LM head's gradient exists too
steps = []
for policy in POLICIES:
    apply_policy(model, policy)
    with LiveMemory() as mem:
        model(seq1, labels=seq1).backward()
    steps.append(mem.peak == acc.step_peak(cfg, 64, 4, policy.modes(cfg.num_hidden_layers)))
print(all(steps))
#> True

for s in acc.loss_peak(QWEN3_8B, tokens=8192, itemsize=2):
    print(f"{s.producer:<22}{s.tensor:<36}{s.formula:<7}{s.bytes / 2**30:>6.2f} GiB")
    #> log_softmax           log-probs (saved for backward)      4·t·V    4.64 GiB
    #> nll_loss backward     ∂L/∂log-probs                       4·t·V    4.64 GiB
    #> log_softmax backward  ∂L/∂logits (fp32)                   4·t·V    4.64 GiB
    #> nll_loss              loss                                4        0.00 GiB
    #> nll_loss              total_weight (saved for backward)   4        0.00 GiB
loss = sum(s.bytes for s in acc.loss_peak(QWEN3_8B, tokens=8192, itemsize=2))
print(f"LM head + loss: {loss / 2**30:.2f} GiB = {loss / layer:.1f} layers without checkpointing")
#> LM head + loss: 13.91 GiB = 8.4 layers without checkpointing
# --8<-- [end:head]

# The figures the prose quotes, recorded and checked on every run
# (results/gradient-checkpointing/layer-bytes.json; `--update-examples` rewrites it).
computed_result(
    "gradient-checkpointing",
    "layer-bytes",
    {
        "per_token_over_h": per_token / h,
        "inside_over_boundary": per_token / boundary,
        "fp32_copies_share": fp32_copies / layer,
        "cheap_share": cheap / sum(r["bytes"] for r in rows),
        "loss_gib": loss / 2**30,
        "loss_over_layer": loss / layer,
    },
)
