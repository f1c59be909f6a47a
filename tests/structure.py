"""Structure checks of a docs tree. Each returns a list of "path:line: problem" strings."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import yaml
from markdown.extensions.toc import slugify

from snippets.common import markup
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
    """Every page is in the nav and every nav entry exists. Posts are in it by derivation
    (hooks/posts.py, from their front matter): theirs must be valid."""
    entries = nav_entries(root)
    docs = root / "docs"
    errors = []
    for page in pages(root):
        if page.parent == docs / "posts":
            continue
        if page.relative_to(docs).as_posix() not in entries:
            errors.append(f"{rel(root, page)}:1: page is not in the nav of mkdocs.yml")
    for entry in entries:
        if not entry.startswith(("http://", "https://")) and not (docs / entry).is_file():
            errors.append(f"mkdocs.yml: nav entry {entry!r} has no file docs/{entry}")
    try:
        markup.series(root)
    except markup.PageError as exc:
        errors.append(str(exc).replace(str(root) + "/", ""))
    return errors


def anchors(page: Path) -> set[str]:
    """Heading ids as Python-Markdown's toc makes them, plus explicit {#id} attributes."""
    ids = set()
    text = page.read_text(encoding="utf-8")
    for line in markup.prose(text, comments=False, spans=False).splitlines():
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


# Math as pymdownx.arithmatex (generic mode) finds it: $$...$$ and \[...\] blocks, $...$ and \(...\)
_MATH = re.compile(
    r"(?P<dd>\$\$)(?P<d>.+?)\$\$|\\\[(?P<b>.+?)\\\]|\\\((?P<p>.+?)\\\)|(?<![\\$\w])\$(?!\s)(?P<i>[^$\n]+?)(?<!\s)\$(?![\w$])",
    re.S,
)


def diagram_items(page: Path, root: Path) -> list[dict]:
    """Every mermaid diagram and formula of a page, with where it starts."""
    text = page.read_text(encoding="utf-8")
    fences = scan(page, text)
    where = rel(root, page)
    items = [{"where": f"{where}:{f.line}", "kind": "mermaid", "text": f.body} for f in fences
             if f.lang == "mermaid"]  # fmt: skip
    prose = markup.prose(text, fences)
    for m in _MATH.finditer(prose):
        tex = next(g for g in (m["d"], m["b"], m["p"], m["i"]) if g is not None)
        items.append({"where": f"{where}:{markup.line_of(text, m.start())}", "kind": "math",
                      "text": tex, "display": m["i"] is None and m["p"] is None})  # fmt: skip
    return items


def diagram_errors(root: Path, only=None) -> list[str]:
    """Mermaid syntax and KaTeX formulas, parsed on the CPU by the site's own pinned libraries."""
    items = [i for p in pages(root) if only is None or p in only for i in diagram_items(p, root)]
    if not items:
        return []
    if not (root / "node_modules" / "mermaid").is_dir():
        return [f"{root / 'node_modules'}: missing; run `npm ci` (nox does) to parse diagrams"]
    proc = subprocess.run(
        ["node", str(Path(__file__).with_name("parse.mjs"))], input=json.dumps(items),
        capture_output=True, text=True, cwd=root, timeout=120,
    )  # fmt: skip
    if proc.returncode != 0:
        return [f"tests/parse.mjs: node failed: {proc.stderr.strip()[-300:]}"]
    return [f"{p['where']}: {p['message']}" for p in json.loads(proc.stdout)]


_ASSET = re.compile(
    r"<(?P<tag>script|link|img|iframe|source|video|audio|embed)\b[^>]*?\b(?:src|href)\s*=\s*"
    r"[\"']?(?P<url>(?:https?:)?//[^\"'\s>]+)", re.I)  # fmt: skip


def asset_errors(root: Path) -> list[str]:
    """No page loads anything from another host (scripts, styles, images, frames)."""
    errors = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        for m in _ASSET.finditer(markup.prose(text, scan(page, text), comments=True)):
            errors.append(
                f"{rel(root, page)}:{markup.line_of(text, m.start())}: <{m['tag']}> loads "
                f"{m['url']} from a third-party host; the site calls no other host: vendor it"
            )
    return errors


