"""What one Qwen3 decoder layer keeps for its backward: one formula per saved tensor, and what
each operator would cost to recompute instead.

Counting rule: autograd saves tensors, memory holds storages. A storage saved by several
operators (the attention norm's output is saved by q_proj, k_proj and v_proj), or saved twice
by one (RMSNorm's fp32 input by pow and by mul), counts once. Parameters and their views are
model state, not activations: they are not counted. Recompute FLOPs are the forward FLOPs of
snippets/qwen3_fusion/accounting.py, the same nominal counts that post uses.
"""

from dataclasses import dataclass

from snippets.common.models.qwen3 import Qwen3Config
from snippets.qwen3_fusion.accounting import layer_ops

FP32 = 4  # RMSNorm statistics and the attention's logsumexp are fp32 whatever the model dtype


# --8<-- [start:saved]
@dataclass(frozen=True)
class Saved:
    producer: str  # the operator of qwen3_fusion.accounting.layer_ops that computes it
    tensor: str
    formula: str  # bytes; t = batch x seq tokens, e = bytes per element of the model dtype
    numel: int
    itemsize: int
    shared: bool = False  # one storage for all layers (the fp32 RoPE table): count it once

    @property
    def bytes(self) -> int:
        return self.numel * self.itemsize


def saved_tensors(cfg: Qwen3Config, batch: int, seq: int, itemsize: int) -> list[Saved]:
    """Every storage autograd keeps for one decoder layer's backward, in forward order."""
    t, h, i, d = batch * seq, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv, e = cfg.num_attention_heads, cfg.num_key_value_heads, itemsize

    def norm(op, rows, dim, r, n):  # rows r and elements n as text: "t" and "t·h"
        return [  # x.float() is saved by pow and mul; rstd by rsqrt and mul; x·rstd by * weight
            Saved(op, "x.float()", f"4·{n}", rows * dim, FP32),
            Saved(op, "rstd", f"4·{r}", rows, FP32),
            Saved(op, "(x·rstd).to(dtype)", f"e·{n}", rows * dim, e),
        ]

    def out(op, tensor, n, numel):
        return Saved(op, tensor, f"e·{n}", numel, e)

    rope = "rope (q, k)"
    return [
        *norm("input_layernorm", t, h, "t", "t·h"),
        out("input_layernorm", "output (q/k/v_proj input)", "t·h", t * h),
        *norm("q_norm + k_norm", t * nq, d, "t·n_q", "t·n_q·d"),
        *norm("q_norm + k_norm", t * nkv, d, "t·n_kv", "t·n_kv·d"),
        out("v_proj", "v", "t·n_kv·d", t * nkv * d),
        Saved(rope, "cos", "e·s·d", seq * d, e, shared=e == FP32),  # .to(fp32) is a no-op
        Saved(rope, "sin", "e·s·d", seq * d, e, shared=e == FP32),
        out(rope, "q rotated", "t·n_q·d", t * nq * d),
        out(rope, "k rotated", "t·n_kv·d", t * nkv * d),
        out("attention", "output (o_proj input)", "t·n_q·d", t * nq * d),
        Saved("attention", "logsumexp", "4·t·n_q", t * nq, FP32),
        *norm("post_attention_layernorm", t, h, "t", "t·h"),
        out("post_attention_layernorm", "output (gate/up_proj input)", "t·h", t * h),
        out("gate_proj", "gate", "t·I", t * i),
        out("up_proj", "up", "t·I", t * i),
        out("silu(gate) * up", "silu(gate)", "t·I", t * i),
        out("silu(gate) * up", "silu(gate)·up (down_proj input)", "t·I", t * i),
    ]


# --8<-- [end:saved]


# --8<-- [start:by_operator]
def by_operator(cfg: Qwen3Config, batch: int, seq: int, itemsize: int) -> list[dict]:
    """Per operator of layer_ops: bytes kept for backward vs forward FLOPs to recompute them."""
    saved = saved_tensors(cfg, batch, seq, itemsize)
    rows = []
    for fwd, _ in layer_ops(cfg, batch, seq):
        if any(r["op"] == fwd.name for r in rows):
            continue  # the two residual adds: nothing saved, listed once
        kept = sum(s.bytes for s in saved if s.producer == fwd.name)
        rows.append({"op": fwd.name, "kind": fwd.kind, "bytes": kept, "flops": fwd.flops})
    return rows


# --8<-- [end:by_operator]


# --8<-- [start:policy_model]
def outputs(cfg: Qwen3Config, batch: int, seq: int, itemsize: int) -> dict[str, int]:
    """Bytes a selective policy keeps when it saves an operator's output instead of recomputing
    it: a projection's output, or the attention's output and logsumexp."""
    t, h, i, d = batch * seq, cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nq, nkv, e = cfg.num_attention_heads, cfg.num_key_value_heads, itemsize
    return {
        "q_proj": e * t * nq * d,
        "k_proj": e * t * nkv * d,
        "v_proj": e * t * nkv * d,
        "attention": e * t * nq * d + FP32 * t * nq,
        "o_proj": e * t * h,
        "gate_proj": e * t * i,
        "up_proj": e * t * i,
        "down_proj": e * t * h,
    }


