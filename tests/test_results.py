"""The results gate on this repository, and the mechanism on a scratch tree.

On the repository: every record is valid, unedited (checksum), fresh (derived sources), from a
commit in this branch's history, and read by a page; every number, table, plot and claim on
every page resolves, and every claim holds at the unfavourable end of its values' spread.

On a scratch tree (a git repository of its own): a snippet module that imports a helper, which
opens a data file, records a result; then each fault a contributor could make is planted and
must fail with the file (and line).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from snippets.common import claims as cl
from snippets.common import markup
from snippets.common import results as res
from tests import gate

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("check", ["record_errors", "page_errors", "unread_errors", "pending"])
def test_repository(check):
    base = ROOT / "results"
    pending = cl.pending(ROOT, base)  # posts awaiting a GPU run (gate.awaiting_lines says why)
    errors = {
        "record_errors": lambda: gate.record_errors(ROOT, base, pending=pending),
        "page_errors": lambda: gate.page_errors(ROOT, base, None, pending),
        "unread_errors": lambda: gate.unread_errors(ROOT, base, None, pending),
        "pending": lambda: cl.pending_errors(ROOT, base),
    }[check]()
    assert not errors, "\n".join(errors)


# --------------------------------------------------------------------------- scratch tree

COMMON = ("__init__.py", "results.py", "markup.py", "claims.py")
HELPER = """from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data" / "demo.yaml"


def size():
    return int(DATA.read_text().split(":")[1])
"""
RECORD = """from snippets.common.results import Stat, computed_result
from snippets.demo.helper import size

N = size()
ms = [1.00, 1.01, 0.99, 1.02, 1.00]
computed_result("demo", "speed", {
    "n": N,
    "rows": [{"impl": "a", "ms": Stat.of(ms, "gpu-graph")},
             {"impl": "b", "ms": Stat.of([2 * x for x in ms], "gpu-graph")}],
})
"""
PAGE = """# Demo

```table speed
rows: rows
caption: 两种实现
columns:
  impl: 实现
  ms: {label: ms, format: .2f}
```

