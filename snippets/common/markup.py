"""The page grammar, in one place: fences, their markers, includes, directives, slugs.

A page is docs/posts/<slug>.md. Its fences are
  ```python / ```py          executed (tests/pages.py), in page order, one namespace per page;
  ```bash / ```console       executed (also sh, shell) in bash in the repository root; `#>`
                             lines (bash) or the lines after `$ cmd` are the expected output;
                             an include fence holds only `--8<-- "snippets/x/y.py:section"` lines;
  ```table NAME / ```plot NAME   result presentation, a YAML spec (snippets/common/claims.py);
  ```calculator NAME         a form in the page, a YAML spec (snippets/common/calculator.py);
  ```text, ```yaml, ...      shown only (NOT_RUN).
The line above a fence may say why it is skipped: `<!-- skip: reason -->` always,
`<!-- gpu: reason -->` without CUDA, `<!-- cpu: reason -->` with CUDA (CPU-only work that the
CPU suite runs; gpu_docs spends its budget on the GPU). Outside fences and code spans:
  {{ NAME:path }} / {{ NAME:path:.1f }}   a number from results/<slug>/NAME.json;
  <!-- claim: EXPR -->                    a claim about results, asserted (claims.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PYTHON = {"python", "py", "python3", "py3"}
SHELL = {
    "bash",
    "sh",
    "shell",
    "console",
}  # executed too: commands, with `#>` (bash) or console-style output
DIRECTIVES = {"table", "plot"}  # result presentation, rendered by hooks/results.py
WIDGETS = {"calculator"}  # forms in the page, rendered by hooks/calculators.py
# Fences in these languages are shown, never run. Anything else is an error (no silent gaps).
NOT_RUN = {
    "text", "txt", "yaml", "yml", "json", "toml", "ini",
    "mermaid", "diff", "markdown", "md", "c", "cpp", "cuda", "latex", "tex", "html", "css", "js",
}  # fmt: skip
SLUG = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_INCLUDE = re.compile(r'^--8<--\s+"(?P<target>[^"]+)"\s*$')
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>skip|gpu|cpu)\s*:(?P<reason>.*?)-->\s*$")
_BARE_MARK = re.compile(r"^\s*<!--\s*(?P<kind>skip|gpu|cpu)\s*-->\s*$")
SECTION = "--8<-- [{}:{}]"
CLAIM = re.compile(r"<!--\s*claim:(?P<expr>.*?)-->", re.S)
# NAME:path[:format]; NAME may be slug/name for another post's result
REF = r"(?P<name>(?:[a-z][a-z0-9-]*/)?[a-z0-9][a-z0-9-]*):(?P<path>[\w.\[\]=,*\"'-]+?)"
INLINE = re.compile(r"\{\{\s*" + REF + r"(?::(?P<fmt>[^}\s]+))?\s*\}\}")


class PageError(Exception):
    """A page is malformed; the message starts with ``path:line``."""


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def package_of(slug: str) -> str:
    return slug.replace("-", "_")


def test_file_of(root: Path, slug: str) -> Path:
    return root / "tests" / "snippets" / f"test_{package_of(slug)}.py"


def post_slugs(root: Path) -> list[str]:
    return sorted(p.stem for p in (root / "docs" / "posts").glob("*.md"))


@dataclass
class Fence:
    path: Path
    line: int  # 1-based line of the opening fence
    end_line: int  # 1-based line of the closing fence
    lang: str
    info: str
    indent: int
    body: str  # dedented content
    start: int  # char offsets of the whole fence in the page
    end: int
    body_start: int  # char offsets of the content
    body_end: int
    index: int = 0  # ordinal among the page's fences
    skip: str | None = None  # reason, always skipped
    gpu: str | None = None  # reason, skipped without CUDA
    cpu: str | None = None  # reason, skipped with CUDA (the CPU suite runs it)
    problem: str | None = None  # a malformed marker above it: the fence fails with this

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"

    @property
    def argument(self) -> str | None:
        """The word after the language: a directive's result name."""
        parts = self.info.split()
        return parts[1] if len(parts) > 1 else None

    def includes(self) -> list[tuple[str, str | None]]:
        """(file, section) per include line; [] for inline code; error on a mixed fence."""
        lines = [ln for ln in self.body.splitlines() if ln.strip()]
        found = [_INCLUDE.match(ln.strip()) for ln in lines]
        if not any(found):
            return []
        if not all(found):
            raise PageError(f"{self.where}: a fence mixes --8<-- includes with inline code")
        out = []
        for m in found:
            target = m["target"]
            file, _, section = target.partition(":")
            if section and not re.fullmatch(r"[A-Za-z0-9_-]+", section):
                raise PageError(f"{self.where}: include {target!r}: use a named section")
            out.append((file, section or None))
        return out


