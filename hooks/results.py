"""Render GPU results (results/<slug>/<name>.json) into pages at build time, on the CPU.

In a page docs/posts/<slug>.md:
  <!-- result: table NAME -->   a table, the provenance line and a link to the raw JSON
  <!-- result: plot NAME -->    an SVG plot of the result's "plot" spec(s), with provenance
  {{ NAME:key }} / {{ NAME:key:.1f }}   a number from the result's "values", inline
A missing result or key fails the build with the page, the line and the refresh command.
"""

from __future__ import annotations

import html
import math
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import results as res  # noqa: E402


def on_files(files: Files, config) -> Files:
    for path in sorted((ROOT / "results").rglob("*.json")):
        uri = path.relative_to(ROOT).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def _slug(page) -> str:
    return Path(page.file.src_uri).stem


def _load(page, name: str, line: int) -> dict:
    path = res.result_path(_slug(page), name)
    try:
        return res.load_result(path)
    except res.ResultError as exc:
        raise PluginError(
            f"docs/{page.file.src_uri}:{line}: result {name!r}: {exc}; produce it on a GPU "
            f"with `{res.refresh_command(_slug(page))}`"
        ) from None


def _fmt(value, fmt: str | None) -> str:
    if value is None:
        return "—"
    if fmt:
        return format(value, fmt)
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def provenance_line(record: dict, page) -> str:
    p = record["provenance"]
    uri = f"results/{record['slug']}/{record['name']}.json"
    href = get_relative_url(uri, page.url)
    parts = [
        f"实测于 {p['gpu']}",
        f"驱动 {p['driver']}",
        f"CUDA {p['cuda']}",
        f"torch {p['torch']}",
        f"triton {p['triton']}",
        p["date"],
        f"commit {p['commit']}",
    ]
    text = " · ".join(html.escape(str(x)) for x in parts)
    return f'<p class="provenance">{text} · <a href="{href}" download>原始数据 JSON</a></p>'


def _is_text(rows: list[dict], key: str) -> bool:
    return any(isinstance(r.get(key), str) for r in rows)


def table(record: dict, page) -> str:
    spec = record.get("table")
    if not spec:
        raise KeyError("table")
    cols = spec["columns"]
    for c in cols:  # a column may be sparse (shown as "—"), but not absent from every row
        if not any(c["key"] in row for row in spec["rows"]):
            raise KeyError(c["key"])
    lines = [
        f"**{record['title']}**",
        "",
        "| " + " | ".join(c["label"] for c in cols) + " |",
        "|" + "".join(":---|" if _is_text(spec["rows"], c["key"]) else "---:|" for c in cols),
    ]
    for row in spec["rows"]:
        cells = (_fmt(row.get(c["key"]), c.get("format")) for c in cols)
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"计算模型：{record['model']}", "", provenance_line(record, page)]
    return "\n".join(lines)


def _text(x: float, y: float, text: str, size: int = 12, rotate: bool = False) -> str:
    turn = f' transform="rotate(-90 {x:.1f} {y:.1f})"' if rotate else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}"{turn} text-anchor="middle" font-size="{size}" '
        f'fill="currentColor">{html.escape(text)}</text>'
    )


