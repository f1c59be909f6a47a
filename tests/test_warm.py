"""snippets/common/warm.py: worker processes that compile ahead. Each unit is claimed by one
worker only; a unit that raises, a unit never run and a worker that died are each reported, and
the wait leaves a line in the harness's trace. This module is also the runner of its units:
run_unit below, which the workers import as `tests.test_warm`."""

import pytest

from snippets.common import warm

RUNNER = __name__


def run_unit(unit, context):
    """A unit here: "boom" raises; any other is appended to the context (in this process)."""
    if unit == "boom":
        raise RuntimeError("no such kernel")
    if context is not None:
        context.append(unit)


def test_once_calls_each_callable_once_and_times_nothing():
    calls = []
    assert warm.once([lambda: calls.append(1), lambda: calls.append(2)], ["a", "b"]) == [1.0, 1.0]
    assert calls == [1, 2]


def test_each_unit_runs_once_and_failures_are_reported(tmp_path):
    ran = []
    units = ["a", "boom", "c", "d"]
    (tmp_path / "claimed-2").touch()  # another worker has it
    warm.work(RUNNER, ran, units, tmp_path)
    assert ran == ["a", "d"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "claimed-0", "claimed-1", "claimed-2", "claimed-3", "failed-1",
        "took-0", "took-1", "took-3"]  # fmt: skip
    (tmp_path / "claimed-2").unlink()  # ... and died before it could claim it
    with pytest.warns(UserWarning) as caught:
        done = warm.finish(warm.Workers([], tmp_path, units, RUNNER, 0.0))
    assert done["units"] == 4 and done["failed"] == 2
    messages = [str(c.message) for c in caught]
    assert "RuntimeError: no such kernel" in messages[0] and "never run" in messages[1]
    assert all(m.startswith(RUNNER) and m.endswith("(compiled here instead)") for m in messages)
    assert not tmp_path.exists()


def test_the_wait_is_traced(monkeypatch, tmp_path):
    trace = tmp_path / "trace.tsv"
    monkeypatch.setenv("HANDBOOK_BENCH_TRACE", str(trace))
    claims = tmp_path / "claims"
    claims.mkdir()
    warm.work(RUNNER, None, ["a"], claims)
    assert warm.finish(warm.Workers([], claims, ["a"], RUNNER, 0.0))["failed"] == 0
    wait, unit = (line.split("\t") for line in trace.read_text(encoding="utf-8").splitlines())
    assert float(wait[0]) >= 0 and wait[1:] == ["(waiting for 0 compile workers)", RUNNER]
    assert float(unit[0]) >= 0 and unit[1:] == ["(its slowest unit: a)", RUNNER]


@pytest.mark.slow  # Python processes that import torch: seconds
def test_workers_run_every_unit_and_a_dead_worker_is_reported():
    done = warm.finish(warm.start(RUNNER, ["a", "b", "c"], workers=2))
    assert done == {"units": 3, "failed": 0, "waited_s": done["waited_s"]}
    with pytest.warns(UserWarning) as caught:
        done = warm.finish(warm.start("tests.no_such_runner", ["a"], workers=1))
    assert done["failed"] == 1
    assert ["exited with code" in str(c.message) for c in caught] == [True, False]
    assert "never run" in str(caught[1].message)
