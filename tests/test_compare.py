"""tests/compare.py: two runs agree value by value; records neither run measured are left out,
two commits are flagged, and a run's rejected values can stand in for its unwritten record."""

import json

from tests import compare


def record(path, values, commit="a" * 40, date="2026-12-03T10:00:00Z", kind="measured",
           sources=None):  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    prov = {"commit": commit, "date": date}
    sources = sources or {"snippets/p/bench.py": "sha256:" + "0" * 64}
    path.write_text(json.dumps({"kind": kind, "provenance": prov, "values": values,
                                "sources": sources}))  # fmt: skip


def stat(median):
    return {"median": median, "lo": median * 0.99, "hi": median * 1.01, "n": 7}


def test_agreement_counts_values_and_lists_the_ones_that_differ(tmp_path):
    a, b = tmp_path / "A" / "results", tmp_path / "B" / "results"
    record(a / "p" / "r.json", {"x": stat(1.0), "y": stat(2.0), "ok": True})
    record(b / "p" / "r.json", {"x": stat(1.04), "y": stat(2.3), "ok": True}, date="later")
    lines, agreed, total = compare.compare(a, b)
    assert (agreed, total) == (2, 3)
    assert any("p/r:y: 2.0 vs 2.3" in line for line in lines)
    assert compare.main([str(a), str(b)]) == 1  # 67 % < 95 %


def test_text_is_listed_apart_and_not_counted(tmp_path):
    """A tool's output has no median: it differs between machines without being a measurement."""
    a, b = tmp_path / "A" / "results", tmp_path / "B" / "results"
    record(a / "p" / "r.json", {"x": stat(1.0), "first": "nvitop 1.7.2", "same": "jq-1.7"})
    record(b / "p" / "r.json", {"x": stat(1.0), "first": "command not found", "same": "jq-1.7"},
           date="later")  # fmt: skip
    lines, agreed, total = compare.compare(a, b)
    assert (agreed, total) == (1, 1)
    at = lines.index("text that differs (1; not counted above):")
    assert lines[at + 1] == "  p/r:first: 'nvitop 1.7.2' vs 'command not found'"


def test_records_neither_run_measured_are_left_out(tmp_path):
    a, b = tmp_path / "A" / "results", tmp_path / "B" / "results"
    record(a / "p" / "r.json", {"x": stat(1.0)})
    record(b / "p" / "r.json", {"x": stat(1.0)})  # same provenance: the committed record
    record(a / "p" / "c.json", {"x": 1.0}, kind="computed")
    record(b / "p" / "c.json", {"x": 9.0}, kind="computed")
    lines, _, total = compare.compare(a, b)
    assert total == 0 and any("the same record in both runs" in line for line in lines)
    assert compare.main([str(a), str(b)]) == 1  # nothing compared is no agreement


def test_two_commits_are_flagged_with_whether_the_measuring_code_differs(tmp_path):
    """Two commits with the same sources ran the same measuring code: a comparison of the code's
    repeatability still; different sources are named as such."""
    a, b = tmp_path / "A" / "results", tmp_path / "B" / "results"
    record(a / "p" / "r.json", {"x": stat(1.0)})
    record(b / "p" / "r.json", {"x": stat(1.0)}, commit="b" * 40, date="later")
    other = {"snippets/p/bench.py": "sha256:" + "1" * 64}
    record(a / "q" / "r.json", {"x": stat(1.0)})
    record(b / "q" / "r.json", {"x": stat(1.0)}, commit="b" * 40, date="later", sources=other)
    lines, agreed, total = compare.compare(a, b)
    assert (agreed, total) == (2, 2)
    two = "measured on two commits, aaaaaaaaaaaa and bbbbbbbbbbbb, with"
    assert any(f"p/r: {two} the same sources" in ln for ln in lines), lines
    assert any(f"q/r: {two} DIFFERENT sources" in ln for ln in lines), lines


def test_rejected_values_stand_in_only_when_asked(tmp_path):
    a, b = tmp_path / "A" / "results", tmp_path / "B" / "results"
    record(a / "p" / "r.json", {"x": stat(1.0)}, date="run A")
    record(b / "p" / "r.json", {"x": stat(1.5)}, commit="b" * 40, date="older")  # not re-written
    rejected = tmp_path / "B" / ".rejected" / "p" / "r.json"
    rejected.parent.mkdir(parents=True)
    rejected.write_text(json.dumps({"x": stat(1.02)}))  # run B's own, too wide to record
    _, agreed, total = compare.compare(a, b)
    assert (agreed, total) == (0, 1)
    lines, agreed, total = compare.compare(a, b, with_rejected=True)
    assert (agreed, total) == (1, 1)
    assert any("run B's values from .rejected/" in line for line in lines)
    assert not any("two commits" in line for line in lines)
