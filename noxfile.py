"""Sessions: docs, serve, tests (default), e2e, gpu_docs (GPU machines only), new_post."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml("pyproject.toml")
nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"  # pip; torch 2.13.0 comes from the CPU wheel on disk
nox.options.reuse_venv = "yes"
os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")


def install(session: nox.Session, *groups: str) -> None:
    session.install(*nox.project.dependency_groups(PYPROJECT, *groups))


def npm_assets(session: nox.Session) -> None:
    """Pinned mermaid and KaTeX from package-lock.json (served from the site itself)."""
    stamp = ROOT / "node_modules" / ".package-lock.json"
    lock = ROOT / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        session.run("npm", "ci", "--no-audit", "--no-fund", external=True)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the site with --strict."""
    install(session, "docs")
    npm_assets(session)
    session.run("mkdocs", "build", "--strict")


@nox.session
def serve(session: nox.Session) -> None:
    """Build and serve the site on http://127.0.0.1:8000/xuntui-handbook/ (the site_url path)."""
    install(session, "docs")
    npm_assets(session)
    session.run("mkdocs", "serve", "--strict", "--dev-addr", "127.0.0.1:8000")


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, run every page and test on the CPU (Triton interpreter), strict build, browser."""
    install(session, "docs", "test", "cpu", "browser")
    npm_assets(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mkdocs", "build", "--strict")
    # the tests read that build (tests/test_built_site.py, tests/e2e) instead of building again
    env = {
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HANDBOOK_SITE_DIR": str(ROOT / "site"),
    }
    session.run("pytest", *(session.posargs or ["--ignore=tests/e2e"]), env=env)
    if session.posargs:  # a chosen page or test: the browser suite is `nox -s e2e`
        return
    ensure_browser(session)
    session.run("pytest", "tests/e2e", env=env)


def post_slugs() -> list[str]:
    return sorted(p.stem for p in (ROOT / "docs" / "posts").glob("*.md"))


@nox.session(venv_backend="none", tags=["gpu"], default=False)
def gpu_docs(session: nox.Session) -> None:
    """On a CUDA machine: run every page and test on the GPU and rewrite results/.

    No venv, no network: uses the interpreter that has CUDA torch. `-- <slug>` runs one post.
    """
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.stdout.strip() != "True":
        session.error("gpu_docs needs a CUDA device: torch.cuda.is_available() is not True here")
    slugs = session.posargs or post_slugs()
    unknown = sorted(set(slugs) - set(post_slugs()))
    if unknown:
        session.error(f"gpu_docs: no post docs/posts/<slug>.md for {', '.join(unknown)}")
    env = {"TRITON_INTERPRET": "0", "HANDBOOK_GPU_RUN": "1"}
    durations = {}
    start = time.perf_counter()
    for slug in slugs:
        t0 = time.perf_counter()
        test_file = ROOT / "tests" / "snippets" / f"test_{slug.replace('-', '_')}.py"
        targets = [f"docs/posts/{slug}.md"] + ([str(test_file)] if test_file.exists() else [])
        session.run(
            sys.executable, "-m", "pytest", *targets, "-p", "no:cacheprovider", "--durations=6",
            env=env,
        )  # fmt: skip
        durations[slug] = time.perf_counter() - t0
    total = time.perf_counter() - start
    session.log("gpu_docs summary (seconds):")
    for slug, seconds in durations.items():
        session.log(f"  {slug:<28} {seconds:7.1f}")
    session.log(f"  {'total':<28} {total:7.1f}")


TEMPLATE_PAGE = """# {title}

一句话说明这篇文章要证明什么。

## 1 第一节

```python
--8<-- "snippets/{package}/example.py:demo"
```

## 参考

