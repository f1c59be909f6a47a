"""Ruff lint and format check of every snippet file and every inline python fence (pytest-examples).

`ruff format` would turn pytest-examples' "#> output" comments into "# > output"; the check
undoes exactly that one change, as pytest-examples does for black. A page's fences share one
namespace as Sybil runs them, so undefined names are looked up in the fences (and included files)
above each fence.
"""

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_examples import CodeExample, EvalExample

from tests.pages import EXAMPLES_CONFIG, PYTHON, _rewrite_fence, first_difference, scan

ROOT = Path(__file__).resolve().parents[1]
SNIPPETS = sorted((ROOT / "snippets").rglob("*.py"))
FENCES = [
    f for page in sorted((ROOT / "docs").rglob("*.md")) for f in scan(page)
    if f.lang in PYTHON and not f.includes()
]  # fmt: skip


def ruff_format(source: str, name: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", name, "-"],
        input=re.sub(r"^( *)#> ", r"\1#:> ", source, flags=re.M),
        capture_output=True, text=True, cwd=ROOT, check=True,
    )  # fmt: skip
    return re.sub(r"^( *)#:> ", r"\1#> ", out.stdout, flags=re.M)


ALONE = dataclasses.replace(EXAMPLES_CONFIG, ruff_ignore=["F821"])  # names: with the page above


def check(example: CodeExample, eval_example: EvalExample, write, config=EXAMPLES_CONFIG) -> None:
    eval_example.config = config
    eval_example.lint_ruff(example)
    formatted = ruff_format(example.source, example.path.name)
    if formatted == example.source:
        return
    if eval_example.update_examples:
        write(formatted)
        return
    first = first_difference(example.source, formatted)
    pytest.fail(
        f"{example.path}:{example.start_line + first - 1}: not ruff-formatted "
        "(run `pytest tests/test_lint.py --update-examples`)",
        pytrace=False,
    )


@pytest.mark.parametrize("path", SNIPPETS, ids=lambda p: str(p.relative_to(ROOT)))
def test_snippet_file(path, eval_example):
    example = CodeExample.create(path.read_text(encoding="utf-8"), path=path.relative_to(ROOT))
    example.start_line = 1
    check(example, eval_example, lambda text: path.write_text(text, encoding="utf-8"))


def above(fence) -> str:
    """The code that runs before a fence in its page's namespace: earlier fences and includes."""
    code = []
    for f in scan(fence.path):
        if f.index >= fence.index:
            break
        if f.lang in PYTHON and not f.skip:
            includes = f.includes()
            code += [(ROOT / file).read_text(encoding="utf-8") for file, _ in includes] or [f.body]
    return "\n".join(code) + "\n"


def undefined_names(fence) -> list[str]:
    """F821 in the fence, read with the page's namespace above it."""
    prefix = above(fence)
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "F821", "--output-format=json",
         "--stdin-filename", "page.py", "-"],
        input=prefix + fence.body, capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    start = prefix.count("\n") + 1
    return [
        f"{fence.path.relative_to(ROOT)}:{fence.line + d['location']['row'] - start + 1}: "
        f"{d['code']} {d['message']}"
        for d in json.loads(out.stdout or "[]")
        if d["location"]["row"] >= start
    ]


@pytest.mark.parametrize("fence", FENCES, ids=lambda f: f.where)
def test_inline_fence(fence, eval_example):
    example = CodeExample.create(fence.body, path=fence.path.relative_to(ROOT))
    example.start_line = fence.line + 1
    check(example, eval_example, lambda text: _rewrite_fence(fence, text), ALONE)
    missing = undefined_names(fence)
    assert not missing, "\n".join(missing)
