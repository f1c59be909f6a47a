"""Show results (results/<slug>/<name>.json) on pages at build time, on the CPU.

The page says how (snippets/common/claims.py reads and checks it):
  {{ NAME:path }} / {{ NAME:path:.1f }}    a number; a timing shows its median, its range on hover
  ```table NAME  (YAML: rows, columns, caption, note, compare, where)   a table
  ```plot NAME   (YAML: a Vega-Lite spec plus rows, caption, note, map, roof, where)  a chart,
                 drawn in the browser by the vendored vega-embed, with error bars for timings
  <!-- claim: EXPR -->                     asserted here; shown as a check mark with the claim
A missing result, an unknown path, a malformed spec or a claim that does not hold fails the
build with the page and the line, unless the post's front matter says `awaiting_gpu: why` and
its results are due: then the page shows a banner, placeholders and unchecked claims instead.
"""

from __future__ import annotations

import copy
import html
import json
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import claims as cl  # noqa: E402
from snippets.common.results import (  # noqa: E402
    FASTEST_SHARE,
    Stat,
    refresh_command,
    results_dir,
)

PYTHON_MARK = "†"
PYTHON_LEGEND = f"{PYTHON_MARK} 从 Python 计时：墙钟时间，含 CPU 一侧的开销"
FASTEST_MARK = "‡"
FASTEST_LEGEND = (
    f"{FASTEST_MARK} 从 Python 计时，只取最快的一部分重复（几次里取几次见悬停提示）："
    "主机 CPU 没有被拖慢时的时间，是循环实际看到的时间的下界"
)
CLOCK_MARKS = {"python": PYTHON_MARK, "python-fastest": FASTEST_MARK}
OVERLAP_MARK = "≈"
OVERLAP_LEGEND = f"{OVERLAP_MARK} 与同组中另一个值的区间重叠：两者之差在测量散布之内"


PENDING: frozenset = frozenset()  # posts awaiting a GPU run, set once per build


def on_files(files: Files, config) -> Files:
    global PENDING
    base = results_dir()  # HANDBOOK_RESULTS_DIR shows a scratch run (e.g. --verify)
    PENDING = cl.pending(ROOT, base)
    for path in sorted(base.glob("*/*.json")):
        uri = f"results/{path.relative_to(base).as_posix()}"
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


# --------------------------------------------------------------------------- formatting


def fmt(value, spec: str | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, Stat) or cl.is_stat(value):
        value = value.median if isinstance(value, Stat) else value["median"]
    if isinstance(value, float) and not spec:
        return f"{value:.3g}"
    return format(value, spec) if spec else str(value)


def spread_text(stat: Stat) -> str:
    s = stat.spread
    return f"±{s:.1%}" if s < 0.1 else f"±{s:.0%}"


def number(value, spec: str | None) -> str:
    text = fmt(value, spec)
    stat = cl.as_stat(value)
    if isinstance(stat, Stat) and stat.n:
        clock = {"python": "，从 Python 计时",
                 "python-fastest": "，从 Python 计时"}.get(stat.clock, "")  # fmt: skip
        span = f"{fmt(stat.lo, spec)}–{fmt(stat.hi, spec)}（{spread_text(stat)}）"
        trim = stat.n // 6  # as Stat.of leaves them out
        kept = f"去掉最快、最慢各 {trim} 次后的范围" if trim else "全部重复的范围"
        repeats = f"{stat.n} 次重复"
        if stat.clock == "python-fastest":
            repeats = f"{stat.drawn or FASTEST_SHARE * stat.n} 次重复中最快的 {stat.n} 次"
        title = f"中位数；{repeats}，{kept} {span}{clock}"
        return f'<span class="measured" title="{html.escape(title)}">{text}</span>'
    return text


def cell(value, col: dict, overlap: bool) -> str:
    if "scale" in col and isinstance(cl.as_stat(value), Stat):  # e.g. ms shown as µs
        value = cl.as_stat(value) * col["scale"]
    mapped = col.get("map", {}).get(value, value) if isinstance(value, str | int) else value
    text = fmt(mapped, col.get("format"))
    stat = cl.as_stat(value)
    if isinstance(stat, Stat) and stat.n and stat.lo != stat.hi:
        text += f" {spread_text(stat)}"
        text += CLOCK_MARKS.get(stat.clock, "")
    if overlap:
        text = f"{OVERLAP_MARK} {text}"
    return text.replace("|", "\\|")


