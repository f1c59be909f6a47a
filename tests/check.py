"""One fast check of one post: every fault on one line, file and line first.

    python -m tests.check SLUG [SLUG ...] [--full-trace]     (what `nox -s check -- SLUG` runs)

For each post: front matter and series; fences, includes, orphans, links and anchors; mermaid and
formulas parsed by the site's own pinned libraries; typed numbers in prose; lint and format of
its code; its results (valid, unedited, fresh, read) and every number, table, plot and claim on
its page; then the page's fences (one namespace, in page order) and its unit tests that are not
marked `slow`, and the page a second time under another hash seed: a value printed differently
the second time is nondeterministic. No site build.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from snippets.common import markup  # noqa: E402
from tests import gate, prose, structure  # noqa: E402


def places(slug: str) -> tuple[str, ...]:
    """The four places of a post, as path prefixes relative to the repository."""
    pkg = markup.package_of(slug)
    return (f"docs/posts/{slug}.md", f"snippets/{pkg}/", f"tests/snippets/test_{pkg}.py",
            f"results/{slug}/")  # fmt: skip


def static_faults(slug: str) -> list[str]:
    page = ROOT / "docs" / "posts" / f"{slug}.md"
    mine = places(slug)
    faults = []
    try:
        markup.post_meta(page)
        markup.series(ROOT)
    except markup.PageError as exc:
        faults += [str(exc)] if str(exc).startswith(mine) else []
    for check in (structure.fence_errors, structure.orphan_errors, structure.nav_errors,
                  structure.link_errors, structure.asset_errors):  # fmt: skip
        faults += [e for e in check(ROOT) if e.startswith(mine)]
    faults += structure.diagram_errors(ROOT, {page})
    faults += structure.data_errors(ROOT)  # data files are everyone's input
    try:
        faults += prose.errors(page, mine[0])
    except markup.PageError as exc:
        faults.append(str(exc))
    faults += gate.errors(ROOT, slugs={slug})
    files = [str(ROOT / p) for p in mine[1:3] if (ROOT / p).exists()]
    ruff = [sys.executable, "-m", "ruff", "check", "--output-format=concise", "--quiet", *files]
    lint = subprocess.run(ruff, cwd=ROOT, capture_output=True, text=True)
    faults += [ln for ln in lint.stdout.splitlines() if ln.strip()]
    return faults


def _junit_faults(report: Path) -> list[str]:
    if not report.is_file():
        return []
    faults = []
    for case in ET.parse(report).getroot().iter("testcase"):
        for bad in [*case.findall("failure"), *case.findall("error")]:
            text = (bad.get("message") or "") + "\n" + (bad.text or "")
            lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
            located = [ln for ln in lines if ":" in ln and ln.split(":")[1].strip().isdigit()]
            first = located[0] if located else f"{case.get('file')}:{case.get('line')}: " + (
                lines[0] if lines else "failed")  # fmt: skip
            first = first.removeprefix("Failed: ")
            faults.append(first.replace(str(ROOT) + os.sep, ""))
    return faults


def start_pytest(targets: list[str], seed: int, dump: Path, extra: list[str]):
    """pytest in the background, its printed values appended to `dump`."""
    env = {**os.environ, "PYTHONHASHSEED": str(seed), "HANDBOOK_PRINTS_DUMP": str(dump),
           "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *targets, "-q", "--tb=line", "-p", "no:cacheprovider",
         "-m", "not slow", f"--junitxml={dump.with_suffix('.xml')}", "-o", "junit_family=xunit1",
         *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish_pytest(proc, targets: list[str], dump: Path) -> list[str]:
    out, _ = proc.communicate()
    faults = _junit_faults(dump.with_suffix(".xml"))
    if proc.returncode not in (0, 1, 5) and not faults:
        tail = out.strip().splitlines()[-5:]
        faults = [f"{targets[0]}:1: pytest could not run: " + " | ".join(tail)]
    return faults


def printed(dump: Path) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    if dump.is_file():
        for line in dump.read_text(encoding="utf-8").splitlines():
            where, n, text = json.loads(line)
            out.setdefault((where, n), []).append(text)
    return out


def dynamic_faults(slug: str, extra: list[str], meanwhile=list) -> list[str]:
    """The page and its tests under pytest, twice (two hash seeds), in the background; the
    faults `meanwhile()` finds while they run come first."""
    page, _, test, _ = places(slug)
    targets = [page] + ([test] if (ROOT / test).is_file() else [])
    with tempfile.TemporaryDirectory(prefix="handbook-check-") as tmp:
        a, b = Path(tmp) / "a.jsonl", Path(tmp) / "b.jsonl"
        lowering = ["tests/test_zz_lowering.py"]  # last: every kernel launched, lowered for sm_90
        first = start_pytest(targets + lowering, 1, a, extra)  # the two runs share the two cores
        second = start_pytest([page], 2, b, extra)
        faults = meanwhile()
        faults += finish_pytest(first, targets, a)
        finish_pytest(second, [page], b)
        first, second = printed(a), printed(b)
        for key in sorted(set(first) & set(second)):
            if first[key] != second[key]:
                where, n = key
                faults.append(
                    f"{where}:{n}: printed {first[key][0]!r} in one run and {second[key][0]!r} in "
                    "another (PYTHONHASHSEED 1 vs 2): print only deterministic values"
                )
    return faults


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slugs", nargs="+")
    ap.add_argument("--full-trace", action="store_true", help="tracebacks instead of one line")
    args = ap.parse_args(argv)
    known = markup.post_slugs(ROOT)
    unknown = [s for s in args.slugs if s not in known]
    if unknown:
        print(f"check: no post docs/posts/<slug>.md for {', '.join(unknown)}", file=sys.stderr)
        return 2
    extra = ["--full-trace", "--tb=long"] if args.full_trace else []
    total = 0
    for slug in args.slugs:
        t0 = time.perf_counter()
        found = dynamic_faults(slug, extra, meanwhile=lambda slug=slug: static_faults(slug))
        faults = list(dict.fromkeys(found))
        total += len(faults)
        for f in faults:
            print(f)
        for note in gate.awaiting_lines(ROOT, ROOT / "results", {slug}):
            print(note)
        verdict = "ok" if not faults else f"{len(faults)} fault(s)"
        print(f"check {slug}: {verdict} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
