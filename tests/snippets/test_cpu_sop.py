"""Unit tests for snippets/cpu_sop/."""

from snippets.cpu_sop.example import double


def test_double():
    assert double(-3) == -6
