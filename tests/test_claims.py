"""Claims and references (snippets/common/claims.py): selectors, interval judgement, errors."""

from pathlib import Path

import pytest

from snippets.common import claims as cl


def timing(median, lo, hi, n=7):
    return {"median": median, "lo": lo, "hi": hi, "n": n}


VALUES = {
    "copy_tb_s": 4.2,
    "rows": [
        {"impl": "ours", "batch": 1, "ms": timing(1.0, 0.98, 1.02)},
        {"impl": "ours", "batch": 64, "ms": timing(1.5, 1.48, 1.53)},
        {"impl": "eager", "batch": 1, "ms": timing(2.0, 1.9, 2.2)},
        {"impl": "eager", "batch": 64, "ms": timing(2.1, 2.05, 2.3)},
    ],
    "skipped": False,
    "first": "0.attn_out",
    "nested": {"full": 1.3},
}


@pytest.fixture
def results(tmp_path):
    return cl.Results(base=tmp_path, loaded={("demo", "r"): {"kind": "measured", "values": VALUES}})


def holds(expr, results):
    return cl.evaluate(expr, "demo", results)[0]


def test_lookup_with_selectors():
    assert cl.lookup(VALUES, "rows[impl=ours,batch=64].ms")["median"] == 1.5
    assert [r["median"] for r in cl.lookup(VALUES, "rows[impl=eager].ms")] == [2.0, 2.1]
    assert len(cl.lookup(VALUES, "rows[*].batch")) == 4
    assert cl.lookup(VALUES, "rows[2].impl") == "eager"
    assert cl.lookup(VALUES, "nested.full") == 1.3
    with pytest.raises(KeyError, match="no row matches"):
        cl.lookup(VALUES, "rows[impl=liger].ms")
    with pytest.raises(KeyError, match="no 'nope'"):
        cl.lookup(VALUES, "nested.nope")


def test_normalized_paths_and_selector_fields():
    assert cl.normalized("rows[impl=ours,batch=1].ms") == (
        "rows[].ms",
        {"rows[].impl", "rows[].batch"},
    )
    assert cl.normalized("nested.full") == ("nested.full", set())


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("r:rows[impl=ours,batch=1].ms < r:rows[impl=eager,batch=1].ms", True),
        # the two ranges are 0.98..1.02 and 1.9..2.2: a 2x claim needs 1.9 / 1.02 > 2
        ("r:rows[impl=eager,batch=1].ms / r:rows[impl=ours,batch=1].ms > 2", False),
        ("r:rows[impl=eager,batch=1].ms / r:rows[impl=ours,batch=1].ms > 1.8", True),
        ("r:rows[impl=ours].ms < r:rows[impl=eager].ms", True),  # element by element
        ("increasing(r:rows[impl=ours].ms)", True),
        ("increasing(r:rows[impl=eager].ms)", False),  # ranges 1.9..2.2 and 2.05..2.3 overlap
        ("abs(r:rows[impl=ours,batch=1].ms - 1) <= 0.03", True),
        ("abs(r:rows[impl=ours,batch=1].ms - 1) <= 0.01", False),
        ("not r:skipped", True),
        ('r:first == "0.attn_out"', True),
        ("1.2 < r:nested.full < 1.4", True),
        ("r:copy_tb_s > 4 and r:copy_tb_s < 5", True),
        ("max(r:rows[*].ms) < 2.3", False),  # the slowest repeat is 2.3
        ("all(r:rows[impl=ours].ms < 1.6)", True),
    ],
)
def test_claims_are_judged_at_the_unfavourable_end(expr, expected, results):
    assert holds(expr, results) is expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("r:copy_tb_s", "must compare"),
        ("r:nope > 1", "no 'nope'"),
        ("r:copy_tb_s > x", "unknown name 'x'"),
        ("1 < 2", "reads no result"),
        ("r:copy_tb_s >", "not an expression"),
        ("r:copy_tb_s.__class__ > 1", "no '__class__'"),
        ("__import__('os') > 1", "reads no result"),
        ("r:first < 1", "cannot order"),
    ],
)
def test_bad_claims_are_errors(expr, message, results):
    with pytest.raises(cl.SpecError, match=message):
        cl.evaluate(expr, "demo", results)


def test_page_errors_name_page_and_line(tmp_path, results):
    page = tmp_path / "demo.md"
    page.write_text(
        "# D\n\n"
        "{{ r:copy_tb_s:.1f }} TB/s，{{ r:rows[impl=ours].ms }}。\n\n"  # one number, then a list
        "快。<!-- claim: r:rows[impl=eager,batch=1].ms < r:rows[impl=ours,batch=1].ms -->\n\n"
        "```table r\nrows: rows\ncolumns:\n  impl: 实现\n  typo: 拼错\n```\n\n"
        "```plot r\nrows: rows\nmark: line\nencoding:\n  x: {field: batch, type: quantitative, "
        "scale: {zero: false}}\n  y: {field: ms, type: quantitative}\n```\n",
        encoding="utf-8",
    )
    errors = cl.page_errors(page, results, "docs/posts/demo.md")
    assert errors[0].startswith("docs/posts/demo.md:3: r:rows[impl=ours].ms matches 2 rows")
    assert errors[1].startswith("docs/posts/demo.md:5: claim does not hold")
    assert errors[2] == "docs/posts/demo.md:7: column 'typo' is in no row of r:rows"
    assert errors[3].startswith("docs/posts/demo.md:14: axis x (batch) of a non-negative")
    assert len(errors) == 4