def data_errors(root: Path) -> list[str]:
    """The published data files load and validate (hardware and its host links, model configs,
    taxonomy, glossary, request lengths, the shared trained models' pins)."""
    from snippets.common.datafile import DataFileError, load_host_links, load_request_lengths
    from snippets.common.hardware import HardwareDataError, load_hardware
    from snippets.common.models.kv_configs import KVDataError, load_kv_configs
    from snippets.common.models.qwen3_configs import Qwen3DataError, load_qwen3_configs
    from snippets.common.taxonomy import DataError, load_glossary, load_taxonomy

    data = root / "data"
    errors, hardware = [], {}
    if (data / "hardware.yaml").is_file():
        try:
            hardware = load_hardware(data / "hardware.yaml")
        except HardwareDataError as exc:
            errors.append(str(exc))
        try:
            load_host_links(data / "hardware.yaml")
        except DataFileError as exc:
            errors.append(str(exc))
    if (data / "qwen3.yaml").is_file():
        try:
            load_qwen3_configs(data / "qwen3.yaml")
        except Qwen3DataError as exc:
            errors.append(str(exc))
    if (data / "kv_models.yaml").is_file():
        try:
            load_kv_configs(data / "kv_models.yaml")
        except KVDataError as exc:
            errors.append(str(exc))
    if (data / "kv_presets.yaml").is_file():
        from snippets.common.models.kv_presets import load_kv_presets

        try:
            load_kv_presets(data / "kv_presets.yaml")
        except (KVDataError, Qwen3DataError) as exc:
            errors.append(str(exc))
    if (data / "request_lengths.yaml").is_file():
        try:
            load_request_lengths(data / "request_lengths.yaml")
        except DataFileError as exc:
            errors.append(str(exc))
    if (data / "trained_models.yaml").is_file():
        from snippets.common.models.trained_configs import TrainedDataError, load_trained_models

        try:
            load_trained_models(data / "trained_models.yaml")
        except TrainedDataError as exc:
            errors.append(str(exc))
    if (data / "taxonomy.yaml").is_file() and (data / "glossary.yaml").is_file():
        try:
            load_glossary(data / "glossary.yaml", load_taxonomy(data / "taxonomy.yaml"), hardware)
        except DataError as exc:
            errors.append(str(exc))
    return [e.replace(str(root) + "/", "") for e in errors]


_CELL_SEP = re.compile(r"(?<!\\)\|")  # a | that is not escaped


def _cells(row: str) -> int:
    """Cells of a Markdown table row, as the tables extension splits it (code spans kept)."""
    row = re.sub(r"`[^`]*`", "``", row.strip()).strip("|")
    return len(_CELL_SEP.split(row))


def table_errors(root: Path) -> list[str]:
    """Every row of every Markdown table has as many cells as its header: a stray | in a cell
    makes the extension drop the last cell or pad the row, silently."""
    errors = []
    for page in pages(root):
        text = page.read_text(encoding="utf-8")
        fences = scan(page)
        prose = markup.prose(text, fences).splitlines()
        header = None
        for n, line in enumerate(prose, 1):
            is_row = line.lstrip().startswith("|")
            if is_row and header is None:
                header = (_cells(line), n)
            elif is_row and not re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", line):
                if _cells(line) != header[0]:
                    errors.append(f"{rel(root, page)}:{n}: table row has {_cells(line)} cells, "
                                  f"its header (line {header[1]}) {header[0]}")  # fmt: skip
            elif not is_row:
                header = None
    return errors


_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # every C0 control but the newline


def control_errors(root: Path) -> list[str]:
    """No tab, carriage return or other control character in a page: a LaTeX command written
    through a Python string ("\\text", "\\rVert" unescaped) lands as one and breaks the formula."""
    errors = []
    for page in pages(root):
        text = page.read_bytes().decode("utf-8")  # read_text would turn a lone \r into \n
        for n, line in enumerate(text.split("\n"), 1):
            if m := _CONTROL.search(line):
                errors.append(f"{rel(root, page)}:{n}: control character {m[0]!r} at column "
                              f"{m.start() + 1}")  # fmt: skip
    return errors


ALL_CHECKS = (fence_errors, orphan_errors, nav_errors, link_errors, asset_errors, data_errors,
              diagram_errors, table_errors, control_errors)  # fmt: skip