def scan(path: Path, text: str | None = None) -> list[Fence]:
    """Every fenced block of a page, with its language, position and skip marker."""
    text = path.read_text(encoding="utf-8") if text is None else text
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln))
    fences: list[Fence] = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i].rstrip("\n"))
        if not m:
            i += 1
            continue
        indent, mark = m["indent"], m["fence"]
        close = re.compile(rf"^{re.escape(indent)}{mark[0]}{{{len(mark)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j].rstrip("\n")):
            j += 1
        if j == len(lines):
            raise PageError(f"{rel(path)}:{i + 1}: fence opened here is never closed")
        info = m["info"].strip()
        lang = info.split()[0].lower() if info else ""
        body_lines = [ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[i + 1 : j]]
        fence = Fence(
            path=path, line=i + 1, end_line=j + 1, lang=lang, info=info, indent=len(indent),
            body="".join(body_lines), start=offsets[i], end=offsets[j + 1],
            body_start=offsets[i + 1], body_end=offsets[j], index=len(fences),
        )  # fmt: skip
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        above = lines[k] if k >= 0 else ""
        marker = _MARK.match(above) or _BARE_MARK.match(above)
        if marker:
            reason = (marker.groupdict().get("reason") or "").strip()
            if reason:
                setattr(fence, marker["kind"], reason)
            else:  # reported by the structure check, and the fence fails: it does not run
                fence.problem = f"{rel(path)}:{k + 1}: <!-- {marker['kind']}: --> needs a reason"
        fences.append(fence)
        i = j + 1
    return fences


def check_language(fence: Fence) -> None:
    if fence.problem:
        raise PageError(fence.problem)
    if fence.lang in PYTHON or fence.lang in SHELL or fence.lang in NOT_RUN:
        return
    if fence.lang in DIRECTIVES or fence.lang in WIDGETS:
        if not fence.argument:
            what = "result" if fence.lang in DIRECTIVES else fence.lang
            raise PageError(f"{fence.where}: ```{fence.lang} needs a {what} name after it")
        return
    raise PageError(
        f"{fence.where}: fence language {fence.lang or '(none)'!r} is neither executed Python "
        f"nor a shown-only language ({', '.join(sorted(NOT_RUN))}); it would silently not run"
    )


def _blank(m: re.Match) -> str:
    return re.sub(r"[^\n]", " ", m.group())


_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)[^\n]+?(?<!`)\1(?!`)")  # one line: ours never wrap


def prose(text: str, fences: list[Fence] | None = None, *, comments: bool = True,
          spans: bool = True) -> str:  # fmt: skip
    """The page with fences, code spans (and HTML comments) blanked out: same length, same
    newlines, so offsets and line numbers still hold."""
    chars = list(text)
    for f in fences if fences is not None else scan(Path("<page>"), text):
        for i in range(f.start, f.end):
            if chars[i] != "\n":
                chars[i] = " "
    out = "".join(chars)
    out = _CODE_SPAN.sub(_blank, out) if spans else out
    if comments:
        out = re.sub(r"<!--.*?-->", _blank, out, flags=re.S)
    return out


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# --------------------------------------------------------------------------- front matter

META_KEYS = {"title": str, "summary": str, "prerequisites": list, "series": int}
OPTIONAL_KEYS = {"awaiting_gpu": str}  # why the post's results are not measured yet
_FRONT = re.compile(r"\A---[ \t]*\n(?P<body>.*?)\n---[ \t]*\n", re.S)


