"""Prose lint: a measured-looking number typed into a page instead of read from a result.

A number with a unit of time, bandwidth, throughput, memory, a percentage or a multiplier
(倍, ×, "3.5x") in prose fails with page:line, unless
  - it is read from a result or data file ({{ NAME:path }} is not prose),
  - its sentence cites a published source (a link to an http(s) page or a footnote), or
  - its sentence carries `<!-- input: reason -->`: a number the page chose (a shape, a batch
    size, a target), stated as such. Each page's markers are counted in the report, or
  - it restates a bound of a claim in the same sentence ("快 2 倍以上" beside `... > 2`).
Code (fences and spans), HTML comments, link targets and math are not prose.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from snippets.common import markup

NUM = r"(?<![\w.])\d+(?:[.,]\d+)*"
UNIT = (
    r"(?:ms|µs|us|ns|s|sec|min|h|毫秒|微秒|纳秒|秒|分钟|小时|天"
    r"|[KMGTP]i?B(?:/s)?|[KMGTP]B/s|bytes?|字节|[kMGTP]?FLOP/s|[GTP]?FLOPS"
    r"|token/s|tokens/s|tok/s"
    r"|个 ?token/s|samples/s|it/s|%|％|倍)"
)
TYPED = re.compile(rf"{NUM}\s?(?:{UNIT}(?![A-Za-z])|[×x](?!\s?\d))")
INPUT = re.compile(r"<!--\s*input\s*:(?P<reason>.*?)-->", re.S)
CITATION = re.compile(r"\]\((?:https?://|[^)]*#(?:ref|参考))|\[\^[^\]]+\]")
MATH = re.compile(r"\$\$.*?\$\$|(?<!\\)\$[^$\n]+?\$|\\\(.*?\\\)|\\\[.*?\\\]", re.S)
LINK_TARGET = re.compile(r"\]\([^)]*\)")
# a sentence ends at 。！？； (or ". "), and takes the comments right after it (its claim, marker)
SENTENCE_END = re.compile(
    r"(?:[。！？；]|(?<=[a-z\u4e00-\u9fff)])\.(?=\s))(?:[ \t\n]*<!--.*?-->)*", re.S
)
HEADING_NUMBER = re.compile(r"^(#{1,6}[ \t]+)([\d.]+)(?=[ \t])", re.M)


REPORT: dict[str, int] = {}  # page -> number of <!-- input: --> markers (conftest prints it)


@dataclass
class Finding:
    line: int
    text: str
    sentence: str


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group())


def units(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the sentences of a page's prose: paragraphs split at sentence
    ends; each table row and each list item on its own."""
    spans, pos = [], 0
    for block in re.split(r"(\n[ \t]*\n)", text):
        start = pos
        pos += len(block)
        if not block.strip():
            continue
        lines = block.splitlines(keepends=True)
        if all(ln.lstrip().startswith(("|", "-", "*", "+")) or re.match(r"\s*\d+\.", ln)
               or ln.startswith("  ") for ln in lines if ln.strip()):  # fmt: skip
            at = start
            for ln in lines:
                if re.match(r"\s*([|*+-]|\d+\.)\s", ln) or not spans or ln.lstrip().startswith("|"):
                    spans.append([at, at + len(ln)])
                else:
                    spans[-1][1] = at + len(ln)
                at += len(ln)
            continue
        cut = start
        for m in SENTENCE_END.finditer(block):
            spans.append([cut, start + m.end()])
            cut = start + m.end()
        if cut < pos:
            spans.append([cut, pos])
    return [tuple(s) for s in spans]


def lint(path: Path, text: str | None = None) -> tuple[list[Finding], int]:
    """Typed numbers on a page, and the number of `<!-- input: -->` markers it uses."""
    text = path.read_text(encoding="utf-8") if text is None else text
    markers = list(INPUT.finditer(text))
    for m in markers:
        if not m["reason"].strip():
            raise markup.PageError(f"{markup.rel(path)}:{markup.line_of(text, m.start())}: "
                                   "<!-- input: --> needs a reason")  # fmt: skip
    body = re.sub(r"\A---\n.*?\n---\n", _blank, text, flags=re.S)  # front matter
    body = markup.INLINE.sub(_blank, body)
    keep_comments = markup.prose(body, comments=False)  # markers and citations still visible
    visible = markup.prose(body)
    visible = MATH.sub(
        _blank, LINK_TARGET.sub(lambda m: "](" + " " * (len(m.group()) - 2), visible)
    )
    visible = re.sub(r"<[^>\n]+>", _blank, visible)  # HTML tags (and their attributes)
    visible = HEADING_NUMBER.sub(lambda m: m[1] + " " * len(m[2]), visible)  # "## 2.1 ..."
    found = []
    for start, end in units(keep_comments):
        sentence = keep_comments[start:end]
        if INPUT.search(sentence) or CITATION.search(sentence):
            continue
        bounds = claim_bounds(sentence)
        for m in TYPED.finditer(visible, start, end):
            if not restates(m.group(), bounds):
                found.append(Finding(markup.line_of(text, m.start()), m.group(), sentence.strip()))
    return found, len(markers)


def claim_bounds(sentence: str) -> set[float]:
    """The numbers written in the sentence's own claims: a bound the prose may restate."""
    out = set()
    for claim in markup.CLAIM.finditer(sentence):
        expr = re.sub(r"\S+:\S+", " ", claim["expr"])  # references hold digits too
        out |= {float(x) for x in re.findall(r"(?<![\w.])\d+(?:\.\d+)?", expr)}
    return out


def restates(typed: str, bounds: set[float]) -> bool:
    """Whether "2 倍", "5%" or "80%" says a claim's own bound (2, 1.05 / 0.95 / 0.05, 0.8)."""
    value = float(re.match(r"\d+(?:\.\d+)?", typed.replace(",", ""))[0])
    options = {value}
    if typed.rstrip().endswith(("%", "％")):
        options |= {value / 100, 1 + value / 100, 1 - value / 100}
    return any(abs(v - b) <= 1e-9 * max(1.0, abs(b)) for v in options for b in bounds)


def errors(path: Path, shown: str | None = None) -> list[str]:
    where = shown or markup.rel(path)
    found, _ = lint(path)
    return [
        f"{where}:{f.line}: typed measured number {f.text!r}: read it from a result "
        "({{ NAME:path }}), cite its source in the sentence, or mark a chosen input with "
        "<!-- input: reason -->"
        for f in found
    ]
