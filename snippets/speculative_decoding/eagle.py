"""An EAGLE-3 draft head for the shared target, trained here with training-time test.

The head (EAGLE-3, Li et al. 2025, arXiv:2503.01840; the official code, SafeAILab/EAGLE
eagle/traineagle3/cnets.py) is one decoder layer on top of the target:
  g = fc([l, m, h])                       low-, mid- and high-level target features, 3H -> H
  a = attention([norm(embed(x_{t+1})), norm(g)])   the next token's embedding beside g (2H)
  o = g + a; o = o + MLP(norm(o))          the layer's output, fed back as the next g
  logits = lm_head(norm(o))                predicts x_{t+2}
At inference the head first reads the target's features of the committed tokens, then drafts
a chain, each step feeding its own output o back in place of a target feature. EAGLE-1/2
trained the head to regress the next top-layer feature (and used it that way); EAGLE-3 drops
that loss and trains only on tokens, and makes training see what inference feeds it: step s of
"training-time test" takes step s - 1's outputs as its features, attends to the true features'
keys before its position and to its own earlier steps' keys at the same position, and its loss
is weighted 0.8^s (main.py: ploss_weight). The loss is the cross-entropy against the target's
whole next-token distribution (cnets.py: target_p * log_softmax).

Our target has two layers, so "low, mid, high" are the residual stream after layer 0's
attention, after layer 0 and after layer 1 (EAGLE-3 takes the inputs of layers 2, L/2, L-3 of
a deep model). The head keeps the full vocabulary (EAGLE-3 shrinks it to 32k of Llama 3's 128k;
ours has 8192 tokens).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from snippets.common.models.qwen3 import Qwen3Config, rope_tables, rotate_half
from snippets.common.train import TrainConfig, batch_order, deterministic, lr_factor, rows
from snippets.speculative_decoding.runner import Cache, Runner, Tree, visible

TAPS = ((0, "attn"), (0, "mlp"), (1, "mlp"))  # low, mid, high: the target's residual stream
TTT_DECAY = 0.8  # EAGLE-3 main.py: ploss_weight = [0.8 ** i ...]


# --8<-- [start:head]
@dataclass(frozen=True)
class HeadConfig:
    hidden: int  # the target's: the head reads its features and its embedding
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    features: int = 3  # target features concatenated into fc's input
    eps: float = 1e-6
    rope_theta: float = 1e6

    @classmethod
    def for_target(cls, cfg: Qwen3Config) -> HeadConfig:
        """A narrower layer than the target's (a quarter of its heads, an MLP half as wide as
        the hidden size): the target has only two layers, and a head as wide as one of them
        would cost half a target step per draft."""
        return cls(cfg.hidden_size, max(1, cfg.num_attention_heads // 4),
                   max(1, cfg.num_key_value_heads // 4), cfg.head_dim, cfg.hidden_size // 2,
                   cfg.vocab_size, len(TAPS), cfg.rms_norm_eps, cfg.rope_theta)  # fmt: skip


class RMS(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # in fp32 at least, back to x's dtype (also under bf16 autocast)
        wide = torch.promote_types(x.dtype, torch.float32)
        out = F.rms_norm(x.to(wide), (x.shape[-1],), self.weight.to(wide), self.eps)
        return out.to(x.dtype)


class EagleHead(nn.Module):
    """The trainable head. The embedding is the target's, frozen (not a parameter)."""

    def __init__(self, cfg: HeadConfig, embed: torch.Tensor):
        super().__init__()
        h, d = cfg.hidden, cfg.head_dim
        self.cfg = cfg
        self.register_buffer("embed", embed.detach(), persistent=False)
        self.fc = nn.Linear(cfg.features * h, h, bias=False)
        self.input_norm, self.hidden_norm = RMS(h, cfg.eps), RMS(h, cfg.eps)
        self.q = nn.Linear(2 * h, cfg.heads * d, bias=False)
        self.k = nn.Linear(2 * h, cfg.kv_heads * d, bias=False)
        self.v = nn.Linear(2 * h, cfg.kv_heads * d, bias=False)
        self.o = nn.Linear(cfg.heads * d, h, bias=False)
        self.post_norm = RMS(h, cfg.eps)
        self.gate = nn.Linear(h, cfg.intermediate, bias=False)
        self.up = nn.Linear(h, cfg.intermediate, bias=False)
        self.down = nn.Linear(cfg.intermediate, h, bias=False)
        self.norm = RMS(h, cfg.eps)
        self.lm_head = nn.Linear(h, cfg.vocab, bias=False)

    def init_from(self, target: Runner, seed: int, std: float = 0.02) -> EagleHead:
        """Matrices N(0, std); fc = [0 0 I], so that g starts as the top feature; the final
        norm and the LM head start as the target's (our choice: a short training run)."""
        gen = torch.Generator(device=self.fc.weight.device).manual_seed(seed)
        with torch.no_grad():
            for m in (self.q, self.k, self.v, self.o, self.gate, self.up, self.down):
                m.weight.normal_(0.0, std, generator=gen)
            h = self.cfg.hidden
            self.fc.weight.zero_()
            self.fc.weight[:, -h:] = torch.eye(h, device=self.fc.weight.device)
            self.norm.weight.copy_(target.norm)
            self.lm_head.weight.copy_(target.head)
        return self

    def block(self, tokens, g, cos, sin, keys, values, mask):
        """One pass of the layer: returns (o, logits, k, v); keys/values: earlier keys and
        values this step may attend to (mask [n, len(earlier) + n])."""
        b, n, _ = g.shape
        cfg = self.cfg
        x = torch.cat([self.input_norm(self.embed[tokens]), self.hidden_norm(g)], -1)
        q = self.q(x).view(b, n, cfg.heads, cfg.head_dim).transpose(1, 2)
        k = self.k(x).view(b, n, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        v = self.v(x).view(b, n, cfg.kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        all_k, all_v = torch.cat([*keys, k], 2), torch.cat([*values, v], 2)
        a = F.scaled_dot_product_attention(q, all_k, all_v, attn_mask=mask, enable_gqa=True)
        o = g + self.o(a.transpose(1, 2).reshape(b, n, -1))
        h = self.post_norm(o)
        o = o + self.down(F.silu(self.gate(h)) * self.up(h))
        return o, self.lm_head(self.norm(o)).float(), k, v


# --8<-- [end:head]


# --8<-- [start:ttt]
def ttt_mask(n: int, step: int, device=None) -> torch.Tensor:
    """[n, (step + 1) n]: at training-time-test step `step`, position t attends to the true
    features' keys at t' <= t (causal) and to its own steps 1..step at t only (diagonal)."""
    blocks = [torch.ones(n, n, dtype=torch.bool, device=device).tril()]
    blocks += [torch.eye(n, dtype=torch.bool, device=device)] * step
    return torch.cat(blocks, 1)


def ttt_loss(head: EagleHead, feats, ids, target_logits, steps: int):
    """EAGLE-3's training loss over `steps` unrolled draft steps. feats [B, T, 3H]: the
    target's features at each position; ids [B, T]; target_logits [B, T, V]. Step s at
    position t reads token t+1+s and predicts token t+2+s, whose target distribution is
    softmax(target_logits[t+1+s]). Returns (weighted loss, per-step top-1 agreement)."""
    t_all = feats.shape[1]
    n = t_all - steps  # positions every step can use
    if n < 1:
        raise ValueError(f"sequences of {t_all} tokens leave nothing for {steps} TTT steps")
    cfg = head.cfg
    cos_all, sin_all = rope_tables(_rope(cfg), t_all, feats.device)
    g = head.fc(feats[:, :n])
    keys, values, total, agree = [], [], 0.0, []
    for s in range(steps):
        cos, sin = cos_all[s : s + n].to(g.dtype), sin_all[s : s + n].to(g.dtype)
        o, logits, k, v = head.block(ids[:, 1 + s : 1 + s + n], g, cos, sin, keys, values,
                                     ttt_mask(n, s, feats.device))  # fmt: skip
        keys.append(k)
        values.append(v)
        target = target_logits[:, 1 + s : 1 + s + n].float()
        loss = -(target.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
        total = total + TTT_DECAY**s * loss
        agree.append((logits.argmax(-1) == target.argmax(-1)).float().mean().detach())
        g = o
    return total, torch.stack(agree)


def _rope(cfg: HeadConfig) -> Qwen3Config:
    return Qwen3Config(head_dim=cfg.head_dim, rope_theta=cfg.rope_theta)


# --8<-- [end:ttt]


# --8<-- [start:train]
@dataclass(frozen=True)
class HeadTraining:
    steps: int = 200
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 5e-4
    warmup_steps: int = 20
    weight_decay: float = 0.0
    ttt_steps: tuple[int, ...] = (5, 1)  # one head per entry: EAGLE-3, and without TTT
    seed: int = 0


def target_features(target: Runner, ids: torch.Tensor):
    """The target's features at TAPS and its logits for whole sequences ids [B, T]."""
    cache = target.cache(ids.shape[0])
    pos0 = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    hidden, taps = target.forward(cache, ids, pos0, Tree.chain(ids.shape[1], ids.device))
    return torch.cat(taps, -1), target.logits(hidden)


def train_heads(target: Runner, stream: torch.Tensor, tc: HeadTraining) -> list[dict]:
    """One head per tc.ttt_steps entry, trained side by side on the same batches (one target
    pass per step feeds them all): AdamW, linear warm-up then cosine decay (the shared
    trainer's schedule), bf16 autocast on CUDA. Returns [{head, ttt_steps, loss, agree}]."""
    device = target.device
    seqs = rows(stream, tc.seq_len).to(device)
    sched = TrainConfig(seed=tc.seed, steps=tc.steps, batch_size=tc.batch_size,
                        seq_len=tc.seq_len, lr=tc.lr, warmup_steps=tc.warmup_steps)  # fmt: skip
    order = batch_order(len(seqs), sched).to(device)
    cfg = HeadConfig.for_target(target.config)
    runs = []
    for i, steps in enumerate(tc.ttt_steps):
        head = EagleHead(cfg, target.embed.float()).to(device).init_from(target, tc.seed + i)
        opt = torch.optim.AdamW(head.parameters(), lr=tc.lr, betas=(0.9, 0.95),
                                weight_decay=tc.weight_decay)  # fmt: skip
        lr = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, sched))
        runs.append({"head": head, "opt": opt, "lr": lr, "ttt_steps": steps, "loss": []})
    autocast = torch.autocast("cuda", torch.bfloat16) if device.type == "cuda" else nullcontext()
    with deterministic():  # as the shared trainer: two runs train the same heads, bit for bit
        _train_steps(target, seqs, order, runs, tc, autocast)
    for run in runs:
        run["head"].eval()
        run["loss"] = torch.stack(run["loss"]).tolist()
    return [{k: r[k] for k in ("head", "ttt_steps", "loss")} for r in runs]


def _train_steps(target: Runner, seqs, order, runs: list[dict], tc: HeadTraining,
                 autocast) -> None:  # fmt: skip
    for step in range(tc.steps):
        ids = seqs[order[step]].long()
        with torch.no_grad():
            feats, logits = target_features(target, ids)
        for run in runs:
            with autocast:
                loss, _ = ttt_loss(run["head"], feats.float(), ids, logits, run["ttt_steps"])
            run["opt"].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run["head"].parameters(), 1.0)
            run["opt"].step()
            run["lr"].step()
            run["loss"].append(loss.detach())


