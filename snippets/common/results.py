"""Result records: results/<slug>/<name>.json hold measurements and nothing else.

A record is `values` (numbers, strings, booleans, nested dicts, lists of rows, and timings with
their spread), `provenance` (where, with what and from which commit it was measured), `sources`
(the SHA-256 of every repository file the measuring module imports, directly or not, and of every
repository file that code opened while it ran: derived, never listed by hand) and a `checksum` of
all of that, written only by the runner. How a value is shown (titles, labels, units, formats,
columns, plots) lives on the page that shows it.

Two kinds:
  measured  written on the GPU by `nox -s gpu_docs` (write_result); a plain test run refuses to.
  computed  a deterministic figure computed on the CPU that prose quotes (computed_result): every
            run recomputes it and compares; `--update-examples` rewrites it.

A reader who runs a page's download (snippets/common/download.py sets READER) records nothing:
a computed figure is compared with the page's published record, a measurement is printed.

Imports no torch at module level: the docs build has none.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = 2
MAX_SPREAD = 0.05  # a timing whose spread (± of the median) is wider fails the run
MIN_REPEATS = 5
TRIM_FROM = 7  # from 7 repeats on, lo and hi drop the n // 6 fastest and slowest repeats
RESULTS_DIR_ENV = "HANDBOOK_RESULTS_DIR"  # set by gpu_docs: where measurements go
UPDATE_ENV = "HANDBOOK_UPDATE_RECORDS"  # set by `pytest --update-examples`: rewrite computed
COMMIT_ENV, DIRTY_ENV = "HANDBOOK_COMMIT", "HANDBOOK_DIRTY"
KINDS = ("measured", "computed")
CLOCKS = ("gpu-graph", "gpu-kernels", "python", "python-fastest")  # how a timing was taken
FASTEST_SHARE = 3  # python-fastest: the statistic of the fastest third of the repeats
REJECTED_DIR = ".rejected"  # write_result keeps values that failed a check here (git-ignored)
RECORDER = "snippets/common/results.py"  # stores numbers, measures nothing: not a source
FIELDS = ("schema", "kind", "slug", "name", "values", "provenance", "sources", "checksum")
READER: str | None = None  # a page's download is running (its slug): compare and print only
AGREES, DIFFERS = "agrees with the page's record", "DIFFERS from the page's record"
PROVENANCE = {
    "measured": ("gpu", "driver", "cuda", "torch", "triton", "python", "date", "commit", "dirty",
                 "measured_by", "wall_s"),
    "computed": ("python", "date", "commit", "dirty", "measured_by"),
}  # fmt: skip


class ResultError(ValueError):
    """A result file is missing, malformed, hand-edited or stale; the message names the file."""


# --------------------------------------------------------------------------- timings


@dataclass(frozen=True)
class Stat:
    """A repeated measurement: median and range (lo..hi) of `n` repeats, and how it was timed.

    From 7 repeats on, lo and hi leave out the n // 6 fastest and the n // 6 slowest repeats
    (of 7: the second-smallest and second-largest, about the 17th and 83rd percentiles; of 13:
    the third from each end): a repeat disturbed by the OS or the GPU's power limit cannot set
    the range. Noisier clocks take more repeats, so more disturbed ones are left out at the same
    quantiles. The fastest and slowest repeats are kept too (`min`, `max`).

    Clock "python-fastest" (bench.step_ms(fastest=True)): median and range of the fastest
    1/FASTEST_SHARE of the repeats, `n` of them (or the fastest `keep`; `drawn` records how
    many repeats were timed); min and max still span them all. It is the time of
    CPU-bound code on the host at its own speed, a lower bound of what a loop sees.

    Arithmetic between Stats (and numbers) is interval arithmetic on (lo, hi), with the median
    computed from the medians: a speed-up eager / graph keeps the widest range the two allow.
    Results of arithmetic are `derived`; only raw timings must meet MAX_SPREAD.
    """

    median: float
    lo: float
    hi: float
    n: int
    clock: str | None = None
    derived: bool = field(default=False, compare=False)
    extremes: tuple[float, float] | None = field(default=None, compare=False)  # all repeats
    drawn: int | None = field(default=None, compare=False)  # python-fastest: repeats timed

    @classmethod
    def of(cls, samples, clock: str, keep: int | None = None) -> Stat:
        """The Stat of timed repeats; python-fastest keeps the fastest `keep` (by default
        1/FASTEST_SHARE of them), at least MIN_REPEATS, drawn from FASTEST_SHARE times as many
        or more."""
        xs = sorted(float(x) for x in samples)
        if len(xs) < MIN_REPEATS:
            raise ValueError(f"a timing needs at least {MIN_REPEATS} repeats, got {len(xs)}")
        if clock not in CLOCKS:
            raise ValueError(f"clock {clock!r} is not one of {', '.join(CLOCKS)}")
        extremes, drawn = (xs[0], xs[-1]), None
        if clock == "python-fastest":
            drawn, keep = len(xs), keep or len(xs) // FASTEST_SHARE
            if keep < MIN_REPEATS or drawn < FASTEST_SHARE * keep:
                raise ValueError(f"a python-fastest timing needs at least "
                                 f"{FASTEST_SHARE * max(keep, MIN_REPEATS)} repeats")  # fmt: skip
            xs = xs[:keep]
        elif keep is not None:
            raise ValueError("keep: only a python-fastest timing keeps the fastest repeats")
        mid = len(xs) // 2
        median = xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
        trim = len(xs) // 6 if len(xs) >= TRIM_FROM else 0  # disturbed repeats set no range
        return cls(median, xs[trim], xs[-1 - trim], len(xs), clock, extremes=extremes, drawn=drawn)

    @property
    def spread(self) -> float:
        """Half-width of the range relative to the median (the "±" shown in tables)."""
        if self.median == 0:
            return 0.0 if self.lo == self.hi == 0 else math.inf
        return max(self.hi - self.median, self.median - self.lo) / abs(self.median)

    def _combine(self, other, op) -> Stat:
        o = other if isinstance(other, Stat) else Stat(other, other, other, self.n, self.clock)
        corners = [op(a, b) for a in (self.lo, self.hi) for b in (o.lo, o.hi)]
        clock = self.clock if self.clock == o.clock else None
        return Stat(op(self.median, o.median), min(corners), max(corners), min(self.n, o.n),
                    clock, derived=True)  # fmt: skip

    def __add__(self, o):
        return self._combine(o, lambda a, b: a + b)

    def __sub__(self, o):
        return self._combine(o, lambda a, b: a - b)

    def __mul__(self, o):
        return self._combine(o, lambda a, b: a * b)

    def __truediv__(self, o):
        lo, hi = (o.lo, o.hi) if isinstance(o, Stat) else (o, o)
        if lo <= 0 <= hi:
            raise ZeroDivisionError(f"division by a range that contains zero: [{lo}, {hi}]")
        return self._combine(o, lambda a, b: a / b)

    def __radd__(self, o):
        return self + o

    def __rsub__(self, o):
        return Stat(o, o, o, self.n, self.clock) - self

    def __rmul__(self, o):
        return self * o

    def __rtruediv__(self, o):
        return Stat(o, o, o, self.n, self.clock) / self

    def __neg__(self):
        return Stat(-self.median, -self.hi, -self.lo, self.n, self.clock, derived=True)

    def __format__(self, spec: str) -> str:
        return format(self.median, spec)

    def to_json(self) -> dict:
        out = {"median": self.median, "lo": self.lo, "hi": self.hi, "n": self.n}
        out |= {"clock": self.clock} if self.clock else {}
        out |= {"drawn": self.drawn} if self.drawn else {}
        return out | ({"min": self.extremes[0], "max": self.extremes[1]} if self.extremes else {})


STAT_KEYS = {"median", "lo", "hi", "n"}


def is_stat(value) -> bool:
    optional = {"clock", "min", "max", "drawn"}
    return isinstance(value, dict) and STAT_KEYS <= set(value) <= STAT_KEYS | optional


# --------------------------------------------------------------------------- sources


def module_file(name: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, root: Path) -> set[Path]:
    """Repository modules a file imports (anywhere in it), and the packages around them."""
    rel = path.relative_to(root).with_suffix("").parts
    package = rel[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module.split(".") if node.module else []
            if node.level:
                base = list(package[: len(package) - node.level + 1]) + base
            mod = ".".join(base)
            names.append(mod)
            names += [f"{mod}.{a.name}" for a in node.names if a.name != "*"]
    found = set()
    for name in names:
        parts = name.split(".")
        if parts[0] != "snippets":
            continue
        for i in range(1, len(parts) + 1):
            f = module_file(".".join(parts[:i]), root)
            if f is not None:
                found.add(f)
    return found


def import_closure(path: Path, root: Path = ROOT) -> set[Path]:
    """`path` and every repository module it imports, directly or through others."""
    seen, todo = set(), [path.resolve()]
    while todo:
        f = todo.pop()
        if f in seen:
            continue
        seen.add(f)
        todo += _imports(f, root.resolve()) - seen
    return {f for f in seen if f.relative_to(root.resolve()).as_posix() != RECORDER}


_OPENED: dict[Path, set[Path]] = {}  # opened file -> the snippet modules that opened it
_STARTED: dict[Path, float] = {}  # snippet module file -> when its code last began to run
# not sources: records, caches, builds, and the wheels carried to the GPU machine (.whl: the
# corpus wheel's content is pinned by its sha256 in data/trained_models.yaml, itself a source)
_SKIP_DIRS = {"results", "__pycache__", ".git", ".nox", "node_modules", "site", ".whl"}


def _audit(event: str, args: tuple) -> None:
    if event == "exec":  # a module's body runs through exec(), whichever way it was imported
        f, name = getattr(args[0], "co_filename", ""), getattr(args[0], "co_name", "")
        if name == "<module>" and f.endswith(".py") and f"{os.sep}snippets{os.sep}" in f:
            _STARTED[Path(os.path.realpath(f))] = time.perf_counter()
        return
    if event != "open" or not isinstance(args[0], str | Path):
        return
    path = str(args[0])
    if path.endswith((".py", ".pyc")) or not os.path.isabs(path):
        return
    frame = sys._getframe(1)
    while frame is not None:  # the innermost snippet module on the stack opened it
        f = frame.f_code.co_filename
        if f.endswith(".py") and f"{os.sep}snippets{os.sep}" in f:
            _OPENED.setdefault(Path(os.path.realpath(path)), set()).add(Path(os.path.realpath(f)))
            return
        frame = frame.f_back


def track_opens() -> None:
    """Record which snippet module opens which repository file (idempotent)."""
    if not getattr(sys, "_handbook_audit", False):
        sys.addaudithook(_audit)
        sys._handbook_audit = True


def derive_sources(measured_by: Path, root: Path = ROOT) -> dict[str, str]:
    """SHA-256 of the measuring module's import closure and of the files that closure opened."""
    root = root.resolve()
    closure = import_closure(measured_by, root)
    data = {
        p for p, openers in _OPENED.items()
        if openers & closure and p.is_relative_to(root) and p.is_file()
        and p.relative_to(root).parts[0] not in _SKIP_DIRS
    }  # fmt: skip
    return hash_files(sorted({*closure, *data}), root)


