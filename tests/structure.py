"""Structure checks of a docs tree. Each returns a list of "path:line: problem" strings."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from markdown.extensions.toc import slugify

from tests.pages import PYTHON, PageError, check_language, resolve_include, scan

# Snippet files that need not be shown: package markers and the shared helpers.
SHARED_HELPERS = "snippets/common/"
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.+?)(?:\s*\{[^}]*#(?P<id>[\w-]+)[^}]*\})?\s*$")
_ATTR_ID = re.compile(r"\{[^}]*#(?P<id>[\w-]+)[^}]*\}")


def pages(root: Path) -> list[Path]:
    return sorted((root / "docs").rglob("*.md"))


def rel(root: Path, path: Path) -> str:
    return str(path.relative_to(root))


def fence_errors(root: Path) -> list[str]:
    """Every fence is executed Python (with includes that resolve) or a shown-only language."""
    errors = []
    for page in pages(root):
        try:
            fences = scan(page)
        except PageError as exc:
            errors.append(str(exc))
            continue
        for fence in fences:
            try:
                check_language(fence)
                if fence.lang in PYTHON:
                    for file, section in fence.includes():
                        resolve_include(fence, root, file, section)
            except PageError as exc:
                errors.append(str(exc))
    return errors


def shown_snippets(root: Path) -> set[Path]:
    shown = set()
    for page in pages(root):
        for fence in scan(page):
            if fence.lang in PYTHON:
                shown.update((root / file).resolve() for file, _ in fence.includes())
    return shown


def orphan_errors(root: Path) -> list[str]:
    """Every file under snippets/ (but package markers and common helpers) is shown on a page."""
    shown = shown_snippets(root)
    errors = []
    for path in sorted((root / "snippets").rglob("*.py")):
        name = rel(root, path)
        if path.name == "__init__.py" or name.startswith(SHARED_HELPERS):
            continue
        if path.resolve() not in shown:
            errors.append(f"{name}:1: snippet file is not included by any page under docs/")
    return errors


class _AnyTagLoader(yaml.SafeLoader):
    """Reads mkdocs.yml without executing its !relative / !!python tags."""


_AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_entries(root: Path) -> list[str]:
    config = yaml.load((root / "mkdocs.yml").read_text(encoding="utf-8"), _AnyTagLoader)
    found: list[str] = []

    def walk(item):
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, list):
            for x in item:
                walk(x)
        elif isinstance(item, dict):
            for x in item.values():
                walk(x)

    walk(config.get("nav", []))
    return found


def nav_errors(root: Path) -> list[str]:
    """Every page is in the nav, and every nav entry exists."""
    entries = nav_entries(root)
    docs = root / "docs"
    errors = []
    for page in pages(root):
        if page.relative_to(docs).as_posix() not in entries:
            errors.append(f"{rel(root, page)}:1: page is not in the nav of mkdocs.yml")
    for entry in entries:
        if not entry.startswith(("http://", "https://")) and not (docs / entry).is_file():
            errors.append(f"mkdocs.yml: nav entry {entry!r} has no file docs/{entry}")
    return errors


def anchors(page: Path) -> set[str]:
    """Heading ids as Python-Markdown's toc makes them, plus explicit {#id} attributes."""
    ids = set()
    in_fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        if in_fence:
            continue
        m = _HEADING.match(line)
        if m:
            ids.add(m["id"] or slugify(m["title"], "-"))
        ids.update(a["id"] for a in _ATTR_ID.finditer(line))
    return ids


def link_errors(root: Path) -> list[str]:
    """Every relative link from a page resolves to a file, and its #anchor to a heading."""
    errors = []
    for page in pages(root):
        fences = scan(page)
        in_fence = {n for f in fences for n in range(f.line, f.end_line + 1)}
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if n in in_fence:
                continue
            for m in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = m["target"]
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, mailto:, …
                    continue
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                where = f"{rel(root, page)}:{n}"
                if not dest.is_file():
                    errors.append(f"{where}: link target {target!r} does not exist")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    errors.append(f"{where}: link {target!r}: no heading with id {anchor!r}")
    return errors


ALL_CHECKS = (fence_errors, orphan_errors, nav_errors, link_errors)