def _overlaps(cells: dict) -> set:
    """Keys of the cells (timings or numbers) whose range overlaps another's."""
    stats = {k: cl.as_stat(v) for k, v in cells.items()}
    stats = {k: v for k, v in stats.items() if isinstance(v, Stat)}
    return {a for a, x in stats.items() for b, y in stats.items()
            if a != b and x.lo <= y.hi and y.lo <= x.hi}  # fmt: skip


def overlapping(rows: list[dict], compare) -> set[tuple[int, str]]:
    """(row index, column) of the cells to mark. `compare: [a, b]` compares columns within each
    row; `compare: {column: ms, within: op}` compares one column across the rows of each group
    (`within: [op, impl]`: groups by both)."""
    if not compare:
        return set()
    if isinstance(compare, list):
        return {
            (i, k) for i, r in enumerate(rows) for k in _overlaps({c: r.get(c) for c in compare})
        }
    col, within = compare["column"], cl.compare_keys(compare.get("within"))
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(tuple(r.get(k) for k in within), {})[i] = r.get(col)
    return {(i, col) for cells in groups.values() for i in _overlaps(cells)}


def provenance_line(records: list[dict], page) -> str:
    parts, links = [], []
    for record in records:
        uri = f"results/{record['slug']}/{record['name']}.json"
        links.append(
            f'<a href="{get_relative_url(uri, page.url)}" download>{record["name"]}.json</a>'
        )
    p = records[0]["provenance"]
    if records[0]["kind"] == "measured":
        parts = [f"实测于 {p['gpu']}", f"驱动 {p['driver']}", f"CUDA {p['cuda']}",
                 f"torch {p['torch']}", f"triton {p['triton']}"]  # fmt: skip
    else:
        parts = [f"CPU 上计算（Python {p['python']}）"]
    parts += [
        p["date"][:10],
        f"commit {p['commit'][:10]}" + ("（工作区有改动）" if p["dirty"] else ""),
    ]
    text = " · ".join(html.escape(str(x)) for x in parts)
    return f'<p class="provenance">{text} · 原始数据 {" ".join(links)}</p>'


# --------------------------------------------------------------------------- blocks


def table(slug: str, d: cl.Directive, results: cl.Results, page, prov: bool = True) -> str:
    cols = cl.table_columns(d)
    rows = cl.rows_of(slug, d, results)
    marked = overlapping(rows, d.spec.get("compare"))
    text_cols = {k for k, _ in cols if any(isinstance(r.get(k), str) for r in rows)}
    lines = [f"**{d.spec['caption']}**", ""] if d.spec.get("caption") else []
    lines += [
        "| " + " | ".join(c["label"].replace("|", "\\|") for _, c in cols) + " |",
        "|" + "".join(":---|" if k in text_cols else "---:|" for k, _ in cols),
    ]
    marks = set()
    for i, r in enumerate(rows):
        cells = [cell(r.get(k), c, (i, k) in marked) for k, c in cols]
        marks |= {OVERLAP_MARK} if any(j == i for j, _ in marked) else set()
        marks |= {CLOCK_MARKS.get(getattr(cl.as_stat(r.get(k)), "clock", None)) for k, _ in cols}
        lines.append("| " + " | ".join(cells) + " |")
    legend_of = {PYTHON_MARK: PYTHON_LEGEND, FASTEST_MARK: FASTEST_LEGEND,
                 OVERLAP_MARK: OVERLAP_LEGEND}  # fmt: skip
    legends = [text for mark, text in legend_of.items() if mark in marks]
    timed = any(isinstance(cl.as_stat(r.get(k)), Stat) and cl.as_stat(r.get(k)).n
                for r in rows for k, _ in cols)  # fmt: skip
    if timed:
        trimmed = (
            "计时为多次重复的中位数；± 为去掉最快、最慢各六分之一"
            "（7 次去 1 次，15 次去 2 次）之后与中位数的最大偏离"
        )
        legends.insert(0, trimmed)
    lines += (
        ["", f'<p class="result-note">{html.escape("；".join(legends))}</p>'] if legends else []
    )
    if d.spec.get("note"):
        lines += ["", f'<p class="result-note">{html.escape(d.spec["note"])}</p>']
    lines += ["", provenance_line([results.record(slug, d.name)], page)] if prov else []
    return "\n".join(lines)


