"""Every fault a contributor can plant is named by `nox -s check` with its file and line.

A scratch copy of the repository gets a freshly scaffolded post, `demo-post`, whose page,
snippets, results and the shared data files carry the faults listed in FAULTS (the list in
docs/contributing.md comes from here). One run of `python -m tests.check demo-post` must report
each of them as one line starting with the exact place; `nox -s gpu_docs` on a machine without
CUDA must refuse with one line. The faults are planted together: one failing fence must not
hide another.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import noxfile
from snippets.common import results as res

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("node_modules", "site", ".nox", ".git", ".whl", "__pycache__", ".e2e", "results")
PAGE = "docs/posts/demo-post.md"

SNIPPETS = {
    "boom.py": "x = 1\n\nraise ValueError('planted')\n",
    "bad_syntax.py": "a = 1\nb = )\n",
    "orphan.py": "X = 1\n",
    "helper.py": "N = 1024\n",
    "measure.py": (
        "from snippets.common.results import computed_result\n"
        "from snippets.demo_post.helper import N\n\n"
        'computed_result("demo-post", "speed", {"n": N, "rows": [{"k": 1, "ms": 2.0}]})\n'
        'computed_result("demo-post", "extra", {"n": N, "unread": 7})\n'
    ),
}
# The page: (marker, the line planted). The marker names the fault in FAULTS below.
PAGE_LINES = """---
title: 演示
summary: 读完本文，你能看到每一种错误都被指出。
prerequisites: [no-such-post]
series: 99
---

# 演示

```python
--8<-- "snippets/demo_post/measure.py"
```

```python
--8<-- "snippets/demo_post/boom.py"
```

```python
--8<-- "snippets/demo_post/bad_syntax.py"
```

```python
--8<-- "snippets/demo_post/nope.py"
```

```python
--8<-- "snippets/demo_post/example.py:nosuch"
```

```py
x = 1
y = x / 0
```

```python
--8<-- "snippets/demo_post/example.py:demo"
```

```python
--8<-- "snippets/demo_post/flaky.py"
```

<!-- skip -->
```python
z = 3
```

```bash
false
```

```pycon
>>> 1
```

