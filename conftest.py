"""Sybil wiring: every page under docs/ is a test file; every python fence on it runs."""

import os
import sys
from pathlib import Path

import pytest
from sybil import Sybil

from tests import pages

ROOT = Path(__file__).parent

if "TRITON_INTERPRET" not in os.environ:  # CPU machines run Triton kernels in the interpreter
    import torch

    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"

if os.environ["TRITON_INTERPRET"] == "1":  # note every launch: tests/test_zz_lowering.py
    from tests import interpreter, lowering

    lowering.record()
    interpreter.fix_e4m3_rounding()  # triton#8322: tests/interpreter.py


def pytest_configure(config):
    pages.UPDATE = bool(config.getoption("update_examples", False))
    pages.FULL_TRACE = bool(config.getoption("fulltrace", False))
    if pages.UPDATE:  # computed results (snippets/common/results.py) are rewritten too
        os.environ["HANDBOOK_UPDATE_RECORDS"] = "1"
    pages.install_finder(ROOT)


pytest_collect_file = Sybil(
    parsers=[pages.PageParser(ROOT)], patterns=["*.md"], path=str(ROOT / "docs")
).pytest()

pytest_plugins = ["pytester"]  # tests/test_machinery.py runs pytest on scratch sites


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.gpu` tests are skipped, with the reason, where there is no CUDA."""
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA: runs in `nox -s gpu_docs`")
        for item in marked:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    prose = sys.modules.get("tests.prose")
    if prose is not None and prose.REPORT:
        counts = ", ".join(f"{page} {n}" for page, n in sorted(prose.REPORT.items()) if n)
        terminalreporter.write_line(f"prose: <!-- input: --> markers per page: {counts or 'none'}")
