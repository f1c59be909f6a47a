"""The built site in headless Chromium, the way a reader uses it.

Every page is loaded four ways -- light and dark palette, each by a direct load and by an instant
navigation (nav click) from another page -- and every load is checked for diagrams, formulas,
foreign requests, console errors and copy buttons. Failures name the page, the load and the
problem, and point at a screenshot.
"""

from __future__ import annotations

import re
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.e2e import checks

pytestmark = pytest.mark.browser

LOADS = [("light", "direct"), ("dark", "direct"), ("light", "instant"), ("dark", "instant")]
SCREENSHOT_POST = "posts/gradient-accumulation/"  # saved in light and dark on every run
# Chinese domain terms and the page that must come first (损失缩放 is left out of
# data/jieba_user_dict.txt on purpose: see docs/contributing.md, 站点资源).
SEARCHES = {
    "梯度累积": "posts/gradient-accumulation/",  # gradient accumulation
    "混合精度": "posts/gradient-accumulation/",  # mixed precision
    "损失缩放": "posts/gradient-accumulation/",  # loss scaling
}
SEARCH_IDS = ["gradient-accumulation", "mixed-precision", "loss-scaling"]


def posts() -> list[str]:
    return [p for p in checks.source_pages(checks.ROOT / "docs") if p.startswith("posts/")]


@pytest.fixture(scope="session")
def page_visits(visitor):
    """All four loads of a page, done once per page and shared by the checks below."""
    cache: dict[str, list[checks.Visit]] = {}
    pages = checks.site_pages()

    def get(path: str) -> list[checks.Visit]:
        if path not in cache:
            other = "" if path else next((p for p in pages if p), "")
            cache[path] = [
                visitor.visit(path, scheme, via, first_from=other) for scheme, via in LOADS
            ]
        return cache[path]

    return get


def report(visits: list[checks.Visit], *check_names: str) -> str:
    return "\n".join(m for v in visits for m in v.messages(*check_names))


def test_mermaid_renders(page_visits, page_path):
    """Every diagram is an SVG with no mermaid error, light and dark, direct and instant."""
    problems = report(page_visits(page_path), "mermaid")
    assert not problems, "\n" + problems


def test_formulas_typeset(page_visits, page_path):
    """Every .arithmatex holds KaTeX output; no raw \\( \\[ $$ left; no .katex-error."""
    problems = report(page_visits(page_path), "katex")
    assert not problems, "\n" + problems


def test_plots_render(page_visits, page_path):
    """Every result plot is drawn by the vendored vega-embed, light and dark, direct and instant."""
    problems = report(page_visits(page_path), "plots")
    assert not problems, "\n" + problems


def test_no_foreign_requests_no_console_errors(page_visits, page_path):
    """Only 127.0.0.1 is contacted (others are blocked and reported); no console/page errors."""
    problems = report(page_visits(page_path), "network", "console")
    assert not problems, "\n" + problems


def test_code_blocks_have_copy_buttons(page_visits, page_path):
    problems = report(page_visits(page_path), "copy")
    assert not problems, "\n" + problems


def test_every_built_page_is_tested(site_dir):
    """The parametrization above covers exactly the pages of the built site."""
    built = set(checks.built_pages(site_dir))
    tested = set(checks.site_pages())
    assert built == tested, (
        f"built but not tested: {sorted(built - tested)}; tested but not built: "
        f"{sorted(tested - built)}"
    )


VEGA_FILES = [f"assets/vendor/vega/{name}.min.js" for name in ("vega", "vega-lite", "vega-embed")]
LIBRARIES = {  # library: (what in a built page needs it, the files it loads then)
    "mermaid": ('<pre class="mermaid"', ["assets/vendor/mermaid/mermaid.min.js"]),
    "vega": ('class="result-plot"', VEGA_FILES),
    "katex": (
        'class="arithmatex"',
        ["assets/vendor/katex/katex.min.js", "assets/vendor/katex/contrib/auto-render.min.js"],
    ),
    "calculator": (' data-calculator="', ["assets/calculator.js", "assets/calculator.css"]),
}


STYLED = """() => [...document.querySelectorAll("form.calc fieldset")]
    .every((f) => getComputedStyle(f).borderTopStyle === "solid")"""


