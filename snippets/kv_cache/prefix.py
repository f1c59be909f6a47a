"""Automatic prefix caching, vLLM-style: a full block is named by the hash of its parent's hash
and its own tokens; unreferenced cached blocks stay until LRU eviction needs their memory."""

from __future__ import annotations

import hashlib
import random
from collections import OrderedDict

from snippets.common.results import computed_result
from snippets.kv_cache.paged import OutOfBlocks


# --8<-- [start:hash]
def block_hashes(tokens: list[int], block_size: int) -> list[str]:
    """One hash per FULL block: h_i = H(h_{i-1}, tokens of block i). Equal hashes mean equal
    prefixes up to the block's end, not just equal blocks. (sha256: stable across processes,
    unlike Python's hash; vLLM's default prefix-caching hash is sha256 too.)"""
    hashes, parent = [], ""
    for i in range(len(tokens) // block_size):
        chunk = tokens[i * block_size : (i + 1) * block_size]
        parent = hashlib.sha256(f"{parent}|{chunk}".encode()).hexdigest()[:16]
        hashes.append(parent)
    return hashes


# --8<-- [end:hash]


# --8<-- [start:cache]
class PrefixCache:
    """Blocks with reference counts; a full block also has a hash. Free blocks with a hash wait
    in `evictable` (oldest release first) and are reused on a hit or evicted on demand."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        self.block_size = block_size
        self.refs = [0] * num_blocks
        self.by_hash: dict[str, int] = {}
        self.hash_of: dict[int, str] = {}
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unreferenced, still cached
        self.empty = list(range(num_blocks - 1, -1, -1))  # unreferenced, holding nothing

    def _take(self) -> int:
        if self.empty:
            return self.empty.pop()
        if not self.evictable:
            raise OutOfBlocks(f"all {len(self.refs)} blocks are referenced")
        block, _ = self.evictable.popitem(last=False)  # least recently released
        del self.by_hash[self.hash_of.pop(block)]
        return block

    def allocate(self, tokens: list[int]) -> tuple[list[int], int]:
        """Blocks for a prompt and how many of its tokens were already cached."""
        blocks, hit = [], 0
        hashes = block_hashes(tokens, self.block_size)
        for h in hashes:
            block = self.by_hash.get(h)
            if block is None:
                break
            self.evictable.pop(block, None)  # referenced again: no longer evictable
            self.refs[block] += 1
            blocks.append(block)
            hit += self.block_size
        try:
            for i in range(len(blocks), -(-len(tokens) // self.block_size)):
                block = self._take()
                self.refs[block] = 1
                if i < len(hashes):  # a full block: cache it under its hash
                    self.by_hash[hashes[i]], self.hash_of[block] = block, hashes[i]
                blocks.append(block)
        except OutOfBlocks:
            self.release(blocks)
            raise
        return blocks, hit

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):  # tail first: a prefix outlives its extensions
            if self.refs[block] == 0:
                raise ValueError(f"block {block} is already free (double free)")
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self.hash_of:
                    self.evictable[block] = None
                else:
                    self.empty.append(block)


# --8<-- [end:cache]


# --8<-- [start:trace]
def chat_trace(users: int, turns: int, system: int, message: int, reply: int, seed: int = 0):
    """Prompts of a multi-turn chat service: every user shares one system prompt; turn t sends
    the system prompt, the whole history and a new message; the reply joins the history."""
    rng = random.Random(seed)
    system_prompt = [rng.randrange(50_000) for _ in range(system)]
    histories = [list(system_prompt) for _ in range(users)]
    for _ in range(turns):
        for u in rng.sample(range(users), users):  # users interleave
            histories[u] += [rng.randrange(50_000) for _ in range(message)]
            yield list(histories[u])
            histories[u] += [rng.randrange(50_000) for _ in range(reply)]


# --8<-- [end:trace]

# --8<-- [start:run]
BLOCK = 16
cache = PrefixCache(num_blocks=4096, block_size=BLOCK)
prompt_tokens = hit_tokens = 0
for prompt in chat_trace(users=16, turns=4, system=1024, message=64, reply=128):
    blocks, hit = cache.allocate(prompt)
    prompt_tokens, hit_tokens = prompt_tokens + len(prompt), hit_tokens + hit
    cache.release(blocks)  # the request finishes; its blocks stay cached until evicted
hit_rate = hit_tokens / prompt_tokens
print(round(hit_rate, 2))
#> 0.87
# --8<-- [end:run]

# --8<-- [start:small]
small = PrefixCache(num_blocks=256, block_size=BLOCK)  # too small for 16 histories: LRU evicts
small_hits = small_tokens = 0
for prompt in chat_trace(users=16, turns=4, system=1024, message=64, reply=128):
    blocks, hit = small.allocate(prompt)
    small_tokens, small_hits = small_tokens + len(prompt), small_hits + hit
    small.release(blocks)
print(round(small_hits / small_tokens, 2))
#> 0.77
# --8<-- [end:small]

# --8<-- [start:memory]
# Memory: the 16 first-turn prompts running at once hold the system prompt's blocks once.
batch = PrefixCache(num_blocks=4096, block_size=BLOCK)
first_turn = list(chat_trace(users=16, turns=1, system=1024, message=64, reply=128))
held = [batch.allocate(p)[0] for p in first_turn]
shared_blocks = len({b for blocks in held for b in blocks})
private_blocks = sum(len(blocks) for blocks in held)
print(shared_blocks, private_blocks)
#> 128 1088
# --8<-- [end:memory]

computed_result(
    "kv-cache",
    "prefix",
    {
        "prompt_tokens": prompt_tokens,
        "hit_rate": hit_rate,
        "small_hit_rate": small_hits / small_tokens,
        "memory_saved": 1 - shared_blocks / private_blocks,
    },
)
