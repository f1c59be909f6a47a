"""PagedAttention's bookkeeping (Kwon et al., SOSP 2023, arXiv:2309.06180, §4.2-4.4): fixed-size
physical blocks with reference counts, a block table per sequence, fork and copy-on-write."""

from __future__ import annotations


class OutOfBlocks(RuntimeError):
    """No free physical block: the scheduler must wait, preempt or swap."""


# --8<-- [start:allocator]
class BlockAllocator:
    """Physical KV blocks 0..n-1; a block is free exactly when its reference count is 0."""

    def __init__(self, num_blocks: int):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.refs = [0] * num_blocks
        self.free = list(range(num_blocks - 1, -1, -1))  # a stack: pop() hands out block 0 first

    def allocate(self) -> int:
        if not self.free:
            raise OutOfBlocks(f"all {len(self.refs)} blocks are in use")
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        if self.refs[block] == 0:
            raise ValueError(f"block {block} is free: nothing to share")
        self.refs[block] += 1

    def release(self, block: int) -> None:
        if self.refs[block] == 0:
            raise ValueError(f"block {block} is already free (double free)")
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)


# --8<-- [end:allocator]


# --8<-- [start:manager]
class BlockManager:
    """Block tables: sequence id -> physical blocks, logical block i holding tokens
    [i * block_size, (i + 1) * block_size). `copies` logs each copy-on-write (src, dst)."""

    def __init__(self, num_blocks: int, block_size: int = 16):
        self.allocator, self.block_size = BlockAllocator(num_blocks), block_size
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.copies: list[tuple[int, int]] = []

    def add(self, seq: int, prompt_tokens: int) -> None:
        """A new sequence: blocks for its prompt, allocated all-or-nothing."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq} already exists")
        need, free = -(-prompt_tokens // self.block_size), len(self.allocator.free)
        if need > free:
            raise OutOfBlocks(f"sequence {seq} needs {need} blocks, {free} free")
        self.tables[seq] = [self.allocator.allocate() for _ in range(need)]
        self.lengths[seq] = prompt_tokens

    def append(self, seq: int) -> None:
        """Room for one more token: a new block when the last is full; a private copy of the
        last block when another sequence shares it (copy-on-write, §4.4)."""
        table, n = self.tables[seq], self.lengths[seq]
        if n % self.block_size == 0:  # last block full (or none yet)
            table.append(self.allocator.allocate())
        elif self.allocator.refs[table[-1]] > 1:
            new = self.allocator.allocate()
            self.copies.append((table[-1], new))  # the kernel copies the block's filled slots
            self.allocator.release(table[-1])
            table[-1] = new
        self.lengths[seq] = n + 1

    def fork(self, parent: int, child: int) -> None:
        """Parallel sampling / beam search: the child shares every block of the parent."""
        if child in self.tables:
            raise ValueError(f"sequence {child} already exists")
        for block in self.tables[parent]:
            self.allocator.share(block)
        self.tables[child] = list(self.tables[parent])
        self.lengths[child] = self.lengths[parent]

    def free(self, seq: int) -> None:
        for block in self.tables.pop(seq):
            self.allocator.release(block)
        del self.lengths[seq]


# --8<-- [end:manager]


def check_invariants(m: BlockManager) -> None:
    """Every block's count equals the number of tables that hold it; free = count 0; a table
    never holds a block twice and has exactly the blocks its length needs."""
    held = [0] * len(m.allocator.refs)
    for seq, table in m.tables.items():
        assert len(set(table)) == len(table), f"sequence {seq} holds a block twice"
        assert len(table) == -(-m.lengths[seq] // m.block_size), f"sequence {seq}: wrong size"
        for block in table:
            held[block] += 1
    assert held == m.allocator.refs, "reference counts differ from the block tables"
    free = sorted(b for b, r in enumerate(held) if r == 0)
    assert sorted(m.allocator.free) == free, "free list differs from the unreferenced blocks"


# --8<-- [start:demo]
m = BlockManager(num_blocks=8, block_size=4)
m.add(0, prompt_tokens=6)  # 2 blocks: [0, 1], the second half full
m.fork(0, 1)  # parallel sampling: sequence 1 shares both blocks
m.append(0)  # block 1 is shared and half full: copy-on-write
m.append(1)  # now sequence 1 is block 1's only owner: it writes in place
print(m.tables, m.copies, m.allocator.refs[:3])
#> {0: [0, 2], 1: [0, 1]} [(1, 2)] [2, 1, 1]
m.free(0)
m.free(1)
check_invariants(m)
print(len(m.allocator.free))
#> 8
# --8<-- [end:demo]
