"""Linear layer + cross-entropy over the vocabulary, chunked over rows: the [N, V] logits are
never materialised, only one [chunk, V] block at a time.

Per chunk: logits = h_c @ W^T (cuBLAS, fp32 accumulation), a Triton kernel turns each row into
its loss and, in place, into d loss / d logits = (softmax - onehot) / n_valid; two more matmuls
give the chunk's dh and add its share of dW to an fp32 accumulator. All gradients are computed
in the forward (the loss is the last operation); the backward only scales them. A custom
operator (torch.library), so that torch.compile(fullgraph=True) keeps it whole.
"""

import torch
import triton
import triton.language as tl

from snippets.common.device import DEVICE
from snippets.triton_kernels.numerics import CHECK_DTYPES, cross_entropy_exact, within

BLOCK_V = 4096  # vocabulary columns per loop step
CHUNK_ROWS = 1024  # rows per chunk: the chunk's logits take CHUNK_ROWS * V * 2 bytes in bf16


# --8<-- [start:kernel]
@triton.jit
def ce_rows_kernel(LOGITS, LABELS, LOSS, SCALE, stride, V, ignore_index,
                   BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr):  # fmt: skip
    """One program per row: loss = lse - logit[label]; logits <- (softmax - onehot) * scale."""
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride
    label = tl.load(LABELS + row)
    valid = label != ignore_index
    cols = tl.arange(0, BLOCK)
    m = float("-inf")  # running max and running sum of exp(l - m), fp32 (online softmax)
    acc = 0.0
    for i in range(N_BLOCKS):
        c = i * BLOCK + cols
        l = tl.load(base + c, mask=c < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(l, axis=0))
        acc = acc * tl.exp(m - m_new) + tl.sum(tl.exp(l - m_new), axis=0)
        m = m_new
    lse = m + tl.log(acc)
    target = tl.load(base + label, mask=valid, other=0.0).to(tl.float32)
    tl.store(LOSS + row, tl.where(valid, lse - target, 0.0))
    scale = tl.where(valid, tl.load(SCALE), 0.0)  # 1 / n_valid; ignored rows get no gradient
    for i in range(N_BLOCKS):  # second pass: the gradient, written over the logits
        c = i * BLOCK + cols
        l = tl.load(base + c, mask=c < V, other=0.0).to(tl.float32)
        grad = tl.exp(l - lse) - tl.where(c == label, 1.0, 0.0)
        tl.store(base + c, (grad * scale).to(LOGITS.dtype.element_ty), mask=c < V)


# --8<-- [end:kernel]


