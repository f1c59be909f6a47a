"""Executed pages: find the fences of a Markdown page and run its Python ones with Sybil.

Rules (docs/contributing.md): every python fence runs, in page order, in one namespace per page; an
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
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_examples.config import ExamplesConfig
from pytest_examples.find_examples import CodeExample
from pytest_examples.run_code import (
    Arg,
    InsertPrintStatements,
    MockPrintFunction,
    PrintStatement,
    parent_frame_id,
)
from sybil import Region

from snippets.common.markup import (
    NOT_RUN,
    PYTHON,
    SECTION,
    SHELL,
    Fence,
    PageError,
    check_language,
    rel,
    scan,
)

EXAMPLES_CONFIG = ExamplesConfig(line_length=100, target_version="py311", ruff_line_length=100)
UPDATE = False  # set from --update-examples by conftest.py
FULL_TRACE = False  # set from --full-trace: show tracebacks instead of one line per fault
PRINTS_DUMP = "HANDBOOK_PRINTS_DUMP"  # a file: every printed value is appended to it
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
    dump = os.environ.get(PRINTS_DUMP)
    if dump:  # `nox -s check` runs a page twice and compares what it printed
        with open(dump, "a", encoding="utf-8") as f:
            for st in printer.print_statements():
                f.write(
                    json.dumps([rel(code.path), st.line_no, str(st)], ensure_ascii=False) + "\n"
                )
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


class _CallerPrint(MockPrintFunction):
    """pytest-examples' print mock, reading only the caller's frame: the original calls
    inspect.stack(), which resolves the module of every frame on the stack (inspect.getmodule
    scans sys.modules, thousands of modules once torch is imported): 18 prints took 1.5 s of
    a post's GPU run on the H200 machine's host."""

    __slots__ = ()

    def __call__(self, *args, sep: str = " ", **kwargs) -> None:
        f = sys._getframe(parent_frame_id)  # the frame inspect.stack()[parent_frame_id] names
        frame = inspect.FrameInfo(f, f.f_code.co_filename, f.f_lineno, f.f_code.co_name,
                                  None, None)  # fmt: skip
        if self._include_file(frame, args):
            self.statements.append(
                PrintStatement(self._find_line_number(frame), sep, [Arg(a) for a in args])
            )


def _printer(path: Path) -> InsertPrintStatements:
    printer = InsertPrintStatements(path, EXAMPLES_CONFIG, True, None, None)
    printer.print_func = _CallerPrint(path, None)
    return printer


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


SHELL_TIMEOUT_S = 120
_SPLIT = "\x1ehandbook-command-boundary\x1e"


def shell_commands(fence: Fence) -> list[tuple[int, str, list[str]]]:
    """(line, command, expected output lines) of a bash or console fence.

    bash: every line that is not a `#>` line is part of a command (a trailing backslash
    continues it); the `#>` lines after a command are its expected output.
    console: `$ command` lines; the lines up to the next `$` are its expected output.
    """
    out: list[tuple[int, str, list[str]]] = []
    cont = False
    for i, raw in enumerate(fence.body.splitlines()):
        line = fence.line + 1 + i
        text = raw.rstrip()
        if fence.lang == "console":
            if text.startswith("$ "):
                out.append((line, text[2:], []))
            elif out:
                out[-1][2].append(text)
            elif text:
                raise PageError(
                    f"{rel(fence.path)}:{line}: a console fence starts with '$ command'"
                )
            continue
        if text.lstrip().startswith("#>") and not cont:
            if not out:
                raise PageError(f"{rel(fence.path)}:{line}: '#>' output before any command")
            out[-1][2].append(text.lstrip()[3:] if text.lstrip() != "#>" else "")
        elif cont:
            out[-1] = (out[-1][0], out[-1][1] + "\n" + text, out[-1][2])
        elif text and not text.lstrip().startswith("#"):
            out.append((line, text, []))
        cont = text.endswith("\\")
    return [(n, cmd, [e for e in exp]) for n, cmd, exp in out]


def run_shell(fence: Fence, root: Path) -> str | None:
    """Run a shell fence's commands in one bash (in the repository root, `set -e`), check each
    command's output against its expected lines; returns the rewritten body in update mode."""
    commands = shell_commands(fence)
    script = "set -eo pipefail\n" + "".join(
        f"{cmd}\nprintf '{_SPLIT}\\n'\n" for _, cmd, _ in commands
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    try:
        proc = subprocess.run(["bash", "-c", script], cwd=root, env=env, capture_output=True,
                              text=True, timeout=SHELL_TIMEOUT_S)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"{fence.where}: the commands ran longer than {SHELL_TIMEOUT_S} s", pytrace=False
        )
    outputs = proc.stdout.split(_SPLIT + "\n")
    done = len(outputs) - 1
    if proc.returncode != 0:
        line, cmd, _ = commands[min(done, len(commands) - 1)]
        detail = (proc.stderr.strip().splitlines() or ["(no error output)"])[-1]
        pytest.fail(f"{rel(fence.path)}:{line}: `{cmd.splitlines()[0]}` exited with "
                    f"{proc.returncode}: {detail}", pytrace=False)  # fmt: skip
    new_body, changed = [], False
    for (line, cmd, expected), printed in zip(commands, outputs, strict=False):
        got = printed.rstrip("\n").splitlines() if printed.strip() else []
        if got != expected:
            changed = True
            if not UPDATE:
                diff = difflib.unified_diff(expected, got, "expected", "printed", lineterm="", n=1)
                first = cmd.splitlines()[0]
                message = f"{rel(fence.path)}:{line}: output of `{first}` differs (rewrite it "
                message += "with --update-examples)\n" + "\n".join(diff)
                pytest.fail(message, pytrace=False)
        if fence.lang == "console":
            new_body += [f"$ {cmd}", *got]
        else:
            new_body += [cmd, *(f"#> {g}".rstrip() for g in got)]
    return "\n".join(new_body) + "\n" if changed else None


