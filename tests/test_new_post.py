"""`nox -s new_post` scaffolds a post in its own places only, and it passes every check at once."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import noxfile
from snippets.common import markup
from tests import structure

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("node_modules", "site", ".nox", ".git", ".whl", "__pycache__", ".e2e", "results")


@pytest.fixture
def repo(tmp_path):
    dest = tmp_path / "repo"
    shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(*SKIP))
    (dest / "node_modules").symlink_to(ROOT / "node_modules", target_is_directory=True)
    return dest


def test_scaffold_writes_three_places_and_the_post_is_derived_everywhere(repo):
    before = {p.relative_to(repo) for p in repo.rglob("*") if p.is_file()}
    written = noxfile.scaffold(repo, "demo-post", "演示：文章")
    after = {p.relative_to(repo) for p in repo.rglob("*") if p.is_file()}
    assert after - before == {p.relative_to(repo) for p in written} == {
        Path("docs/posts/demo-post.md"), Path("snippets/demo_post/__init__.py"),
        Path("snippets/demo_post/example.py"), Path("tests/snippets/test_demo_post.py"),
    }  # fmt: skip
    meta = markup.post_meta(repo / "docs/posts/demo-post.md")
    # after the 25 planned posts and the unplanned ones already written (trained-models, 26)
    assert (meta.title, meta.series) == ("演示：文章", 27)
    assert [p.slug for p in markup.series(repo)][-1] == "demo-post"  # nav, home page, series
    for check in structure.ALL_CHECKS:
        assert [e for e in check(repo) if "demo" in e] == [], check.__name__


def test_a_planned_post_takes_its_place_in_the_series(repo):
    """The first planned post not written yet goes between the written ones, by its plan."""
    written = {p.stem for p in (repo / "docs" / "posts").glob("*.md")}
    plan = [s for s in re.findall(r"^  - \{slug: ([a-z0-9-]+),",
                                  (repo / "data" / "taxonomy.yaml").read_text(encoding="utf-8"),
                                  re.M)]  # fmt: skip
    slug = next(s for s in plan if s not in written)
    noxfile.scaffold(repo, slug, "计划中的文章")
    order = [p.slug for p in markup.series(repo)]
    before = [s for s in plan[: plan.index(slug)] if s in written]
    assert before and order.index(slug) == len(before)  # after every earlier planned post


@pytest.mark.parametrize(
    ("slug", "message"),
    [("Bad_Slug", "must be lowercase"), ("gradient-accumulation", "already exists")],
)
def test_bad_slugs_are_refused(repo, slug, message):
    with pytest.raises(ValueError, match=message):
        noxfile.scaffold(repo, slug, "标题")


def test_new_post_then_check_is_green(repo):
    """What a contributor does first: scaffold, then the fast check of the new post."""
    run = subprocess.run(
        [sys.executable, "-m", "nox", "-s", "new_post", "--", "demo-post", "演示文章"],
        cwd=repo, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    check = subprocess.run([sys.executable, "-m", "tests.check", "demo-post"], cwd=repo,
                           capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "check demo-post: ok" in check.stderr