见[不存在的页](nothing.md)与[不存在的锚点](metrics.md#no-such-anchor)。

```mermaid
flowchart LR
    A[开始 --> B{{判断
```

坏公式 $\\frac{1}{$ 在这里。

<script src="https://cdn.example.com/x.js"></script>

一步要 12.5 ms。

n 是 {{ speed:n }}，{{ extra:n }}。<!-- claim: speed:n > 2000 -->

```plot speed
rows: rows
mark: line
encoding:
  x: {field: k, type: quantitative}
  y: {field: nope, type: quantitative}
```
"""


def line(text: str, needle: str) -> int:
    return text.splitlines().index(needle) + 1


NOPE = '--8<-- "snippets/demo_post/nope.py"'
NOSUCH = '--8<-- "snippets/demo_post/example.py:nosuch"'
LINKS = "见[不存在的页](nothing.md)与[不存在的锚点](metrics.md#no-such-anchor)。"
FORMULA = "坏公式 $\\frac{1}{$ 在这里。"
SCRIPT = '<script src="https://cdn.example.com/x.js"></script>'
CLAIM = "n 是 {{ speed:n }}，{{ extra:n }}。<!-- claim: speed:n > 2000 -->"


def FAULTS(page: str, data: dict) -> dict[str, str]:
    """Fault -> the start of the line `check` must print for it."""

    def at(needle: str, shift: int = 0) -> str:
        return f"{PAGE}:{line(page, needle) + shift}"

    return {
        "raising snippet": "snippets/demo_post/boom.py:3: ValueError: planted",
        "syntax error in a snippet": "snippets/demo_post/bad_syntax.py:2: SyntaxError: unmatched",
        "missing include file": at(NOPE, -1)
        + ": included file 'snippets/demo_post/nope.py' does not exist",
        "missing section": at(NOSUCH, -1)
        + ": included file 'snippets/demo_post/example.py' has no section 'nosuch'",
        "raising ```py fence": at("y = x / 0") + ": ZeroDivisionError: division by zero",
        "wrong #> output": f"snippets/demo_post/example.py:{data['example_line']}: "
        "printed output differs from its #>",
        "nondeterministic print": "snippets/demo_post/flaky.py:1: printed ",
        "skip without a reason": at("<!-- skip -->") + ": <!-- skip: --> needs a reason",
        "failing shell command": at("false") + ": `false` exited with 1",
        "unknown fence language": at("```pycon") + ": fence language 'pycon'",
        "orphan snippet": "snippets/demo_post/orphan.py:1: snippet file is not included",
        "broken link": at(LINKS) + ": link target 'nothing.md' does not exist",
        "broken anchor": at(LINKS)
        + ": link 'metrics.md#no-such-anchor': no heading with id 'no-such-anchor'",
        "mermaid syntax error": at("```mermaid") + ": Parse error on line 2",
        "malformed formula": at(FORMULA) + ": KaTeX parse error",
        "third-party <script>": at(SCRIPT) + ": <script> loads https://cdn.example.com/x.js",
        "typed measured number": at("一步要 12.5 ms。") + ": typed measured number '12.5 ms'",
        "failing claim": at(CLAIM) + ": claim does not hold: speed:n > 2000",
        "unknown plot field": at("```plot speed") + ": plot field(s) nope in no row of speed:rows",
        "unknown prerequisite": f"{PAGE}:1: prerequisites ['no-such-post'] are not other posts",
        "stale result": "results/demo-post/speed.json: stale: snippets/demo_post/helper.py changed",
        "hand-edited result": "results/demo-post/extra.json: checksum mismatch",
        "value nobody reads": f"results/demo-post/speed.json:{data['rows_line']}: "
        "value 'rows[].ms' is read by no page",
        "malformed data file": f"data/hardware.yaml:{data['hw_line']}: gpu 'h200-sxm': "
        "field 'sms': expected int, got 'many'",
        "glossary term without a source": f"data/glossary.yaml:{data['gl_line']}: term ",
    }


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    repo = tmp_path_factory.mktemp("faults") / "repo"
    shutil.copytree(ROOT, repo, ignore=shutil.ignore_patterns(*SKIP))
    (repo / "node_modules").symlink_to(ROOT / "node_modules", target_is_directory=True)
    noxfile.scaffold(repo, "demo-post", "演示")
    pkg = repo / "snippets" / "demo_post"
    for name, text in SNIPPETS.items():
        (pkg / name).write_text(text, encoding="utf-8")
    seed1 = subprocess.run([sys.executable, "-c", "print(hash('handbook') % 997)"],
                           env={**os.environ, "PYTHONHASHSEED": "1"}, capture_output=True,
                           text=True).stdout.strip()  # fmt: skip
    (pkg / "flaky.py").write_text(f"print(hash('handbook') % 997)\n#> {seed1}\n", encoding="utf-8")
    page = PAGE_LINES
    (repo / PAGE).write_text(page, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(repo), res.UPDATE_ENV: "1", res.DIRTY_ENV: "0",
           res.COMMIT_ENV: res._git("rev-parse", "HEAD") or "0" * 40}  # fmt: skip
    made = subprocess.run([sys.executable, "-c", "import snippets.demo_post.measure"], cwd=repo,
                          env=env, capture_output=True, text=True)  # fmt: skip
    assert made.returncode == 0, made.stderr
    # the faults planted after measuring: an edited source, an edited result, bad data files
    (pkg / "helper.py").write_text("N = 1024  # edited after measuring\n", encoding="utf-8")
    extra = repo / "results" / "demo-post" / "extra.json"
    extra.write_text(extra.read_text(encoding="utf-8").replace('"unread": 7', '"unread": 8'))
    ex = pkg / "example.py"
    ex.write_text(ex.read_text(encoding="utf-8").replace("#> 4", "#> 5"), encoding="utf-8")
    hw = repo / "data" / "hardware.yaml"
    hw_text = hw.read_text(encoding="utf-8")
    h200 = hw_text.index("  h200-sxm:")
    sms = hw_text.index("    sms:", h200)
    hw.write_text(re.sub(r"    sms: \d+", "    sms: many", hw_text[sms:], count=1).join(
        [hw_text[:sms], ""]), encoding="utf-8")  # fmt: skip
    gl = repo / "data" / "glossary.yaml"
    gl_lines = gl.read_text(encoding="utf-8").splitlines(keepends=True)
    first_source = next(i for i, ln in enumerate(gl_lines) if ln.startswith("    source:"))
    del gl_lines[first_source]
    gl.write_text("".join(gl_lines), encoding="utf-8")
    term_line = max(i for i in range(first_source) if gl_lines[i].startswith("  - ")) + 1
    speed = (repo / "results" / "demo-post" / "speed.json").read_text(encoding="utf-8")
    data = {
        "rows_line": next(i for i, ln in enumerate(speed.splitlines(), 1) if '"ms"' in ln),
        "hw_line": hw.read_text(encoding="utf-8").splitlines().index("    sms: many") + 1,
        "gl_line": term_line,
        "example_line": ex.read_text(encoding="utf-8").splitlines().index("#> 5") + 1,
    }
    check = subprocess.run([sys.executable, "-m", "tests.check", "demo-post"], cwd=repo,
                           env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True,
                           text=True)  # fmt: skip
    return repo, page, data, check


def test_at_least_twenty_distinct_faults_are_planted(planted):
    _, page, data, _ = planted
    assert len(FAULTS(page, data)) >= 20


NO_DATA = {"rows_line": 0, "hw_line": 0, "gl_line": 0, "example_line": 0}


@pytest.mark.parametrize("fault", list(FAULTS(PAGE_LINES, NO_DATA)))
def test_check_names_the_fault(planted, fault):
    _, page, data, check = planted
    expected = FAULTS(page, data)[fault]
    lines = check.stdout.splitlines()
    assert check.returncode == 1
    assert any(ln.startswith(expected) for ln in lines), (
        f"{fault}: no line starts with {expected!r}:\n" + check.stdout + check.stderr
    )


def test_each_fault_is_one_line_with_its_place(planted):
    _, _, _, check = planted
    for ln in check.stdout.splitlines():
        assert re.match(r"^[\w./-]+(:\d+){0,2}: \S", ln), ln


def test_gpu_docs_refuses_without_cuda(planted):
    repo, *_ = planted
    run = subprocess.run([sys.executable, "-m", "nox", "-s", "gpu_docs"], cwd=repo,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True,
                         text=True)  # fmt: skip
    assert run.returncode != 0
    assert "gpu_docs needs a CUDA device: torch.cuda.is_available() is not True here" in (
        run.stdout + run.stderr
    )


def test_gpu_docs_refuses_downloads_only_with_no_downloads(planted):
    repo, *_ = planted
    run = subprocess.run([sys.executable, "-m", "nox", "-s", "gpu_docs", "--", "--downloads-only",
                          "--no-downloads"], cwd=repo, capture_output=True, text=True)  # fmt: skip
    assert run.returncode != 0
    assert "--downloads-only runs downloads only" in run.stdout + run.stderr


def test_fault_list_is_in_the_contributing_guide():
    text = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    missing = [f for f in FAULTS(PAGE_LINES, NO_DATA) if f not in text]
    assert not missing, f"docs/contributing.md does not list: {missing}"
