"""Unit tests for snippets/rl_training/."""

from snippets.rl_training.example import double


def test_double():
    assert double(-3) == -6
