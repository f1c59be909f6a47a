"""No measured-looking number is typed into prose (tests/prose.py), on every page; and the lint
itself catches what it should and lets through what it should."""

from pathlib import Path

import pytest

from tests import prose

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_typed_measurements(page):
    shown = str(page.relative_to(ROOT))
    prose.REPORT[shown] = prose.lint(page)[1]  # input markers, listed in the test report
    errors = prose.errors(page, shown)
    assert not errors, "\n".join(errors)


def lint(text: str) -> list[str]:
    found, _ = prose.lint(Path("docs/posts/demo.md"), text)
    return [f"{f.line}:{f.text}" for f in found]


def test_typed_numbers_are_found_with_their_line():
    text = "# T\n\n一步要 12.5 ms，带宽 3.9 TB/s。\n\n快了 2.4 倍，也就是 2.4×，或 3x；占 81%。\n"
    assert lint(text) == ["3:12.5 ms", "3:3.9 TB/s", "5:2.4 倍", "5:2.4×", "5:3x", "5:81%"]


def test_what_is_not_a_typed_measurement():
    text = (
        "# T\n\n## 2.1 tokens/s 与 TGS\n\n"  # a section number
        "读出来的 {{ r:ms:.1f }} ms 不算；`12 ms` 是代码；$2\\times 3$ 是公式。\n\n"
        "形状是 4 × 4096 的矩阵。\n\n"  # a shape, not a multiplier
        "论文报告 46.2%（[PaLM](https://arxiv.org/abs/2204.02311)）。\n\n"  # cited in the sentence
        "目标是 80% 的拷贝带宽。<!-- input: the target this page sets -->\n\n"
        "```python\nx = 5  # 7 ms\n```\n"
    )
    assert lint(text) == []
    assert prose.lint(Path("x.md"), text)[1] == 1  # one input marker counted


def test_a_citation_exempts_its_sentence_only():
    text = "# T\n\n论文说 46.2%（[PaLM](https://arxiv.org/abs/2204.02311)）。我们测到 44.0%。\n"
    assert lint(text) == ["3:44.0%"]


def test_input_marker_needs_a_reason():
    with pytest.raises(prose.markup.PageError, match=r"demo.md:3: <!-- input: --> needs a reason"):
        prose.lint(Path("docs/posts/demo.md"), "# T\n\n形状 64 MB。<!-- input: -->\n")


def test_a_claims_own_bound_may_be_restated():
    text = (
        "# T\n\n图在每一行都快 2 倍以上。<!-- claim: r:rows[*].speedup > 2 -->\n\n"
        "快不到 5%。<!-- claim: r:train[model=mid].speedup < 1.05 -->\n\n"
        "快 3 倍。<!-- claim: r:rows[*].speedup > 2 -->\n"
    )
    assert lint(text) == ["7:3 倍"]
