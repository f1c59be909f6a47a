"""hooks/results.py renders what a page declares: tables with spreads and marks, Vega-Lite
specs with error bars and a roofline, numbers with their range on hover, claims as a check."""

import json
import re
from html import unescape

import pytest

from snippets.common import claims as cl
from tests.hooks import fake_page, load_hook

PROV = {"gpu": "NVIDIA H200", "driver": "580", "cuda": "13.0", "torch": "2.11", "triton": "3.6",
        "python": "3.12", "date": "2026-12-03T10:00:00Z", "commit": "a" * 40, "dirty": False,
        "measured_by": "snippets/demo/bench.py", "wall_s": 3.0}  # fmt: skip
VALUES = {
    "copy_tb_s": 4.25,
    "peak_tflops": 700.0,
    "rows": [
        {"impl": "ours", "x": 1.0, "ms": {"median": 1.0, "lo": 0.99, "hi": 1.01, "n": 7}},
        {"impl": "a|b", "x": 300.0, "ms": {"median": 1.005, "lo": 0.98, "hi": 1.03, "n": 7,
                                          "clock": "python"}},
    ],
}  # fmt: skip


@pytest.fixture
def hook():
    return load_hook("results")


@pytest.fixture
def results(tmp_path):
    record = {"kind": "measured", "slug": "demo", "name": "r", "values": VALUES, "provenance": PROV}
    return cl.Results(base=tmp_path, loaded={("demo", "r"): record})


def directive(kind, body):
    import yaml

    return cl.Directive(kind, 1, "r", body, spec=yaml.safe_load(body))


def test_table_shows_spread_marks_and_escapes_pipes(hook, results):
    d = directive("table", "rows: rows\ncaption: 标题\n"
                           "columns:\n  impl: {label: 实现, map: {ours: 本文}}\n"
                           "  ms: {label: 时间 (ms), format: .3f}\n")  # fmt: skip
    text = hook.table("demo", d, results, fake_page("posts/demo.md"))
    assert "**标题**" in text
    assert "| 实现 | 时间 (ms) |\n|:---|---:|" in text
    assert "| 本文 | 1.000 ±1.0% |" in text
    assert "| a\\|b | 1.005 ±2.5%† |" in text  # a literal | cannot split the row
    assert "† 从 Python 计时" in text and "≈" not in text
    assert 'href="../../results/demo/r.json"' in text and "commit aaaaaaaaaa" in text


def test_fastest_third_gets_its_own_mark_legend_and_hover(hook, results):
    """A python-fastest timing: ‡ and its legend in a table; the hover names the share kept."""
    import copy

    record = copy.deepcopy(results.loaded[("demo", "r")])  # VALUES is shared by the tests
    rows = record["values"]["rows"]
    rows[1]["ms"]["clock"] = "python-fastest"
    results = cl.Results(base=results.base, loaded={("demo", "r"): record})
    d = directive("table", "rows: rows\ncolumns: {impl: i, ms: {label: t, format: .3f}}\n")
    text = hook.table("demo", d, results, fake_page("posts/demo.md"), prov=False)
    assert "| a\\|b | 1.005 ±2.5%‡ |" in text and "‡ 从 Python 计时，只取最快的一部分重复" in text
    assert "†" not in text
    hover = unescape(hook.number(cl.as_stat(rows[1]["ms"]), ".3f"))
    assert "21 次重复中最快的 7 次" in hover, hover  # no `drawn`: a third, as before it existed
    rows[1]["ms"]["drawn"] = 110  # fastest_interleaved: the fastest 7 of 110
    hover = unescape(hook.number(cl.as_stat(rows[1]["ms"]), ".3f"))
    assert "110 次重复中最快的 7 次" in hover, hover


def test_compare_marks_overlapping_cells(hook, results):
    """0.99..1.01 and 0.98..1.03 overlap: within 'their spread' of each other; x does not."""
    page = fake_page("posts/demo.md")
    d = directive("table", "rows: rows\ncompare: {column: ms}\ncolumns: {impl: i, ms: t, x: x}\n")
    rows = hook.table("demo", d, results, page, prov=False).split("\n")[2:4]
    assert rows == ["| ours | ≈ 1 ±1.0% | 1 |", "| a\\|b | ≈ 1 ±2.5%† | 300 |"]
    d = directive("table", "rows: rows\ncompare: {column: x}\ncolumns: {impl: i, x: x}\n")
    assert "≈" not in hook.table("demo", d, results, page, prov=False)
    d = directive("table", "rows: rows\ncompare: [ms, x]\ncolumns: {impl: i, ms: t, x: x}\n")
    rows = hook.table("demo", d, results, page, prov=False).split("\n")[2:4]
    assert rows[0] == "| ours | ≈ 1 ±1.0% | ≈ 1 |" and "≈" not in rows[1]  # 1.0 in 0.99..1.01
    d = directive(
        "table", "rows: rows\ncompare: {column: ms, within: impl}\ncolumns: {impl: i, ms: t}\n"
    )
    assert "≈" not in hook.table("demo", d, results, page, prov=False)  # one row a group
    d = directive("table", "rows: rows\ncompare: {column: ms, within: [x, impl]}\n"
                           "columns: {impl: i, ms: t}\n")  # fmt: skip
    assert "≈" not in hook.table("demo", d, results, page, prov=False)  # groups by both keys
    d = directive(
        "table", "rows: rows\ncompare: {column: ms, within: []}\ncolumns: {impl: i, ms: t}\n"
    )
    rows = hook.table("demo", d, results, page, prov=False).split("\n")[2:4]
    assert all("≈" in r for r in rows)  # an empty list: one group, as no `within`


