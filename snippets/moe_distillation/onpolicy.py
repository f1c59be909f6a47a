"""On-policy distillation: the student writes the continuations, the teacher grades every position.

GKD (Agarwal et al. 2024) with the student data fraction lambda = 1 and MiniLLM's single-step
term (Gu et al. 2024) are the same update: sample a continuation from the student, then at each
position the student wrote, minimise a divergence between the student's and the teacher's
next-token distributions over the whole vocabulary (here the reverse KL, GKD's beta = 1). The
samples are data: no gradient flows through the sampling, so no policy-gradient estimator is
needed. Sequence-level KD (Kim & Rush 2016) is the mirror image: the teacher writes, the
student imitates the tokens.
"""

from __future__ import annotations

import torch

from snippets.cuda_graph.decode import StaticCache, decode_step
from snippets.moe_distillation.losses import DistillInputError, jsd_loss


# --8<-- [start:sample]
def gumbel_sample(logits: torch.Tensor, generator, temperature: float = 1.0) -> torch.Tensor:
    """One token per row from softmax(logits / T): the argmax of logits / T plus Gumbel noise
    (exact sampling, reproducible from the generator, no normalisation needed)."""
    u = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    gumbel = -(-u.clamp_min(torch.finfo(torch.float32).tiny).log()).log()
    return (logits.float() / temperature + gumbel).argmax(-1)


def sample_continuations(step, prompt: torch.Tensor, new_tokens: int, generator,
                         temperature: float = 1.0) -> torch.Tensor:  # fmt: skip
    """[B, P + new_tokens]: the prompt [B, P] fed one token per step through `step(tokens, pos)`
    (-> logits [B, V], a decode step over a KV cache), then new_tokens sampled one at a time."""
    b, p = prompt.shape
    if p < 1 or new_tokens < 1:
        raise DistillInputError(f"need a prompt and new tokens, got {p} and {new_tokens}")
    out = list(prompt.unbind(1))
    pos = torch.zeros(b, dtype=torch.long, device=prompt.device)
    for t in range(p + new_tokens - 1):
        logits = step(out[t], pos + t)
        if t + 1 >= p:
            out.append(gumbel_sample(logits, generator, temperature))
    return torch.stack(out, 1)


def eager_step(model, batch: int, max_len: int):
    """`step(tokens, pos)` for sample_continuations: the cuda-graph post's decode step over a
    static KV cache in the model's dtype (on the GPU, GraphedDecoder replays the same step)."""
    w = next(model.parameters())
    cache = StaticCache.empty(model.config, batch, max_len, w.dtype, w.device)
    return lambda tokens, pos: decode_step(model, cache, tokens, pos)


# --8<-- [end:sample]


# --8<-- [start:loss]
def written_positions(prompt_len: int, new_tokens: int) -> slice:
    """The positions whose next token the student sampled: the last prompt position and every
    sampled token but the last (position t predicts token t + 1)."""
    return slice(prompt_len - 1, prompt_len + new_tokens - 1)


def on_policy_loss(student, teacher, ids: torch.Tensor, prompt_len: int, beta: float = 1.0,
                   teacher_logits=None):  # fmt: skip
    """GKD's loss on one on-policy batch `ids` [B, P + G]: the generalized JSD(beta) between
    teacher and student at every position the student wrote (beta = 1: the reverse KL). The
    teacher is run without gradients unless its logits are given."""
    at = written_positions(prompt_len, ids.shape[1] - prompt_len)
    s = student(ids)[:, at].flatten(0, 1)
    if teacher_logits is None:
        with torch.no_grad():
            teacher_logits = teacher(ids)
    t = teacher_logits[:, at].flatten(0, 1)
    return jsd_loss(s, t, beta=beta)


# --8<-- [end:loss]


# --8<-- [start:greedy]
@torch.no_grad()
def greedy_continue(model, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """[B, P + new_tokens]: the model's greedy continuation, recomputing the whole prefix at
    each step (works for the MoE teacher too, which the dense decode step does not cover).
    Sequence-level KD trains the student with cross-entropy on these tokens."""
    ids = prompt
    for _ in range(new_tokens):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


# --8<-- [end:greedy]