def test_libraries_and_calculators_load_only_on_pages_that_use_them(visitor, site_dir):
    """mermaid (3.5 MB), Vega (0.8 MB), KaTeX (0.3 MB) and the site's calculator.js and .css are
    requested only by a page with a diagram, a plot, a formula or a calculator
    (docs/assets/loader.js), and are when an instant navigation reaches one from a page without.
    One page of each combination, loaded directly; then instant navigations from a page that uses
    none of them to the fewest pages that together use all."""
    uses: dict[str, frozenset[str]] = {}
    for path in checks.built_pages(site_dir):
        text = (site_dir / path / "index.html").read_text(encoding="utf-8")
        uses[path] = frozenset(lib for lib, (needs, _) in LIBRARIES.items() if needs in text)
    first: dict[frozenset[str], str] = {}
    for path, libs in uses.items():
        first.setdefault(libs, path)
    plain = first.get(frozenset())
    targets: list[str] = []
    covered: frozenset[str] = frozenset()
    while plain is not None and covered != frozenset(LIBRARIES):
        best = max(first.values(), key=lambda p: len(uses[p] - covered))
        if not uses[best] - covered:
            break
        targets.append(best)
        covered |= uses[best]
    assert plain is not None and covered == frozenset(LIBRARIES), (
        f"no page uses none of {sorted(LIBRARIES)}, or no pages together use all: {uses}"
    )
    every = {f for _, files in LIBRARIES.values() for f in files}
    problems: list[str] = []

    def check(page, guard, path: str, how: str) -> None:
        want = sorted(f for lib in uses[path] for f in LIBRARIES[lib][1])
        got = sorted({visitor.path_of(url) for url in guard.requests} & every)
        if got != want:
            problems.append(f"{checks.page_id(path)} ({how}): requested {got}, want {want}")
        found = checks.check_mermaid(page) + checks.check_plots(page) + checks.check_katex(page)
        found += checks.check_calculators(page)
        if "calculator" in uses[path]:  # calculator.css styles the forms (Chromium's fieldset
            try:  # border is "groove" without it)
                page.wait_for_function(STYLED, timeout=checks.READY_TIMEOUT_MS)
            except Exception:
                found.append("calculator.css never styled the calculator forms")
        found += guard.network_problems() + guard.console_problems()
        problems.extend(f"{checks.page_id(path)} ({how}): {p}" for p in found)

    for path in first.values():
        page, guard = visitor.open(path)
        try:
            check(page, guard, path, "direct load")
        finally:
            page.close()
    for target in targets:
        page, guard = visitor.open(plain)
        try:
            guard.reset()
            how = f"instant navigation from {checks.page_id(plain)}"
            problems.extend(checks.navigate_instantly(page, visitor.url(target)))
            checks.wait_ready(page)
            check(page, guard, target, how)
            if problems:
                name = f"libraries-on-demand-{checks.page_id(target).replace('/', '-')}.png"
                problems.append(f"[screenshot: {visitor.screenshot(page, name, full_page=False)}]")
        finally:
            page.close()
    assert not problems, "\n" + "\n".join(problems)


@pytest.mark.parametrize("term", list(SEARCHES), ids=SEARCH_IDS)
def test_search_finds_the_right_page_first(visitor, term):
    page, _ = visitor.open("")
    try:
        try:
            results = checks.search(page, term)
        except Exception as exc:
            results = []
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        else:
            error = ""
        want = visitor.url(SEARCHES[term])
        if not results or results[0] != want:
            name = f"search-{SEARCH_IDS[list(SEARCHES).index(term)]}.png"
            shot = visitor.screenshot(page, name, full_page=False)
            pytest.fail(
                f"search {term!r} on the home page: first result {results[:1]}, want {want} "
                f"(all results: {results}) {error} [screenshot: {shot}]"
            )
    finally:
        page.close()


def test_nav_reaches_every_post(visitor):
    page, _ = visitor.open("")
    try:
        hrefs = page.locator("nav.md-nav--primary a.md-nav__link").evaluate_all(
            "(as) => as.map((a) => a.href.split('#')[0])"
        )
        missing = [p for p in posts() if visitor.url(p) not in hrefs]
        if missing:
            shot = visitor.screenshot(page, "index-nav.png", full_page=False)
            pytest.fail(f"index: the nav has no link to {missing} [screenshot: {shot}]")
    finally:
        page.close()
    assert posts(), "no docs/posts/*.md found"


