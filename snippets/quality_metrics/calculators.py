"""The page's calculator, Python side: paste two transcripts, get WER and CER with the alignment.

docs/assets/calculator.js repeats it (formulas["wer"]) with the same tokenization, the same
dynamic program, the same tie-breaking and the same layout; both are checked on
tests/fixtures/calculators/wer.json (snippets/common/calculator.py).
"""

from __future__ import annotations

from snippets.common.calculator import Calculator
from snippets.quality_metrics.wer import align, chars, render, words


# --8<-- [start:calculator]
def wer_calculator(reference: str, hypothesis: str) -> dict:
    """Both units at once: words (WER) and characters (CER), each with its counts and its
    alignment drawn as text. An empty reference has no error rate: a ValueError."""
    out = {}
    for unit, split, sep in (("word", words, " "), ("char", chars, "")):
        a = align(split(reference), split(hypothesis))
        out |= {f"{unit}_rate": a.rate(), f"{unit}_substitutions": a.substitutions,
                f"{unit}_deletions": a.deletions, f"{unit}_insertions": a.insertions,
                f"{unit}_hits": a.hits, f"{unit}_alignment": render(a, sep)}  # fmt: skip
    return out


# --8<-- [end:calculator]

JIWER_DOCS = [  # jiwer's documentation (docs/usage.md): its alignment and CER examples
    ("short one here", "shoe order one"),
    ("quite a bit of longer sentence", "quite bit of an even longest sentence here"),
    ("i can spell", "i kan cpell"),
    ("i hope", "i hop"),
]
CASES = [
    *JIWER_DOCS,
    ("今天天气真好", "今天天汽很好啊"),  # CJK: two columns each in the drawing
    ("我用 GPU 训练模型。", "我用GPU训练模型"),  # mixed scripts, full-width punctuation
    ("the cat sat", "the cat sat"),  # nothing wrong
    ("the cat sat", ""),  # nothing recognised: every token deleted
    ("yes", "yes yes yes no"),  # more insertions than reference words: a rate above 1
    ("  a  b\tc\n", "a b c"),  # runs of whitespace and newlines separate words
    ("👍 ok", "👎 ok"),  # a character outside the BMP is one character on both sides
]
CALCULATORS = {
    "wer": Calculator(
        wer_calculator,
        cases=[{"reference": r, "hypothesis": h} for r, h in CASES],
        defaults={"reference": JIWER_DOCS[1][0], "hypothesis": JIWER_DOCS[1][1]},
    ),
}