def _flat(rows: list[dict], mapping: dict) -> list[dict]:
    """Rows for Vega-Lite: a timing becomes its median plus <field>_lo and <field>_hi."""
    out = []
    for r in rows:
        flat = {}
        for k, v in r.items():
            v = cl.as_stat(v)
            if isinstance(v, Stat):
                flat[k] = v.median
                if v.n:
                    flat[f"{k}_lo"], flat[f"{k}_hi"] = v.lo, v.hi
            elif isinstance(v, str | int | float | bool) or v is None:
                flat[k] = mapping.get(k, {}).get(v, v) if isinstance(v, str | int) else v
        out.append(flat)
    return out


def range_tooltip(encoding: dict) -> list[dict]:
    """The hover tooltip of an error bar (y..y2): its x and series, then both ends titled with
    the y axis's title (Vega-Lite's own error-bar tooltip names the raw _lo/_hi fields)."""

    def field(ch: dict, title: str | None = None) -> dict:
        return {"field": ch["field"], "type": ch.get("type", "quantitative"),
                "title": title or str(ch.get("title") or ch["field"])}  # fmt: skip

    shown = [field(encoding[k]) for k in ("x", "color")
             if isinstance(encoding.get(k), dict) and "field" in encoding[k]]  # fmt: skip
    y = encoding["y"]
    title = str(y.get("title") or y["field"])
    return [*shown, field(y, f"{title}（范围下端）"),
            field({**encoding["y2"], "type": "quantitative"}, f"{title}（范围上端）")]  # fmt: skip


def zero_axes(encoding: dict, rows: list[dict]) -> None:
    """Quantitative x/y axes of non-negative data start at zero unless log-scaled (Vega-Lite
    leaves point and line axes free to start anywhere). A log-scaled one is not stacked:
    Vega-Lite stacks bars and areas from zero, which puts 0 in a log domain and draws nothing."""
    for channel in ("x", "y"):
        ch = encoding.get(channel)
        if not isinstance(ch, dict) or ch.get("type") != "quantitative" or "field" not in ch:
            continue
        if isinstance(ch.get("scale"), dict) and ch["scale"].get("type") == "log":
            ch.setdefault("stack", None)
        values = [r.get(ch["field"]) for r in rows]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        scale = dict(ch.get("scale") or {})
        if not numbers or min(numbers) < 0 or scale.get("type") in ("log", "symlog"):
            continue
        if "zero" not in scale and "domain" not in scale:
            ch["scale"] = {**scale, "zero": True}


