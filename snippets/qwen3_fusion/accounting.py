"""FLOPs and bytes of every operator of one Qwen3 decoder layer, forward and backward.

Byte model: each operator reads its inputs once and writes its outputs once from HBM, in bf16
(2 bytes), weights included; no cache reuse across operators. That is what an unfused
implementation pays at best, and what fusing two operators saves: the intermediate tensor's
write and re-read. Elementwise FLOP counts are nominal (e.g. SiLU-and-multiply as 5 per
element); they only decide that such operators sit far below any ridge point.
"""

from dataclasses import dataclass

from snippets.common.models.qwen3 import QWEN3_8B, Qwen3Config

BYTES = 2  # bf16


# --8<-- [start:ops]
@dataclass(frozen=True)
class Op:
    name: str
    kind: str  # "matmul", "attention", "norm", "elementwise"
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def linear(name, t, k, n):
    """Y[t, n] = X[t, k] @ W[n, k]^T. Backward: dX = dY W and dW = dY^T X, twice the FLOPs."""
    fwd = Op(name, "matmul", 2 * t * k * n, BYTES * (t * k + n * k + t * n))
    bwd = Op(name, "matmul", 4 * t * k * n, BYTES * 2 * (t * n + n * k + t * k))
    return fwd, bwd


def rmsnorm(name, rows, dim):
    """Forward reads x and w, writes y; backward reads x, w, dy, writes dx and dw."""
    fwd = Op(name, "norm", 4 * rows * dim, BYTES * (2 * rows * dim + dim))
    bwd = Op(name, "norm", 8 * rows * dim, BYTES * (3 * rows * dim + 2 * dim))
    return fwd, bwd


def elementwise(name, n_in, n_out, numel, flops_per_element, identity_backward=False):
    fwd = Op(name, "elementwise", flops_per_element * numel, BYTES * (n_in + n_out) * numel)
    if identity_backward:  # a + b: both inputs receive the output gradient itself, no kernel
        return fwd, Op(name, "elementwise", 0, 0)
    # backward reads the forward inputs and the output gradient, writes one grad per input
    bwd = Op(name, "elementwise", 2 * flops_per_element * numel, BYTES * (2 * n_in + 1) * numel)
    return fwd, bwd


def attention(name, batch, seq, n_q, n_kv, d):
    """Causal FlashAttention: QK^T and PV over the lower triangle, S x S scores never stored.

    Forward 2 matmuls x 2 FLOPs x (S^2 / 2) x d per head; backward recomputes the scores and
    does 4 more matmuls (FlashAttention-2, arXiv:2307.08691 §3.1.2): 2.5 x the forward.
    """
    fwd_flops = 2 * 2 * batch * n_q * seq * seq * d / 2
    q, kv = batch * seq * n_q * d, batch * seq * n_kv * d
    fwd = Op(name, "attention", fwd_flops, BYTES * (q + 2 * kv + q))
    bwd = Op(name, "attention", 2.5 * fwd_flops, BYTES * (2 * q + 2 * kv + q + 2 * kv + q))
    return fwd, bwd


def layer_ops(cfg: Qwen3Config = QWEN3_8B, batch: int = 2, seq: int = 4096):
    """(forward, backward) Op pairs of one decoder layer, in execution order."""
    t, h, i = batch * seq, cfg.hidden_size, cfg.intermediate_size
    d, nq, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    return [
        rmsnorm("input_layernorm", t, h),
        linear("q_proj", t, h, nq * d),
        linear("k_proj", t, h, nkv * d),
        linear("v_proj", t, h, nkv * d),
        rmsnorm("q_norm + k_norm", t * (nq + nkv), d),
        elementwise("rope (q, k)", 1, 1, t * (nq + nkv) * d, 3),
        attention("attention", batch, seq, nq, nkv, d),
        linear("o_proj", t, nq * d, h),
        elementwise("residual add", 2, 1, t * h, 1, identity_backward=True),
        rmsnorm("post_attention_layernorm", t, h),
        linear("gate_proj", t, h, i),
        linear("up_proj", t, h, i),
        elementwise("silu(gate) * up", 2, 1, t * i, 5),
        linear("down_proj", t, i, h),
        elementwise("residual add", 2, 1, t * h, 1, identity_backward=True),
    ]


# --8<-- [end:ops]


# --8<-- [start:forward_flops]
def model_forward_flops(cfg: Qwen3Config = QWEN3_8B, batch: int = 2, seq: int = 4096) -> float:
    """All layers + final norm + LM head, summed from the per-operator accounting."""
    per_layer = sum(fwd.flops for fwd, _ in layer_ops(cfg, batch, seq))
    t = batch * seq
    final_norm = rmsnorm("norm", t, cfg.hidden_size)[0].flops
    lm_head = linear("lm_head", t, cfg.hidden_size, cfg.vocab_size)[0].flops
    return cfg.num_hidden_layers * per_layer + final_norm + lm_head


def rule_of_thumb_flops(cfg: Qwen3Config, n_params: int, batch: int, seq: int) -> float:
    """2 N T for the weights (the embedding lookup does no FLOPs: its V x h are left out)
    plus the causal attention term 2 L B S^2 (n_q d) (PaLM, arXiv:2204.02311, Appendix B)."""
    weights = n_params - cfg.vocab_size * cfg.hidden_size
    attn = 2 * cfg.num_hidden_layers * batch * seq**2 * cfg.num_attention_heads * cfg.head_dim
    return 2 * weights * batch * seq + attn


# --8<-- [end:forward_flops]