@torch.no_grad()
def agreement(head: EagleHead, target: Runner, stream: torch.Tensor, steps: int, seq_len: int,
              batch_size: int = 8) -> list[float]:  # fmt: skip
    """Per draft step, how often the head's top token is the target's top token on held-out
    text (every row of seq_len tokens in `stream`), each step fed the head's own earlier
    outputs (the training-time-test pass): a teacher-forced proxy of greedy acceptance."""
    seqs = rows(stream, seq_len).to(target.device)  # (rows() refuses a stream too short)
    total = torch.zeros(steps, device=target.device)
    for ids in seqs.long().split(batch_size):
        feats, logits = target_features(target, ids)
        total += ttt_loss(head, feats.float(), ids, logits, steps)[1] * len(ids)
    return (total / len(seqs)).tolist()


# --8<-- [end:train]


# --8<-- [start:runner]
class HeadRunner:
    """The trained head for decoding: weights in `dtype`, a one-layer KV cache, and the same
    visibility rule as the target's Runner (committed slots, plus the new tokens' tree)."""

    def __init__(self, head: EagleHead, target: Runner):
        cast = lambda t: t.detach().to(target.dtype).contiguous()  # noqa: E731
        self.cfg, self.dtype, self.device = head.cfg, target.dtype, target.device
        self.embed = target.embed
        with torch.no_grad():
            self.fc = cast(head.fc.weight)
            self.in_norm = cast(head.input_norm.weight)
            self.hid_norm = cast(head.hidden_norm.weight)
            self.qkv = cast(torch.cat([head.q.weight, head.k.weight, head.v.weight]))
            self.o, self.post = cast(head.o.weight), cast(head.post_norm.weight)
            self.gate_up = cast(torch.cat([head.gate.weight, head.up.weight]))
            self.down, self.norm = cast(head.down.weight), cast(head.norm.weight)
            self.lm_head = cast(head.lm_head.weight)
        self.cos, self.sin, self.slots = target.cos, target.sin, target.slots
        self.max_len = target.max_len

    def cache(self, batch: int, max_len: int | None = None) -> Cache:
        c, max_len = self.cfg, max_len or self.max_len
        k = torch.zeros(1, batch, c.kv_heads, max_len, c.head_dim, dtype=self.dtype,
                        device=self.device)  # fmt: skip
        return Cache(k, torch.zeros_like(k))

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        return feats @ self.fc.T

    @torch.no_grad()
    def forward(self, cache: Cache, tokens, g, pos0, tree: Tree):
        """tokens [b, n] (the token after each feature's position), g [b, n, H] at slots
        pos0 + (0..n-1). Returns (o [b, n, H], fp32 logits [b, n, V])."""
        c, (b, n) = self.cfg, tokens.shape
        eps = c.eps
        x = torch.cat([F.rms_norm(self.embed[tokens], (c.hidden,), self.in_norm, eps),
                       F.rms_norm(g, (c.hidden,), self.hid_norm, eps)], -1)  # fmt: skip
        qkv = (x @ self.qkv.T).view(b, n, c.heads + 2 * c.kv_heads, c.head_dim)
        at = pos0[:, None] + tree.depth[None, :]
        cos, sin = self.cos[at][:, :, None], self.sin[at][:, :, None]
        qk = qkv[:, :, : c.heads + c.kv_heads]
        qk = torch.addcmul(qk * cos, qk.roll(c.head_dim // 2, -1), sin)  # RoPE, as in Runner
        q, k, v = qk[:, :, : c.heads], qk[:, :, c.heads :], qkv[:, :, c.heads + c.kv_heads :]
        slots = pos0[:, None] + torch.arange(n, device=pos0.device)
        rows = torch.arange(b, device=pos0.device)[:, None, None]
        idx = (rows, torch.arange(c.kv_heads, device=pos0.device)[None, None, :], slots[:, :, None])
        cache.k[0].index_put_(idx, k)
        cache.v[0].index_put_(idx, v)
        mask = visible(self.slots[: cache.max_len], pos0, tree)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), cache.k[0], cache.v[0],
                                           attn_mask=mask, enable_gqa=True)  # fmt: skip
        o = g + a.transpose(1, 2).reshape(b, n, -1) @ self.o.T
        gate, up = (F.rms_norm(o, (c.hidden,), self.post, eps) @ self.gate_up.T).chunk(2, -1)
        o = o + (F.silu(gate) * up) @ self.down.T
        logits = F.rms_norm(o, (c.hidden,), self.norm, eps) @ self.lm_head.T
        return o, logits.to(torch.promote_types(logits.dtype, torch.float32))


# --8<-- [end:runner]