def vega_spec(slug: str, d: cl.Directive, results: cl.Results) -> dict:
    rows = cl.rows_of(slug, d, results)
    data = _flat(rows, d.spec.get("map") or {})
    spec = copy.deepcopy({k: v for k, v in d.spec.items() if k not in cl.PLOT_KEYS})
    spec.setdefault("width", "container")
    spec.setdefault("height", 300)
    if "layer" in spec:
        given = spec.pop("layer")
    else:
        given = [{"mark": spec.pop("mark"), "encoding": spec.pop("encoding", {})}]
    layers = []
    for layer in given:  # each mark gets tooltips, and error bars where y is a timing
        layer = dict(layer)
        mark = layer.get("mark")
        if mark is not None:
            mark = {"type": mark} if isinstance(mark, str) else dict(mark)
            # hover: the encoded fields by their axis and legend titles (Vega-Lite's "encoding"
            # content; loader.js sets the number format); an error bar: its range, titled
            merged = {**(spec.get("encoding") or {}), **(layer.get("encoding") or {})}
            ranged = mark["type"] in ("errorbar", "errorband") and "tooltip" not in mark
            ends = [merged.get(k) for k in ("y", "y2")]
            ranged = ranged and all(isinstance(e, dict) and "field" in e for e in ends)
            if ranged and "tooltip" not in merged:
                layer["encoding"] = {**layer.get("encoding", {}), "tooltip": range_tooltip(merged)}
            else:
                mark.setdefault("tooltip", True)
            if mark["type"] == "line":
                mark.setdefault("point", True)
            layer["mark"] = mark
        layers.append(layer)
        encoding = layer.get("encoding") or {}
        own = layer.get("data")
        zero_axes(encoding, own.get("values", data) if isinstance(own, dict) else data)
        y = encoding.get("y", {})
        rows = own.get("values", data) if isinstance(own, dict) else data
        timed = isinstance(y, dict) and any(f"{y.get('field')}_lo" in r for r in rows)
        if timed and mark and mark["type"] not in ("errorbar", "errorband", "rule", "text"):
            bar = {k: v for k, v in encoding.items() if k in ("x", "color", "detail")}
            bar["y"] = {**y, "field": f"{y['field']}_lo", "title": y.get("title") or y["field"]}
            bar["y2"] = {"field": f"{y['field']}_hi"}
            extra = {k: v for k, v in layer.items() if k in ("transform", "data")}
            bar["tooltip"] = range_tooltip({**(spec.get("encoding") or {}), **bar})
            layers.append({**extra, "mark": {"type": "errorbar", "ticks": True}, "encoding": bar})
    roof = d.spec.get("roof")
    if roof:
        enc = {**(spec.get("encoding") or {}), **(layers[0].get("encoding") or {})}
        xf, yf = enc["x"]["field"], enc["y"]["field"]
        bw = cl.as_stat(cl.spec_ref(slug, d, str(roof["bandwidth"]), results)).median
        peak = cl.as_stat(cl.spec_ref(slug, d, str(roof["peak"]), results)).median
        xs = [r[xf] for r in data if isinstance(r.get(xf), int | float)]
        ridge = peak / bw
        lo, hi = min([*xs, ridge]) / 2, max([*xs, ridge]) * 2
        line = [{xf: lo, yf: bw * lo}, {xf: ridge, yf: peak}, {xf: hi, yf: peak}]
        layers.insert(0, {
            "data": {"values": line},
            "mark": {"type": "line", "color": "#888", "strokeDash": [4, 3]},
            "encoding": {"x": {"field": xf, "type": "quantitative"},
                         "y": {"field": yf, "type": "quantitative"}},
        })  # fmt: skip
    zero_axes(spec.get("encoding") or {}, data)
    legend_toggle(spec.get("encoding") or {}, layers)
    return {**spec, "data": {"values": used_fields(data, [spec, layers])}, "layer": layers}


DATUM = re.compile(r"datum(?:\.(\w+)|\[['\"]([^'\"]+)['\"]\])")


def used_fields(data: list[dict], spec) -> list[dict]:
    """The records with only the fields the spec can read: named anywhere in it as a string
    (a "field", a fold's or groupby's list, a sort) or as datum.<field> in an expression, and
    the _lo/_hi of each; a record's other columns would be page weight that no reader sees.
    Where the spec names none of them (the data table then shows every field), all stay."""
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, str):
            names.add(node)
            names.update(a or b for a, b in DATUM.findall(node))

    walk(spec)
    keep = {k for r in data for k in r if k in names}
    keep |= {f"{k}_{end}" for k in keep for end in ("lo", "hi")}
    if not keep:
        return data
    return [{k: v for k, v in r.items() if k in keep} for r in data]


LEGEND_CHANNELS = ("color", "shape", "strokeDash")  # the channels whose legend lists series
TOGGLE = "series"  # the name of the legend-bound selection (one per plot: each is its own view)
DIMMED = 0.1  # the opacity of a series not selected: its shape stays, faintly, for context


