"""The machinery catches contributors' mistakes, with messages that name file and line.

Faults are planted in copies of the tiny site in tests/fixtures/site, never in the real docs.
"""

import shutil
import sys
from pathlib import Path

import pytest

from tests import structure

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "site"


@pytest.fixture
def site(tmp_path):
    """A scratch copy of the fixture site with this project's Sybil wiring."""
    dest = tmp_path / "site"
    shutil.copytree(FIXTURE, dest)
    (dest / "tests").mkdir()
    for name in ("__init__.py", "pages.py", "lowering.py", "interpreter.py"):
        shutil.copy(ROOT / "tests" / name, dest / "tests" / name)
    (dest / "snippets" / "common").mkdir()
    for name in ("__init__.py", "markup.py"):  # the page grammar
        shutil.copy(ROOT / "snippets" / "common" / name, dest / "snippets" / "common" / name)
    shutil.copy(ROOT / "conftest.py", dest / "conftest.py")
    (dest / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider -rA\n", "utf-8")
    return dest


def add_page(site: Path, name: str, text: str) -> None:
    (site / "docs" / name).write_text(text, encoding="utf-8")
    with (site / "mkdocs.yml").open("a", encoding="utf-8") as f:
        f.write(f"  - {name}\n")


@pytest.fixture
def run(pytester, site, monkeypatch):
    """Run pytest on the scratch site's pages in a subprocess; return (result, all output)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the fixture needs no torch

    def go(*args):
        monkeypatch.chdir(site)
        result = pytester.run(sys.executable, "-m", "pytest", "docs", *args)
        return result, result.stdout.str() + result.stderr.str()

    return go


def test_clean_fixture_passes(run, site):
    result, out = run()
    assert result.ret == 0, out
    assert "2 passed, 1 skipped" in out
    assert "docs/page.md:15: shows a failure on purpose" in out  # skips list their reason
    for check in structure.ALL_CHECKS:
        assert check(site) == [], check.__name__


def test_sybil_faults_name_file_and_line(run, site):
    (site / "snippets" / "mini" / "boom.py").write_text(
        "x = 1\n\n\nraise ValueError('planted')\n", encoding="utf-8"
    )
    add_page(site, "raises.md", '# R\n\n```python\n--8<-- "snippets/mini/boom.py"\n```\n')
    add_page(site, "missing.md", '# M\n\ntext\n\n```python\n--8<-- "snippets/mini/nope.py"\n```\n')
    add_page(site, "section.md", '# S\n\n```python\n--8<-- "snippets/mini/ok.py:nosuch"\n```\n')
    add_page(site, "py.md", "# P\n\n```py\nx = 1\ny = x / 0\n```\n")
    add_page(site, "output.md", '# O\n\n```python\n--8<-- "snippets/mini/ok.py"\n```\n')
    ok = site / "snippets" / "mini" / "ok.py"
    ok.write_text(ok.read_text().replace("#> 4", "#> 5"), encoding="utf-8")
    result, out = run()
    assert result.ret == 1, out
    expected = {
        "raises.md::line:3": "snippets/mini/boom.py:4: ValueError",  # traceback in the snippet
        "missing.md::line:5": "docs/missing.md:5: included file 'snippets/mini/nope.py' does not",
        "section.md::line:3": "docs/section.md:3: included file 'snippets/mini/ok.py' has no "
        "section 'nosuch'",
        "py.md::line:3": "docs/py.md:5: ZeroDivisionError",  # page line of `y = x / 0`
        "output.md::line:3": "snippets/mini/ok.py:7: printed output differs from its #> comments",
    }
    for test_id, message in expected.items():
        assert f"FAILED docs/{test_id}" in out, test_id
        assert message in out, f"{test_id}: expected {message!r} in output"


def test_update_examples_rewrites_output(run, site):
    ok = site / "snippets" / "mini" / "ok.py"
    ok.write_text(ok.read_text().replace("#> 4", "#> 5"), encoding="utf-8")
    result, out = run("--update-examples")
    assert result.ret == 0, out
    assert "#> 4" in ok.read_text()
    assert run()[0].ret == 0


def test_structure_faults_name_file_and_line(site):
    (site / "snippets" / "mini" / "orphan.py").write_text("x = 1\n", encoding="utf-8")
    (site / "docs" / "hidden.md").write_text("# Hidden\n", encoding="utf-8")
    page = site / "docs" / "page.md"
    text = page.read_text(encoding="utf-8")
    text += "\nSee [nothing](nothing.md) and [no anchor](index.md#nope).\n\n```pycon\n>>> 1\n```\n"
    page.write_text(text, encoding="utf-8")
    n_link = text.splitlines().index("See [nothing](nothing.md) and [no anchor](index.md#nope).")
    n_fence = text.splitlines().index("```pycon")
    errors = {c.__name__: "\n".join(c(site)) for c in structure.ALL_CHECKS}
    assert "snippets/mini/orphan.py:1: snippet file is not included" in errors["orphan_errors"]
    assert "docs/hidden.md:1: page is not in the nav" in errors["nav_errors"]
    assert (
        f"docs/page.md:{n_link + 1}: link target 'nothing.md' does not exist"
        in errors["link_errors"]
    )
    assert f"docs/page.md:{n_link + 1}: link 'index.md#nope': no heading" in errors["link_errors"]
    assert f"docs/page.md:{n_fence + 1}: fence language 'pycon'" in errors["fence_errors"]


def test_cpu_and_gpu_markers_are_read_and_applied(tmp_path, monkeypatch):
    from snippets.common import markup
    from tests import pages

    page = tmp_path / "p.md"
    text = "<!-- cpu: gloo demo -->\n```python\nx = 1\n```\n\n"
    text += "<!-- gpu: needs CUDA -->\n```python\ny = 2\n```\n"
    page.write_text(text, encoding="utf-8")
    cpu, gpu = markup.scan(page)
    assert (cpu.cpu, cpu.gpu, gpu.cpu, gpu.gpu) == ("gloo demo", None, None, "needs CUDA")
    for cuda, ran in ((False, [cpu]), (True, [gpu])):
        monkeypatch.setattr(pages, "_cuda", lambda cuda=cuda: cuda)
        done = []
        for fence in (cpu, gpu):
            try:
                pages.PageParser._admit(fence)
                done.append(fence)
            except pytest.skip.Exception:
                pass
        assert done == ran


def test_skip_needs_a_reason(site):
    add_page(site, "bare.md", "# B\n\n<!-- skip: -->\n```python\nx = 1\n```\n")
    errors = structure.fence_errors(site)
    assert any("docs/bare.md:3: <!-- skip: --> needs a reason" in e for e in errors), errors


def test_a_snippet_runs_once_per_run_and_its_page_checks_the_prints(pytester, site, monkeypatch):
    """A unit test imports the snippet before its page: it still runs once, and the page still
    checks what it printed."""
    (site / "snippets" / "mini" / "counted.py").write_text(
        "from pathlib import Path\n\n"
        "with Path(__file__).with_suffix('.runs').open('a') as f:\n"
        "    f.write('x')\n"
        "print(6 * 7)\n"
        "#> 41\n",
        encoding="utf-8",
    )
    add_page(site, "counted.md", '# C\n\n```python\n--8<-- "snippets/mini/counted.py"\n```\n')
    (site / "test_first.py").write_text(
        "def test_import():\n    import snippets.mini.counted  # noqa: F401\n", encoding="utf-8"
    )
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.chdir(site)
    result = pytester.run(sys.executable, "-m", "pytest", "test_first.py", "docs/counted.md")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 1, out
    assert "snippets/mini/counted.py:6: printed output differs" in out, out
    assert (site / "snippets" / "mini" / "counted.runs").read_text() == "x"