def kept_per_layer(cfg, batch, seq, itemsize, saves: frozenset | None) -> int:
    """Bytes one layer holds from its forward to its backward. saves=None: not checkpointed,
    everything autograd saves. Checkpointed: its input, plus the outputs a policy saves
    (frozenset() is full recomputation)."""
    if saves is None:
        return sum(s.bytes for s in saved_tensors(cfg, batch, seq, itemsize) if not s.shared)
    t, e = batch * seq, itemsize
    return e * t * cfg.hidden_size + sum(outputs(cfg, batch, seq, e)[op] for op in saves)


def recompute_flops(cfg, batch, seq, saves: frozenset | None, kinds=("matmul", "attention")):
    """Forward FLOPs a checkpointed layer runs again in backward. The recomputation stops once
    the last tensor backward needs exists (PyTorch's early stop), which is down_proj's input:
    down_proj and the last residual add are never recomputed."""
    if saves is None:
        return 0
    ops = [fwd for fwd, _ in layer_ops(cfg, batch, seq)]
    last = [op.name for op in ops].index("down_proj")
    return sum(op.flops for op in ops[:last] if op.kind in kinds and op.name not in saves)


def kept_after_forward(cfg, batch, seq, itemsize, modes: list) -> int:
    """Bytes Qwen3ForCausalLM.hidden_states keeps for backward, one mode per layer: the layers'
    shares, the final norm's saved tensors, and the fp32 RoPE table while anything holds it
    (a checkpointed layer's arguments, or fp32 layers that save it themselves)."""
    layers = sum(kept_per_layer(cfg, batch, seq, itemsize, m) for m in modes)
    held = itemsize == FP32 or any(m is not None for m in modes)
    rope = 2 * FP32 * seq * cfg.head_dim if held else 0
    return layers + final_norm(cfg, batch * seq, itemsize) + rope


def final_norm(cfg, tokens: int, itemsize: int) -> int:
    """What the final RMSNorm saves: its fp32 input, rstd, and the normalized output."""
    return (FP32 + itemsize) * tokens * cfg.hidden_size + FP32 * tokens


def step_flops(cfg, batch, seq, kinds=("matmul", "attention")) -> float:
    """One layer's forward plus backward FLOPs without recomputation."""
    return sum(f.flops + b.flops for f, b in layer_ops(cfg, batch, seq) if f.kind in kinds)


# --8<-- [end:policy_model]


# --8<-- [start:head]
def loss_peak(cfg: Qwen3Config, tokens: int, itemsize: int) -> list[Saved]:
    """The storages eager lm_loss (snippets/common/models/qwen3.py) holds at its peak beyond its
    inputs (hidden states, LM head weight, labels), for `tokens` rows of already shifted labels.

    lm_loss: logits = h @ W.T in the model dtype, upcast to fp32, then F.cross_entropy, which
    PyTorch runs as log_softmax + nll_loss on every device (cross_entropy_loss is a composite op).
    Forward: the e-byte logits live until the upcast, the fp32 ones until log_softmax is done,
    (e + 4) t V then 8 t V bytes. Backward: nll_loss's backward hands log_softmax's backward a
    dense t x V gradient and gets one back, while log_softmax's saved output is alive: 12 t V,
    the peak whatever the model dtype. The e-byte gradient and the LM head's dW matmul come after
    these are freed (e t V + e V h, so the peak is here for t >= e h / (12 - e) tokens).
    """
    t, v = tokens, cfg.vocab_size
    return [
        Saved("log_softmax", "log-probs (saved for backward)", "4·t·V", t * v, FP32),
        Saved("nll_loss backward", "∂L/∂log-probs", "4·t·V", t * v, FP32),
        Saved("log_softmax backward", "∂L/∂logits (fp32)", "4·t·V", t * v, FP32),
        Saved("nll_loss", "loss", "4", 1, FP32),
        Saved("nll_loss", "total_weight (saved for backward)", "4", 1, FP32),
    ]


def step_peak(cfg, seq: int, itemsize: int, modes: list) -> int:
    """Peak bytes of a training step, model(ids, labels).backward() on one sequence, beyond the
    parameters and their gradients, where the loss's peak is the step's: the loss comes before
    any layer's backward, so everything the forward kept is alive, plus the final hidden states
    (the LM head's input) and the loss's buffers over the seq - 1 predicted tokens. One sequence:
    the shifted hidden states and labels are views; with more, both are copied."""
    hidden = itemsize * seq * cfg.hidden_size
    loss = sum(s.bytes for s in loss_peak(cfg, seq - 1, itemsize))
    return kept_after_forward(cfg, 1, seq, itemsize, modes) + hidden + loss


def head_per_token(cfg, itemsize: int) -> int:
    """The same per token, on top of the layers' share: what the budget model adds for the LM
    head and the loss (the constant loss scalars and the RoPE table left out)."""
    per_token = sum(s.bytes for s in loss_peak(cfg, 1, itemsize) if "V" in s.formula)
    return final_norm(cfg, 1, itemsize) + itemsize * cfg.hidden_size + per_token


# --8<-- [end:head]