def legend_toggle(top: dict, layers: list[dict]) -> None:
    """Clicking a legend entry shows that series alone (shift-click adds one, a click elsewhere
    shows all again): a point selection on the first nominal legend field, bound to the legend,
    and every layer drawing that field gets its opacity from it. Layers with data of their own
    (a roofline) and layers without the field (a reference rule) stay as they are."""

    def legend_field(encoding: dict) -> str | None:
        for channel in LEGEND_CHANNELS:
            ch = encoding.get(channel)
            if isinstance(ch, dict) and ch.get("type") == "nominal" and "field" in ch:
                return ch["field"]
        return None

    def fields(encoding: dict) -> set:
        return {ch.get("field") for name, ch in encoding.items()
                if name in LEGEND_CHANNELS and isinstance(ch, dict)}  # fmt: skip

    drawing = [layer for layer in layers if "data" not in layer and layer.get("mark")]
    field = legend_field(top) or next(
        (f for layer in drawing if (f := legend_field(layer.get("encoding") or {}))), None
    )
    if field is None:
        return
    opacity = {"condition": {"param": TOGGLE, "value": 1}, "value": DIMMED}
    host = None
    for layer in drawing:
        encoding = layer.setdefault("encoding", {})
        if field not in fields({**top, **encoding}) or "opacity" in {**top, **encoding}:
            continue
        encoding["opacity"] = opacity
        host = host or layer
    if host is not None:
        host.setdefault("params", []).append(
            {"name": TOGGLE, "select": {"type": "point", "fields": [field]}, "bind": "legend"}
        )


# --------------------------------------------------------------------------- the plot as text
# A reader who cannot see the chart gets a description (role="img" with an aria-label: caption,
# axes with their units, series, number of points) and every plot has a "数据表" disclosure with
# its records as an HTML table, made here from the same records as the chart's data.

# the kind of chart, by the first of these marks it has (a line through points is a line chart)
MARK_NAMES = {"bar": "柱状图", "point": "散点图", "circle": "散点图", "line": "折线图",
              "area": "面积图"}  # fmt: skip
TABLE_SUMMARY = "数据表"


def _layers(spec: dict) -> list[dict]:
    """The top level and each layer that draws the records (not one with data of its own, such
    as the roofline): where their encodings and transforms are declared."""
    return [spec, *[layer for layer in spec.get("layer", [])
                    if isinstance(layer, dict) and "data" not in layer]]  # fmt: skip


def _transforms(spec: dict) -> list[dict]:
    return [t for part in _layers(spec) for t in part.get("transform") or [] if isinstance(t, dict)]


def _channels(spec: dict) -> list[tuple[str, dict]]:
    """(channel, definition) of every encoding, top level first, in the order written."""
    return [(ch, enc) for part in _layers(spec) for ch, enc in (part.get("encoding") or {}).items()
            if isinstance(enc, dict)]  # fmt: skip


def table_fields(spec: dict, data: list[dict]) -> list[tuple[str, str]]:
    """(field, label) of the columns of a plot's data table: the encoded fields that are in its
    records (a timing's _lo/_hi go into its cell), a fold's source fields for the folded value,
    and "#" for a row_number window; labels are the axis or legend titles."""
    keys = {k for r in data for k in r}
    folds = {t["as"][1]: (t["as"][0], t["fold"]) for t in _transforms(spec)
             if "fold" in t and len(t.get("as") or []) == 2}  # fmt: skip
    windows = {w.get("as") for t in _transforms(spec) for w in t.get("window") or []
               if isinstance(w, dict) and w.get("op") == "row_number"}  # fmt: skip
    out: dict[str, str] = {}
    for ch, enc in _channels(spec):
        field = enc.get("field")
        if ch in ("y2", "x2") or not isinstance(field, str):
            continue
        title = str(enc.get("title") or ("图中标注" if ch == "text" else field))
        if field in folds:
            for source in folds[field][1]:
                out.setdefault(source, f"{title}：{source}")
        elif field in windows:
            out.setdefault("#", "#")
        elif field in keys and not (field.endswith(("_lo", "_hi")) and field[:-3] in out):
            out.setdefault(field, title)
    if not out:  # nothing encoded is a record field: show every plain field
        out = {k: k for r in data for k in r if not k.endswith(("_lo", "_hi"))}
    titles = list(out.values())  # two fields on one axis: name each
    return [(f, f"{t}：{f}" if titles.count(t) > 1 else t) for f, t in out.items()]


