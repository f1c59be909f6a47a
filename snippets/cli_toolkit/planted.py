"""A loop with a planted hot spot: one function does most of the work in pure Python."""

import sys


# --8<-- [start:planted]
def slow_tokenize(text: str) -> list[int]:
    ids = []
    for ch in text:  # per character, in Python: the planted hot spot
        ids.append((ord(ch) * 2654435761) % 50_000)
    return ids


def collate(batch: list[list[int]]) -> int:
    return sum(len(x) for x in batch)


def main(steps: int) -> int:
    text = "训推加速 handbook " * 400
    total = 0
    for _ in range(steps):
        total += collate([slow_tokenize(text) for _ in range(8)])
    return total


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 250)
# --8<-- [end:planted]
