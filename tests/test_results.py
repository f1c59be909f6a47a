"""Freshness gate: GPU results must match the code they were measured with, and be shown.

A result whose sources changed since it was measured fails with the command that refreshes
it; a page that references a missing result fails; a result that no page shows fails.
"""

import json
import re
import shutil
from pathlib import Path

import pytest

from snippets.common import results as res
from tests.hooks import fake_page, load_hook

ROOT = Path(__file__).resolve().parents[1]


def result_files(root: Path) -> list[Path]:
    return sorted((root / "results").rglob("*.json"))


def references(root: Path) -> dict[tuple[str, str], str]:
    """(slug, name) -> "page:line" of the first reference, for every page."""
    refs = {}
    for page in sorted((root / "docs" / "posts").glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for m in res.references(text):
            line = text.count("\n", 0, m.start()) + 1
            refs.setdefault((page.stem, m["name"]), f"{page.relative_to(root)}:{line}")
    return refs


def freshness_errors(root: Path) -> list[str]:
    errors = []
    for path in result_files(root):
        rel = path.relative_to(root)
        try:
            record = res.load_result(path)
        except res.ResultError as exc:
            errors.append(str(exc))
            continue
        changed = res.stale_sources(record, root)
        if changed:
            errors.append(
                f"{rel}: stale: {', '.join(changed)} changed since it was measured on "
                f"{record['provenance'].get('date')}; refresh on a GPU with "
                f"`{res.refresh_command(record['slug'])}` and commit the new result"
            )
    return errors


def reference_errors(root: Path) -> list[str]:
    refs = references(root)
    errors = [
        f"{where}: result {name!r} does not exist (results/{slug}/{name}.json); "
        f"produce it with `{res.refresh_command(slug)}`"
        for (slug, name), where in refs.items()
        if not res.result_path(slug, name, root).is_file()
    ]
    for path in result_files(root):
        slug, name = path.parent.name, path.stem
        if (slug, name) not in refs:
            errors.append(
                f"{path.relative_to(root)}: no page shows this result "
                f"(add <!-- result: table {name} --> to docs/posts/{slug}.md, or delete it)"
            )
    return errors


@pytest.mark.parametrize("check", [freshness_errors, reference_errors], ids=lambda c: c.__name__)
def test_results(check):
    errors = check(ROOT)
    assert not errors, "\n".join(errors)


# The mechanism, on a scratch tree: measure, edit one line, see it fail, re-measure, pass.

FAKE_PROVENANCE = {
    "gpu": "NVIDIA H200", "driver": "0", "cuda": "13.0", "torch": "2.11.0",
    "triton": "3.6.0", "date": "2026-01-01", "commit": "0" * 12,
}  # fmt: skip


@pytest.fixture
def scratch(tmp_path):
    for rel in res.HARNESS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    snippet = tmp_path / "snippets" / "demo" / "bench.py"
    snippet.parent.mkdir(parents=True)
    snippet.write_text("N = 1024\nprint(N)\n", encoding="utf-8")
    page = tmp_path / "docs" / "posts" / "demo.md"
    page.parent.mkdir(parents=True)
    page.write_text(
        "# Demo\n\n<!-- result: table speed -->\n\nIt took {{ speed:ms }} ms.\n", "utf-8"
    )
    return tmp_path


def measure(root: Path) -> Path:
    return res.write_result(
        "demo", "speed", title="t", model="bytes = 2N", values={"ms": 1.5},
        sources=["snippets/demo/bench.py"], prov=FAKE_PROVENANCE, root=root,
    )  # fmt: skip


def test_edit_after_measuring_is_caught_and_remeasuring_fixes_it(scratch):
    measure(scratch)
    assert freshness_errors(scratch) == []
    assert reference_errors(scratch) == []
    snippet = scratch / "snippets" / "demo" / "bench.py"
    snippet.write_text("N = 2048\nprint(N)\n", encoding="utf-8")  # one line edited
    (error,) = freshness_errors(scratch)
    assert error.startswith("results/demo/speed.json: stale: snippets/demo/bench.py changed")
    assert "`nox -s gpu_docs -- demo`" in error
    measure(scratch)  # what gpu_docs does
    assert freshness_errors(scratch) == []


def test_harness_edit_makes_every_result_stale(scratch):
    measure(scratch)
    harness = scratch / "snippets" / "common" / "bench.py"
    harness.write_text(harness.read_text() + "\n# tweak\n", encoding="utf-8")
    assert "snippets/common/bench.py" in freshness_errors(scratch)[0]


def test_missing_and_unshown_results_are_caught(scratch):
    page = scratch / "docs" / "posts" / "demo.md"
    errors = reference_errors(scratch)  # nothing measured yet
    assert errors == [
        "docs/posts/demo.md:3: result 'speed' does not exist (results/demo/speed.json); "
        "produce it with `nox -s gpu_docs -- demo`"
    ]
    measure(scratch)
    page.write_text("# Demo\n", encoding="utf-8")
    (error,) = reference_errors(scratch)
    assert error.startswith("results/demo/speed.json: no page shows this result")


def test_malformed_result_names_file_and_line(scratch):
    path = measure(scratch)
    path.write_text(path.read_text().replace('"values"', '"values" "'), encoding="utf-8")
    (error,) = freshness_errors(scratch)
    assert re.match(rf"{re.escape(str(path))}:\d+: malformed JSON", error), error


def test_result_records_provenance_and_hashes(scratch):
    record = json.loads(measure(scratch).read_text(encoding="utf-8"))
    assert set(FAKE_PROVENANCE) <= set(record["provenance"])
    assert set(record["sources"]) == {"snippets/demo/bench.py", *res.HARNESS}
    assert all(d.startswith("sha256:") and len(d) == 71 for d in record["sources"].values())


def test_hook_renders_tables_and_well_formed_svg(scratch):
    """hooks/results.py turns a record into a Markdown table and parseable SVG plots."""
    import xml.etree.ElementTree as ET

    hook = load_hook("results")
    rows = [{"name": "a", "x": 1.0, "y": 2.0}, {"name": "b", "x": 300.0, "y": 900.0}]
    record = json.loads(measure(scratch).read_text(encoding="utf-8"))
    record["table"] = {
        "columns": [{"key": "name", "label": "名称"}, {"key": "y", "label": "值", "format": ".1f"}],
        "rows": rows,
    }
    record["plot"] = [
        {"x": "name", "y": "y", "x_label": "名称", "y_label": "值"},
        {"kind": "roofline", "x": "x", "y": "y", "label": "name", "peak_tflops": 700.0,
         "bandwidth_tb_s": 4.0, "x_label": "FLOP/B", "y_label": "TFLOP/s"},
    ]  # fmt: skip
    page = fake_page("posts/demo.md")
    table = hook.table(record, page)
    assert "| 名称 | 值 |\n|:---|---:|\n| a | 2.0 |\n| b | 900.0 |" in table
    assert 'href="../../results/demo/speed.json"' in table
    svgs = re.findall(r"<svg.*?</svg>", hook.plot(record, page))
    assert len(svgs) == 2
    for svg in svgs:
        ET.fromstring(svg)  # well-formed
    assert svgs[1].count("<circle") == 2 and "脊点 175 FLOP/B" in svgs[1]
    rows[1]["note"] = "x"  # a sparse column: "—" where a row lacks it
    record["table"]["columns"].append({"key": "note", "label": "备注"})
    assert "| a | 2.0 | — |\n| b | 900.0 | x |" in hook.table(record, page)
    record["table"]["columns"].append({"key": "typo", "label": "?"})  # in no row: an error
    with pytest.raises(KeyError, match="typo"):
        hook.table(record, page)


def test_scatter_rows_sharing_a_label_are_one_series(scratch):
    """Repeated labels (e.g. a model name per batch size) give one line each, named once."""
    import xml.etree.ElementTree as ET

    hook = load_hook("results")
    record = json.loads(measure(scratch).read_text(encoding="utf-8"))
    record["table"] = {"columns": [{"key": "m", "label": "模型"}],
                       "rows": [{"m": m, "b": b, "t": b * k} for m, k in (("A", 1.0), ("B", 2.0))
                                for b in (1, 4, 64)]}  # fmt: skip
    record["plot"] = {"kind": "scatter", "x": "b", "y": "t", "label": "m", "x_label": "batch",
                      "y_label": "ms"}  # fmt: skip
    page = fake_page("posts/demo.md")
    (svg,) = re.findall(r"<svg.*?</svg>", hook.plot(record, page))
    ET.fromstring(svg)
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 6
    assert svg.count(">A<") == 1 and svg.count(">B<") == 1 and "对数轴" in svg