def test_reads_cover_numbers_tables_plots_and_claims(tmp_path):
    page = tmp_path / "demo.md"
    page.write_text(
        "{{ r:copy_tb_s }} <!-- claim: r:nested.full > 1 -->\n\n"
        "```table r\nrows: rows[impl=ours]\ncolumns: {batch: b}\n```\n\n"
        "```plot r\nrows: rows\nmark: point\n"
        "encoding: {x: {field: batch}, y: {field: ms_lo}}\n```\n",
        encoding="utf-8",
    )
    assert cl.reads(page) == {
        ("demo", "r"): {"copy_tb_s", "nested.full", "rows[].batch", "rows[].impl", "rows[].ms"}
    }


def test_hardware_constants_are_readable(results):
    assert holds("r:copy_tb_s < hardware:h200-sxm.hbm_tb_per_s", results)


def test_max_of_several_lists_and_numbers_in_code_spans(tmp_path, results):
    assert holds("max(r:rows[impl=ours].ms, r:rows[impl=eager].ms) <= 2.3", results)
    page = tmp_path / "posts" / "demo.md"
    page.parent.mkdir()
    page.write_text("# D\n\n表里写 `{{ r:copy_tb_s }}`。\n", encoding="utf-8")
    (error,) = cl.page_errors(page, results, "docs/posts/demo.md")
    assert error.startswith("docs/posts/demo.md:3: {{ r:copy_tb_s }} is inside a code span")


# --------------------------------------------------------------------------- log-scale rule

SPANS = {"rows": [{"n": n, "ms": timing(n / 10, n / 11, n / 9), "small": 1.0, "big": float(n),
                   "signed": n - 5.0} for n in (1, 10, 100, 1000)]}  # fmt: skip


@pytest.fixture
def spans(tmp_path):
    record = {"kind": "measured", "values": SPANS}
    return cl.Results(base=tmp_path, loaded={("demo", "s"): record})


def plot_page(tmp_path, encoding: str, extra: str = "") -> Path:
    page = tmp_path / "demo.md"
    page.write_text(f"# D\n\n```plot s\nrows: rows\nmark: point\n{extra}encoding:\n{encoding}```\n",
                    encoding="utf-8")  # fmt: skip
    return page


def test_an_axis_spanning_decades_must_be_log_scaled(tmp_path, spans):
    """A planted linear axis over three decades is an error at the page line of its channel;
    log-scaled (or under LOG_SPAN, or not all positive) it passes."""
    x = "  x: {field: small, type: quantitative}\n"
    page = plot_page(tmp_path, x + "  y: {field: ms, type: quantitative}\n")
    (error,) = cl.page_errors(page, spans, "docs/posts/demo.md")
    assert error.startswith("docs/posts/demo.md:8: axis y (ms) spans 0.1..100, 1000x > 100x")
    assert page.read_text().splitlines()[7].startswith("  y: {field: ms")
    page = plot_page(tmp_path, x + "  y: {field: ms, type: quantitative, scale: {type: log}}\n")
    assert cl.page_errors(page, spans) == []
    page = plot_page(tmp_path, x + "  y: {field: signed, type: quantitative}\n")  # -4 .. 995
    assert cl.page_errors(page, spans) == []
    page = plot_page(tmp_path, "  x: {field: big, type: quantitative}\n"
                               "  y: {field: small, type: quantitative}\n")  # fmt: skip
    assert [e.split(": ", 1)[1][:22] for e in cl.page_errors(page, spans)] == [
        "axis x (big) spans 1.."
    ]
    assert cl.LOG_SPAN == 100  # the derivation in claims.py is for this ratio


def test_a_linear_axis_over_decades_needs_its_reason_on_the_line(tmp_path, spans):
    y = "  y:\n    field: big\n    type: quantitative\n    scale: {type: linear}"
    x = "  x: {field: small, type: quantitative}\n"
    page = plot_page(tmp_path, x + y + "  # the sum is what matters\n")
    assert cl.page_errors(page, spans) == []
    page = plot_page(tmp_path, x + y + "\n")
    (error,) = cl.page_errors(page, spans, "p.md")
    assert error.startswith("p.md:8: axis y (big) spans 1..1e+03, 1000x > 100x")


def test_a_folded_axis_is_judged_on_the_fields_it_folds(tmp_path, spans):
    fold = "transform:\n  - fold: [small, big]\n    as: [which, value]\n"
    enc = "  x: {field: n, type: quantitative, scale: {type: log}}\n"
    page = plot_page(tmp_path, enc + "  y: {field: value, type: quantitative}\n", fold)
    (error,) = cl.page_errors(page, spans, "p.md")
    assert error.startswith("p.md:11: axis y (value) spans 1..1e+03")