def _framed(spec: dict, w: int, h: int, left: int, bottom: int, top: int, right: int,
            x_label: str | None = None) -> list[str]:  # fmt: skip
    """An SVG's opening, the plot area's frame and both axis labels."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="{html.escape(spec["y_label"])}" class="result-svg">',
        f'<rect x="{left}" y="{top}" width="{w - left - right}" height="{h - top - bottom}" '
        'fill="none" stroke="currentColor" stroke-opacity="0.4"/>',
        _text(14, (h - bottom + top) / 2, spec["y_label"], rotate=True),
        _text((w - right + left) / 2, h - 6, x_label or spec["x_label"]),
    ]


def svg_bars(rows: list[dict], spec: dict) -> str:
    """A bar chart: one bar per row, y = spec['y'], labelled by spec['x']. Theme colours."""
    w, h, left, bottom, top = 640, 260, 60, 40, 20
    ys = [float(r[spec["y"]]) for r in rows]
    ymax = max(ys) * 1.15 or 1.0
    step = (w - left - 10) / len(rows)
    bar = step * 0.6
    base = h - bottom
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="{html.escape(spec["y_label"])}" class="result-svg">',
        f'<line x1="{left}" y1="{base}" x2="{w - 10}" y2="{base}" stroke="currentColor"/>',
        _text(14, (base + top) / 2, spec["y_label"], rotate=True),
        _text((w + left) / 2, h - 4, spec["x_label"]),
    ]
    for i, (row, y) in enumerate(zip(rows, ys, strict=True)):
        x = left + i * step + (step - bar) / 2
        bh = (base - top) * y / ymax
        parts += [
            f'<rect x="{x:.1f}" y="{base - bh:.1f}" width="{bar:.1f}" height="{bh:.1f}" '
            'fill="var(--md-primary-fg-color)"/>',
            _text(x + bar / 2, base - bh - 4, f"{y:.3g}", size=11),
            _text(x + bar / 2, base + 16, str(row[spec["x"]])),
        ]
    parts.append("</svg>")
    return "".join(parts)


def svg_roofline(rows: list[dict], spec: dict) -> str:
    """Log-log roofline: min(peak, bandwidth x intensity), and one labelled point per row."""
    w, h, left, bottom, top, right = 640, 320, 64, 44, 16, 16
    xs = [float(r[spec["x"]]) for r in rows]
    ys = [float(r[spec["y"]]) for r in rows]
    peak, bw = spec["peak_tflops"], spec["bandwidth_tb_s"]
    x_lo, x_hi = math.log10(min(xs) / 2), math.log10(max(max(xs), peak / bw) * 2)
    y_lo, y_hi = math.log10(max(min(ys), 1e-3) / 2), math.log10(peak * 2)

    def px(x):
        return left + (math.log10(x) - x_lo) / (x_hi - x_lo) * (w - left - right)

    def py(y):
        return h - bottom - (math.log10(max(y, 1e-9)) - y_lo) / (y_hi - y_lo) * (h - bottom - top)

    ridge = peak / bw
    roof = [(10**x_lo, bw * 10**x_lo), (ridge, peak), (10**x_hi, peak)]
    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in roof)
    parts = [
        *_framed(spec, w, h, left, bottom, top, right),
        f'<polyline points="{line}" fill="none" stroke="currentColor" stroke-width="2"/>',
        _text(px(ridge), py(peak) - 6, f"脊点 {ridge:.0f} FLOP/B", size=11),
    ]
    for exp in range(math.ceil(x_lo), math.floor(x_hi) + 1):
        parts.append(_text(px(10**exp), h - bottom + 16, f"1e{exp}", size=10))
    for exp in range(math.ceil(y_lo), math.floor(y_hi) + 1):
        parts.append(_text(left - 20, py(10**exp) + 4, f"1e{exp}", size=10))
    for row, x, y in zip(rows, xs, ys, strict=True):
        parts += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="var(--md-primary-fg-color)"/>',
            _text(px(x) + 9, py(y) + 4, str(row[spec["label"]]), size=10),
        ]
    parts.append("</svg>")
    return "".join(parts)


SERIES_COLOURS = ("var(--md-primary-fg-color)", "var(--md-accent-fg-color)", "currentColor")


def svg_series(rows: list[dict], spec: dict) -> str:
    """Rows that share a label form one series: a line through its points (sorted by x), named
    once at its last point. x is on a log2 axis when it spans a factor of 16 or more."""
    w, h, left, bottom, top, right = 640, 320, 64, 44, 16, 150
    series: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        series.setdefault(str(r[spec["label"]]), []).append(
            (float(r[spec["x"]]), float(r[spec["y"]]))
        )
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts]
    log = min(xs) > 0 and max(xs) / min(xs) >= 16
    tx = math.log2 if log else float
    x_lo, x_hi = (tx(min(xs)), tx(max(xs))) if log else (0.0, max(xs) * 1.05 or 1.0)
    y_hi = max(ys) * 1.1 or 1.0

    def px(x):
        return left + (tx(x) - x_lo) / ((x_hi - x_lo) or 1.0) * (w - left - right)

    def py(y):
        return h - bottom - y / y_hi * (h - bottom - top)

    parts = _framed(
        spec, w, h, left, bottom, top, right, spec["x_label"] + ("（对数轴）" if log else "")
    )
    ticks = sorted({x for x in xs}) if log else [x_hi * i / 4 for i in range(5)]
    for x in ticks:
        parts.append(_text(px(x), h - bottom + 16, f"{x:.3g}", size=10))
    for i in range(5):
        parts.append(_text(left - 22, py(y_hi * i / 4) + 4, f"{y_hi * i / 4:.3g}", size=10))
    for k, (name, pts) in enumerate(series.items()):
        colour = SERIES_COLOURS[k % len(SERIES_COLOURS)]
        pts.sort()
        line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
        parts += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{colour}"/>' for x, y in pts
        ]
        x, y = pts[-1]
        parts.append(_text(px(x) + 8, py(y) + 4, name, size=11))
    parts.append("</svg>")
    return "".join(parts)


def svg_scatter(rows: list[dict], spec: dict) -> str:
    """Linear x-y scatter, one labelled point per row. Rows whose spec['front'] key is true are
    filled and joined by a line (a Pareto front); others are hollow. The row whose
    spec['highlight'] key is true gets a ring."""
    labels = [str(r[spec["label"]]) for r in rows]
    if all(labels) and len(set(labels)) < len(labels):  # repeated labels: one line per series
        return svg_series(rows, spec)
    w, h, left, bottom, top, right = 640, 320, 64, 44, 16, 24
    xs = [float(r[spec["x"]]) for r in rows]
    ys = [float(r[spec["y"]]) for r in rows]
    x_hi = max(xs) * 1.1 or 1.0
    spread = (max(ys) - min(ys)) or abs(max(ys)) or 1.0  # y zoomed to the data, not from 0
    y_lo, y_hi = min(ys) - 0.15 * spread, max(ys) + 0.15 * spread

    def px(x):
        return left + x / x_hi * (w - left - right)

    def py(y):
        return h - bottom - (y - y_lo) / (y_hi - y_lo) * (h - bottom - top)

    front = sorted((x, y) for r, x, y in zip(rows, xs, ys, strict=True) if r.get(spec.get("front")))
    line = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in front)
    parts = [
        *_framed(spec, w, h, left, bottom, top, right),
        f'<polyline points="{line}" fill="none" stroke="var(--md-primary-fg-color)" '
        'stroke-dasharray="4 3"/>',
    ]
    for i in range(5):  # ticks at 0, 1/4, ..., 1 of each axis
        parts.append(_text(px(x_hi * i / 4), h - bottom + 16, f"{x_hi * i / 4:.3g}", size=10))
        y_tick = y_lo + (y_hi - y_lo) * i / 4
        parts.append(_text(left - 22, py(y_tick) + 4, f"{y_tick:.3g}", size=10))
    for row, x, y in zip(rows, xs, ys, strict=True):
        fill = "var(--md-primary-fg-color)" if row.get(spec.get("front")) else "none"
        parts += [
            f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="4" fill="{fill}" '
            'stroke="var(--md-primary-fg-color)" stroke-width="1.5"/>',
            _text(px(x) + 9, py(y) + 4, str(row[spec["label"]]), size=10),
        ]
        if row.get(spec.get("highlight")):
            parts.append(
                f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="9" fill="none" '
                'stroke="currentColor" stroke-width="1.5"/>'
            )
    parts.append("</svg>")
    return "".join(parts)


def plot(record: dict, page) -> str:
    specs = record.get("plot")
    if not specs:
        raise KeyError("plot")
    specs = specs if isinstance(specs, list) else [specs]
    rows = record["table"]["rows"]
    draw = {"bars": svg_bars, "roofline": svg_roofline, "scatter": svg_scatter}
    figures = [
        f'<div class="result-plot">{draw[s.get("kind", "bars")](rows, s)}</div>' for s in specs
    ]
    return "\n\n".join([*figures, provenance_line(record, page)])


RENDER = {"table": table, "plot": plot}


def verified_line(records: list[dict]) -> str:
    """The page's "last verified on a GPU" line, from its newest result."""
    p = max((r["provenance"] for r in records), key=lambda p: p["date"])
    text = f"本页的 GPU 测量最近一次运行于 {p['gpu']}：{p['date']}（commit {p['commit']}）"
    return f'<p class="provenance">{html.escape(text)}</p>'


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = f"docs/{page.file.src_uri}"
    out = []
    last = 0
    records = []
    for m in res.references(markdown):
        line = markdown.count("\n", 0, m.start()) + 1
        record = _load(page, m["name"], line)
        records.append(record)
        try:
            if m.re is res.BLOCK:
                text = RENDER[m["kind"]](record, page)
            else:
                text = _fmt(res.lookup(record, m["key"]), m["fmt"])
        except (KeyError, ValueError) as exc:
            raise PluginError(f"{where}:{line}: result {m['name']!r}: no {exc} in it") from None
        out += [markdown[last : m.start()], text]
        last = m.end()
    markdown = "".join([*out, markdown[last:]])
    if records:  # under the page title
        head, sep, rest = markdown.partition("\n")
        markdown = f"{head}{sep}\n{verified_line(records)}\n{rest}"
    return markdown
