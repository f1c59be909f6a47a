"""Tree verification: several candidate continuations, sharing prefixes, verified in one target
pass (SpecInfer, Miao et al. 2023; Medusa, Cai et al. 2024; EAGLE-2, Li et al. 2024). Node 0
is the last committed token; every other node is a drafted token under its parent. All nodes
go through the target at once: node i sits at position pos0 + depth(i), in cache slot pos0 + i,
and attends to the committed text and to its own ancestors only (Tree.mask), so its logits
are exactly those the target would give the path from the root to i.

Greedy acceptance walks down from the root, each time into the child whose token is the
target's argmax after its parent (siblings carry different tokens, so at most one matches);
the target's argmax after the last accepted node is the extra token. The accepted nodes'
keys and values sit at their tree slots: `compact` moves them to the slots of their positions,
so that the cache again holds a plain sequence.
"""

from __future__ import annotations

import torch

from snippets.speculative_decoding.runner import Cache, Runner, Tree


# --8<-- [start:verify]
def tree_logits(target: Runner, cache: Cache, tokens: torch.Tensor, pos0: torch.Tensor,
                tree: Tree) -> torch.Tensor:  # fmt: skip
    """[b, n, V]: the target's logits after every node of the tree, in one pass."""
    hidden, _ = target.forward(cache, tokens, pos0, tree)
    return target.logits(hidden)


def accept_greedy(tokens: torch.Tensor, logits: torch.Tensor, tree: Tree):
    """(on_path [b, n] bool, accepted [b] drafts, token [b] the target's next token, last [b]
    the deepest accepted node). Node i (i >= 1) is accepted iff its parent is and its token is
    the argmax of the logits after its parent."""
    best = logits.argmax(-1)  # [b, n]
    on_path = torch.zeros_like(tokens, dtype=torch.bool)
    on_path[:, 0] = True
    for i in range(1, tree.n):
        p = tree.parents[i]
        on_path[:, i] = on_path[:, p] & (tokens[:, i] == best[:, p])
    depth = torch.where(on_path, tree.depth[None, :], -1)
    last = depth.argmax(1)  # the deepest node on the path (one per depth at most)
    accepted = depth.max(1).values
    return on_path, accepted, best.gather(1, last[:, None])[:, 0], last


def compact(cache: Cache, pos0: torch.Tensor, on_path: torch.Tensor, tree: Tree) -> None:
    """Move the keys and values of the accepted node at each depth d from its slot pos0 + i to
    slot pos0 + d. Where no node of depth d was accepted, slot pos0 + d keeps what it holds
    (it lies past the committed text and is masked until overwritten)."""
    depths = int(tree.depth.max()) + 1
    node = torch.arange(tree.n, device=pos0.device)
    src = []
    for d in range(depths):
        here = on_path & (tree.depth == d)[None, :]  # at most one node per row
        src.append(torch.where(here.any(1), (here * node).sum(1), d))
    src = pos0[:, None] + torch.stack(src, 1)  # [b, depths]
    dst = pos0[:, None] + torch.arange(depths, device=pos0.device)
    for kv in (cache.k, cache.v):  # [layers, b, heads, slots, d]
        shape = (kv.shape[0], kv.shape[1], kv.shape[2], depths, kv.shape[4])
        rows = kv.gather(3, src[None, :, None, :, None].expand(shape))
        kv.scatter_(3, dst[None, :, None, :, None].expand(shape), rows)


# --8<-- [end:verify]


# --8<-- [start:build]
def topk_tree(branching: list[int]) -> list[int]:
    """The parents of a static tree: the root, then at depth d every node of depth d - 1 gets
    branching[d - 1] children (its draft's top-k tokens). [2, 1] is a root with two children,
    each with one child: parents [-1, 0, 0, 1, 2]."""
    parents, level = [-1], [0]
    for k in branching:
        if k < 1:
            raise ValueError(f"branching {branching}: every level needs at least one child")
        nxt = []
        for node in level:
            for _ in range(k):
                parents.append(node)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


# --8<-- [end:build]
