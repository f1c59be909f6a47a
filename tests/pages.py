"""Executed pages: find the fences of a Markdown page and run its Python ones with Sybil.

Rules (DESIGN.md): every python fence runs, in page order, in one namespace per page; an
include fence (``--8<-- "snippets/x/y.py:section"``) imports the included file, which runs
whole once per test run (SnippetFinder: a unit test importing it first does not cause a second
run) and whose recorded prints the page checks; a fence is skipped only when the line above
it says why (``<!-- skip: reason -->``, or ``<!-- gpu: reason -->`` for code that needs CUDA);
``#>`` output comments are checked with pytest-examples and rewritten by
``pytest --update-examples``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.abc
import importlib.machinery
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from pytest_examples.config import ExamplesConfig
from pytest_examples.find_examples import CodeExample
from pytest_examples.run_code import InsertPrintStatements
from sybil import Region

PYTHON = {"python", "py", "python3", "py3"}
# Fences in these languages are shown, never run. Anything else is an error (no silent gaps).
NOT_RUN = {
    "bash", "sh", "shell", "console", "text", "txt", "yaml", "yml", "json", "toml", "ini",
    "mermaid", "diff", "markdown", "md", "c", "cpp", "cuda", "latex", "tex", "html", "css", "js",
}  # fmt: skip
EXAMPLES_CONFIG = ExamplesConfig(line_length=100, target_version="py311", ruff_line_length=100)
UPDATE = False  # set from --update-examples by conftest.py

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*)$")
_INCLUDE = re.compile(r'^--8<--\s+"(?P<target>[^"]+)"\s*$')
_MARK = re.compile(r"^\s*<!--\s*(?P<kind>skip|gpu)\s*:(?P<reason>.*?)-->\s*$")
_SECTION = "--8<-- [{}:{}]"


class PageError(Exception):
    """A page is malformed; the message starts with ``path:line``."""


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

    @property
    def where(self) -> str:
        return f"{_rel(self.path)}:{self.line}"

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
            raise PageError(f"{path}:{i + 1}: fence opened here is never closed")
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
        marker = _MARK.match(lines[k]) if k >= 0 else None
        if marker:
            reason = marker["reason"].strip()
            if not reason:
                raise PageError(f"{path}:{k + 1}: <!-- {marker['kind']}: --> needs a reason")
            setattr(fence, marker["kind"], reason)
        fences.append(fence)
        i = j + 1
    return fences


def check_language(fence: Fence) -> None:
    if fence.lang in PYTHON or fence.lang in NOT_RUN:
        return
    raise PageError(
        f"{fence.where}: fence language {fence.lang or '(none)'!r} is neither executed Python "
        f"nor a shown-only language ({', '.join(sorted(NOT_RUN))}); it would silently not run"
    )


def resolve_include(fence: Fence, root: Path, file: str, section: str | None) -> Path:
    target = root / file
    if not target.is_file():
        raise PageError(f"{fence.where}: included file {file!r} does not exist")
    if section:
        text = target.read_text(encoding="utf-8")
        for edge in ("start", "end"):
            if _SECTION.format(edge, section) not in text:
                raise PageError(
                    f"{fence.where}: included file {file!r} has no section {section!r} "
                    f"(missing '# {_SECTION.format(edge, section)}')"
                )
    return target


def module_name(root: Path, target: Path) -> str:
    rel = target.resolve().relative_to(root.resolve()).with_suffix("")
    return ".".join(rel.parts)


def first_difference(old: str, new: str) -> int:
    """1-based number of the first line where two texts differ."""
    a, b = old.splitlines(), new.splitlines()
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False), 1) if x != y),
        min(len(a), len(b)) + 1,
    )


def _check_prints(printer: InsertPrintStatements, code: CodeExample, where: str) -> str | None:
    """Compare the ``#>`` comments of ``code`` with what ``printer`` recorded.

    Returns the source with fresh ``#>`` comments in update mode, None when nothing changed.
    """
    __tracebackhide__ = True
    new = printer.updated_print_statements(code)
    if new is None or UPDATE:
        return new
    old_lines, new_lines = code.source.splitlines(), new.splitlines()
    shown = _rel(code.path)
    diff = difflib.unified_diff(
        old_lines, new_lines, f"{shown} (#> comments)", f"{shown} (printed)", lineterm="", n=2
    )
    line = first_difference(code.source, new)
    pytest.fail(
        f"{shown}:{line}: printed output differs from its #> comments "
        f"(run `pytest --update-examples {where}` to rewrite them)\n" + "\n".join(diff),
        pytrace=False,
    )


def _printer(path: Path) -> InsertPrintStatements:
    return InsertPrintStatements(path, EXAMPLES_CONFIG, True, None, None)


class _RecordingLoader(importlib.machinery.SourceFileLoader):
    """Executes a snippet module with its prints recorded (and kept on the module)."""

    def exec_module(self, module):
        printer = _printer(Path(self.path))
        with printer:
            super().exec_module(module)
        module.__printer__ = printer


class SnippetFinder(importlib.abc.MetaPathFinder):
    """Every module under <root>/snippets runs once per test run, with its prints recorded,
    whoever imports it first (a page or a unit test); its page then checks those prints."""

    def __init__(self, root: Path):
        self.snippets = (root / "snippets").resolve()

    def find_spec(self, name, path, target=None):
        if not name.startswith("snippets."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.origin is None or spec.submodule_search_locations is not None:
            return spec  # packages (their __init__) load as usual
        if Path(spec.origin).resolve().is_relative_to(self.snippets):
            spec.loader = _RecordingLoader(name, spec.origin)
        return spec


def install_finder(root: Path) -> None:
    if not any(isinstance(f, SnippetFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SnippetFinder(root))


def run_include(root: Path, target: Path, namespace: dict, where: str) -> None:
    """Import the snippet file as its real module (executing it unless this run already did)
    and check the prints recorded when it executed."""
    module = importlib.import_module(module_name(root, target))
    printer = getattr(module, "__printer__", None)
    if printer is None:
        raise PageError(f"{where}: {_rel(target)} was imported before its prints could be recorded")
    code = CodeExample.create(target.read_text(encoding="utf-8"), path=target, start_line=1)
    new = _check_prints(printer, code, where)
    if new is not None:
        target.write_text(new, encoding="utf-8")
    namespace.update({k: v for k, v in vars(module).items() if not k.startswith("__")})


def run_inline(fence: Fence, namespace: dict) -> str | None:
    """Execute an inline fence in the page namespace; returns rewritten body in update mode."""
    pad = "\n" * fence.line  # body starts on the line after the opening fence
    source = pad + fence.body
    code = CodeExample.create(source, path=fence.path, start_line=1)
    printer = _printer(fence.path)
    with printer:
        exec(compile(source, str(fence.path), "exec"), namespace)
    new = _check_prints(printer, code, _rel(fence.path))
    return new[len(pad) :] if new is not None else None


class PageParser:
    """Sybil parser: one region per python fence; errors for malformed pages."""

    def __init__(self, root: Path):
        self.root = root

    def __call__(self, document):
        path = Path(document.path)
        for fence in scan(path, document.text):
            if fence.lang in PYTHON:
                yield Region(fence.start, fence.end, fence, self.evaluate)

    def evaluate(self, example) -> None:
        __tracebackhide__ = True
        fence: Fence = example.parsed
        if fence.skip:
            pytest.skip(f"{fence.where}: {fence.skip}")
        if fence.gpu and not _cuda():
            pytest.skip(f"{fence.where}: needs CUDA: {fence.gpu}")
        try:
            self._run(fence, example.namespace)
        except (PageError, pytest.fail.Exception, pytest.skip.Exception):
            raise
        except Exception as exc:  # show only the frames of the page and its snippets
            tb = exc.__traceback__
            while tb and not _is_user_code(tb.tb_frame.f_code.co_filename, self.root):
                tb = tb.tb_next
            raise exc.with_traceback(tb or exc.__traceback__) from None

    def _run(self, fence: Fence, namespace: dict) -> None:
        includes = fence.includes()
        if not includes:
            new = run_inline(fence, namespace)
            if new is not None:
                _rewrite_fence(fence, new)
            return
        done = namespace.setdefault("__included__", set())
        for file, section in includes:
            target = resolve_include(fence, self.root, file, section)
            if target not in done:
                done.add(target)
                run_include(self.root, target, namespace, _rel(fence.path))


def _rewrite_fence(fence: Fence, body: str) -> None:
    text = fence.path.read_text(encoding="utf-8")
    fence = scan(fence.path, text)[fence.index]  # earlier rewrites may have moved it
    pad = " " * fence.indent
    body = "".join(pad + ln if ln.strip() else ln for ln in body.splitlines(keepends=True))
    fence.path.write_text(text[: fence.body_start] + body + text[fence.body_end :], "utf-8")


def _is_user_code(filename: str, root: Path) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(root.resolve() / d) for d in ("docs", "snippets"))


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
