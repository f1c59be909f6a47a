"""Unit tests for snippets/quality_metrics/."""

from snippets.quality_metrics.example import double


def test_double():
    assert double(-3) == -6
