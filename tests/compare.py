"""Compare two sets of results value by value: how far two GPU runs of one commit agree.

    python -m tests.compare [--with-rejected] RUN_A [RUN_B]     (RUN_B defaults to results/)

A numeric value agrees when its two medians are within 5 % of each other; for timings the
report also says whether the two ranges overlap. Booleans must be equal. Text (a tool's output,
a label) has no median: it is not counted, and text that differs is listed apart. Prints one
line per post and the values that disagree, worst first.

Only measured records that both runs measured are compared: a record with the same provenance
in both (neither run re-measured it) is listed and left out, and records measured on two
different commits are flagged (the agreement the site asks for is of one commit).
--with-rejected: a record whose timings failed the spread rule is not written, its values go
to .rejected/<slug>/<name>.json beside the run's results/ folder; compare those values instead
(they are that run's measurement), and say so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from snippets.common.results import is_stat  # noqa: E402

TOLERANCE = 0.05


def leaves(values, prefix: str = ""):
    """(path, value) of every value, list items by index: rows[3].ms."""
    if is_stat(values) or not isinstance(values, dict | list):
        yield prefix, values
        return
    items = values.items() if isinstance(values, dict) else enumerate(values)
    for k, v in items:
        sub = f"{prefix}[{k}]" if isinstance(values, list) else (f"{prefix}.{k}" if prefix else k)
        yield from leaves(v, sub)


def _median(v):
    return v["median"] if is_stat(v) else v


def compare_values(a, b) -> tuple[bool, float | None, bool | None]:
    """(agrees, relative difference of the medians, ranges overlap (timings only))."""
    ma, mb = _median(a), _median(b)
    numeric = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (ma, mb))
    if not numeric:
        return a == b, None, None
    scale = max(abs(ma), abs(mb))
    diff = 0.0 if scale == 0 else abs(ma - mb) / scale
    overlap = None
    if is_stat(a) and is_stat(b):
        overlap = a["lo"] <= b["hi"] and b["lo"] <= a["hi"]
    return diff <= TOLERANCE, diff, overlap


def _values(record_file: Path, with_rejected: bool) -> tuple[dict, bool]:
    """The record, and whether its values were replaced by the run's rejected ones (then its
    provenance is the older record's: the rejected values carry none)."""
    record = json.loads(record_file.read_text(encoding="utf-8"))
    rejected = record_file.parent.parent.parent / ".rejected" / record_file.parent.name
    rejected = rejected / record_file.name
    if with_rejected and rejected.is_file():
        return {**record, "values": json.loads(rejected.read_text(encoding="utf-8"))}, True
    return record, False


def is_text(value) -> bool:
    return isinstance(_median(value), str)


def compare(run_a: Path, run_b: Path, with_rejected: bool = False) -> tuple[list[str], int, int]:
    lines, total, agreed, outliers, notes, texts = [], 0, 0, [], [], []
    slugs = sorted({p.parent.name for p in run_a.glob("*/*.json")} |
                   {p.parent.name for p in run_b.glob("*/*.json")})  # fmt: skip
    for slug in slugs:
        n = ok = timings = overlapping = 0
        for fa in sorted((run_a / slug).glob("*.json")):
            fb = run_b / slug / fa.name
            if not fb.is_file():
                outliers.append((1.0, f"{slug}/{fa.stem}: only in {run_a}"))
                continue
            (ra, rej_a), (rb, rej_b) = (_values(f, with_rejected) for f in (fa, fb))
            if ra.get("kind") == "computed":
                continue
            pa, pb = ra.get("provenance", {}), rb.get("provenance", {})
            if pa == pb and not (rej_a or rej_b):
                notes.append(f"{slug}/{fa.stem}: the same record in both runs (measured "
                             f"{pa.get('date', '?')[:10]}): not compared")  # fmt: skip
                continue
            if pa.get("commit") != pb.get("commit") and not (rej_a or rej_b):
                same = ra.get("sources") == rb.get("sources")  # the code that measured
                notes.append(
                    f"{slug}/{fa.stem}: measured on two commits, "
                    f"{str(pa.get('commit'))[:12]} and {str(pb.get('commit'))[:12]}, "
                    + ("with the same sources" if same else "with DIFFERENT sources")
                )
            for tag, rej in (("A", rej_a), ("B", rej_b)):
                if rej:
                    notes.append(f"{slug}/{fa.stem}: run {tag}'s values from .rejected/ "
                                 "(they failed the spread rule there)")  # fmt: skip
            vb = dict(leaves(rb["values"]))
            for path, va in leaves(ra["values"]):
                if is_text(va) or is_text(vb.get(path)):
                    if va != vb.get(path):
                        texts.append(f"{slug}/{fa.stem}:{path}: {va!r} vs {vb.get(path)!r}")
                    continue
                n += 1
                if path not in vb:
                    outliers.append((1.0, f"{slug}/{fa.stem}:{path}: only in {run_a}"))
                    continue
                agrees, diff, overlap = compare_values(va, vb[path])
                ok += agrees
                if overlap is not None:
                    timings += 1
                    overlapping += overlap
                if not agrees:
                    shown = f"{_median(va)!r} vs {_median(vb[path])!r}"
                    shown += f" ({diff:+.1%})" if diff is not None else ""
                    worst = diff if diff is not None else 1.0
                    outliers.append((worst, f"{slug}/{fa.stem}:{path}: {shown}"))
        if n:
            lines.append(f"{slug:<26} {ok:>4}/{n:<4} agree within {TOLERANCE:.0%} ({ok / n:6.1%});"
                         f" timings whose ranges overlap: {overlapping}/{timings}")  # fmt: skip
        total += n
        agreed += ok
    outliers.sort(reverse=True)
    lines.append(f"{'all':<26} {agreed:>4}/{total:<4} agree ({agreed / max(total, 1):6.1%})")
    if notes:
        lines.append("notes:")
        lines += [f"  {text}" for text in notes]
    if outliers:
        lines.append("disagreeing values, worst first:")
        lines += [f"  {text}" for _, text in outliers]
    if texts:
        lines.append(f"text that differs ({len(texts)}; not counted above):")
        lines += [f"  {text}" for text in texts]
    return lines, agreed, total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--with-rejected",
        action="store_true",
        help="compare a run's rejected values (.rejected/ beside results/) too",
    )
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path, nargs="?", default=ROOT / "results")
    args = ap.parse_args(argv)
    for run in (args.run_a, args.run_b):
        if not run.is_dir():
            ap.error(f"{run}: not a folder of results")
    lines, agreed, total = compare(args.run_a, args.run_b, args.with_rejected)
    print("\n".join(lines))
    return 0 if total and agreed / total >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
