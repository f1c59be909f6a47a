"""Interactive result plots: a plot with a legend of series toggles them from the legend
(hooks/results.py legend_toggle), on every page that has one."""

from __future__ import annotations

import pytest

from tests.e2e import checks

pytestmark = pytest.mark.browser

LEGEND = (checks.JS / "legend.js").read_text(encoding="utf-8")


def legend_pages(site_dir) -> list[str]:
    """Pages with a plot that has a nominal legend channel (the built spec says so)."""
    out = []
    for path in checks.built_pages(site_dir):
        html = (site_dir / path / "index.html").read_text(encoding="utf-8")
        if 'class="result-plot"' in html and "&quot;type&quot;: &quot;nominal&quot;" in html:
            out.append(path)
    return out


def toggle_problems(page) -> tuple[int, list[str]]:
    """(plots with a legend of two or more entries, what is wrong with their toggling): clicking
    a plot's first legend entry must keep that series' marks opaque and dim others."""
    problems, tried = [], 0
    for index in range(page.locator(".result-plot").count()):
        before = page.evaluate(LEGEND, {"index": index})
        if before["entries"] < 2:
            continue
        tried += 1
        where = f"plot {index + 1}"
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
