"""Three ways to read the same tokenized corpus: a memory-mapped token file with an offset
index, one JSON line per sample read and tokenized on every access, and shards streamed in
order through a shuffle buffer. All three return the same documents (tested)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

# --8<-- [start:write]
WORDS = ("token", "batch", "loader", "GPU", "训练", "推理", "加速", "memmap", "shard", "pack")


def make_docs(n: int, seed: int = 0, mean_words: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(max(1, int(rng.expovariate(1 / mean_words)))))
            for _ in range(n)]  # fmt: skip


def tokenize(text: str) -> np.ndarray:
    """Byte-level tokens (vocabulary 256): enough to make tokenizing cost real CPU time."""
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)


def write_corpus(folder: Path, docs: list[str], shard_docs: int = 256) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    toks = [tokenize(d) for d in docs]
    offsets = np.zeros(len(toks) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(t) for t in toks])
    np.concatenate(toks).tofile(folder / "tokens.bin")  # uint16, back to back
    np.save(folder / "offsets.npy", offsets)
    lines = [json.dumps({"text": d}, ensure_ascii=False).encode() + b"\n" for d in docs]
    (folder / "docs.jsonl").write_bytes(b"".join(lines))
    np.save(folder / "docs_offsets.npy", np.cumsum([0] + [len(x) for x in lines]))
    for s in range(0, len(toks), shard_docs):
        part = toks[s : s + shard_docs]
        np.savez(folder / f"shard-{s // shard_docs:05d}.npz", tokens=np.concatenate(part),
                 lengths=np.array([len(t) for t in part]))  # fmt: skip


# --8<-- [end:write]


# --8<-- [start:read]
class MemmapSamples:
    """Random access without reading the file: the OS pages in what a slice touches."""

    def __init__(self, folder: Path):
        self.tokens = np.memmap(folder / "tokens.bin", dtype=np.uint16, mode="r")
        self.offsets = np.load(folder / "offsets.npy")
        if self.offsets[-1] != len(self.tokens):
            raise ValueError(f"{folder}/offsets.npy ends at {self.offsets[-1]}, but tokens.bin "
                             f"holds {len(self.tokens)} tokens")  # fmt: skip

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        return np.array(self.tokens[self.offsets[i] : self.offsets[i + 1]])


class JsonlSamples:
    """Per sample: open, seek, read a line, parse JSON, tokenize (what a naive Dataset does)."""

    def __init__(self, folder: Path):
        self.path, self.offsets = folder / "docs.jsonl", np.load(folder / "docs_offsets.npy")

    def __len__(self):
        return len(self.offsets) - 1

    def __getitem__(self, i):
        with open(self.path, "rb") as f:
            f.seek(int(self.offsets[i]))
            line = f.readline()
        try:
            return tokenize(json.loads(line)["text"])
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(f"{self.path}: sample {i}: not a {{'text': ...}} line: "
                             f"{exc}") from None  # fmt: skip


def shard_stream(folder: Path, seed: int = 0, buffer: int = 512):
    """Shards in a shuffled order, each read whole and sequentially; documents leave through a
    shuffle buffer (the WebDataset way: random enough across an epoch, never a random seek)."""
    rng = random.Random(seed)
    shards = sorted(folder.glob("shard-*.npz"))
    if not shards:
        raise FileNotFoundError(f"{folder}: no shard-*.npz files")
    rng.shuffle(shards)
    pool: list[np.ndarray] = []
    for path in shards:
        with np.load(path) as z:
            tokens, lengths = z["tokens"], z["lengths"]
        for doc in np.split(tokens, np.cumsum(lengths)[:-1]):
            pool.append(doc)
            if len(pool) >= buffer:
                yield pool.pop(rng.randrange(len(pool)))
    rng.shuffle(pool)
    yield from pool


# --8<-- [end:read]