1. 一手来源（论文、官方仓库或官方文档），附链接。
"""

TEMPLATE_SNIPPET = '''"""{title}: the central claim of the post, executed."""


# --8<-- [start:demo]
def double(x):
    return 2 * x


assert double(21) == 42
print(double(2))
#> 4
# --8<-- [end:demo]
'''

TEMPLATE_TEST = '''"""Unit tests for snippets/{package}/."""

from snippets.{package}.example import double


def test_double():
    assert double(-3) == -6
'''


def scaffold(root: Path, slug: str, title: str) -> list[Path]:
    """Write a post's page, snippet package and test, and add it to the nav. ValueError if not."""
    if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", slug):
        raise ValueError(f"slug {slug!r} must be lowercase words joined by '-'")
    package = slug.replace("-", "_")
    page = root / "docs" / "posts" / f"{slug}.md"
    pkg = root / "snippets" / package
    test = root / "tests" / "snippets" / f"test_{package}.py"
    existing = [str(p.relative_to(root)) for p in (page, pkg, test) if p.exists()]
    if existing:
        raise ValueError(f"already exists: {', '.join(existing)}")
    config = root / "mkdocs.yml"
    text = config.read_text(encoding="utf-8")
    section = re.search(r"^  - 系列文章:\n(?:      - .*\n)*", text, flags=re.M)
    if not section:
        raise ValueError("mkdocs.yml has no '  - 系列文章:' nav section")
    fmt = {"title": title, "package": package}
    page.write_text(TEMPLATE_PAGE.format(**fmt), encoding="utf-8")
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f'"""{title} ({slug}) snippets."""\n', encoding="utf-8")
    (pkg / "example.py").write_text(TEMPLATE_SNIPPET.format(**fmt), encoding="utf-8")
    test.write_text(TEMPLATE_TEST.format(**fmt), encoding="utf-8")
    entry = f"      - {title}: posts/{slug}.md\n"
    config.write_text(text[: section.end()] + entry + text[section.end() :], encoding="utf-8")
    return [page, pkg / "__init__.py", pkg / "example.py", test, config]


@nox.session(venv_backend="none", default=False)
def new_post(session: nox.Session) -> None:
    """Scaffold a post: nox -s new_post -- <slug> "<标题>"."""
    if len(session.posargs) != 2:
        session.error('usage: nox -s new_post -- <slug> "<标题>"')
    slug, title = session.posargs
    try:
        written = scaffold(ROOT, slug, title)
    except ValueError as exc:
        session.error(f"new_post: {exc}")
    for path in written:
        session.log(f"wrote {path.relative_to(ROOT)}")
    session.log(f"next: edit them, then `nox -s tests -- docs/posts/{slug}.md`")


# Browser suite (tests/e2e): Debian's Chromium driven by Playwright (its own browser download is
# not used), a CJK font so that screenshots show Chinese, not boxes.
BROWSER = os.environ.get("HANDBOOK_CHROMIUM", "/usr/bin/chromium")
BROWSER_PACKAGES = ["chromium", "fonts-noto-cjk"]


def ensure_browser(session: nox.Session) -> None:
    """Install Debian's chromium and a CJK font when missing (as root), else say how."""
    try:
        fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        fonts = ""
    if Path(BROWSER).exists() and fonts.strip():
        return
    if os.geteuid() != 0:
        session.error(
            f"the browser suite needs {BROWSER} and a CJK font: run `sudo apt-get install -y "
            f"--no-install-recommends {' '.join(BROWSER_PACKAGES)}` (or set HANDBOOK_CHROMIUM)"
        )
    apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", external=True, env=apt_env)
    session.run(
        "apt-get", "install", "-y", "--no-install-recommends", *BROWSER_PACKAGES,
        external=True, env=apt_env,
    )  # fmt: skip


@nox.session
def e2e(session: nox.Session) -> None:
    """Build the site and test it in headless Chromium (also run at the end of `tests`)."""
    install(session, "docs", "test", "browser")
    npm_assets(session)
    ensure_browser(session)
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}  # the root conftest skips torch
    session.run("pytest", "tests/e2e", *session.posargs, env=env)
