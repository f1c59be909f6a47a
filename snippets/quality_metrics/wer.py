"""Word and character error rates by edit distance, with the alignment that explains them.

WER = (S + D + I) / N: the substitutions, deletions and insertions of a minimum-cost alignment
of the hypothesis to the reference (every edit costs 1, a match 0), over the N reference words.
docs/assets/calculator.js repeats `align`, `words`, `chars`, `display_width` and `render` for the
page's calculator, operation by operation (tests/fixtures/calculators/wer.json checks both).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# --8<-- [start:tokens]
WHITESPACE = " \t\n\r\f\v"  # the six ASCII separators; the JavaScript twin uses the same set
_SPLIT = re.compile(f"[{re.escape(WHITESPACE)}]+")


def words(text: str) -> list[str]:
    """Words: split on runs of whitespace (jiwer's default also collapses spaces and strips)."""
    return [w for w in _SPLIT.split(text) if w]


def chars(text: str) -> list[str]:
    """Characters (code points) of the stripped text, spaces inside included, as jiwer's
    default for CER does. For Chinese transcripts written with spaces, remove them first."""
    return list(text.strip(WHITESPACE))


# --8<-- [end:tokens]


# --8<-- [start:align]
@dataclass(frozen=True)
class Alignment:
    """One minimum-cost alignment: ops are ("=", r, h), ("S", r, h), ("D", r, None) or
    ("I", None, h), in reading order."""

    ops: tuple[tuple[str, str | None, str | None], ...]

    def count(self, kind: str) -> int:
        return sum(op[0] == kind for op in self.ops)

    @property
    def hits(self) -> int:
        return self.count("=")

    @property
    def substitutions(self) -> int:
        return self.count("S")

    @property
    def deletions(self) -> int:
        return self.count("D")

    @property
    def insertions(self) -> int:
        return self.count("I")

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def ref_len(self) -> int:  # N = H + S + D
        return self.hits + self.substitutions + self.deletions

    def rate(self) -> float:
        """(S + D + I) / N: no upper bound (insertions), undefined for an empty reference."""
        if self.ref_len == 0:
            raise ValueError("the reference is empty: an error rate divides by its length")
        return self.errors / self.ref_len


def align(ref: list[str], hyp: list[str]) -> Alignment:
    """Levenshtein distance by dynamic programming, then one optimal path traced back from the
    end. Several paths can be optimal (they share S + D + I, not always the split); ties go
    to a deletion, then a match or substitution, then an insertion, which reproduces the
    alignments printed in jiwer's documentation."""
    n, m = len(ref), len(hyp)
    d = [[i + j if i == 0 or j == 0 else 0 for j in range(m + 1)] for i in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            diag = d[i - 1][j - 1] + (0 if ref[i - 1] == hyp[j - 1] else 1)
            d[i][j] = min(diag, d[i - 1][j] + 1, d[i][j - 1] + 1)
    ops, i, j = [], n, m
    while i > 0 or j > 0:
        if i > 0 and d[i][j] == d[i - 1][j] + 1:
            ops.append(("D", ref[i - 1], None))
            i -= 1
        elif i > 0 and j > 0 and d[i][j] == d[i - 1][j - 1] + (ref[i - 1] != hyp[j - 1]):
            ops.append(("=" if ref[i - 1] == hyp[j - 1] else "S", ref[i - 1], hyp[j - 1]))
            i, j = i - 1, j - 1
        else:
            ops.append(("I", None, hyp[j - 1]))
            j -= 1
    return Alignment(tuple(reversed(ops)))


def wer(reference: str, hypothesis: str) -> float:
    return align(words(reference), words(hypothesis)).rate()


def cer(reference: str, hypothesis: str) -> float:
    return align(chars(reference), chars(hypothesis)).rate()


def corpus_rate(alignments: list[Alignment]) -> float:
    """Over several utterances: all errors over all reference tokens (what jiwer and sclite
    report), not the mean of the per-utterance rates."""
    n = sum(a.ref_len for a in alignments)
    if n == 0:
        raise ValueError("every reference is empty: an error rate divides by their length")
    return sum(a.errors for a in alignments) / n


# --8<-- [end:align]


# --8<-- [start:measures]
def measures(a: Alignment) -> dict[str, float]:
    """WER and Morris et al.'s MER and WIL (Interspeech 2004) from one alignment's counts."""
    h, n_hyp = a.hits, a.hits + a.substitutions + a.insertions
    wip = (h / a.ref_len) * (h / n_hyp) if n_hyp else 0.0
    return {"wer": a.rate(), "mer": a.errors / (h + a.errors), "wil": 1 - wip, "wip": wip}


# --8<-- [end:measures]


# --8<-- [start:render]
# East Asian Wide and Fullwidth blocks (after Markus Kuhn's wcwidth): two columns in a terminal
WIDE = ((0x1100, 0x115F), (0x2E80, 0x303E), (0x3041, 0x3247), (0x3250, 0x33FF),
        (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xA000, 0xA4CF), (0xAC00, 0xD7A3),
        (0xF900, 0xFAFF), (0xFE30, 0xFE4F), (0xFF00, 0xFF60), (0xFFE0, 0xFFE6),
        (0x20000, 0x2FFFD), (0x30000, 0x3FFFD))  # fmt: skip


def display_width(token: str) -> int:
    return sum(2 if any(a <= ord(c) <= b for a, b in WIDE) else 1 for c in token)


def render(a: Alignment, sep: str = " ") -> str:
    """jiwer's visualize_alignment layout: REF and HYP right-aligned in columns, '*' filling a
    gap, S / D / I under each error. Columns are measured in display width (a CJK character
    is two), so Chinese lines up too; trailing spaces (the padding) are dropped."""
    rows = [["REF:"], ["HYP:"], ["    "]]
    for kind, r, h in a.ops:
        width = max(display_width(r or ""), display_width(h or ""))
        r = "*" * width if r is None else r
        h = "*" * width if h is None else h
        for row, cell in zip(rows, (r, h, "" if kind == "=" else kind), strict=True):
            row.append(" " * (width - display_width(cell)) + cell)
    return "\n".join((rows[k][0] + " " + sep.join(rows[k][1:])).rstrip(" ") for k in range(3))


# --8<-- [end:render]