def _text(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "是" if value else "否"
    if isinstance(value, float):
        return f"{value:.0f}" if 1e3 <= abs(value) < 1e9 else f"{value:.3g}"
    return str(value)


def data_table(spec: dict, data: list[dict], caption: str) -> str:
    """The records of a plot as a <details> table: one row per record, in the records' order."""
    fields = table_fields(spec, data)
    head = "".join(f"<th>{html.escape(label)}</th>" for _, label in fields)
    rows = []
    for i, r in enumerate(data):
        cells = []
        for field, _ in fields:
            value = i + 1 if field == "#" else r.get(field)
            text = _text(value)
            if f"{field}_lo" in r and f"{field}_hi" in r:
                text += f"（{_text(r[f'{field}_lo'])}–{_text(r[f'{field}_hi'])}）"
            cells.append(f"<td>{html.escape(text)}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    timed = any(f"{f}_lo" in r for f, _ in fields for r in data)
    note = "；括号内为去掉最快、最慢各六分之一重复后的范围" if timed else ""
    title = html.escape(f"{TABLE_SUMMARY}（{len(data)} 行{note}）")
    label = html.escape(caption) if caption else ""
    cap = f"<caption>{label}</caption>" if label else ""
    return (
        f'<details class="result-data"><summary>{title}</summary>'
        f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</details>"
    )


def _axis(spec: dict, channel: str) -> str | None:
    for ch, enc in _channels(spec):
        if ch == channel and (enc.get("title") or enc.get("field")):
            text = str(enc.get("title") or enc["field"])
            scale = enc.get("scale") or {}
            if isinstance(scale, dict) and scale.get("type") in ("log", "symlog"):
                text += "，对数刻度"
            elif enc.get("type") in ("nominal", "ordinal"):
                text += "，类别"
            return text
    return None


def describe(spec: dict, data: list[dict], caption: str) -> str:
    """A text alternative of a plot: what kind, its caption, both axes (their titles carry the
    units), how many series and how many points -- the rows of its data table."""
    marks = [p.get("mark") for p in _layers(spec) if p.get("mark")]
    types = [m.get("type") if isinstance(m, dict) else m for m in marks]
    kind = next((MARK_NAMES[t] for t in MARK_NAMES if t in types), "图")
    parts = [f"{kind}：{caption}" if caption else kind]
    for channel, name in (("x", "横轴"), ("y", "纵轴")):
        axis = _axis(spec, channel)
        if axis:
            parts.append(f"{name}：{axis}")
    folds = [t for t in _transforms(spec) if "fold" in t]
    color = next((enc for ch, enc in _channels(spec) if ch == "color" and "field" in enc), None)
    if folds:
        names = [str(f) for f in folds[0]["fold"]]
    elif color and any(color["field"] in r for r in data):
        names = list(dict.fromkeys(str(r.get(color["field"])) for r in data))
    else:
        names = []
    if len(names) > 1:
        by = f"按{color.get('title') or color['field']}分 " if color else ""
        shown = "、".join(names[:6]) + ("等" if len(names) > 6 else "")
        parts.append(f"{by}{len(names)} 个系列（{shown}）")
    parts.append(f"共 {len(data)} 个数据点，数值见图下的“{TABLE_SUMMARY}”")
    return "；".join(parts) + "。"


def plot(slug: str, d: cl.Directive, results: cl.Results, page, prov: bool = True) -> str:
    # in an attribute, not a <script type="application/json">: Material's instant navigation
    # re-creates every inline script without its type, and would run the JSON as JavaScript
    vega = vega_spec(slug, d, results)
    spec = html.escape(json.dumps(vega, ensure_ascii=False))
    text = str(d.spec.get("caption") or "")
    caption = html.escape(text)
    label = html.escape(describe(vega, vega["data"]["values"], text))
    parts = [f'<p class="result-caption"><strong>{caption}</strong></p>'] if caption else []
    parts.append(
        f'<div class="result-plot" role="img" aria-label="{label}" '
        f'data-result="{html.escape(d.name)}" data-spec="{spec}"></div>'
    )
    parts.append(data_table(vega, vega["data"]["values"], text))
    if d.spec.get("note"):
        parts.append(f'<p class="result-note">{html.escape(d.spec["note"])}</p>')
    if prov:
        parts.append(provenance_line([results.record(slug, d.name)], page))
    return "\n\n".join(parts)


def claim(d: cl.Directive) -> str:
    title = f"已断言：{d.text}（每次构建与每次 GPU 运行都对照结果检查，按区间不利的一端判断）"
    return f'<span class="claim" title="{html.escape(title)}">✓</span>'


PENDING_TITLE = "待 GPU 测量"


def pending_block(d: cl.Directive, slug: str) -> str:
    """A table or plot of a post awaiting a GPU run: what it will show, and how to produce it."""
    what = {"table": "表", "plot": "图"}[d.kind]
    caption = html.escape(str(d.spec.get("caption") or d.name))
    return _pending_box(
        f"{what}：{caption}。数据 <code>results/{slug}/{html.escape(d.name)}.json</code> "
        f"尚未由当前代码生成，运行 <code>nox -s gpu_docs -- {slug}</code> 后显示。"
    )


def _pending_box(body: str) -> str:
    return (
        f'<div class="admonition warning pending"><p class="admonition-title">{PENDING_TITLE}'
        f"</p><p>{body}</p></div>\n"
    )


def pending_banner(slug: str, reason: str) -> str:
    text = (
        f"本页的 GPU 实测数据尚未由当前代码生成：{reason}。"
        "依赖这些测量的表、图和数字暂缺（标“待测”），"
        f"上标“待”的论断尚未对照当前代码的测量核实（运行 <code>nox -s gpu_docs -- {slug}</code>）；"
        "CPU 上算出的记录照常显示、照常核对。"
    )
    return _pending_box(text)


def pending_claim(d: cl.Directive) -> str:
    title = f"待核实：{d.text}（本文的测量尚未由当前代码生成）"
    return f'<span class="claim pending" title="{html.escape(title)}">待</span>'


def on_page_markdown(markdown: str, page, config, files) -> str:
    path = ROOT / "docs" / page.file.src_uri
    slug = cl.slug_of(path)
    results = cl.Results(pending=PENDING)
    where = f"docs/{page.file.src_uri}"
    source = path.read_text(encoding="utf-8") if path.is_file() else markdown
    shift = source[: source.find(markdown)].count("\n") if markdown in source else 0  # front matter
    try:
        found = cl.directives(path, markdown)
    except (cl.SpecError, cl.markup.PageError) as exc:
        raise PluginError(str(exc)) from None
    out, last, shown = [], 0, set()
    for d in found:
        try:
            problem = cl.check_directive(slug, d, results)
            if problem:
                raise cl.SpecError(problem)
            if d.kind == "number":
                text = number(cl.resolve(slug, d.name, d.text, results), d.fmt)
            elif d.kind in ("table", "plot"):  # the provenance line once per result
                render = table if d.kind == "table" else plot
                text = render(slug, d, results, page, d.name not in shown) + "\n"
                shown.add(d.name)
            else:
                text = claim(d)
        except cl.Pending:
            problem = cl.spec_problem(d)
            if problem:
                raise PluginError(f"{where}:{d.line + shift}: {problem}") from None
            if d.kind == "number":
                text = '<span class="pending" title="待 GPU 测量">（待测）</span>'
            elif d.kind == "claim":
                text = pending_claim(d)
            else:
                text = pending_block(d, slug)
        except cl.SpecError as exc:
            hint = (
                f" (produce it with `{refresh_command(slug)}`)"
                if "no such result" in str(exc)
                else ""
            )
            raise PluginError(f"{where}:{d.line + shift + exc.offset}: {exc}{hint}") from None
        out += [markdown[last : d.start], text]
        last = d.end
    markdown = "".join([*out, markdown[last:]])
    if slug in PENDING and path.parent.name == "posts":  # under the page title (hooks/posts.py
        # puts the "last verified" line above it)
        line = pending_banner(slug, html.escape(cl.markup.post_meta(path).awaiting_gpu or ""))
        head, sep, rest = markdown.partition("\n")
        markdown = f"{head}{sep}\n{line}\n{rest}"
    return markdown