def file_hash(path: Path) -> str:
    """sha256 of the file; a page's `awaiting_gpu:` front-matter line left out, so that a page
    read by its own measuring code does not go stale when the line is deleted after the run."""
    data = path.read_bytes()
    if path.suffix == ".md" and data.startswith(b"---\n"):
        head, sep, body = data[4:].partition(b"\n---\n")
        if sep:
            kept = [ln for ln in head.split(b"\n") if not ln.startswith(b"awaiting_gpu:")]
            data = b"---\n" + b"\n".join(kept) + sep + body
    return "sha256:" + hashlib.sha256(data).hexdigest()


def hash_files(paths, root: Path = ROOT) -> dict[str, str]:
    root = root.resolve()
    return {Path(p).resolve().relative_to(root).as_posix(): file_hash(Path(p)) for p in paths}


def _caller_file() -> Path:
    """The snippet module that called into this file: the measuring code, whose imports are
    the result's sources. A call from a page fence or a test has no such module: an error."""
    frame = sys._getframe(1)
    here = Path(__file__).resolve()
    while frame is not None and Path(frame.f_code.co_filename).resolve() == here:
        frame = frame.f_back
    caller = Path(frame.f_code.co_filename) if frame is not None else Path("?")
    if caller.suffix != ".py" or f"{os.sep}snippets{os.sep}" not in str(caller.resolve()):
        raise ResultError(
            f"{caller}: results are recorded by a module under snippets/ (its imports become the "
            "record's sources); move this call into the post's snippet file"
        )
    return caller.resolve()