class PageParser:
    """Sybil parser: one region per python or shell fence; errors for malformed pages."""

    def __init__(self, root: Path):
        self.root = root

    def __call__(self, document):
        path = Path(document.path)
        for fence in scan(path, document.text):
            if fence.lang in PYTHON:
                yield Region(fence.start, fence.end, fence, self.evaluate)
            elif fence.lang in SHELL:
                yield Region(fence.start, fence.end, fence, self.evaluate_shell)

    @staticmethod
    def _admit(fence: Fence) -> None:
        """Fail a fence under a malformed marker; skip one marked skip (gpu without CUDA, cpu
        with it)."""
        __tracebackhide__ = True
        if fence.problem:
            pytest.fail(fence.problem, pytrace=False)
        if fence.skip:
            pytest.skip(f"{fence.where}: {fence.skip}")
        if fence.gpu and not _cuda():
            pytest.skip(f"{fence.where}: needs CUDA: {fence.gpu}")
        if fence.cpu and _cuda():
            pytest.skip(f"{fence.where}: CPU only, the CPU suite runs it: {fence.cpu}")

    def evaluate_shell(self, example) -> None:
        __tracebackhide__ = True
        fence: Fence = example.parsed
        self._admit(fence)
        new = run_shell(fence, self.root)
        if new is not None and UPDATE:
            _rewrite_fence(fence, new)

    def evaluate(self, example) -> None:
        __tracebackhide__ = True
        fence: Fence = example.parsed
        self._admit(fence)
        try:
            self._run(fence, example.namespace)
            return
        except PageError as exc:
            message = str(exc)
        except (pytest.fail.Exception, pytest.skip.Exception):
            raise
        except Exception as exc:
            if FULL_TRACE:  # --full-trace: the frames of the page and its snippets
                tb = exc.__traceback__
                while tb and not _is_user_code(tb.tb_frame.f_code.co_filename, self.root):
                    tb = tb.tb_next
                raise exc.with_traceback(tb or exc.__traceback__) from None
            message = one_line(exc, fence, self.root)
        pytest.fail(message, pytrace=False)  # outside the except: no chained traceback

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


def one_line(exc: BaseException, fence: Fence, root: Path) -> str:
    """`file:line: Type: message` at the innermost line of the page or its snippets (the whole
    traceback is behind pytest's --full-trace)."""
    where = fence.where
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        where = f"{rel(Path(exc.filename))}:{exc.lineno}"
        message = exc.msg
    else:
        tb = exc.__traceback__
        while tb is not None:
            if _is_user_code(tb.tb_frame.f_code.co_filename, root):
                where = f"{rel(Path(tb.tb_frame.f_code.co_filename))}:{tb.tb_lineno}"
            tb = tb.tb_next
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{where}: {type(exc).__name__}: {message}".rstrip(": ")


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