def test_footer_and_home_lead_through_the_series(visitor):
    """A reader walks the series: the home page's list gives each post its status, and the
    footer's next / previous links of a post lead to its neighbours in series order."""
    from snippets.common import markup

    order = [m.slug for m in markup.series(checks.ROOT)]
    assert len(order) >= 3, order
    problems = []
    page, guard = visitor.open("")
    try:
        statuses = page.locator("article table tbody tr").evaluate_all(
            "(rows) => rows.map((r) => r.lastElementChild.innerText.trim())"
        )
        status = re.compile(r"待 GPU 测量|GPU 实测 \d{4}-\d\d-\d\d|CPU 上验证")
        if len(statuses) != len(order) or not all(status.fullmatch(s) for s in statuses):
            problems.append(f"index: status cells {statuses} for {len(order)} posts")
        problems += guard.network_problems() + guard.console_problems()
    finally:
        page.close()
    page, guard = visitor.open(f"posts/{order[1]}/")
    try:
        for kind, slug in (("next", order[2]), ("prev", order[1])):
            link = page.locator(f"a.md-footer__link--{kind}")
            if not link.count():
                problems.append(f"{page.url}: no {kind} link in the footer")
                break
            link.click()
            try:
                page.wait_for_url(visitor.url(f"posts/{slug}/"), timeout=checks.READY_TIMEOUT_MS)
            except Exception:
                problems.append(f"the footer's {kind} link led to {page.url}, not posts/{slug}/")
                break
            checks.wait_ready(page)
        problems += guard.network_problems() + guard.console_problems()
        if problems:
            shot = visitor.screenshot(page, "footer.png", full_page=False)
            problems.append(f"[screenshot: {shot}]")
    finally:
        page.close()
    assert not problems, "\n".join(problems)


def test_404_page(visitor, site_dir):
    assert (site_dir / "404.html").exists(), f"{site_dir}/404.html was not built"
    missing = visitor.url("no-such-page/")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(missing, timeout=10)
    assert info.value.code == 404, f"{missing}: HTTP {info.value.code}, want 404"
    # http.server does not send 404.html for a 404; open it directly (it links its assets
    # absolutely, under the site_url path, as it is served on the real host).
    page, guard = visitor.open("404.html")
    try:
        heading = page.locator(".md-content h1").first.inner_text()
        styled = page.evaluate(
            "!!document.querySelector('.md-header') && "
            "getComputedStyle(document.querySelector('.md-header')).position"
        )
        problems = []
        if "404" not in heading:
            problems.append(f"404.html: heading {heading!r} does not say 404")
        if styled not in ("sticky", "fixed"):
            problems.append("404.html: Material's stylesheet is not applied (header not sticky)")
        problems += [f"404.html: {p}" for p in guard.network_problems() + guard.console_problems()]
        if problems:
            shot = visitor.screenshot(page, "404-page.png")
            pytest.fail("\n".join(problems) + f"\n[screenshot: {shot}]")
    finally:
        page.close()


def test_post_screenshots(visitor):
    """Light and dark screenshots of one post, for a person to look at (not committed)."""
    post = SCREENSHOT_POST if SCREENSHOT_POST in posts() else (posts() or [None])[0]
    if post is None:
        pytest.skip("no post to screenshot")
    slug = post.strip("/").split("/")[-1]
    for scheme in ("light", "dark"):
        page, _ = visitor.open(post, scheme)
        try:
            assert not checks.check_scheme(page, scheme)
            path = visitor.screenshot(page, f"{slug}-{scheme}.png")
            # a second, viewport-sized shot with the first diagram in view
            diagram = page.locator("div.mermaid").first
            if diagram.count():
                diagram.scroll_into_view_if_needed()
                visitor.screenshot(page, f"{slug}-{scheme}-diagram.png", full_page=False)
        finally:
            page.close()
        assert path.stat().st_size > 10_000, f"{path} looks empty"
        print(f"screenshot: {path}")


def test_chinese_text_has_a_font():
    """Chromium finds its fonts through fontconfig: without a CJK font, Chinese shows as boxes."""
    try:
        fonts = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.fail("fc-list is missing (fontconfig): Chromium cannot have found a CJK font")
    assert fonts.stdout.strip(), (
        "no font covers Chinese (fc-list :lang=zh is empty): pages and screenshots show boxes; "
        "`apt-get install -y --no-install-recommends fonts-noto-cjk` (nox -s e2e does it as root)"
    )