# --------------------------------------------------------------------------- provenance


def _git(*args: str, root: Path = ROOT) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=root)
    except FileNotFoundError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit_and_dirty(root: Path = ROOT) -> tuple[str, bool]:
    """The commit measured on and whether the tree differed from it (results/ aside).

    From HANDBOOK_COMMIT / HANDBOOK_DIRTY where set (a GPU copy of the tree has no .git: the
    machine that holds the repository passes them), else from git.
    """
    commit = os.environ.get(COMMIT_ENV) or _git("rev-parse", "HEAD", root=root)
    if not commit or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise ResultError(
            f"cannot tell the commit measured on (got {commit!r}): run in a git checkout, or set "
            f"{COMMIT_ENV}=<40-hex sha> and {DIRTY_ENV}=0|1 from the machine that holds it"
        )
    dirty = os.environ.get(DIRTY_ENV)
    if dirty is None:
        status = _git("status", "--porcelain", "--", ".", ":(exclude)results", root=root)
        return commit, bool(status)
    if dirty not in ("0", "1"):
        raise ResultError(f"{DIRTY_ENV} must be 0 or 1, got {dirty!r}")
    return commit, dirty == "1"


def wall_s(measured_by: Path) -> float | None:
    """Seconds since the measuring module's body began to run (None: it never ran here)."""
    started = _STARTED.get(Path(os.path.realpath(measured_by)))
    return round(time.perf_counter() - started, 1) if started is not None else None


