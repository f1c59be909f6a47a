"""Four realistic bugs, each planted in a copy of our code (the originals stay untouched), for
the gates to catch; tests/snippets/test_precision_alignment.py asserts which gate catches each.

1. RMSNorm backward whose dW accumulator is declared in the input dtype (fp16 / bf16).
2. RMSNorm forward that multiplies by the weight in fp32 and rounds once (not Hugging Face's
   "round, then multiply" order).
3. The fused add + RMSNorm forward with one layer wired to the wrong norm weight.
4. RoPE whose cos / sin tables are built in bf16 (positions, frequencies, angles).
"""

import torch
import triton
import triton.language as tl

from snippets.common.models.qwen3 import Qwen3ForCausalLM, rope_tables
from snippets.common.models.qwen3 import apply_rope as eager_rope
from snippets.triton_kernels.rmsnorm import ROWS_PER_PROGRAM, RMSNormFunction, add_rms_norm, as_rows


# --8<-- [start:dw]
@triton.jit
def rmsnorm_bwd_lowp_dw_kernel(DY, X, W, RSTD, DX, DW_PART, stride_dy, stride_x, stride_dx,
                               n_rows, H, ROWS: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """A copy of rmsnorm_bwd_kernel's one-block path; only the dw accumulator changed."""
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    dw = tl.zeros([BLOCK], dtype=X.dtype.element_ty)  # BUG: was tl.float32
    for i in range(ROWS):
        row = pid * ROWS + i
        live = row < n_rows
        mask = (cols < H) & live
        rstd = tl.load(RSTD + row, mask=live, other=0.0)
        dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        g = (dy * w).to(DY.dtype.element_ty).to(tl.float32)
        n = x * rstd
        dot = tl.sum(g * n, axis=0)
        dx = rstd * (g - n * (dot / H))
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        dw += (dy * n.to(X.dtype.element_ty).to(tl.float32)).to(X.dtype.element_ty)
    tl.store(DW_PART + pid * H + cols, dw.to(tl.float32), mask=cols < H)


class LowPrecisionDW(RMSNormFunction):
    """Our RMSNorm, with the backward above (rows <= one block)."""

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dy2 = as_rows(dy)
        rows, h = x2.shape
        per = ctx.tile[1] or ROWS_PER_PROGRAM  # tile: block, rows per program, rows per step
        programs = triton.cdiv(rows, per)
        partial = torch.empty(programs, h, device=x2.device, dtype=torch.float32)
        dx = torch.empty_like(x2)
        rmsnorm_bwd_lowp_dw_kernel[(programs,)](
            dy2, x2, weight, rstd, dx, partial, dy2.stride(0), x2.stride(0), dx.stride(0),
            rows, h, ROWS=per, BLOCK=triton.next_power_of_2(h),
        )  # fmt: skip
        return dx.view(ctx.shape), partial.sum(0).to(weight.dtype), None, None, None


def rms_norm_lowp_dw(rows_per_program):
    return lambda x, w: LowPrecisionDW.apply(x, w, 1e-6, None, rows_per_program)


# --8<-- [end:dw]


# --8<-- [start:cast]
@triton.jit
def rmsnorm_fwd_weight_first_kernel(X, Y, W, RSTD, stride_x, stride_y, H, eps,
                                    BLOCK: tl.constexpr):  # fmt: skip
    """A copy of rmsnorm_fwd_kernel's one-block path with the cast moved after the weight."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w  # BUG: was (x * rstd).to(X's dtype), then times w
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


class WeightFirstRMSNorm(RMSNormFunction):
    """Our RMSNorm, with the forward above; the backward is the original."""

    @staticmethod
    def forward(ctx, x, weight, eps, block=None, rows_per_program=None):
        x2 = as_rows(x)
        rows, h = x2.shape
        y = torch.empty(rows, h, device=x.device, dtype=torch.promote_types(x.dtype, weight.dtype))
        rstd = torch.empty(rows, device=x.device, dtype=torch.float32)
        rmsnorm_fwd_weight_first_kernel[(rows,)](
            x2, y, weight, rstd, x2.stride(0), y.stride(0), h, eps, BLOCK=triton.next_power_of_2(h)
        )
        ctx.save_for_backward(x2, weight, rstd)
        ctx.shape, ctx.tile = x.shape, (block, rows_per_program, None)
        return y.view(x.shape)


def rms_norm_weight_first(x, w):
    return WeightFirstRMSNorm.apply(x, w, 1e-6)


# --8<-- [end:cast]


# --8<-- [start:wiring]
def fused_loss_miswired(model: Qwen3ForCausalLM, input_ids, labels, bad_layer=1):
    """A copy of snippets.triton_kernels.qwen3.fused_loss in which layer `bad_layer` normalises
    the MLP input with the attention norm's weight (both are called `...layernorm.weight`)."""
    eps = model.config.rms_norm_eps
    x = model.model.embed_tokens(input_ids)
    cos, sin = rope_tables(model.config, input_ids.shape[1], input_ids.device)
    delta = None
    for i, layer in enumerate(model.model.layers):
        if delta is None:
            h = layer.input_layernorm(x)
        else:
            x, h = add_rms_norm(x, delta, layer.input_layernorm.weight, eps)
        norm2 = layer.input_layernorm if i == bad_layer else layer.post_attention_layernorm  # BUG
        x, h = add_rms_norm(x, layer.self_attn(h, cos, sin), norm2.weight, eps)
        delta = layer.mlp(h)
    h = add_rms_norm(x, delta, model.model.norm.weight, eps)[1]
    return model.kernels.loss(h[:, :-1], model.lm_head.weight, labels[:, 1:])


# --8<-- [end:wiring]


# --8<-- [start:rope]
def rope_bf16_tables(theta: float):
    """A RoPE that rebuilds its own tables in bf16 (ignoring the fp32 ones it is given)."""

    def rope(q, k, cos, sin):
        seq, dim = q.shape[-2], q.shape[-1]
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, device=q.device).float() / dim)
        angles = torch.outer(torch.arange(seq, device=q.device).bfloat16(), inv_freq.bfloat16())
        emb = torch.cat((angles, angles), dim=-1)  # BUG: angles rounded to bf16
        return eager_rope(q, k, emb.cos().to(q.dtype), emb.sin().to(q.dtype))

    return rope


# --8<-- [end:rope]
