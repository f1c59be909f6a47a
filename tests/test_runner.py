"""The GPU runner's choices, on the CPU: which posts are due, and how a full run is sharded."""

import os

import noxfile
from tests import gate
from tests.test_results import RESULT, edit, scratch  # noqa: F401  (the scratch-tree fixture)


def test_shards_cover_every_post_once_and_balance_the_load():
    weights = {"a": 50.0, "b": 40.0, "c": 30.0, "d": 20.0, "e": 10.0}
    parts = [noxfile.shard(list(weights), weights, i, 2) for i in (1, 2)]
    assert sorted(parts[0] + parts[1]) == sorted(weights)
    loads = [sum(weights[s] for s in p) for p in parts]
    assert abs(loads[0] - loads[1]) <= 10.0
    assert noxfile.shard(["x"], {"x": 1.0}, 1, 1) == ["x"]


def test_a_shard_keeps_the_shared_models_with_the_posts_that_load_them():
    """Each shard is a run of its own, with a fresh model cache: a post that loads the models
    in a shard without their post would train them itself, over its budget."""
    weights = {"m": 90.0, "u1": 60.0, "u2": 50.0, "a": 60.0, "b": 55.0, "c": 50.0, "d": 45.0}
    together = frozenset({"m", "u1", "u2"})
    parts = [noxfile.shard(list(weights), weights, i, 3, together) for i in (1, 2, 3)]
    assert sorted(s for p in parts for s in p) == sorted(weights)
    assert any(set(together) <= set(p) for p in parts)
    assert noxfile.shard(list(weights), weights, 1, 3) != parts[0]  # ungrouped: split apart
    slugs = noxfile.post_slugs()
    users = {s for s in slugs if noxfile.uses_models(s)}
    assert noxfile.MODELS_POST in users and {"moe-training", "rl-training"} <= users
    assert not users & {"metrics", "flash-attention", "tech-map"}


def test_the_shared_models_run_first_within_their_own_budget_line():
    """The other posts load the checkpoints the models' post trains (one cache per run)."""
    assert noxfile.run_order(["cuda-graph", "metrics", "trained-models"]) == [
        "trained-models", "cuda-graph", "metrics"]  # fmt: skip
    assert noxfile.run_order(["metrics", "cuda-graph"]) == ["metrics", "cuda-graph"]
    assert noxfile.budget_of("trained-models") == 90
    assert noxfile.budget_of("metrics") == noxfile.BUDGET_S == 60
    assert (noxfile.ROOT / "docs" / "posts" / f"{noxfile.MODELS_POST}.md").is_file()


def test_due_lists_posts_with_stale_or_missing_results(scratch):  # noqa: F811
    assert gate.due(scratch) == []
    edit(scratch / "snippets/demo/helper.py", "def size():", "def size():  # tweak")
    assert gate.due(scratch) == ["demo"]
    (scratch / RESULT).unlink()
    assert gate.due(scratch) == ["demo"]  # referenced by its page, missing


def test_downloads_find_the_corpus_wheel_in_their_tmpdir(tmp_path):
    """gpu_docs runs the downloads with TMPDIR = reader_tmp(...): the pinned wheel is where
    corpus.find_wheel looks after the repository's own folders (the reader's pip download)."""
    import subprocess
    import sys

    given = tmp_path / "given"
    given.mkdir()
    (given / "demo-1.0-py3-none-any.whl").write_bytes(b"wheel")
    tmp = noxfile.reader_tmp(tmp_path / "run", given)
    code = (
        "import tempfile; from snippets.common import corpus; "
        "print(corpus.cache_dir() / 'wheels' in corpus.wheel_dirs(), corpus.cache_dir())"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("HANDBOOK_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=noxfile.ROOT, capture_output=True,
                         text=True, env=env | {"TMPDIR": str(tmp)}, check=True)  # fmt: skip
    assert out.stdout.split() == ["True", str(tmp / "handbook-models")]
    assert (tmp / "handbook-models" / "wheels" / "demo-1.0-py3-none-any.whl").read_bytes() == (
        b"wheel"
    )


def test_summary_reports_the_hosts_python_speed():
    """gpu_docs prints a fixed Python loop's time at the run's start and end beside the
    budgets: an overrun on a slow host reads differently from one on a fast host."""
    logged = []

    class Session:
        def log(self, msg):
            logged.append(msg)

    ms = noxfile.host_loop_ms(repeats=3, n=20_000)
    assert 0 < ms < 1000
    noxfile._summary(Session(), [("metrics", 32.7, 7, "ok")], (6.4, 11.0))
    host = next(line for line in logged if "host:" in line)
    assert "took 6.4 ms at the start and 11.0 ms at the end" in host, host
    assert noxfile.HOST_LOOP_REFERENCE in host
    noxfile._summary(Session(), [])  # downloads-only: no host line
    assert sum("host:" in line for line in logged) == 1


def test_bytecode_is_written_for_the_pythonpath_entries(tmp_path):
    site = tmp_path / "site"
    (site / "pkg").mkdir(parents=True)
    (site / "pkg" / "mod.py").write_text("X = 1\n")
    entries = ["", str(tmp_path / "missing"), str(site)]  # empty and missing ones are skipped
    noxfile.write_bytecode({"PYTHONPATH": os.pathsep.join(entries)})
    assert list((site / "pkg" / "__pycache__").glob("mod.*.pyc"))