def provenance(kind: str, measured_by: Path, root: Path = ROOT) -> dict:
    commit, dirty = commit_and_dirty(root)
    prov = {
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": commit,
        "dirty": dirty,
        "measured_by": measured_by.resolve().relative_to(root.resolve()).as_posix(),
    }
    if kind == "computed":
        return prov
    import torch
    import triton

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "unknown",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        **prov,
        "wall_s": wall_s(measured_by),
    }


# --------------------------------------------------------------------------- writing


def _plain(value, path: str, raw: list):
    """JSON-ready copy of `values`; collects raw timings for the spread check."""
    if isinstance(value, Stat):
        if not value.derived:
            raw.append((path, value))
        if not all(math.isfinite(x) for x in (value.median, value.lo, value.hi)):
            raise ResultError(f"{path}: a timing is not finite: {value}")
        return value.to_json()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ResultError(f"{path}: value {value} is not finite")
        return value
    if hasattr(value, "item") and callable(value.item):  # a 0-d tensor or numpy scalar
        return _plain(value.item(), path, raw)
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str) or not re.fullmatch(r"[\w-]+", k)]
        if bad:
            raise ResultError(f"{path}: keys must be words ([A-Za-z0-9_-]), got {bad!r}")
        return {k: _plain(v, f"{path}.{k}" if path else k, raw) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]", raw) for i, v in enumerate(value)]
    raise ResultError(f"{path}: cannot record a {type(value).__name__}")


def checksum(record: dict) -> str:
    body = {k: record[k] for k in FIELDS if k != "checksum"}
    text = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def results_dir(root: Path = ROOT) -> Path:
    return Path(os.environ.get(RESULTS_DIR_ENV) or root / "results")


def result_path(slug: str, name: str, root: Path = ROOT) -> Path:
    return root / "results" / slug / f"{name}.json"


def refresh_command(record_or_slug) -> str:
    if isinstance(record_or_slug, dict) and record_or_slug.get("kind") == "computed":
        return f"nox -s tests -- --update-examples docs/posts/{record_or_slug['slug']}.md"
    slug = record_or_slug["slug"] if isinstance(record_or_slug, dict) else record_or_slug
    return f"nox -s gpu_docs -- {slug}"


def build_record(kind, slug, name, values, measured_by: Path, root: Path = ROOT) -> dict:
    raw: list[tuple[str, Stat]] = []
    plain = _plain(values, "", raw)
    if not isinstance(plain, dict) or not plain:
        raise ResultError(f"{slug}/{name}: values must be a non-empty dict")
    wide = [(p, s) for p, s in raw if s.spread > MAX_SPREAD]
    if wide:
        listed = "; ".join(f"{p} = {s.median:.4g} ±{s.spread:.1%} (n={s.n})" for p, s in wide)
        raise ResultError(
            f"results/{slug}/{name}.json: timing spread wider than ±{MAX_SPREAD:.0%} of the "
            f"median: {listed}; make the benchmark steadier (more calls per repeat, a quieter "
            "clock), never the bound wider"
        )
    record = {
        "schema": SCHEMA, "kind": kind, "slug": slug, "name": name, "values": plain,
        "provenance": provenance(kind, measured_by, root),
        "sources": derive_sources(measured_by, root),
    }  # fmt: skip
    record["checksum"] = checksum(record)
    return record


