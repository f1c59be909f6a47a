"""Interactive result plots: a plot with a legend of series toggles them from the legend
(hooks/results.py legend_toggle), and every plot shows its values on hover, on every page."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest

from tests.e2e import checks

pytestmark = pytest.mark.browser

LEGEND = (checks.JS / "legend.js").read_text(encoding="utf-8")
HOVER = (checks.JS / "hover.js").read_text(encoding="utf-8")
SPEC = re.compile(r'class="result-plot"[^>]*data-spec="([^"]*)"')


def legend_pages(site_dir) -> list[str]:
    """Pages with a plot that has a nominal legend channel (the built spec says so)."""
    out = []
    for path in checks.built_pages(site_dir):
        html = (site_dir / path / "index.html").read_text(encoding="utf-8")
        if 'class="result-plot"' in html and "&quot;type&quot;: &quot;nominal&quot;" in html:
            out.append(path)
    return out


def toggle_problems(page) -> tuple[int, list[str]]:
    """(plots with a legend of two or more entries, what is wrong with them): no legend label
    cut short, and clicking a plot's first legend entry must keep that series' marks opaque
    and dim others."""
    problems, tried = [], 0
    for index in range(page.locator(".result-plot").count()):
        before = page.evaluate(LEGEND, {"index": index})
        if before["entries"] < 2:
            continue
        tried += 1
        where = f"plot {index + 1}"
        if before["truncated"]:  # Vega cuts a label past its labelLimit: series look alike
            problems.append(f"{where}: legend labels cut short: {before['truncated']}")
        page.locator(".result-plot").nth(index).locator(".role-legend-symbol path").first.click(
            force=True  # without a legend binding Vega leaves the symbol inert: click it anyway
        )
        page.wait_for_timeout(200)  # Vega re-renders on its next animation frame
        after = page.evaluate(LEGEND, {"index": index})
        label = after["label"]
        if len(after["marks"]) != len(before["marks"]):
            problems.append(f"{where}: {len(before['marks'])} marks became {len(after['marks'])}")
            continue
        pairs = list(zip(before["marks"], after["marks"], strict=True))
        dimmed = [a for b, a in pairs if a["opacity"] < b["opacity"]]  # marks have own opacities
        kept = [a for b, a in pairs if a["opacity"] == b["opacity"] and f": {label}" in a["aria"]]
        if not dimmed:
            problems.append(f"{where}: clicking legend entry {label!r} dimmed no mark")
        if not kept:
            problems.append(f"{where}: after clicking {label!r}, none of its marks kept its look")
        wrong = [m["aria"] for m in dimmed if m["aria"].endswith(f": {label}")]
        if wrong:
            problems.append(f"{where}: marks of the clicked series {label!r} dimmed: {wrong[:2]}")
    return tried, problems


def test_clicking_a_legend_entry_shows_that_series_alone(visitor, site_dir):
    pages = legend_pages(site_dir)
    assert pages, "no built page has a plot with a nominal legend channel"
    problems, tried = [], 0
    for path in pages:
        page, guard = visitor.open(path)
        try:
            n, found = toggle_problems(page)
            tried += n
            found += guard.console_problems()
            if found:
                name = f"legend-{checks.page_id(path).replace('/', '-')}.png"
                found.append(f"[screenshot: {visitor.screenshot(page, name)}]")
            problems += [f"{checks.page_id(path)}: {p}" for p in found]
        finally:
            page.close()
    assert tried, f"no plot on {pages} drew a legend of two or more entries"
    assert not problems, "\n" + "\n".join(problems)


def y_names(spec: dict) -> tuple[set[str], set[str]]:
    """(titles, fields) of a plot's y encodings: what its tooltip must name. A title is the
    axis title, or the one a tooltip the page wrote gives the field."""
    encodings = [part.get("encoding") or {} for part in [spec, *spec.get("layer", [])]]
    titles, fields = set(), set()
    for enc in encodings:
        y = enc.get("y")
        if isinstance(y, dict) and "field" in y:
            fields.add(y["field"])
            titles.add(str(y.get("title") or y["field"]))
    for enc in encodings:
        tips = enc.get("tooltip") if isinstance(enc.get("tooltip"), list) else []
        titles |= {str(t["title"]) for t in tips if t.get("field") in fields and "title" in t}
    return titles, fields


def shows_records(spec: dict) -> bool:
    """Whether a layer asks for the whole record as its tooltip (keys are field names)."""
    marks = [part.get("mark") for part in [spec, *spec.get("layer", [])]]
    return any(isinstance(m, dict) and m.get("tooltip") == {"content": "data"} for m in marks)


def test_every_plot_shows_its_values_on_hover(visitor, site_dir):
    """Hovering the data marks of each plot shows vega-embed's tooltip naming the plotted value
    by its axis title (hooks/results.py: Vega-Lite's "encoding" tooltip), or by its field where
    the page asked for the whole record."""
    plots = {}
    for path in checks.built_pages(site_dir):
        html = (site_dir / path / "index.html").read_text(encoding="utf-8")
        specs = [json.loads(unescape(m)) for m in SPEC.findall(html)]
        if specs:
            plots[path] = specs
    assert plots, "no built page has a plot"
    problems, titled = [], 0
    for path, specs in plots.items():
        page, guard = visitor.open(path)
        try:
            for index, spec in enumerate(specs):
                keys = None
                for x, y in page.evaluate(HOVER, {"index": index, "step": "marks"}):
                    page.mouse.move(x, y)
                    page.wait_for_timeout(100)
                    keys = page.evaluate(HOVER, {"index": index, "step": "tooltip"})
                    if keys:
                        break
                where = f"{checks.page_id(path)} plot {index + 1}"
                titles, fields = y_names(spec)
                names = titles | fields if shows_records(spec) else titles
                titled += not shows_records(spec)
                if not keys:
                    problems.append(f"{where}: no tooltip on hovering its marks")
                elif not any(k.startswith(tuple(names)) for k in keys):  # "title（范围下端）"
                    problems.append(f"{where}: tooltip {keys} names none of {sorted(names)}")
            problems += [f"{checks.page_id(path)}: {p}" for p in guard.console_problems()]
        finally:
            page.close()
    assert titled, "every plot shows whole records on hover: none names its values by title"
    assert not problems, "\n" + "\n".join(problems)
