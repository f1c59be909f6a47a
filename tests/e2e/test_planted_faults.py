"""The browser checks catch contributors' mistakes, naming the page.

One scratch copy of the repository gets four planted pages -- a mermaid syntax error, a
malformed formula, a script from a CDN, a plot Vega-Lite warns about -- and is built once (not
strict: the planted pages are not in the nav) and served; each fault must be reported by its
check, with the page's name. A clean page of the same build is the control: the checks must
not cry wolf.
"""

from __future__ import annotations

import shutil

import pytest

from tests.e2e import checks

pytestmark = pytest.mark.browser

NOT_COPIED = {".git", ".nox", ".e2e", ".venv", ".whl", ".ruff_cache", ".pytest_cache", "site"}
NOT_COPIED |= {"node_modules"}  # linked instead
# page name: (the check that must catch it, page text, words its messages must contain,
#             words they must not contain: the page's good parts)
PLANTED = {
    "planted-mermaid": (
        "mermaid",
        "# 图\n\n```mermaid\nflowchart LR\n    A[开始 --> B{{判断\n    B -- 是 --> \n```\n",
        ("was not rendered", "mermaid error", "Parse error on line 2"),
        (),
    ),
    "planted-formula": (
        "katex",
        "# 公式\n\n坏公式：\n\n$$\\frac{1}{$$\n\n未定义的宏 $\\badmacro{x}$，好公式 $k$。\n",
        ("not typeset", "KaTeX error", "badmacro"),
        ("«k»",),
    ),
    "planted-script": (
        "network",
        '# 脚本\n\n正文。\n\n<script src="https://cdn.example.com/x.js"></script>\n',
        ("https://cdn.example.com/x.js",),
        (),
    ),
    "planted-plot-warning": (  # a stacked bar on a log axis: Vega-Lite draws an empty plot
        "console",
        '# 图\n\n<div class="result-plot" data-spec="{&quot;data&quot;: {&quot;values&quot;: '
        "[{&quot;a&quot;: &quot;x&quot;, &quot;v&quot;: 0.001}, {&quot;a&quot;: &quot;y&quot;, "
        "&quot;v&quot;: 1}]}, &quot;mark&quot;: &quot;bar&quot;, &quot;encoding&quot;: {&quot;x"
        "&quot;: {&quot;field&quot;: &quot;a&quot;, &quot;type&quot;: &quot;nominal&quot;}, "
        "&quot;y&quot;: {&quot;field&quot;: &quot;v&quot;, &quot;type&quot;: &quot;quantitative"
        '&quot;, &quot;scale&quot;: {&quot;type&quot;: &quot;log&quot;}}}}"></div>\n',
        ("Log scale domain includes zero",),
        (),
    ),
}
CONTROL = "posts/gradient-accumulation/"  # has a diagram, formulas and code blocks


@pytest.fixture(scope="module")
def scratch_visitor(browser, tmp_path_factory, shots):
    repo = tmp_path_factory.mktemp("planted") / "repo"
    shutil.copytree(
        checks.ROOT,
        repo,
        ignore=lambda d, names: [
            n for n in names if n == "__pycache__" or (d == str(checks.ROOT) and n in NOT_COPIED)
        ],
    )
    (repo / "node_modules").symlink_to(checks.ROOT / "node_modules", target_is_directory=True)
    for name, (_, text, _, _) in PLANTED.items():
        (repo / "docs" / f"{name}.md").write_text(text, encoding="utf-8")
    site = checks.build_site(repo / "mkdocs.yml", repo / "site", strict=False)
    with checks.serve(site, repo.parent / "serve") as base:
        visitor = checks.Visitor(browser, base, shots / "planted")
        yield visitor
        visitor.close()


@pytest.mark.parametrize("name", list(PLANTED))
def test_planted_fault_is_caught(scratch_visitor, name):
    check, _, expected, unexpected = PLANTED[name]
    visit = scratch_visitor.visit(f"{name}/")
    messages = visit.messages(check)
    report = "\n".join(messages) or "(nothing reported)"
    assert messages, f"{check} check missed the fault planted in docs/{name}.md:\n{visit.problems}"
    assert all(m.startswith(f"{name} (") for m in messages), report
    for word in expected:  # every planted variant is reported
        assert any(word in m for m in messages), f"no message says {word!r}:\n{report}"
    for word in unexpected:  # and nothing else on the page is blamed
        assert not any(word in m for m in messages), f"a good part {word!r} is blamed:\n{report}"
    assert visit.screenshots[check].exists()
    print(f"{name}: {check} check reported:\n{report}")


def test_clean_page_passes_the_same_checks(scratch_visitor):
    if CONTROL not in checks.source_pages(checks.ROOT / "docs"):
        pytest.skip(f"control page {CONTROL} is gone")
    visit = scratch_visitor.visit(CONTROL, "dark")
    problems = visit.messages("mermaid", "katex", "copy")
    assert not problems, "\n".join(problems)