def test_a_plot_opens_as_its_data_table(visitor, site_dir):
    """The first plot of the site, as a reader without the chart meets it: the box is an image
    with a description, and its "数据表" disclosure opens to a table of one row per point."""
    built = {
        p: (site_dir / p / "index.html").read_text("utf-8") for p in checks.built_pages(site_dir)
    }
    pages = [p for p, html in built.items() if 'class="result-plot"' in html]
    assert pages, "no page of the built site has a plot"
    page, guard = visitor.open(pages[0])
    problems = []
    try:
        box = page.locator(".result-plot").first
        n = box.evaluate("(b) => JSON.parse(b.dataset.spec).data.values.length")
        label = box.get_attribute("aria-label") or ""
        if box.get_attribute("role") != "img" or f"共 {n} 个数据点" not in label:
            problems.append(f"plot box: role {box.get_attribute('role')!r}, label {label!r}")
        details = page.locator("details.result-data").first
        table = details.locator("table")
        if table.is_visible():
            problems.append("the data table shows before its disclosure is opened")
        details.locator("summary").click()
        if not details.evaluate("(d) => d.open") or not table.is_visible():
            problems.append("clicking 数据表 did not show the table")
        rows = table.locator("tbody tr").count()
        if rows != n:
            problems.append(f"the table shows {rows} rows for {n} data points")
        problems += guard.network_problems() + guard.console_problems()
        if problems:
            shot = visitor.screenshot(page, "plot-data-table.png", full_page=False)
            pytest.fail(f"{pages[0]}: " + "; ".join(problems) + f" [screenshot: {shot}]")
        details.scroll_into_view_if_needed()
        visitor.screenshot(page, "plot-data-table.png", full_page=False)
    finally:
        page.close()


HEAD_POST = "gradient-checkpointing"  # has GPU measurements and cells that need CUDA


def test_post_head_and_downloads(visitor):
    """One post's head as a reader sees it: the reading time (its rate on hover), the "last
    verified" line of its newest GPU measurement, and two buttons that download its code as a
    .py that compiles and a valid notebook."""
    import json

    import nbformat

    records = [json.loads(p.read_text(encoding="utf-8"))
               for p in sorted((checks.ROOT / "results" / HEAD_POST).glob("*.json"))]  # fmt: skip
    p = max((r["provenance"] for r in records if r["kind"] == "measured"), key=lambda p: p["date"])
    want = [p["date"][:10], p["commit"][:10], p["gpu"], f"torch {p['torch']}",
            f"triton {p['triton']}"]  # fmt: skip
    page, guard = visitor.open(f"posts/{HEAD_POST}/")
    problems = []
    try:
        head = page.locator("article .page-head")
        reading = head.locator(".reading-time")
        if not reading.is_visible() or not re.fullmatch(r"阅读约 \d+ 分钟", reading.inner_text()):
            problems.append(f"reading time: {reading.all_inner_texts()}")
        elif not re.search(r"按每分钟 \d+ 字", reading.get_attribute("title") or ""):
            problems.append(f"reading time: no rate on hover: {reading.get_attribute('title')!r}")
        line = head.locator(".verified").inner_text()
        problems += [f"last verified line {line!r} lacks {w!r}" for w in want if w not in line]
        links = head.locator("a.md-button[download]")
        names = [f"{HEAD_POST}.py", f"{HEAD_POST}.ipynb"]
        for i, name in enumerate(names):
            if i >= links.count() or not links.nth(i).is_visible():
                problems.append(f"no visible button for {name}")
                continue
            with page.expect_download() as info:
                links.nth(i).click()
            got = info.value
            text = Path(got.path()).read_text(encoding="utf-8")
            if got.suggested_filename != name:
                problems.append(f"button {i + 1} downloads {got.suggested_filename}, not {name}")
            elif name.endswith(".py"):
                compile(text, name, "exec")
            else:
                nbformat.validate(nbformat.reads(text, as_version=4))
        problems += guard.network_problems() + guard.console_problems()
        if problems:
            shot = visitor.screenshot(page, f"{HEAD_POST}-head.png", full_page=False)
            pytest.fail(f"posts/{HEAD_POST}/: " + "; ".join(problems) + f" [screenshot: {shot}]")
    finally:
        page.close()
