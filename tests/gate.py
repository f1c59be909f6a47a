"""The results gate: every record valid, unedited, fresh, from a known commit, and read; every
page's numbers, tables, plots and claims resolve and hold. Each problem is one line that starts
with the file (and line).

    python -m tests.gate [--results DIR] [--claims] [SLUG ...]

checks the committed results (or DIR, e.g. a --verify scratch folder) and, with --claims,
prints each claim and whether it holds. Used by tests/test_results.py, `nox -s check` and
`nox -s gpu_docs` (right after measuring).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from snippets.common import claims as cl  # noqa: E402
from snippets.common import markup  # noqa: E402
from snippets.common import results as res  # noqa: E402


def result_files(base: Path, slugs=None) -> list[Path]:
    files = sorted(base.glob("*/*.json"))
    return [f for f in files if slugs is None or f.parent.name in slugs]


def pages(root: Path, slugs=None) -> list[Path]:
    found = sorted((root / "docs").rglob("*.md"))
    return [p for p in found if slugs is None or p.stem in slugs]


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return str(path)


def record_errors(root: Path, base: Path, slugs=None, *, fresh: bool = True,
                  pending=frozenset()) -> list[str]:  # fmt: skip
    """Schema, checksum, commit and (with `fresh`) stale sources of every record; of a post
    awaiting a GPU run only schema and checksum (that it is out of date is why it waits)."""
    errors = []
    for path in result_files(base, slugs):
        shown = _rel(path, root)
        try:
            record = res.load_result(path)
        except res.ResultError as exc:
            errors.append(str(exc).replace(str(path), shown, 1))
            continue
        if path.parent.name in pending and cl.record_due(path, root):
            continue
        commit = record["provenance"]["commit"]
        if res.commit_known(commit, root) is False:
            errors.append(
                f"{shown}: measured on commit {commit[:12]}, which is not in this branch's "
                f"history; re-measure with `{res.refresh_command(record)}`"
            )
        changed = res.stale_sources(record, root) if fresh else []
        if changed:
            errors.append(
                f"{shown}: stale: {', '.join(changed)} changed since it was measured on "
                f"{record['provenance']['date'][:10]}; refresh with "
                f"`{res.refresh_command(record)}` and commit the new result"
            )
    return errors


def page_errors(root: Path, base: Path, slugs=None, pending=frozenset()) -> list[str]:
    results = cl.Results(base, pending=pending)
    return [
        e for page in pages(root, slugs) for e in cl.page_errors(page, results, _rel(page, root))
    ]


def unread_errors(root: Path, base: Path, slugs=None, pending=frozenset()) -> list[str]:
    """Results no page shows, and values no page or claim reads (a post awaiting a GPU run
    shows none of its values)."""
    read: dict[tuple[str, str], set[str]] = {}
    for page in pages(root):
        try:
            for key, paths in cl.reads(page).items():
                read.setdefault(key, set()).update(paths)
        except (cl.SpecError, markup.PageError):
            continue  # page_errors reports it
    errors = []
    for path in result_files(base, slugs):
        if path.parent.name in pending and cl.record_due(path, root):
            continue
        key = (path.parent.name, path.stem)
        shown = _rel(path, root)
        if key not in read:
            errors.append(
                f"{shown}: no page shows this result (reference it from docs/posts/{key[0]}.md "
                "with {{ " + key[1] + ":... }}, ```table or ```plot, or delete it)"
            )
            continue
        try:
            record = res.load_result(path)
        except res.ResultError:
            continue  # record_errors reports it
        text = path.read_text(encoding="utf-8")
        for leaf in sorted(res.leaf_paths(record["values"]) - read[key]):
            last = leaf.replace("[]", "").split(".")[-1]
            line = text.count("\n", 0, max(text.find(f'"{last}"'), 0)) + 1
            errors.append(
                f"{shown}:{line}: value {leaf!r} is read by no page, table, plot or claim: "
                "show it, or stop recording it"
            )
    return errors


def errors(root: Path = ROOT, base: Path | None = None, slugs=None) -> list[str]:
    base = base or root / "results"
    pending = cl.pending(root, base)
    return (
        record_errors(root, base, slugs, pending=pending)
        + page_errors(root, base, slugs, pending)
        + unread_errors(root, base, slugs, pending)
        + ready_errors(root, base, slugs)
    )


def ready_errors(root: Path, base: Path, slugs=None) -> list[str]:
    """Posts that say they await a GPU run while their results are complete and fresh."""
    found = cl.pending_errors(root, base)
    return [e for e in found if slugs is None or Path(e.split(":")[0]).stem in slugs]


def awaiting_lines(root: Path, base: Path, slugs=None) -> list[str]:
    """One notice per post that awaits a GPU run: its page shows no measurement yet."""
    pending = cl.pending(root, base)
    return [
        f"docs/posts/{s}.md:{m.awaiting_line}: awaiting a GPU run (`nox -s gpu_docs -- {s}`): "
        f"{m.awaiting_gpu}"
        for s, m in cl.awaiting(root).items()
        if s in pending and (slugs is None or s in slugs)
    ]


def claim_report(root: Path, base: Path, slugs=None, measured=False) -> tuple[list[str], int]:
    """One line per claim ("holds" / "FAILS" / "pending" for a post awaiting a GPU run), and
    the number that fail. measured: `slugs` were just measured into `base` (gpu_docs), so none
    of them is pending, whatever its front matter says or whether this copy knows the commit."""
    pending = cl.pending(root, base) - (set(slugs or ()) if measured else set())
    results = cl.Results(base, pending=pending)
    lines, failed = [], 0
    for page in pages(root, slugs):
        try:
            found = cl.claims(page, results)
        except (cl.SpecError, markup.PageError) as exc:
            lines.append(f"{exc}")
            failed += 1
            continue
        for line, expr, holds, shown in found:
            failed += holds is False
            status = {True: "holds", False: "FAILS", None: "pending"}[holds]
            lines.append(f"{_rel(page, root)}:{line}: {status}: {expr}  [{shown}]")
    return lines, failed


def due(root: Path = ROOT, base: Path | None = None) -> list[str]:
    """Posts whose results are missing, invalid or stale: what `nox -s gpu_docs` measures."""
    return sorted(cl.due(root, base or root / "results"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slugs", nargs="*")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--claims", action="store_true", help="print every claim and whether it holds")
    ap.add_argument("--no-fresh", action="store_true", help="skip the stale-source check")
    ap.add_argument("--due", action="store_true", help="print the posts whose results are due")
    ap.add_argument("--measured", action="store_true",
                    help="with --claims: the slugs were just measured")  # fmt: skip
    args = ap.parse_args(argv)
    if args.due:
        print(" ".join(due(ROOT, args.results.resolve())))
        return 0
    slugs = set(args.slugs) or None
    base = args.results.resolve()
    if args.claims:
        lines, failed = claim_report(ROOT, base, slugs, args.measured)
        print("\n".join(lines) or "no claims")
        waiting = sum(": pending: " in line for line in lines)
        print(f"{len(lines) - failed - waiting} of {len(lines)} claims hold"
              + (f", {waiting} await a GPU run" if waiting else ""))  # fmt: skip
        return 1 if failed else 0
    pending = cl.pending(ROOT, base)
    found = record_errors(ROOT, base, slugs, fresh=not args.no_fresh, pending=pending)
    found += page_errors(ROOT, base, slugs, pending)
    found += ready_errors(ROOT, base, slugs)
    print("\n".join(awaiting_lines(ROOT, base, slugs) + found) or "results gate: clean")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
