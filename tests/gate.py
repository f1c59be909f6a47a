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


def record_errors(root: Path, base: Path, slugs=None, *, fresh: bool = True) -> list[str]:
    """Schema, checksum, commit and (with `fresh`) stale sources of every record."""
    errors = []
    for path in result_files(base, slugs):
        shown = _rel(path, root)
        try:
            record = res.load_result(path)
        except res.ResultError as exc:
            errors.append(str(exc).replace(str(path), shown, 1))
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


def page_errors(root: Path, base: Path, slugs=None) -> list[str]:
    results = cl.Results(base)
    return [
        e for page in pages(root, slugs) for e in cl.page_errors(page, results, _rel(page, root))
    ]


def unread_errors(root: Path, base: Path, slugs=None) -> list[str]:
    """Results no page shows, and values no page or claim reads."""
    read: dict[tuple[str, str], set[str]] = {}
    for page in pages(root):
        try:
            for key, paths in cl.reads(page).items():
                read.setdefault(key, set()).update(paths)
        except (cl.SpecError, markup.PageError):
            continue  # page_errors reports it
    errors = []
    for path in result_files(base, slugs):
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
    return (
        record_errors(root, base, slugs)
        + page_errors(root, base, slugs)
        + unread_errors(root, base, slugs)
    )


def claim_report(root: Path, base: Path, slugs=None) -> tuple[list[str], int]:
    """One line per claim ("holds" / "FAILS"), and the number that fail."""
    results = cl.Results(base)
    lines, failed = [], 0
    for page in pages(root, slugs):
        try:
            found = cl.claims(page, results)
        except (cl.SpecError, markup.PageError) as exc:
            lines.append(f"{exc}")
            failed += 1
            continue
        for line, expr, holds, shown in found:
            failed += not holds
            status = "holds" if holds else "FAILS"
            lines.append(f"{_rel(page, root)}:{line}: {status}: {expr}  [{shown}]")
    return lines, failed


def due(root: Path = ROOT, base: Path | None = None) -> list[str]:
    """Posts whose results are missing, invalid or stale: what `nox -s gpu_docs` measures."""
    base = base or root / "results"
    out = set()
    for path in result_files(base):
        if record_errors(root, base, {path.parent.name}):
            out.add(path.parent.name)
    for page in pages(root):
        try:
            wanted = cl.reads(page)
        except (cl.SpecError, markup.PageError):
            continue
        for slug, name in wanted:
            if name != cl.DATA and not (base / slug / f"{name}.json").is_file():
                out.add(slug)
    return sorted(s for s in out if (root / "docs" / "posts" / f"{s}.md").is_file())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("slugs", nargs="*")
    ap.add_argument("--results", type=Path, default=ROOT / "results")
    ap.add_argument("--claims", action="store_true", help="print every claim and whether it holds")
    ap.add_argument("--no-fresh", action="store_true", help="skip the stale-source check")
    ap.add_argument("--due", action="store_true", help="print the posts whose results are due")
    args = ap.parse_args(argv)
    if args.due:
        print(" ".join(due(ROOT, args.results.resolve())))
        return 0
    slugs = set(args.slugs) or None
    base = args.results.resolve()
    if args.claims:
        lines, failed = claim_report(ROOT, base, slugs)
        print("\n".join(lines) or "no claims")
        print(f"{len(lines) - failed} of {len(lines)} claims hold")
        return 1 if failed else 0
    found = record_errors(ROOT, base, slugs, fresh=not args.no_fresh)
    found += page_errors(ROOT, base, slugs)
    print("\n".join(found) or "results gate: clean")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
