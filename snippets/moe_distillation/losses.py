"""Distillation losses on logits, each with its gradient in closed form.

Shapes: student_logits and teacher_logits are [N, V] (N positions, V the shared vocabulary),
mask is [N] (True where the position is scored). Every loss is the mean over scored positions
of a per-position divergence computed in fp32 at least (the quality-metrics post's `kl`), and
the teacher side is treated as data (no gradient flows into it).

For a loss L(q) of the student's distribution q = softmax(s), the chain rule through the
softmax gives dL/ds_i = q_i (g_i - sum_j q_j g_j) with g = dL/dq: each loss below names its g,
and `closed_form_grad` returns that gradient, which the tests hold against autograd.
"""

from __future__ import annotations

import math

import torch

from snippets.quality_metrics.divergence import kl
from snippets.quality_metrics.lm import IGNORE_INDEX, token_nll


# --8<-- [start:checks]
class DistillInputError(ValueError):
    """Logits, mask or a parameter the losses cannot use; the message names which."""


def _upcast(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


def check_pair(student_logits, teacher_logits, mask=None):
    """Student and teacher logits of one [N, V] shape; a boolean [N] mask with a scored row.
    Returns the logits in fp32 (fp64 stays fp64) and the mask."""
    if student_logits.dim() != 2:
        raise DistillInputError(f"student logits must be [positions, vocab], got shape "
                                f"{tuple(student_logits.shape)}")  # fmt: skip
    if teacher_logits.shape != student_logits.shape:
        shapes = f"{tuple(teacher_logits.shape)} and {tuple(student_logits.shape)}"
        raise DistillInputError(f"teacher and student logits differ in shape: {shapes}")
    return _upcast(student_logits), _upcast(teacher_logits), check_mask(mask, student_logits)


def check_mask(mask, logits):
    n = logits.shape[0]
    if mask is None:
        return torch.ones(n, dtype=torch.bool, device=logits.device)
    if mask.dtype != torch.bool or mask.shape != (n,):
        raise DistillInputError(f"mask must be a bool tensor of shape ({n},), got "
                                f"{mask.dtype} {tuple(mask.shape)}")  # fmt: skip
    if not mask.any():
        raise DistillInputError("mask scores no position: a mean over zero positions "
                                "is undefined (drop the batch, or add it to others)")  # fmt: skip
    return mask


def masked_mean(per_position: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, per_position, 0.0).sum() / mask.sum()


def _unit(name: str, value: float, *, closed_right: bool = True) -> float:
    ok = 0 <= value <= 1 if closed_right else 0 <= value < 1
    if not ok:
        raise DistillInputError(f"{name} must be in [0, 1{']' if closed_right else ')'}, "
                                f"got {value}")  # fmt: skip
    return value


# --8<-- [end:checks]


# --8<-- [start:kl]
def forward_kl_loss(student_logits, teacher_logits, mask=None, temperature: float = 1.0):
    """Hinton et al. 2015: T^2 KL(p_T || q_T), both softmaxes at temperature T. The T^2 keeps
    the gradient's size as T changes (the soft-target gradient scales as 1/T^2 otherwise).
    With respect to q_T, g_i = -T^2 p_i / q_i; through s / T, dL/ds = T (q_T - p_T)."""
    if not temperature > 0:
        raise DistillInputError(f"temperature must be > 0, got {temperature}")
    s, t, mask = check_pair(student_logits, teacher_logits, mask)
    logq, logp = (s / temperature).log_softmax(-1), (t / temperature).log_softmax(-1).detach()
    return temperature**2 * masked_mean(kl(logp, logq), mask)


def reverse_kl_loss(student_logits, teacher_logits, mask=None):
    """KL(q || p), the student's expectation (MiniLLM's objective, one position at a time):
    mode-seeking. g_i = log q_i - log p_i + 1, so dL/ds_i = q_i (log q_i/p_i - KL(q || p))."""
    s, t, mask = check_pair(student_logits, teacher_logits, mask)
    return masked_mean(kl(s.log_softmax(-1), t.log_softmax(-1).detach()), mask)


# --8<-- [end:kl]


# --8<-- [start:mixtures]
def _mix(logp, logq, w_p: float):
    """log(w_p p + (1 - w_p) q), stable where one weight is 0."""
    if w_p == 0:
        return logq
    if w_p == 1:
        return logp
    return torch.logaddexp(logp + math.log(w_p), logq + math.log1p(-w_p))


def jsd_loss(student_logits, teacher_logits, mask=None, beta: float = 0.5):
    """GKD's generalized JSD (Agarwal et al. 2024), p the teacher, q the student:
    beta KL(p || m) + (1 - beta) KL(q || m), m = beta p + (1 - beta) q. beta = 0.5 is the JS
    divergence; the expression goes to 0 at both ends, so, as TRL does, beta = 0 is the forward
    KL and beta = 1 the reverse KL exactly. g_i = (1 - beta) log(q_i / m_i) for 0 < beta < 1."""
    _unit("beta", beta)
    s, t, mask = check_pair(student_logits, teacher_logits, mask)
    logq, logp = s.log_softmax(-1), t.log_softmax(-1).detach()
    if beta == 0:
        return masked_mean(kl(logp, logq), mask)
    if beta == 1:
        return masked_mean(kl(logq, logp), mask)
    logm = _mix(logp, logq, beta)
    return masked_mean(beta * kl(logp, logm) + (1 - beta) * kl(logq, logm), mask)


def skew_kl_loss(student_logits, teacher_logits, mask=None, alpha: float = 0.1,
                 reverse: bool = False):  # fmt: skip
    """DistiLLM (Ko et al. 2024): the skew KL KL(p || alpha p + (1 - alpha) q), or with
    reverse=True the skew reverse KL KL(q || (1 - alpha) p + alpha q). alpha = 0 gives the
    plain forward / reverse KL; mixing a little of one distribution into the other bounds the
    ratio inside the log. Forward: g_i = -(1 - alpha) p_i / m_i; reverse: g_i = log(q_i / m_i)
    + 1 - alpha q_i / m_i."""
    _unit("alpha", alpha, closed_right=False)
    s, t, mask = check_pair(student_logits, teacher_logits, mask)
    logq, logp = s.log_softmax(-1), t.log_softmax(-1).detach()
    if reverse:
        return masked_mean(kl(logq, _mix(logp, logq, 1 - alpha)), mask)
    return masked_mean(kl(logp, _mix(logp, logq, alpha)), mask)


# --8<-- [end:mixtures]


# --8<-- [start:topk]
def teacher_topk(teacher_logits, k: int, value_dtype=torch.bfloat16):
    """What an offline pass stores per position: the k largest logits (in value_dtype) and
    their token ids (int32: a 151,936-token vocabulary needs 18 bits, more than int16 holds).
    Raw logits suffice when the loss renormalizes over the k: the softmax's normalizer cancels."""
    v = teacher_logits.shape[-1]
    if not 1 <= k <= v:
        raise DistillInputError(f"k must be in [1, {v}] (the vocabulary), got {k}")
    values, idx = teacher_logits.topk(k, dim=-1)
    return values.to(value_dtype), idx.to(torch.int32)


def topk_kl_loss(student_logits, top_values, top_idx, mask=None, temperature: float = 1.0):
    """KL(p~ || q_T) with p~ the teacher renormalized over its stored top-k S (zero outside S)
    and q the student's full softmax: T^2 sum_{i in S} p~_i (log p~_i - log q_i). Its gradient
    T (q_T - p~) pushes the student's mass outside S to zero, mass the teacher did give: the
    truncation's bias. k = V is the forward KL."""
    if not temperature > 0:
        raise DistillInputError(f"temperature must be > 0, got {temperature}")
    s = _upcast(student_logits)
    if top_values.shape != top_idx.shape or top_values.shape[:-1] != s.shape[:-1]:
        shapes = f"{tuple(top_values.shape)} and {tuple(top_idx.shape)}"
        raise DistillInputError(f"top-k values and ids must both be [{s.shape[0]}, k], "
                                f"got {shapes}")  # fmt: skip
    v = s.shape[-1]
    if top_idx.dtype.is_floating_point or not 0 <= top_idx.min() <= top_idx.max() < v:
        raise DistillInputError(f"top-k ids must be integer token ids in [0, {v})")
    mask = check_mask(mask, s)
    logq = (s / temperature).log_softmax(-1).gather(-1, top_idx.long())
    logp = (top_values.to(s.dtype) / temperature).log_softmax(-1).detach()
    return temperature**2 * masked_mean(kl(logp, logq), mask)


# --8<-- [end:topk]


# --8<-- [start:sequence]
def sequence_kd_loss(student_logits, teacher_tokens, mask=None):
    """Kim & Rush 2016, sequence-level KD: plain next-token cross-entropy, on sequences the
    teacher generated (its beam or greedy output) instead of the data. Its gradient is
    q - onehot(teacher token); the teacher's distribution is never read. `teacher_tokens` [N]
    are the targets of the N positions (ignore_index where not scored)."""
    s = _upcast(student_logits)
    mask = check_mask(mask, s)
    targets = torch.where(mask, teacher_tokens, IGNORE_INDEX)
    return masked_mean(token_nll(s, targets), mask)


# --8<-- [end:sequence]


# --8<-- [start:grads]
def softmax_chain(q: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """dL/ds from g = dL/dq through q = softmax(s): q * (g - <q, g>)."""
    return q * (g - (q * g).sum(-1, keepdim=True))


def closed_form_grad(method: str, student_logits, teacher_logits, mask=None, **kw):
    """The gradient of each loss with respect to the student logits, written out (fp64)."""
    s, t, mask = check_pair(student_logits.double(), teacher_logits.double(), mask)
    q, p = s.softmax(-1), t.softmax(-1)
    if method == "forward_kl":
        temp = kw.get("temperature", 1.0)
        grad = temp * ((s / temp).softmax(-1) - (t / temp).softmax(-1))
    elif method == "reverse_kl":
        grad = softmax_chain(q, q.log() - p.log() + 1)
    elif method == "jsd":
        beta = kw["beta"]
        m = beta * p + (1 - beta) * q
        grad = softmax_chain(q, (1 - beta) * (q / m).log())
    elif method == "skew_kl":
        alpha = kw["alpha"]
        m = alpha * p + (1 - alpha) * q
        grad = softmax_chain(q, -(1 - alpha) * p / m)
    elif method == "skew_rkl":
        alpha = kw["alpha"]
        m = (1 - alpha) * p + alpha * q
        grad = softmax_chain(q, (q / m).log() + 1 - alpha * q / m)
    elif method == "topk_kl":
        temp, k = kw.get("temperature", 1.0), kw["k"]
        values, idx = t.topk(k, dim=-1)
        p_tilde = torch.zeros_like(t).scatter(-1, idx, (values / temp).softmax(-1))
        grad = temp * ((s / temp).softmax(-1) - p_tilde)
    elif method == "sequence_kd":
        grad = q - torch.nn.functional.one_hot(kw["targets"], s.shape[-1]).to(q.dtype)
    else:
        raise DistillInputError(f"unknown method {method!r}")
    return torch.where(mask[:, None], grad, 0.0) / mask.sum()


# --8<-- [end:grads]
