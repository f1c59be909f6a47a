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
import sys
from pathlib import Path

import pytest
from pytest_examples.config import ExamplesConfig
from pytest_examples.find_examples import CodeExample
from pytest_examples.run_code import InsertPrintStatements
from sybil import Region

from snippets.common.markup import (
    NOT_RUN,
    PYTHON,
    SECTION,
    Fence,
    PageError,
    check_language,
    rel,
    scan,
)

EXAMPLES_CONFIG = ExamplesConfig(line_length=100, target_version="py311", ruff_line_length=100)
UPDATE = False  # set from --update-examples by conftest.py
__all__ = ["NOT_RUN", "PYTHON", "Fence", "PageError", "check_language", "scan"]


def resolve_include(fence: Fence, root: Path, file: str, section: str | None) -> Path:
    target = root / file
    if not target.is_file():
        raise PageError(f"{fence.where}: included file {file!r} does not exist")
    if section:
        text = target.read_text(encoding="utf-8")
        for edge in ("start", "end"):
            if SECTION.format(edge, section) not in text:
                raise PageError(
                    f"{fence.where}: included file {file!r} has no section {section!r} "
                    f"(missing '# {SECTION.format(edge, section)}')"
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
    shown = rel(code.path)
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
        raise PageError(f"{where}: {rel(target)} was imported before its prints could be recorded")
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
    new = _check_prints(printer, code, rel(fence.path))
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
                run_include(self.root, target, namespace, rel(fence.path))


def _rewrite_fence(fence: Fence, body: str) -> None:
    text = fence.path.read_text(encoding="utf-8")
    fence = scan(fence.path, text)[fence.index]  # earlier rewrites may have moved it
    pad = " " * fence.indent
    body = "".join(pad + ln if ln.strip() else ln for ln in body.splitlines(keepends=True))
    fence.path.write_text(text[: fence.body_start] + body + text[fence.body_end :], "utf-8")


def _is_user_code(filename: str, root: Path) -> bool:
    path = Path(filename).resolve()
    return any(path.is_relative_to(root.resolve() / d) for d in ("docs", "snippets"))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()
