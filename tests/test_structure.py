"""The docs tree is whole: every fence runs or is shown-only, every snippet is shown,
every page is in the nav, every internal link resolves."""

from pathlib import Path

import pytest

from tests import structure

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("check", structure.ALL_CHECKS, ids=lambda c: c.__name__)
def test_docs_tree(check):
    errors = check(ROOT)
    assert not errors, "\n".join(errors)
