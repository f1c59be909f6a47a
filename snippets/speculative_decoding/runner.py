"""A decoder for the shared Qwen3 models that takes several new tokens per sequence in one pass.

`Runner` holds a model's weights as serving needs them (fused q/k/v and gate/up matrices, in
the serving dtype) and `Cache` a static KV cache: every tensor has a fixed shape and address,
so a decoding round built from them can be captured in a CUDA graph. `Runner.forward` writes
the keys and values of n new tokens per sequence at slots pos0 .. pos0 + n - 1 and lets token
i see every committed slot (< pos0) and the new slots `tree[i]` allows: a causal block for a
chain of drafts, ancestor-or-self for a token tree. The same call verifies drafts, prefills a
prompt (n = prompt length, pos0 = 0) and decodes one token (n = 1).

Fewer, larger kernels than the model's own forward (it is what a decode step is made of in a
CUDA graph): one fused RMSNorm call per norm, one matmul for q, k, v and one for gate and up,
q/k norm and RoPE over q and k together (rotate_half(x) * sin == roll(x, d/2) * sign * sin).
Checked against Qwen3ForCausalLM.forward in tests/snippets/test_speculative_decoding.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snippets.common.models.qwen3 import Qwen3ForCausalLM, rope_tables


# --8<-- [start:tree]
@dataclass(frozen=True)
class Tree:
    """The shape of the n tokens a forward pass adds per sequence: parents[i] is the index of
    token i's parent among them (-1 for the first, which continues the committed text), a
    parent before its children. mask[i, j]: token i sees token j (j is i or an ancestor);
    depth[i]: i's distance from the first token (its position is pos0 + depth[i])."""

    parents: tuple[int, ...]
    mask: torch.Tensor  # [n, n] bool
    depth: torch.Tensor  # [n] long

    @classmethod
    def of(cls, parents, device=None) -> Tree:
        parents = tuple(int(x) for x in parents)
        n = len(parents)
        if n == 0 or parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(parents) if i):
            raise ValueError(f"parents {parents}: the first token has parent -1, every other "
                             "an earlier token")  # fmt: skip
        mask = torch.eye(n, dtype=torch.bool)
        depth = [0] * n
        for i in range(1, n):
            mask[i] |= mask[parents[i]]
            depth[i] = depth[parents[i]] + 1
        return cls(parents, mask.to(device), torch.tensor(depth, device=device))

    @classmethod
    def chain(cls, n: int, device=None) -> Tree:
        return cls.of([-1, *range(n - 1)], device)

    @property
    def n(self) -> int:
        return len(self.parents)


# --8<-- [end:tree]


def visible(slots: torch.Tensor, pos0: torch.Tensor, tree: Tree) -> torch.Tensor:
    """[b, 1, n, max_len]: what each new token attends to. Committed slots (< pos0) and, among
    the n new slots pos0 .. pos0 + n - 1, those tree.mask allows; later slots hold stale keys
    of rejected drafts and stay hidden."""
    rel = slots[None, None, :] - pos0[:, None, None]  # slot - pos0: [b, 1, max_len]
    new = (rel >= 0) & (rel < tree.n)
    query = torch.arange(tree.n, device=pos0.device)[None, :, None]
    return ((rel < 0) | (new & tree.mask[query, rel.clamp(0, tree.n - 1)]))[:, None]


@dataclass
class Cache:
    k: torch.Tensor  # [layers, batch, kv_heads, max_len, head_dim]
    v: torch.Tensor

    @property
    def max_len(self) -> int:
        return self.k.shape[3]


@dataclass(frozen=True)
class Layer:
    ln1: torch.Tensor
    qkv: torch.Tensor  # [(nq + 2 nkv) d, H]: q, k, v stacked
    qk_norm: torch.Tensor  # [nq + nkv, d]: q_norm's weight per q head, then k_norm's
    o: torch.Tensor
    ln2: torch.Tensor
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor


# --8<-- [start:runner]
class Runner:
    """A Qwen3ForCausalLM's weights, fused, in `dtype`; `taps` names the residual-stream
    points forward() can return: (layer, "attn") after that layer's attention block,
    (layer, "mlp") after the whole layer."""

    def __init__(self, model: Qwen3ForCausalLM, dtype: torch.dtype, max_len: int,
                 taps: tuple[tuple[int, str], ...] = ()):  # fmt: skip
        cfg = self.config = model.config
        w = next(model.parameters())
        self.device, self.dtype = w.device, dtype
        self.nq, self.nkv, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.eps = cfg.rms_norm_eps
        with torch.no_grad():
            cast = lambda t: t.detach().to(dtype).contiguous()  # noqa: E731
            self.layers = [
                Layer(
                    ln1=cast(layer.input_layernorm.weight),
                    qkv=cast(torch.cat([layer.self_attn.q_proj.weight,
                                        layer.self_attn.k_proj.weight,
                                        layer.self_attn.v_proj.weight])),
                    qk_norm=cast(torch.cat([layer.self_attn.q_norm.weight.expand(self.nq, -1),
                                            layer.self_attn.k_norm.weight.expand(self.nkv, -1)])),
                    o=cast(layer.self_attn.o_proj.weight),
                    ln2=cast(layer.post_attention_layernorm.weight),
                    gate_up=cast(torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])),
                    down=cast(layer.mlp.down_proj.weight),
                )
                for layer in model.model.layers
            ]  # fmt: skip
            self.embed = cast(model.model.embed_tokens.weight)
            self.norm = cast(model.model.norm.weight)
            self.head = cast(model.lm_head.weight)
        cos, sin = rope_tables(cfg, max_len, self.device)  # fp32, as the model computes them
        half = self.d // 2
        sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(self.device)
        self.cos, self.sin = cos.to(dtype), (sin * sign).to(dtype)
        self.max_len = max_len
        self.slots = torch.arange(max_len, device=self.device)
        order = [(i, w) for i in range(len(self.layers)) for w in ("attn", "mlp")]
        if any(t not in order for t in taps) or list(taps) != sorted(taps, key=order.index):
            raise ValueError(f"taps {taps}: points (layer, 'attn' | 'mlp') of {len(self.layers)} "
                             "layers, in the order the forward pass reaches them")  # fmt: skip
        self.taps = tuple(taps)

    def weights(self) -> list[torch.Tensor]:
        """The tensors one decode step reads: every layer's, the final norm and the LM head
        (of the embedding a step reads one row per token: left out)."""
        return [t for w in self.layers for t in vars(w).values()] + [self.norm, self.head]

    def cache(self, batch: int, max_len: int | None = None) -> Cache:
        """Zeros for `batch` sequences of up to max_len tokens (at most the Runner's)."""
        max_len = max_len or self.max_len
        if not 1 <= max_len <= self.max_len:
            raise ValueError(f"a cache of {max_len} slots: this Runner has {self.max_len}")
        shape = (len(self.layers), batch, self.nkv, max_len, self.d)
        k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return Cache(k, torch.zeros_like(k))

    @torch.no_grad()
    def forward(
        self,
        cache: Cache,
        tokens: torch.Tensor,
        pos0: torch.Tensor,
        tree: Tree,
        *,
        embedded: torch.Tensor | None = None,
        layers=None,
    ) -> tuple[torch.Tensor, list]:
        """tokens [b, n] at slots pos0[b] + (0..n-1), positions pos0 + tree.depth. Returns the
        final hidden states [b, n, H] (normed: logits() turns them into logits) and the taps.
        embedded: inputs already embedded (a draft head's); layers: a subset to run."""
        b, n = tokens.shape[:2]
        if n != tree.n:
            raise ValueError(f"{n} tokens for a tree of {tree.n}")
        x = self.embed[tokens] if embedded is None else embedded
        at = pos0[:, None] + tree.depth[None, :]  # positions [b, n]
        cos, sin = self.cos[at][:, :, None], self.sin[at][:, :, None]  # [b, n, 1, d]
        mask = visible(self.slots[: cache.max_len], pos0, tree)
        slots = pos0[:, None] + torch.arange(n, device=pos0.device)  # [b, n]
        rows = torch.arange(b, device=pos0.device)[:, None, None]
        heads = torch.arange(self.nkv, device=pos0.device)[None, None, :]
        nqk = self.nq + self.nkv
        taps = []
        for i, w in enumerate(self.layers if layers is None else layers):
            h = F.rms_norm(x, (x.shape[-1],), w.ln1, self.eps)
            qkv = (h @ w.qkv.T).view(b, n, nqk + self.nkv, self.d)
            qk = F.rms_norm(qkv[:, :, :nqk], (self.d,), None, self.eps) * w.qk_norm
            qk = torch.addcmul(qk * cos, qk.roll(self.d // 2, -1), sin)  # RoPE
            q, k, v = qk[:, :, : self.nq], qk[:, :, self.nq :], qkv[:, :, nqk:]
            idx = (rows, heads, slots[:, :, None])
            cache.k[i].index_put_(idx, k)
            cache.v[i].index_put_(idx, v)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), cache.k[i], cache.v[i],
                                                 attn_mask=mask, enable_gqa=True)  # fmt: skip
            x = x + out.transpose(1, 2).reshape(b, n, -1) @ w.o.T
            if (i, "attn") in self.taps:
                taps.append(x)
            h = F.rms_norm(x, (x.shape[-1],), w.ln2, self.eps)
            gate, up = (h @ w.gate_up.T).chunk(2, -1)
            x = x + (F.silu(gate) * up) @ w.down.T
            if (i, "mlp") in self.taps:
                taps.append(x)
        return F.rms_norm(x, (x.shape[-1],), self.norm, self.eps), taps

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits (at least) from the final hidden states."""
        out = hidden @ self.head.T
        return out.to(torch.promote_types(out.dtype, torch.float32))


# --8<-- [end:runner]