def test_vega_spec_gets_data_error_bars_and_a_roofline(hook, results):
    d = directive("plot", "rows: rows\nmap: {impl: {ours: 本文}}\nroof: {bandwidth: copy_tb_s, "
                          "peak: peak_tflops}\nmark: point\nencoding:\n"
                          "  x: {field: x, type: quantitative, scale: {type: log}}\n"
                          "  y: {field: ms, type: quantitative}\n"
                          "  color: {field: impl, type: nominal}\n")  # fmt: skip
    spec = hook.vega_spec("demo", d, results)
    rows = spec["data"]["values"]
    assert rows[0] == {"impl": "本文", "x": 1.0, "ms": 1.0, "ms_lo": 0.99, "ms_hi": 1.01}
    roof, points, bars = spec["layer"]
    assert roof["data"]["values"][1] == {"x": 700.0 / 4.25, "ms": 700.0}  # the ridge
    assert points["mark"] == {"type": "point", "tooltip": True}  # the encoded fields, titled
    assert bars["mark"] == {"type": "errorbar", "ticks": True}
    assert [t["title"] for t in bars["encoding"]["tooltip"]] == ["x", "impl", "ms（范围下端）",
                                                                 "ms（范围上端）"]  # fmt: skip
    assert bars["encoding"]["y"]["field"] == "ms_lo" and bars["encoding"]["y2"]["field"] == "ms_hi"
    html = hook.plot("demo", d, results, fake_page("posts/demo.md"))
    assert "<script" not in html  # instant navigation would run it as JavaScript
    payload = re.search(r'data-spec="([^"]*)"', html).group(1)
    assert json.loads(unescape(payload)) == json.loads(json.dumps(spec))


def test_a_plot_carries_only_the_fields_its_spec_reads(hook, results):
    """A record's columns that the spec never names stay off the page (flash-attention's two
    plots carried 21 columns a row for the 4 they draw); a field read only by an expression
    (datum.impl) or a fold's list stays, with the _lo/_hi of a timing it keeps."""
    d = directive("plot", "rows: rows\nmark: point\nencoding:\n"
                          "  x: {field: x, type: quantitative}\n"
                          "  y: {field: ms, type: quantitative}\n")  # fmt: skip
    rows = hook.vega_spec("demo", d, results)["data"]["values"]
    assert rows[0] == {"x": 1.0, "ms": 1.0, "ms_lo": 0.99, "ms_hi": 1.01}
    data = [{"a": 1, "b": 2, "b_lo": 1, "b_hi": 3, "c": 4}]
    assert hook.used_fields(data, {"transform": [{"filter": "datum.a > 0"}]}) == [{"a": 1}]
    assert hook.used_fields(data, [{"fold": ["b"]}, "datum['c']"]) == [
        {"b": 2, "b_lo": 1, "b_hi": 3, "c": 4}
    ]
    assert hook.used_fields(data, {"mark": "point"}) == data  # names none: all stay