N 是 {{ speed:n }}。a 比 b 快。<!-- claim: speed:rows[impl=a].ms < speed:rows[impl=b].ms -->
"""


def git(root: Path, *args: str) -> str:
    who = {f"GIT_{role}_{what}": v for role in ("AUTHOR", "COMMITTER")
           for what, v in (("NAME", "t"), ("EMAIL", "t@t"))}  # fmt: skip
    env = {**os.environ, **who}
    out = subprocess.run(
        ["git", *args], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def measure(root: Path, commit: str | None = None) -> subprocess.CompletedProcess:
    """What a run does: import the snippet, which records (computed kind, rewritten)."""
    env = {**os.environ, "PYTHONPATH": str(root), res.UPDATE_ENV: "1", res.DIRTY_ENV: "0",
           res.COMMIT_ENV: commit or git(root, "rev-parse", "HEAD")}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", "import snippets.demo.record"],
        cwd=root, env=env, capture_output=True, text=True,
    )  # fmt: skip


@pytest.fixture
def scratch(tmp_path):
    root = tmp_path / "repo"
    for name in COMMON:
        (root / "snippets" / "common").mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "snippets" / "common" / name, root / "snippets" / "common" / name)
    shutil.copy(ROOT / "snippets" / "__init__.py", root / "snippets" / "__init__.py")
    files = {
        "snippets/demo/__init__.py": "",
        "snippets/demo/helper.py": HELPER,
        "snippets/demo/record.py": RECORD,
        "data/demo.yaml": "n: 1024\n",
        "docs/posts/demo.md": PAGE,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "scratch")
    run = measure(root)
    assert run.returncode == 0, run.stderr
    return root


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, old
    path.write_text(text.replace(old, new), encoding="utf-8")


RESULT = "results/demo/speed.json"


def test_scratch_is_clean_and_sources_are_derived(scratch):
    assert gate.errors(scratch) == []
    record = json.loads((scratch / RESULT).read_text(encoding="utf-8"))
    assert set(record["sources"]) == {  # imports, direct and indirect, and the file opened
        "snippets/__init__.py", "snippets/common/__init__.py", "snippets/demo/__init__.py",
        "snippets/demo/record.py", "snippets/demo/helper.py", "data/demo.yaml",
    }  # fmt: skip
    assert record["provenance"]["measured_by"] == "snippets/demo/record.py"
    assert record["provenance"]["commit"] == git(scratch, "rev-parse", "HEAD")
    assert all(d.startswith("sha256:") and len(d) == 71 for d in record["sources"].values())


def test_carried_wheels_are_not_sources(tmp_path, monkeypatch):
    """A file a snippet opens is a source, but not a wheel carried in .whl/ (git-ignored: a
    record would be stale wherever the wheel is not carried); its pin is in data/."""
    module, data = tmp_path / "snippets" / "m.py", tmp_path / "data" / "d.yaml"
    wheel = tmp_path / ".whl" / "corpus" / "w-1.0-py3-none-any.whl"
    for path in (module, data, wheel):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x = 1\n", encoding="utf-8")
    opened = {f.resolve(): {module.resolve()} for f in (data, wheel)}
    monkeypatch.setattr(res, "_OPENED", opened)
    assert set(res.derive_sources(module, tmp_path)) == {"snippets/m.py", "data/d.yaml"}


def test_wall_time_counts_from_the_measuring_module_however_imported():
    """gpu_docs's pages import bench modules with importlib.import_module, which raises no
    'import' audit event: the wall time must still start when the module's body runs."""
    code = (
        "import importlib, time, snippets\n"
        "from snippets.common import results\n"
        "m = importlib.import_module('snippets.metrics.calculators')\n"
        "time.sleep(0.2)\n"
        "print(results.wall_s(m.__file__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert 0.2 <= float(out.stdout.split()[-1]) < 5, out.stdout[-200:]
    assert res.wall_s(ROOT / "snippets" / "never_ran.py") is None


def test_hand_edited_value_fails_by_checksum(scratch):
    edit(scratch / RESULT, '"n": 1024', '"n": 2048')
    error, *also = gate.errors(scratch)  # the page cannot read it either
    assert all("checksum mismatch" in e for e in also)
    assert error.startswith(f"{RESULT}: checksum mismatch: the file was edited"), error


def test_false_claim_names_page_and_line(scratch):
    edit(scratch / "docs/posts/demo.md", "[impl=a].ms < speed", "[impl=a].ms > speed")
    (error,) = gate.errors(scratch)
    assert error.startswith("docs/posts/demo.md:11: claim does not hold"), error


def test_claim_is_judged_at_the_unfavourable_end(scratch):
    """b's range is 1.98..2.04 ms; 'a takes under 1.0 ms' fails: a's slowest repeat is 1.02."""
    edit(scratch / "docs/posts/demo.md", "< speed:rows[impl=b].ms", "< 1.0")
    (error,) = gate.errors(scratch)
    assert "claim does not hold" in error and "[0.99, 1.02] (n=5)" in error, error


def test_indirect_import_change_makes_the_result_stale(scratch):
    edit(scratch / "snippets/demo/helper.py", "def size():", "def size():  # tweak")
    (error,) = gate.errors(scratch)
    assert error.startswith(f"{RESULT}: stale: snippets/demo/helper.py changed"), error
    assert "`nox -s tests -- --update-examples docs/posts/demo.md`" in error


def test_data_file_change_and_new_import_make_the_result_stale(scratch):
    edit(scratch / "data/demo.yaml", "1024", "1024  # same")
    (scratch / "snippets/demo/extra.py").write_text("X = 1\n", encoding="utf-8")
    edit(
        scratch / "snippets/demo/record.py",
        "from snippets.demo.helper",
        "import snippets.demo.extra\nfrom snippets.demo.helper",
    )
    (error,) = gate.errors(scratch)
    assert "data/demo.yaml" in error and "snippets/demo/extra.py (newly imported)" in error, error


def test_unread_value_names_file_and_line(scratch):
    edit(scratch / "snippets/demo/record.py", '"n": N,', '"n": N, "extra": 3,')
    assert measure(scratch).returncode == 0
    (error,) = gate.errors(scratch)
    text = (scratch / RESULT).read_text(encoding="utf-8").splitlines()
    line = next(i for i, t in enumerate(text, 1) if '"extra"' in t)
    assert error.startswith(f"{RESULT}:{line}: value 'extra' is read by no page"), error


def test_unknown_commit_fails(scratch):
    (scratch / RESULT).unlink()  # an unchanged record is not rewritten
    assert measure(scratch, commit="0" * 40).returncode == 0
    (error,) = gate.errors(scratch)
    assert error.startswith(f"{RESULT}: measured on commit 000000000000, which is not in"), error


def test_presentation_changes_make_nothing_stale(scratch):
    edit(scratch / "docs/posts/demo.md", "caption: 两种实现", "caption: 两种实现（新标题）")
    edit(scratch / "docs/posts/demo.md", "{label: ms,", "{label: 毫秒,")
    assert gate.errors(scratch) == []


def test_missing_result_and_unshown_result(scratch):
    edit(scratch / "docs/posts/demo.md", "{{ speed:n }}", "{{ speed:n }} {{ nope:x }}")
    (error,) = gate.page_errors(scratch, scratch / "results")
    assert error.startswith("docs/posts/demo.md:11: result 'nope':") and "no such result" in error
    (scratch / "docs/posts/demo.md").write_text("# Demo\n", encoding="utf-8")
    (error,) = gate.unread_errors(scratch, scratch / "results")
    assert error.startswith(f"{RESULT}: no page shows this result"), error


def test_malformed_and_old_schema_results_name_the_file(scratch):
    path = scratch / RESULT
    edit(path, '"values"', '"values" "')
    (error,) = gate.record_errors(scratch, scratch / "results")
    assert error.startswith(f"{RESULT}:") and "malformed JSON" in error, error
    path.write_text('{"slug": "demo"}', encoding="utf-8")
    (error,) = gate.record_errors(scratch, scratch / "results")
    assert error.startswith(f"{RESULT}:1: schema None, expected 2"), error


def test_computed_result_detects_drift_without_update(scratch):
    edit(scratch / "data/demo.yaml", "1024", "2048")
    env = {k: v for k, v in os.environ.items() if k != res.UPDATE_ENV}
    env |= {"PYTHONPATH": str(scratch), res.COMMIT_ENV: git(scratch, "rev-parse", "HEAD"),
            res.DIRTY_ENV: "0"}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", "import snippets.demo.record"], cwd=scratch,
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1
    assert f"{RESULT}: the committed values differ from what the code computes now" in run.stderr


# --------------------------------------------------------------------------- the runner side


def test_wide_timing_spread_fails_naming_the_value(monkeypatch):
    monkeypatch.setattr(res, "provenance", lambda *a, **k: {})
    noisy = res.Stat.of([1.0, 1.0, 1.0, 1.0, 1.2], "gpu-graph")
    steady = res.Stat.of([1.0, 1.01, 0.99, 1.0, 1.0], "gpu-graph")
    res.build_record(
        "measured", "demo", "x", {"ok": steady, "ratio": noisy / steady}, Path(__file__)
    )
    with pytest.raises(res.ResultError, match=r"rows\[0\]\.ms = 1 ±20\.0% \(n=5\)"):
        res.build_record("measured", "demo", "x", {"rows": [{"ms": noisy}]}, Path(__file__))


def test_rejected_values_are_kept_outside_results(monkeypatch, tmp_path):
    """A run that fails the spread check loses nothing: the values go to .rejected/, which no
    gate or page reads, and the error names the file."""
    monkeypatch.setenv(res.RESULTS_DIR_ENV, str(tmp_path / "results"))
    monkeypatch.setattr(res, "_caller_file", lambda: tmp_path / "snippets" / "demo" / "bench.py")
    noisy = res.Stat.of([1.0, 1.0, 1.0, 1.0, 1.2], "gpu-graph")
    with pytest.raises(res.ResultError, match=r"ms = 1 ±20\.0%.*\.rejected/demo/x\.json"):
        res.write_result("demo", "x", {"rows": [{"ms": noisy}]}, root=tmp_path)
    kept = json.loads((tmp_path / ".rejected" / "demo" / "x.json").read_text())
    assert kept["rows"][0]["ms"]["hi"] == 1.2
    assert not (tmp_path / "results").exists()


def test_measurements_are_written_by_the_runner_only(monkeypatch):
    monkeypatch.delenv(res.RESULTS_DIR_ENV, raising=False)
    with pytest.raises(res.ResultError, match="`nox -s gpu_docs -- demo`"):
        res.write_result("demo", "x", {"a": 1})


def test_results_are_recorded_by_snippet_modules_only(monkeypatch, tmp_path):
    """A call from a test or a page fence has no measuring module whose imports are sources."""
    monkeypatch.setenv(res.RESULTS_DIR_ENV, str(tmp_path))
    with pytest.raises(res.ResultError, match="recorded by a module under snippets/"):
        res.write_result("demo", "x", {"a": 1})


def test_stat_range_leaves_out_a_sixth_of_the_repeats_at_each_end():
    """n // 6 repeats at each end set no range: of 7 one (as before), of 15 two, so two
    disturbed repeats of a noisy Python clock cannot widen it; min and max are kept."""
    assert res.Stat.of([1.0, 1.0, 1.0, 1.0, 1.5], "python").hi == 1.5  # under 7: all repeats
    seven = res.Stat.of([0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.5], "python")
    assert (seven.lo, seven.hi, seven.extremes) == (1.0, 1.0, (0.5, 1.5))
    fifteen = res.Stat.of([0.5, 0.6] + [1.0] * 11 + [1.4, 1.5], "python")
    assert (fifteen.lo, fifteen.hi, fifteen.median, fifteen.n) == (1.0, 1.0, 1.0, 15)
    three_off = res.Stat.of([0.5, 0.6, 0.7] + [1.0] * 12, "python")
    assert three_off.lo == 0.7  # a third disturbed repeat shows


def test_python_fastest_is_the_stat_of_the_fastest_third():
    """Clock python-fastest: median and range of the fastest n // 3 repeats (n of them), min and
    max of all; fewer than 15 repeats is an error (the third must hold MIN_REPEATS)."""
    host = [2.0] * 20 + [1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08, 1.09]  # 30 repeats
    t = res.Stat.of(host, "python-fastest")
    assert (t.n, t.median, t.lo, t.hi) == (10, 1.045, 1.01, 1.08)
    assert t.extremes == (1.0, 2.0) and t.spread < 0.05
    assert res.Stat.of(host, "python").median == 2.0  # all repeats: the slow host's time
    with pytest.raises(ValueError, match="at least 15 repeats"):
        res.Stat.of([1.0] * 14, "python-fastest")


def test_python_fastest_can_keep_a_given_number_and_records_how_many_were_timed():
    """keep=7 of 110 repeats: the Stat of the 7 fastest, `drawn` 110 in the record; fewer than
    3 x keep repeats, too few kept, or keep on another clock is an error."""
    host = [2.0] * 100 + [1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.5, 1.6, 1.7]
    t = res.Stat.of(host, "python-fastest", keep=7)
    assert (t.n, t.median, t.lo, t.hi, t.drawn) == (7, 1.03, 1.01, 1.05, 110)
    assert t.to_json()["drawn"] == 110 and res.is_stat(t.to_json())
    assert res.Stat.of([1.0] * 30, "python-fastest").drawn == 30  # the third: drawn too
    with pytest.raises(ValueError, match="at least 21 repeats"):
        res.Stat.of([1.0] * 20, "python-fastest", keep=7)
    with pytest.raises(ValueError, match="at least 15 repeats"):
        res.Stat.of([1.0] * 40, "python-fastest", keep=4)
    with pytest.raises(ValueError, match="only a python-fastest timing"):
        res.Stat.of([1.0] * 30, "python", keep=7)


def test_stat_arithmetic_keeps_the_widest_range():
    a = res.Stat(2.0, 1.9, 2.1, 7, "gpu-graph")
    b = res.Stat(1.0, 0.95, 1.05, 5, "gpu-graph")
    r = a / b
    assert (r.median, r.n, r.derived) == (2.0, 5, True)
    assert r.lo == pytest.approx(1.9 / 1.05) and r.hi == pytest.approx(2.1 / 0.95)
    d = 1 - b / a
    assert d.lo == pytest.approx(1 - 1.05 / 1.9) and d.hi == pytest.approx(1 - 0.95 / 2.1)
    with pytest.raises(ZeroDivisionError):
        a / res.Stat(0.0, -1.0, 1.0, 5)
    with pytest.raises(ValueError, match="at least 5 repeats"):
        res.Stat.of([1, 2, 3], "python")


FRONT = """---
title: 演示
summary: 演示。
prerequisites: []
series: 1
awaiting_gpu: 计时方法改了，还没有在 GPU 上重新运行
---

"""
AWAITING = (
    "docs/posts/demo.md:6: awaiting a GPU run (`nox -s gpu_docs -- demo`): "
    "计时方法改了，还没有在 GPU 上重新运行"
)


def test_a_post_awaiting_a_gpu_run_passes_with_stale_or_missing_results(scratch):
    page = scratch / "docs/posts/demo.md"
    page.write_text(FRONT + PAGE, encoding="utf-8")
    edit(scratch / "snippets/demo/helper.py", "def size():", "def size():  # tweak")
    assert gate.errors(scratch) == []  # stale, but said so: nothing of it is shown
    assert gate.awaiting_lines(scratch, scratch / "results") == [AWAITING]
    lines, failed = gate.claim_report(scratch, scratch / "results")
    assert failed == 0 and len(lines) == 1 and ": pending: " in lines[0]
    # right after gpu_docs measured it, its claims are checked, awaiting_gpu or not
    lines, failed = gate.claim_report(scratch, scratch / "results", {"demo"}, measured=True)
    assert failed == 0 and len(lines) == 1 and ": holds: " in lines[0]
    (scratch / RESULT).unlink()
    assert gate.errors(scratch) == [] and gate.due(scratch) == ["demo"]


def test_a_post_awaiting_a_gpu_run_still_checks_what_needs_no_results(scratch):
    page = scratch / "docs/posts/demo.md"
    page.write_text(FRONT + PAGE.replace("< speed:rows[impl=b].ms", "<"), encoding="utf-8")
    (scratch / RESULT).unlink()
    error, *more = gate.errors(scratch)
    assert (
        not more
        and error.startswith("docs/posts/demo.md:19: claim ")
        and "not an expression" in error
    )


def test_awaiting_gpu_on_a_post_whose_results_are_fresh_fails(scratch):
    (scratch / "docs/posts/demo.md").write_text(FRONT + PAGE, encoding="utf-8")
    assert gate.errors(scratch) == [
        "docs/posts/demo.md:6: awaiting_gpu is set, but results/demo/ are complete and fresh: "
        "remove the key so the page shows them"
    ]


def test_awaiting_gpu_without_a_reason_is_a_front_matter_error(tmp_path):
    page = tmp_path / "docs" / "posts" / "demo.md"
    page.parent.mkdir(parents=True)
    page.write_text(FRONT.replace("计时方法改了，还没有在 GPU 上重新运行", '""') + "# 演示\n")
    with pytest.raises(
        markup.PageError, match=r"demo\.md:6: front matter: 'awaiting_gpu' must say"
    ):
        markup.post_meta(page)


def test_a_pages_hash_leaves_out_its_awaiting_gpu_line(tmp_path):
    from snippets.common.results import file_hash

    page = tmp_path / "p.md"
    body = "---\ntitle: t\n{}series: 3\n---\n\n# t\nawaiting_gpu: in the text counts\n"
    page.write_text(body.format(""))
    clean = file_hash(page)
    page.write_text(body.format("awaiting_gpu: why\n"))
    assert file_hash(page) == clean  # deleting the line after the run: not a change
    page.write_text(body.format("").replace("# t", "# u"))
    assert file_hash(page) != clean
    page.write_text(body.format("").replace("in the text", "in the body"))
    assert file_hash(page) != clean
    script = tmp_path / "s.py"  # only pages are read this way
    script.write_text("---\nawaiting_gpu: x\n---\n")
    assert file_hash(script) == "sha256:" + hashlib.sha256(script.read_bytes()).hexdigest()