# --8<-- [start:launcher]
def _add_matmul(acc, a, b):
    """acc += a @ b with fp32 accumulation whatever the dtypes of a and b."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda:  # cuBLAS accumulates in fp32 and adds into the fp32 buffer (torch >= 2.8)
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def linear_cross_entropy_forward(h, weight, labels, ignore_index=-100, chunk_rows=None,
                                 dw_dtype=torch.float32, block_v=None):  # fmt: skip
    """h: [N, H] contiguous, labels: [N]. Returns the mean loss, dh and dW (for loss = 1)."""
    n, hid = h.shape
    vocab = weight.shape[0]
    chunk = min(chunk_rows or CHUNK_ROWS, n)
    block = block_v or min(triton.next_power_of_2(vocab), BLOCK_V)
    scale = (1.0 / (labels != ignore_index).sum()).to(torch.float32).reshape(1)  # no host sync
    loss_rows = torch.empty(n, device=h.device, dtype=torch.float32)
    dh = torch.empty_like(h)
    dw = torch.zeros(vocab, hid, device=h.device, dtype=dw_dtype)
    logits = torch.empty(chunk, vocab, device=h.device, dtype=h.dtype)  # reused by every chunk
    for start in range(0, n, chunk):
        rows = min(chunk, n - start)
        hc, lc = h[start : start + rows], logits[:rows]
        torch.mm(hc, weight.T, out=lc)
        ce_rows_kernel[(rows,)](
            lc, labels[start : start + rows], loss_rows[start : start + rows], scale,
            lc.stride(0), vocab, ignore_index, BLOCK=block, N_BLOCKS=triton.cdiv(vocab, block),
            num_warps=8 if block >= 2048 else 4,
        )  # fmt: skip
        torch.mm(lc, weight, out=dh[start : start + rows])  # this chunk's dh, complete
        _add_matmul(dw, lc.T, hc)  # this chunk's share of dW
    return loss_rows.sum() * scale[0], dh, dw.to(weight.dtype)


# --8<-- [end:launcher]


# --8<-- [start:op]
Three = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


@torch.library.custom_op("handbook::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                            ignore_index: int = -100, chunk_rows: int | None = None,
                            dw_dtype: torch.dtype = torch.float32,
                            block_v: int | None = None) -> Three:  # fmt: skip
    """(loss, dh, dW): the gradients come out of the forward, as outputs (an op returns fresh
    tensors only; the autograd formula below saves them)."""
    h = hidden.reshape(-1, hidden.shape[-1]).contiguous()  # no copy when already contiguous
    loss, dh, dw = linear_cross_entropy_forward(
        h, weight, labels.reshape(-1).contiguous(), ignore_index, chunk_rows, dw_dtype, block_v
    )
    return loss, dh.view(hidden.shape), dw


@linear_cross_entropy_op.register_fake
def _(hidden, weight, labels, ignore_index=-100, chunk_rows=None, dw_dtype=torch.float32,
      block_v=None):  # fmt: skip
    loss = hidden.new_empty((), dtype=torch.float32)
    return loss, hidden.new_empty(hidden.shape), weight.new_empty(weight.shape)


@torch.library.custom_op("handbook::linear_cross_entropy_backward", mutates_args=("dh", "dw"))
def linear_cross_entropy_backward_op(dloss: torch.Tensor, dh: torch.Tensor,
                                     dw: torch.Tensor) -> None:  # fmt: skip
    """Scales the forward's gradients by the loss's own gradient, in place: no second copy of
    dW (1 when the loss is the last operation)."""
    dh.mul_(dloss), dw.mul_(dloss)


@linear_cross_entropy_backward_op.register_fake
def _(dloss, dh, dw):
    return None


def _setup_context(ctx, inputs, output):
    _, dh, dw = output
    ctx.mark_non_differentiable(dh, dw)
    # otherwise autograd hands the backward zeros for dh's and dW's own (absent) gradients: two
    # more tensors the size of dh and dW (1.2 GiB at the benchmark's shape, seen on the H200)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(dh, dw)


def _backward(ctx, dloss, *_):
    dh, dw = ctx.saved_tensors
    linear_cross_entropy_backward_op(dloss, dh, dw)
    return dh, dw, None, None, None, None, None


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy(hidden, weight, labels, ignore_index=-100, chunk_rows=None,
                         dw_dtype=torch.float32, block_v=None):  # fmt: skip
    """Drop-in for the model's `loss` swap point: mean over labels != -100."""
    return linear_cross_entropy_op(hidden, weight, labels, ignore_index, chunk_rows, dw_dtype,
                                   block_v)[0]  # fmt: skip


# --8<-- [end:op]


# --8<-- [start:check]
def check_linear_cross_entropy(n, hid, vocab, dtype, chunk_rows, block_v=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hid, generator=gen).to(DEVICE, dtype).requires_grad_()
    w = (torch.randn(vocab, hid, generator=gen) / hid**0.5).to(DEVICE, dtype).requires_grad_()
    labels = torch.randint(0, vocab, (n,), generator=gen).to(DEVICE)
    labels[::3] = -100  # every third row is padding
    loss = linear_cross_entropy(h, w, labels, -100, chunk_rows, torch.float32, block_v)
    loss.backward()
    exact, bound = cross_entropy_exact(h, w, labels)
    return within({"loss": loss, "dh": h.grad, "dw": w.grad}, exact, bound)


print(all(check_linear_cross_entropy(10, 48, 300, t, 4, 128) for t in CHECK_DTYPES))
#> True
# --8<-- [end:check]