@dataclass(frozen=True)
class PostMeta:
    """A post's front matter: its nav title, one-line summary (what the reader will be able to
    do), the posts it builds on, and its position in the series; plus its H1 heading."""

    slug: str
    title: str
    summary: str
    prerequisites: tuple[str, ...]
    series: int
    heading: str
    awaiting_gpu: str | None = None  # set while its results wait for `nox -s gpu_docs`
    awaiting_line: int = 0


def post_meta(path: Path, text: str | None = None) -> PostMeta:
    """Read and check a post's front matter; errors name the page and line."""
    import yaml

    text = path.read_text(encoding="utf-8") if text is None else text
    where = rel(path)
    m = _FRONT.match(text)
    if not m:
        raise PageError(
            f"{where}:1: a post starts with front matter: ---, title, summary, prerequisites, "
            "series, --- (`nox -s new_post` writes it)"
        )
    try:
        meta = yaml.safe_load(m["body"]) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PageError(f"{where}:{2 + (mark.line if mark else 0)}: front matter: {exc}") from None
    if not isinstance(meta, dict):
        raise PageError(f"{where}:2: front matter must be a mapping")
    lines = m["body"].splitlines()

    def line_of_key(key):
        return next((i + 2 for i, ln in enumerate(lines) if ln.startswith(f"{key}:")), 2)

    for key in meta:
        if key not in META_KEYS and key not in OPTIONAL_KEYS:
            known = ", ".join([*META_KEYS, *OPTIONAL_KEYS])
            raise PageError(f"{where}:{line_of_key(key)}: front matter: unknown key {key!r} "
                            f"(known: {known})")  # fmt: skip
    awaiting = meta.get("awaiting_gpu")
    if "awaiting_gpu" in meta and (not isinstance(awaiting, str) or not awaiting.strip()):
        raise PageError(f"{where}:{line_of_key('awaiting_gpu')}: front matter: "
                        f"'awaiting_gpu' must say why the results wait for a GPU run, "
                        f"got {awaiting!r}")  # fmt: skip
    for key, kind in META_KEYS.items():
        if key not in meta:
            raise PageError(f"{where}:1: front matter: missing {key!r}")
        value = meta[key]
        if (
            not isinstance(value, kind)
            or isinstance(value, bool)
            or (value in ("", []) and key != "prerequisites")
        ):
            raise PageError(f"{where}:{line_of_key(key)}: front matter: {key!r} must be a "
                            f"non-empty {kind.__name__}, got {value!r}")  # fmt: skip
    bad = [p for p in meta["prerequisites"] if not isinstance(p, str) or not SLUG.fullmatch(p)]
    if bad:
        raise PageError(f"{where}:{line_of_key('prerequisites')}: front matter: prerequisites "
                        f"are post slugs, got {bad!r}")  # fmt: skip
    heading = re.search(r"^# (.+)$", text[m.end() :], re.M)
    if not heading:
        raise PageError(f"{where}:{text[: m.end()].count(chr(10)) + 1}: a post needs a '# ' title")
    awaiting = awaiting.strip() if awaiting else None
    return PostMeta(path.stem, meta["title"], meta["summary"].strip(),
                    tuple(meta["prerequisites"]), meta["series"], heading[1].strip(),
                    awaiting, line_of_key("awaiting_gpu"))  # fmt: skip


def series(root: Path) -> list[PostMeta]:
    """Every post, in series order; errors for duplicate positions and unknown prerequisites."""
    posts = [post_meta(p) for p in sorted((root / "docs" / "posts").glob("*.md"))]
    slugs = {p.slug for p in posts}
    seen: dict[int, str] = {}
    for p in posts:
        where = rel(root / "docs" / "posts" / f"{p.slug}.md")
        if p.series in seen:
            raise PageError(f"{where}:1: series position {p.series} is also {seen[p.series]}'s")
        seen[p.series] = p.slug
        unknown = [s for s in p.prerequisites if s not in slugs or s == p.slug]
        if unknown:
            raise PageError(f"{where}:1: prerequisites {unknown!r} are not other posts")
    return sorted(posts, key=lambda p: p.series)
