"""Unit tests for snippets/gpu_sop/: the collective-hang analysis on hand-made ledgers (each
fault, and the healthy case), bad ledgers, and the live gloo runs the page prints."""

import json

import pytest

from snippets.gpu_sop.hang import analyze, read_ledgers, run


def started(seq, op="all_reduce", shape=(4,)):
    return {"seq": seq, "op": op, "shape": list(shape), "state": "started"}


def completed(seq, op="all_reduce", shape=(4,)):
    return {"seq": seq, "op": op, "shape": list(shape), "state": "completed"}


def test_healthy():
    rows = [started(0), completed(0), started(1), completed(1)]
    assert analyze({0: rows, 1: rows}).startswith("no hang")


def test_straggler_is_the_rank_that_never_entered():
    ok = [started(0), completed(0), started(1)]
    late = [started(0), completed(0)]
    report = analyze({0: ok, 1: ok, 2: late})
    assert report == ("collective #1 all_reduce: ranks [0, 1] waited; ranks [2] never entered "
                      "it (last completed: rank 2 #0)")  # fmt: skip


def test_mismatch_names_each_side():
    a = [started(0), started(1, "broadcast")]
    b = [started(0), started(1, "all_reduce", (8,))]
    assert analyze({0: a, 1: a, 2: b}) == (
        "collective #1: ranks disagree: all_reduce[8] on ranks [2]; broadcast[4] on ranks [0, 1]"
    )


def test_first_disagreement_wins():
    a = [started(0), completed(0), started(1)]
    b = [started(0, shape=(2,))]
    assert analyze({0: a, 1: b}).startswith("collective #0: ranks disagree")


def test_bad_ledgers(tmp_path):
    with pytest.raises(FileNotFoundError, match="no rank"):
        read_ledgers(tmp_path)
    (tmp_path / "rank0.jsonl").write_text(json.dumps(started(0)) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"rank0.jsonl:2: not a JSON ledger line"):
        read_ledgers(tmp_path)


@pytest.mark.parametrize("fault,want", [
    ("none", "no hang"),
    ("straggler", "collective #2 all_reduce: ranks [0, 1] waited; ranks [2] never entered"),
    ("shape", "collective #2: ranks disagree"),
])  # fmt: skip
def test_live_gloo_runs(fault, want):
    assert run(fault).startswith(want)