def _dump(record: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    return path


def write_result(slug: str, name: str, values: dict, *, root: Path = ROOT) -> Path:
    """Record a measurement (GPU). Only the runner writes: it sets HANDBOOK_RESULTS_DIR."""
    if READER is not None:
        return _print_measured(slug, name, values, root)
    if not os.environ.get(RESULTS_DIR_ENV):
        raise ResultError(
            f"{slug}/{name}: measurements are written by the runner: `nox -s gpu_docs -- {slug}`"
            f" (or `-- --verify {slug}` to measure without touching results/)"
        )
    measured_by = _caller_file()
    try:
        record = build_record("measured", slug, name, values, measured_by, root)
    except ResultError as e:  # keep what was measured for a look, outside results/
        kept = root / REJECTED_DIR / slug / f"{name}.json"
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_text(json.dumps(_plain(values, "", []), ensure_ascii=False, indent=1))
        except (ResultError, OSError):
            raise e from None
        raise ResultError(f"{e} (the rejected values: {kept.relative_to(root)})") from None
    return _dump(record, results_dir(root) / slug / f"{name}.json")


def computed_result(slug: str, name: str, values: dict, *, root: Path = ROOT) -> Path:
    """Record a deterministic CPU figure that prose quotes. A run recomputes it and fails if the
    committed file differs; `pytest --update-examples` (HANDBOOK_UPDATE_RECORDS=1) rewrites it."""
    if READER is not None:
        return _compare_published(slug, name, values, root)
    measured_by = _caller_file()
    path = result_path(slug, name, root)
    if os.environ.get(UPDATE_ENV) == "1":
        fresh = build_record("computed", slug, name, values, measured_by, root)
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        same = old and old.get("values") == fresh["values"] and old.get("sources") == fresh[
            "sources"]  # fmt: skip
        return path if same else _dump(fresh, path)
    old = load_result(path)  # raises with the file's name when missing or malformed
    if not same_values(old["values"], _plain(values, "", [])):
        command = refresh_command({"kind": "computed", "slug": slug})
        raise ResultError(
            f"{path.relative_to(root)}: the committed values differ from what the code computes "
            f"now; rewrite it with `{command}`"
        )
    return path


def _compare_published(slug: str, name: str, values: dict, root: Path) -> Path:
    """A reader's run: say whether the figure equals the published record; write nothing."""
    path = result_path(slug, name, root)
    if not path.is_file():
        print(f"{slug}/{name}: no published record to compare with")
        return path
    same = same_values(load_result(path)["values"], _plain(values, "", []))
    why = "" if same else " (expected where code, data or libraries differ from the page's)"
    print(f"{slug}/{name}: {AGREES if same else DIFFERS}{why}")
    return path


def _print_measured(slug: str, name: str, values: dict, root: Path) -> Path:
    """A reader's run: print what was measured; records are written by `nox -s gpu_docs`."""
    plain = json.dumps(_plain(values, "", []), ensure_ascii=False, separators=(",", ":"))
    print(f"{slug}/{name}: measured (not recorded: the repository's runner writes records) {plain}")
    return result_path(slug, name, root)


def same_values(a, b, rel: float = 1e-9) -> bool:
    """Equal, with floats equal to a relative 1e-9 (libm rounding differs between machines)."""
    if isinstance(a, float) or isinstance(b, float):
        if not isinstance(a, int | float) or not isinstance(b, int | float):
            return False
        return math.isclose(a, b, rel_tol=rel, abs_tol=1e-300)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_values(x, y, rel) for x, y in zip(a, b, strict=True))
    return a == b and type(a) is type(b)


# --------------------------------------------------------------------------- reading


