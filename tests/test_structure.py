"""The docs tree is whole: every fence runs or is shown-only, every snippet is shown,
every page is in the nav, every internal link resolves."""

from pathlib import Path

import pytest

from tests import structure

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("check", structure.ALL_CHECKS, ids=lambda c: c.__name__)
def test_docs_tree(check):
    errors = check(ROOT)
    assert not errors, "\n".join(errors)


def test_table_check_sees_a_stray_pipe(tmp_path):
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_text(
        "# P\n\n| a | b |\n|---|---|\n| `x|y` | a\\|b |\n| 1 | 2 | 3 |\n\n| c |\n|---|\n| 4 |\n",
        encoding="utf-8",
    )
    assert structure.table_errors(tmp_path) == [
        "docs/p.md:6: table row has 3 cells, its header (line 3) 2"
    ]


def test_control_check_sees_a_tab_and_a_carriage_return(tmp_path):
    page = tmp_path / "docs" / "p.md"
    page.parent.mkdir()
    page.write_bytes(b"# P\n\n$O_{\text{x}}$\n\\lVert a \rVert\n")
    assert structure.control_errors(tmp_path) == [
        "docs/p.md:3: control character '\\t' at column 5",
        "docs/p.md:4: control character '\\r' at column 10",
    ]