def test_a_plot_has_a_text_alternative_and_its_records_as_a_table(hook, results):
    """role="img" with a description (kind, caption, axes with units, series, points) and a
    "数据表" disclosure with one row per record; the roofline's own data is not a record."""
    d = directive("plot", "rows: rows\ncaption: 两种实现\nroof: {bandwidth: copy_tb_s, "
                          "peak: peak_tflops}\nmark: point\nencoding:\n"
                          "  x: {field: x, type: quantitative, scale: {type: log},"
                          "      title: 强度 (FLOP/B)}\n"
                          "  y: {field: ms, type: quantitative, title: 时间 (ms)}\n"
                          "  color: {field: impl, type: nominal, title: 实现}\n")  # fmt: skip
    html = hook.plot("demo", d, results, fake_page("posts/demo.md"), prov=False)
    label = unescape(
        re.search(r'<div class="result-plot" role="img" aria-label="([^"]*)"', html)[1]
    )
    assert label == (
        "散点图：两种实现；横轴：强度 (FLOP/B)，对数刻度；纵轴：时间 (ms)；"
        "按实现分 2 个系列（ours、a|b）；共 2 个数据点，数值见图下的“数据表”。"
    )
    table = re.search(r'<details class="result-data"><summary>(.*?)</summary>(.*)</details>', html)
    assert table[1] == "数据表（2 行；括号内为去掉最快、最慢各六分之一重复后的范围）"
    assert "<th>强度 (FLOP/B)</th><th>时间 (ms)</th><th>实现</th>" in table[2]
    assert "<tr><td>300</td><td>1（0.98–1.03）</td><td>a|b</td></tr>" in table[2]
    assert table[2].count("<tr>") == 3  # the head and one row per record
    d = directive("plot", "rows: rows\ntransform: [{fold: [x, ms], as: [what, v]}]\nmark: line\n"
                          "encoding:\n  x: {field: impl, type: nominal, title: 实现}\n"
                          "  y: {field: v, type: quantitative, title: 值}\n"
                          "  color: {field: what, type: nominal, title: 量}\n")  # fmt: skip
    html = hook.plot("demo", d, results, fake_page("posts/demo.md"), prov=False)
    assert "<th>实现</th><th>值：x</th><th>值：ms</th>" in html
    assert "；横轴：实现，类别；纵轴：值；按量分 2 个系列（x、ms）；共 2 个数据点" in unescape(html)


def test_numbers_show_their_range_and_claims_their_expression(hook):
    text = hook.number(VALUES["rows"][1]["ms"], ".2f")
    assert text.startswith(
        '<span class="measured" title="中位数；7 次重复，去掉最快、最慢各 1 次后的范围 0.98–1.03'
    )
    assert "从 Python 计时" in text and text.endswith(">1.00</span>")
    assert hook.number(4.25, ".1f") == "4.2"
    badge = hook.claim(cl.Directive("claim", 1, None, "r:a < r:b"))
    assert "已断言：r:a &lt; r:b" in badge and badge.endswith(">✓</span>")


def test_page_render_and_failure_name_the_line(hook, tmp_path, monkeypatch):
    from mkdocs.exceptions import PluginError

    page = fake_page("posts/demo.md")
    monkeypatch.setattr(hook, "ROOT", tmp_path)
    scratch = cl.Results  # the hook builds one per page: point it at an empty scratch folder
    monkeypatch.setattr(hook.cl, "Results", lambda **kw: scratch(base=tmp_path / "results"))
    with pytest.raises(
        PluginError, match=r"docs/posts/demo.md:3: result 'nope':.*gpu_docs -- demo"
    ):
        hook.on_page_markdown("# D\n\n{{ nope:x }}\n", page, None, None)


def test_columns_scale_and_roofs_read_the_datasheet(hook, results):
    d = directive(
        "table", "rows: rows\ncolumns: {impl: i, ms: {label: µs, format: .0f, scale: 1000}}\n"
    )
    text = hook.table("demo", d, results, fake_page("posts/demo.md"), prov=False)
    assert "| ours | 1000 ±1.0% |" in text and "| a\\|b | 1005 ±2.5%† |" in text
    d = directive("plot", "rows: rows\nroof: {bandwidth: 'hardware:h200-sxm.hbm_tb_per_s', "
                          "peak: 'hardware:h200-sxm.bf16_dense_tflops'}\nmark: point\nencoding:\n"
                          "  x: {field: x, type: quantitative, scale: {type: log}}\n"
                          "  y: {field: ms, type: quantitative, scale: {type: log}}\n")  # fmt: skip
    assert cl.check_directive("demo", d, results) is None
    ridge = hook.vega_spec("demo", d, results)["layer"][0]["data"]["values"][1]
    assert ridge["ms"] == pytest.approx(989.5) and ridge["x"] == pytest.approx(989.5 / 4.8)


def test_linear_axes_of_non_negative_data_start_at_zero(hook, results):
    d = directive("plot", "rows: rows\nmark: point\nencoding:\n"
                          "  x: {field: x, type: quantitative}\n"
                          "  y: {field: ms, type: quantitative, scale: {type: log}}\n")  # fmt: skip
    enc = hook.vega_spec("demo", d, results)["layer"][0]["encoding"]
    assert enc["x"]["scale"] == {"zero": True} and enc["y"]["scale"] == {"type": "log"}
    assert "scale" not in d.spec["encoding"]["x"]  # the page's spec is left as written


