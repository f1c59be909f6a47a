"""Piecewise CUDA graphs, the way vLLM captures a model: everything but attention is recorded,
one set of graphs per padded token count; attention runs eager between the pieces, on ragged
sequences described by CPU-side metadata that changes from batch to batch.

The tokens of all sequences are packed into one [T, H] matrix (no batch dimension, no padding
between sequences). Outside attention every operation works token by token (embedding, norms,
projections, RoPE, MLP), so its shapes depend only on T: padded up to a captured size, one graph
per piece serves any mix of sequence lengths. Attention is the only place where tokens of one
sequence meet, and where the sequence boundaries (`starts`, vLLM's query_start_loc) matter.
"""

from itertools import pairwise
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from snippets.common.models.qwen3 import rope_tables
from snippets.cuda_graph.graphs import bucket_for, capture


# --8<-- [start:pieces]
def qkv(layer, x, cos, sin):
    """A layer up to attention, for packed tokens x [T, H]; cos, sin [T, head_dim] hold each
    token's own position. Returns q, k, v as [heads, T, head_dim]."""
    attn, t, d = layer.self_attn, x.shape[0], layer.self_attn.head_dim
    h = layer.input_layernorm(x)
    q = attn.q_norm(attn.q_proj(h).view(t, attn.n_q, d)).transpose(0, 1)
    k = attn.k_norm(attn.k_proj(h).view(t, attn.n_kv, d)).transpose(0, 1)
    v = attn.v_proj(h).view(t, attn.n_kv, d).transpose(0, 1)
    q, k = attn.rope(q, k, cos.to(q.dtype), sin.to(q.dtype))
    return q, k, v


def after_attention(layer, x, out):
    """A layer after attention: output projection and residual, then the MLP and residual."""
    x = x + layer.self_attn.o_proj(out)
    return x + layer.mlp(layer.post_attention_layernorm(x))


def ragged_attention(q, k, v, starts, out):
    """Causal attention of each sequence over its own tokens. starts = [0, end of sequence 0,
    ..., n] lives on the CPU (vLLM keeps it as query_start_loc and hands it to a varlen kernel).
    Writes rows [0, n) of the preallocated out [T, heads * head_dim]; padding rows are left as
    they are: nothing downstream mixes tokens, so they cannot leak into real rows."""
    for s, e in pairwise(starts):
        o = F.scaled_dot_product_attention(
            q[None, :, s:e], k[None, :, s:e], v[None, :, s:e], is_causal=True, enable_gqa=True
        )
        out[s:e] = o[0].transpose(0, 1).reshape(e - s, -1)


# --8<-- [end:pieces]


# --8<-- [start:piecewise]
class Piecewise:
    """A Qwen3 model as L + 1 pieces per bucket of token counts: embedding and layer 0 up to
    attention; from one attention to the next; after the last attention to the final norm.
    With graphs=True each piece is a CUDA graph (all in one pool, the largest bucket captured
    first); attention and the LM head run eager, as in vLLM. graphs=False runs the same pieces
    eagerly (the CPU checks the splitting that way)."""

    @torch.no_grad()
    def __init__(self, model, buckets, max_len: int, graphs: bool = True):
        self.model, self.buckets = model, sorted(buckets)
        self.device = model.lm_head.weight.device
        self.cos, self.sin = rope_tables(model.config, max_len, self.device)
        pool = torch.cuda.graph_pool_handle() if graphs else None
        self.runs = {t: self._pieces(t, graphs, pool) for t in reversed(self.buckets)}

    def _pieces(self, t: int, graphs: bool, pool):
        layers, w = self.model.model.layers, self.model.lm_head.weight
        width = self.model.config.num_attention_heads * self.model.config.head_dim
        s = SimpleNamespace(  # the static tensors of this bucket, and the pieces' outputs
            ids=torch.zeros(t, dtype=torch.long, device=self.device),
            pos=torch.zeros(t, dtype=torch.long, device=self.device),
            attn=[torch.zeros(t, width, dtype=w.dtype, device=self.device) for _ in layers],
            x=[None] * len(layers),
            qkv=[None] * len(layers),
        )

        def piece(i: int):
            def run():
                if i == 0:
                    x = self.model.model.embed_tokens(s.ids)
                    s.cos, s.sin = self.cos[s.pos], self.sin[s.pos]
                else:
                    x = after_attention(layers[i - 1], s.x[i - 1], s.attn[i - 1])
                if i < len(layers):
                    s.x[i], s.qkv[i] = x, qkv(layers[i], x, s.cos, s.sin)
                else:
                    s.hidden = self.model.model.norm(x)

            return run

        s.pieces = [piece(i) for i in range(len(layers) + 1)]
        if graphs:  # in order: each piece reads the outputs the one before it was captured with
            s.pieces = [capture(run, pool=pool)[0].replay for run in s.pieces]
        return s

    @torch.no_grad()
    def __call__(self, ids, starts):
        """ids [n]: the tokens of all sequences back to back; starts: Python ints, starts[-1] = n.
        Returns the logits [n, vocab]; the pieces' outputs are overwritten by the next call."""
        n = ids.shape[0]
        s = self.runs[bucket_for(n, self.buckets)]
        pos = torch.cat([torch.arange(e - b) for b, e in pairwise(starts)])
        s.ids.zero_()  # padding: token 0 at position 0
        s.pos.zero_()
        s.ids[:n].copy_(ids)
        s.pos[:n].copy_(pos)
        for i, run in enumerate(s.pieces):
            run()
            if i < len(s.attn):
                ragged_attention(*s.qkv[i], starts, s.attn[i])
        return self.model.lm_head(s.hidden[:n])


# --8<-- [end:piecewise]


def packed(lengths, vocab: int, device, seed: int = 0):
    """Random sequences of the given lengths, packed: (ids [n], starts, the sequences)."""
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, vocab, (n,), generator=g).to(device) for n in lengths]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    return torch.cat(seqs), starts, seqs


def rel_to_reference(model, pw, lengths, seed: int = 0) -> float:
    """Largest difference between the piecewise logits of a packed batch and the model run on
    each sequence alone, relative to the largest logit."""
    ids, starts, seqs = packed(lengths, model.config.vocab_size, pw.device, seed)
    got = pw(ids, starts)
    with torch.no_grad():
        want = torch.cat([model(seq[None])[0] for seq in seqs])
    return ((got - want).abs().max() / want.abs().max()).item()
