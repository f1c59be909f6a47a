"""Decode with a static KV cache: every tensor the step touches has a fixed shape and address.

The cache holds max_len positions for every sequence; a step writes the new token's key and
value at its position and attends over all max_len slots with a mask (slots after the position
are hidden). Nothing in the step depends on a Python value that changes from token to token, so
the same step can be captured once as a CUDA graph and replayed for every token.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from snippets.common.models.qwen3 import Qwen3Config, Qwen3ForCausalLM, rope_tables


# --8<-- [start:cache]
@dataclass
class StaticCache:
    k: torch.Tensor  # [layers, batch, kv_heads, max_len, head_dim]
    v: torch.Tensor
    cos: torch.Tensor  # [max_len, head_dim], fp32, as the model computes them
    sin: torch.Tensor
    slots: torch.Tensor  # arange(max_len), for the mask

    @classmethod
    def empty(cls, cfg: Qwen3Config, batch: int, max_len: int, dtype, device):
        shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, max_len, cfg.head_dim)
        cos, sin = rope_tables(cfg, max_len, device)
        k = torch.zeros(shape, dtype=dtype, device=device)
        slots = torch.arange(max_len, device=device)
        return cls(k, torch.zeros_like(k), cos, sin, slots)

    def rows(self, batch: int) -> "StaticCache":
        """The first `batch` sequences: views, so the addresses stay the same."""
        return StaticCache(self.k[:, :batch], self.v[:, :batch], self.cos, self.sin, self.slots)

    def write(self, layer: int, pos, k, v):
        """Store each sequence's new key and value [batch, kv_heads, head_dim] at its own
        position, in place: one index_put_ on the whole tensor. Written through a view instead
        (self.k[layer, rows, :, pos] = k), torch.compile copies the layer's cache (section 2.4)."""
        b, heads = k.shape[:2]
        rows = torch.arange(b, device=k.device)[:, None]
        idx = (rows * 0 + layer, rows, torch.arange(heads, device=k.device), pos[:, None])
        self.k.index_put_(idx, k)
        self.v.index_put_(idx, v)


# --8<-- [end:cache]


# --8<-- [start:step]
@torch.no_grad()
def decode_step(model: Qwen3ForCausalLM, cache: StaticCache, tokens, pos):
    """One new token per sequence. tokens, pos: [batch] on the device. Returns logits [batch, V]."""
    b, d = tokens.shape[0], model.config.head_dim
    x = model.model.embed_tokens(tokens)[:, None]  # [b, 1, H]
    cos, sin = cache.cos[pos][:, None, None], cache.sin[pos][:, None, None]  # [b, 1, 1, d]
    visible = (cache.slots[None] <= pos[:, None])[:, None, None]  # [b, 1, 1, max_len]
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(b, 1, attn.n_q, d)).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(h).view(b, 1, attn.n_kv, d)).transpose(1, 2)
        v = attn.v_proj(h).view(b, 1, attn.n_kv, d).transpose(1, 2)
        q, k = attn.rope(q, k, cos.to(q.dtype), sin.to(q.dtype))
        cache.write(i, pos, k[:, :, 0], v[:, :, 0])  # this token's key and value, in place
        out = F.scaled_dot_product_attention(
            q, cache.k[i], cache.v[i], attn_mask=visible, enable_gqa=True
        )
        x = x + attn.o_proj(out.transpose(1, 2).reshape(b, 1, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.lm_head(model.model.norm(x))[:, 0]


# --8<-- [end:step]


# --8<-- [start:generate]
def generate(step, prompt, new_tokens: int):
    """Greedy decoding, one step per position: the prompt is fed token by token, then the
    argmax of each step is the next input. `step(tokens, pos)` returns logits [batch, V].
    Nothing leaves the GPU inside the loop (no .item(), no .cpu())."""
    n, p = prompt.shape
    out = list(prompt.unbind(1))
    start = torch.zeros(n, dtype=torch.long, device=prompt.device)
    for t in range(p + new_tokens - 1):
        logits = step(out[t], start + t)
        if t + 1 >= p:
            out.append(logits.argmax(-1))  # consumed before the next step overwrites logits
    return torch.stack(out, 1)


# --8<-- [end:generate]
