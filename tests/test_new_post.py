"""`nox -s new_post` scaffolds a post that passes the page, unit and structure tests at once."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import noxfile
from tests import structure

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo(tmp_path):
    dest = tmp_path / "repo"
    ignore = shutil.ignore_patterns("node_modules", "site", ".nox", ".git", ".whl", "__pycache__")
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def test_scaffolded_post_passes(repo):
    written = noxfile.scaffold(repo, "demo-post", "演示文章")
    assert {p.relative_to(repo).as_posix() for p in written} == {
        "docs/posts/demo-post.md",
        "snippets/demo_post/__init__.py",
        "snippets/demo_post/example.py",
        "tests/snippets/test_demo_post.py",
        "mkdocs.yml",
    }
    assert "      - 演示文章: posts/demo-post.md\n" in (repo / "mkdocs.yml").read_text()
    for check in structure.ALL_CHECKS:
        assert check(repo) == [], check.__name__
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "docs/posts/demo-post.md", "tests/snippets/test_demo_post.py"],
        cwd=repo, capture_output=True, text=True, env={"TRITON_INTERPRET": "1", "PATH": ""},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


@pytest.mark.parametrize(
    ("slug", "message"),
    [("Bad_Slug", "must be lowercase"), ("gradient-accumulation", "already exists")],
)
def test_bad_slugs_are_refused(repo, slug, message):
    with pytest.raises(ValueError, match=message):
        noxfile.scaffold(repo, slug, "标题")