def _line_of(text: str, needle: str) -> int:
    at = text.find(needle)
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def _check_values(value, path: str, errors: list):
    if is_stat(value):
        m, lo, hi, n = (value[k] for k in ("median", "lo", "hi", "n"))
        if not all(isinstance(x, int | float) and not isinstance(x, bool) for x in (m, lo, hi)):
            errors.append((path, "a timing's median, lo and hi must be numbers"))
        elif not lo <= m <= hi:
            errors.append((path, f"a timing needs lo <= median <= hi, got {lo}, {m}, {hi}"))
        if not isinstance(n, int) or n < MIN_REPEATS:
            errors.append((path, f"a timing needs n >= {MIN_REPEATS} repeats, got {n!r}"))
        if value.get("clock", CLOCKS[0]) not in CLOCKS:
            errors.append((path, f"clock must be one of {', '.join(CLOCKS)}"))
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_values(v, f"{path}.{k}" if path else k, errors)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_values(v, f"{path}[{i}]", errors)
    elif not (value is None or isinstance(value, bool | int | float | str)):
        errors.append((path, f"unexpected {type(value).__name__}"))


def load_result(path: Path) -> dict:
    """Read and validate a record: JSON, schema, checksum. Errors name the file (and line)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ResultError(f"{path}: no such result") from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    if not isinstance(record, dict):
        raise ResultError(f"{path}:1: a result is a JSON object")
    if record.get("schema") != SCHEMA:
        line = _line_of(text, chr(34) + "schema")
        raise ResultError(
            f"{path}:{line}: schema {record.get('schema')!r}, expected {SCHEMA}; "
            f"re-measure with `{refresh_command(path.parent.name)}`"
        )
    missing = [k for k in FIELDS if k not in record]
    extra = [k for k in record if k not in FIELDS]
    if missing or extra:
        raise ResultError(
            f"{path}: fields must be exactly {', '.join(FIELDS)}"
            + (f"; missing {', '.join(missing)}" if missing else "")
            + (f"; unexpected {', '.join(extra)} (presentation lives on the page)" if extra else "")
        )
    if record["kind"] not in KINDS:
        raise ResultError(f"{path}:{_line_of(text, chr(34) + 'kind')}: kind must be one of {KINDS}")
    if (record["slug"], record["name"]) != (path.parent.name, path.stem):
        raise ResultError(f"{path}: slug/name {record['slug']}/{record['name']} differ from path")
    want = PROVENANCE[record["kind"]]
    prov = record["provenance"]
    absent = [k for k in want if not isinstance(prov, dict) or k not in prov]
    if absent:
        raise ResultError(
            f"{path}:{_line_of(text, chr(34) + 'provenance')}: provenance lacks {', '.join(absent)}"
        )
    errors: list = []
    _check_values(record["values"], "", errors)
    if errors:
        where, problem = errors[0]
        key = where.split(".")[-1].split("[")[0]
        raise ResultError(f"{path}:{_line_of(text, chr(34) + key)}: values.{where}: {problem}")
    if record["checksum"] != checksum(record):
        raise ResultError(
            f"{path}: checksum mismatch: the file was edited after the runner wrote it; "
            f"re-measure with `{refresh_command(record)}` instead of editing results"
        )
    return record


def stale_sources(record: dict, root: Path = ROOT) -> list[str]:
    """Sources changed or vanished since measuring, and modules the measuring code imports now
    but did not then."""
    changed = []
    for file, digest in record["sources"].items():
        path = root / file
        if not path.is_file() or file_hash(path) != digest:
            changed.append(file)
    measured_by = root / record["provenance"]["measured_by"]
    if measured_by.is_file():
        try:
            now = import_closure(measured_by, root)
        except SyntaxError:
            return changed or [record["provenance"]["measured_by"]]
        rel = {p.relative_to(root.resolve()).as_posix() for p in now}
        changed += sorted(f"{f} (newly imported)" for f in rel - set(record["sources"]))
    return changed


def commit_known(commit: str, root: Path = ROOT) -> bool | None:
    """Whether `commit` is in HEAD's history; None where there is no git history to ask."""
    if _git("rev-parse", "--git-dir", root=root) is None:
        return None
    if _git("rev-parse", "--is-shallow-repository", root=root) == "true":
        return None
    return _git("merge-base", "--is-ancestor", commit, "HEAD", root=root) is not None


def leaf_paths(values, prefix: str = "") -> set[str]:
    """Every value's path, lists written as `[]`: `rows[].ms`, `copy_tb_s`, `slowdown.full`."""
    if is_stat(values) or not isinstance(values, dict | list):
        return {prefix}
    if isinstance(values, list):
        out = set()
        for v in values:
            out |= leaf_paths(v, f"{prefix}[]")
        return out or {f"{prefix}[]"}
    out = set()
    for k, v in values.items():
        out |= leaf_paths(v, f"{prefix}.{k}" if prefix else k)
    return out