def test_a_post_awaiting_a_gpu_run_shows_placeholders_and_a_banner(hook, tmp_path, monkeypatch):
    body = ("# 演示\n\n```table r\nrows: rows\ncaption: 两种实现\ncolumns: {impl: 实现}\n```\n\n"
            "N 是 {{ r:copy_tb_s }}。a 快。<!-- claim: r:rows[impl=ours].ms < 2 -->\n")  # fmt: skip
    front = "---\ntitle: 演示\nsummary: 演示。\nprerequisites: []\nseries: 1\n"
    page = tmp_path / "docs" / "posts" / "demo.md"
    page.parent.mkdir(parents=True)
    page.write_text(f"{front}awaiting_gpu: 计时方法改了\n---\n\n{body}", encoding="utf-8")
    monkeypatch.setattr(hook, "ROOT", tmp_path)
    monkeypatch.setattr(hook, "PENDING", frozenset({"demo"}))
    html = hook.on_page_markdown(body, fake_page("posts/demo.md"), None, None)
    assert "本页的 GPU 实测数据尚未由当前代码生成：计时方法改了。" in html
    assert "CPU 上算出的记录照常显示" in html
    assert "表：两种实现。数据 <code>results/demo/r.json</code> 尚未由当前代码生成" in html
    assert 'N 是 <span class="pending"' in html and "（待测）" in html
    assert 'class="claim pending"' in html and "✓" not in html
    broken = body.replace("< 2 -->", "< -->")
    with pytest.raises(Exception, match=r"docs/posts/demo.md:\d+: claim .* is not an expression"):
        hook.on_page_markdown(broken, fake_page("posts/demo.md"), None, None)


def test_a_nominal_legend_toggles_its_series(hook, results):
    """One legend-bound selection on the color field; every layer drawing it (the generated
    error bars too) takes its opacity from it; a reference rule without the field does not."""
    d = directive("plot", "rows: rows\nencoding:\n  color: {field: impl, type: nominal}\n"
                          "layer:\n  - mark: point\n    encoding:\n"
                          "      x: {field: x, type: quantitative, scale: {type: log}}\n"
                          "      y: {field: ms, type: quantitative}\n"
                          "  - mark: rule\n    data: {values: [{y: 1}]}\n"
                          "    encoding: {y: {field: y, type: quantitative}}\n")  # fmt: skip
    layers = hook.vega_spec("demo", d, results)["layer"]
    points, bars, rule = layers
    assert points["params"] == [{"name": "series", "select": {"type": "point", "fields": ["impl"]},
                                 "bind": "legend"}]  # fmt: skip
    assert bars["mark"]["type"] == "errorbar" and "params" not in bars
    for layer in (points, bars):
        assert layer["encoding"]["opacity"]["condition"] == {"param": "series", "value": 1}
    assert "opacity" not in rule["encoding"] and "params" not in rule


def test_a_plot_without_a_nominal_legend_gets_no_toggle(hook, results):
    d = directive("plot", "rows: rows\nmark: point\nencoding:\n"
                          "  x: {field: x, type: quantitative, scale: {type: log}}\n"
                          "  y: {field: ms, type: quantitative}\n"
                          "  color: {field: x, type: quantitative}\n")  # fmt: skip
    spec = json.dumps(hook.vega_spec("demo", d, results))
    assert '"params"' not in spec and '"opacity"' not in spec


def test_the_build_names_the_line_of_an_axis_that_should_be_log(hook, results, monkeypatch):
    from mkdocs.exceptions import PluginError

    monkeypatch.setattr(hook.cl, "Results", lambda **kw: results)
    body = ("# D\n\n```plot r\nrows: rows\nmark: point\nencoding:\n"
            "  y: {field: ms, type: quantitative}\n"
            "  x: {field: x, type: quantitative}\n```\n")  # fmt: skip
    with pytest.raises(PluginError, match=r"docs/posts/demo.md:8: axis x \(x\) spans 1..300, 300x"):
        hook.on_page_markdown(body, fake_page("posts/demo.md"), None, None)
    fixed = body.replace("x, type: quantitative}", "x, type: quantitative, scale: {type: log}}")
    page = fake_page("posts/demo.md")
    assert 'class="result-plot"' in hook.on_page_markdown(fixed, page, None, None)


def test_a_log_axis_is_not_stacked(hook, results):
    """Vega-Lite stacks bars from zero; on a log axis that puts 0 in the domain and the plot
    comes out empty (the browser suite's planted-plot-warning page shows the warning)."""
    d = directive("plot", "rows: rows\nmark: bar\nencoding:\n  x: {field: impl, type: nominal}\n"
                          "  y: {field: x, type: quantitative, scale: {type: log}}\n")  # fmt: skip
    y = hook.vega_spec("demo", d, results)["layer"][0]["encoding"]["y"]
    assert "stack" in y and y["stack"] is None
