"""Sybil wiring: every page under docs/ is a test file; every python fence on it runs."""

import os
from pathlib import Path

from sybil import Sybil

from tests import pages

ROOT = Path(__file__).parent

if "TRITON_INTERPRET" not in os.environ:  # CPU machines run Triton kernels in the interpreter
    import torch

    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"


def pytest_configure(config):
    pages.UPDATE = bool(config.getoption("update_examples", False))
    if pages.UPDATE:  # computed results (snippets/common/results.py) are rewritten too
        os.environ["HANDBOOK_UPDATE_RECORDS"] = "1"
    pages.install_finder(ROOT)


pytest_collect_file = Sybil(
    parsers=[pages.PageParser(ROOT)], patterns=["*.md"], path=str(ROOT / "docs")
).pytest()

pytest_plugins = ["pytester"]  # tests/test_machinery.py runs pytest on scratch sites
