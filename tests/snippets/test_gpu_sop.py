"""Unit tests for snippets/gpu_sop/."""

from snippets.gpu_sop.example import double


def test_double():
    assert double(-3) == -6
