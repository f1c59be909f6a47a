"""The built site requests no third-party host: scripts, stylesheets, CSS imports and url()s
all point into the site itself (the canonical link to our own site_url is allowed)."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAG_URL = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)=\"(?P<url>https?://[^\"]+)\"[^>]*>")
CSS_URL = re.compile(r"(?:@import\s+|url\()\s*[\"']?(?P<url>https?://[^\"')\s]+)")


def own_host() -> str:
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return urlparse(re.search(r"^site_url:\s*(\S+)", text, re.M)[1]).netloc


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if os.environ.get("HANDBOOK_SITE_DIR"):  # nox -s tests has just built it
        return Path(os.environ["HANDBOOK_SITE_DIR"])
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(out)],
        cwd=ROOT, check=True, env={"NO_MKDOCS_2_WARNING": "1", "PATH": ""},
    )  # fmt: skip
    return out


def third_party(site: Path) -> list[str]:
    found = []
    for path in sorted(site.rglob("*")):
        if path.suffix not in {".html", ".css"}:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        patterns = [CSS_URL] if path.suffix == ".css" else [TAG_URL, CSS_URL]
        for pattern in patterns:
            for m in pattern.finditer(text):
                if urlparse(m["url"]).netloc != own_host():
                    line = text.count("\n", 0, m.start()) + 1
                    found.append(f"{path.relative_to(site)}:{line}: {m['url']}")
    return found


def test_no_third_party_requests(site):
    found = third_party(site)
    assert not found, "third-party URLs in the built site:\n" + "\n".join(found)


def test_the_check_sees_a_planted_cdn_script(site, tmp_path):
    page = tmp_path / "index.html"
    page.write_text('<p>x</p>\n<script src="https://cdn.example.com/x.js"></script>\n', "utf-8")
    assert third_party(tmp_path) == ["index.html:2: https://cdn.example.com/x.js"]


def test_vendored_assets_are_in_the_site(site):
    for rel in ("assets/vendor/mermaid/mermaid.min.js", "assets/vendor/katex/katex.min.js"):
        assert (site / rel).stat().st_size > 100_000, rel
    for name in ("vega", "vega-lite", "vega-embed"):  # loaded by assets/loader.js
        assert (site / f"assets/vendor/vega/{name}.min.js").stat().st_size > 10_000, name
    assert list((site / "assets/vendor/katex/fonts").glob("*.woff2"))


# --------------------------------------------------------------------------- bug classes
# Each check below would have caught a bug the site once had; each is tried on a planted copy.

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # a tab or another control character
MATH = re.compile(r'<(span|div) class="arithmatex">(?P<tex>.*?)</\1>', re.S)
CODE = re.compile(r"<pre\b[^>]*>(?P<code>.*?)</pre>", re.S)
TAG = re.compile(r"<[^>]+>")


def html_pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def math_errors(site: Path) -> list[str]:
    """No control character inside a formula (a "\\t" in a Python string once became a TAB
    where `\\times` was meant)."""
    found = []
    for path in html_pages(site):
        text = path.read_text(encoding="utf-8")
        for m in MATH.finditer(text):
            c = CONTROL.search(m["tex"])
            if c:
                line = text.count("\n", 0, m.start() + c.start()) + 1
                found.append(f"{path.relative_to(site)}:{line}: control character "
                             f"{c.group()!r} in a formula: {m['tex'][:60]!r}")  # fmt: skip
    return found


def home_errors(site: Path, slugs: list[str]) -> list[str]:
    """The home page links every post (it once listed seven of eight)."""
    text = (site / "index.html").read_text(encoding="utf-8")
    return [f"index.html: no link to posts/{s}/" for s in slugs if f'href="posts/{s}/"' not in text]


def section_lines(root: Path, file: str, section: str | None) -> list[str]:
    lines = (root / file).read_text(encoding="utf-8").splitlines()
    if section:
        start = lines.index(next(ln for ln in lines if f"--8<-- [start:{section}]" in ln))
        end = lines.index(next(ln for ln in lines if f"--8<-- [end:{section}]" in ln))
        lines = lines[start + 1 : end]
    return [ln.strip() for ln in lines if ln.strip() and "--8<-- [" not in ln]


def include_errors(site: Path, root: Path) -> list[str]:
    """Every line of every included snippet section is on the built page (a section once lost
    its first line and the list after it)."""
    from html import unescape

    from snippets.common import markup

    found = []
    for page in sorted((root / "docs").rglob("*.md")):
        built = site / page.relative_to(root / "docs").with_suffix("") / "index.html"
        if page.stem == "index":
            built = site / page.relative_to(root / "docs").with_suffix(".html")
        if not built.is_file():
            continue
        code = "\n".join(unescape(TAG.sub("", m["code"]))
                         for m in CODE.finditer(built.read_text(encoding="utf-8")))  # fmt: skip
        shown = {ln.strip() for ln in code.splitlines()}
        for fence in markup.scan(page):
            for file, section in fence.includes():
                missing = [ln for ln in section_lines(root, file, section) if ln not in shown]
                where = f"{page.relative_to(root)}:{fence.line}"
                if missing:
                    found.append(f"{where}: {file}:{section or ''} shows without {missing[0]!r}")
    return found


def test_no_control_characters_in_formulas(site):
    assert not math_errors(site)


def test_the_home_page_links_every_post(site):
    from snippets.common import markup

    assert not home_errors(site, markup.post_slugs(ROOT))


def test_every_included_section_shows_whole(site):
    found = include_errors(site, ROOT)
    assert not found, "\n".join(found)


def test_the_bug_class_checks_see_their_bugs_planted_back(tmp_path):
    (tmp_path / "index.html").write_text('<a href="posts/a/">a</a>\n', encoding="utf-8")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "index.html").write_text(
        '<p>x</p>\n<span class="arithmatex">\\(a \times b\\)</span>\n', encoding="utf-8"
    )
    assert math_errors(tmp_path) == [
        "m/index.html:2: control character '\\t' in a formula: '\\\\(a \\times b\\\\)'"
    ]
    assert home_errors(tmp_path, ["a", "b"]) == ["index.html: no link to posts/b/"]
    root = tmp_path / "repo"
    (root / "docs" / "posts").mkdir(parents=True)
    (root / "snippets").mkdir()
    (root / "snippets" / "x.py").write_text(
        "# --8<-- [start:demo]\nimport math\nprint(math.pi)\n# --8<-- [end:demo]\n", "utf-8"
    )
    (root / "docs" / "posts" / "p.md").write_text(
        '# P\n\n```python\n--8<-- "snippets/x.py:demo"\n```\n', encoding="utf-8"
    )
    site = tmp_path / "site"
    (site / "posts" / "p").mkdir(parents=True)
    (site / "posts" / "p" / "index.html").write_text(
        "<pre><code><span>print</span>(math.pi)</code></pre>", encoding="utf-8"
    )
    assert include_errors(site, root) == [
        "docs/posts/p.md:3: snippets/x.py:demo shows without 'import math'"
    ]


# --------------------------------------------------------------------------- plots as text
# Every plot (hooks/results.py) is also readable without seeing it: role="img" with a description
# that counts its points, and a "数据表" disclosure holding one table row per data point.

PLOT = re.compile(r'<div class="result-plot"(?P<attrs>[^>]*)>')
ATTR = re.compile(r'\b(?P<name>[\w-]+)="(?P<value>[^"]*)"')
DETAILS = re.compile(r'<details class="result-data"><summary>(?P<summary>.*?)</summary>'
                     r"(?P<body>.*?)</details>", re.S)  # fmt: skip


def plot_text_errors(site: Path) -> list[str]:
    import json
    from html import unescape

    found = []
    for path in html_pages(site):
        text = path.read_text(encoding="utf-8")
        plots = list(PLOT.finditer(text))
        for i, m in enumerate(plots):
            attrs = {a["name"]: unescape(a["value"]) for a in ATTR.finditer(m["attrs"])}
            line = text.count("\n", 0, m.start()) + 1
            where = f"{path.relative_to(site)}:{line}: plot {attrs.get('data-result')!r}"
            n = len(json.loads(attrs.get("data-spec", "{}")).get("data", {}).get("values", []))
            if attrs.get("role") != "img":
                found.append(f'{where}: no role="img"')
            if f"共 {n} 个数据点" not in attrs.get("aria-label", ""):
                found.append(f"{where}: no aria-label describing its {n} data points")
            end = plots[i + 1].start() if i + 1 < len(plots) else len(text)
            table = DETAILS.search(text, m.end(), end)
            if not table or not table["summary"].startswith("数据表"):
                found.append(f"{where}: no 数据表 disclosure after it")
                continue
            body = table["body"].partition("<tbody>")[2]
            rows = body.count("<tr>")
            if rows != n:
                found.append(f"{where}: its data table has {rows} rows for {n} data points")
    return found


def test_every_plot_has_a_text_alternative_and_its_data_table(site):
    found = plot_text_errors(site)
    assert not found, "\n".join(found)
    assert any(PLOT.search(p.read_text(encoding="utf-8")) for p in html_pages(site)), "no plots"


def test_the_plot_text_check_sees_planted_faults(site, tmp_path):
    import json
    from html import unescape

    page = next(p for p in html_pages(site) if PLOT.search(p.read_text(encoding="utf-8")))
    text = page.read_text(encoding="utf-8")
    plot = PLOT.search(text)
    attrs = {a["name"]: unescape(a["value"]) for a in ATTR.finditer(plot["attrs"])}
    name, n = attrs["data-result"], len(json.loads(attrs["data-spec"])["data"]["values"])
    line = text.count("\n", 0, plot.start()) + 1
    table = DETAILS.search(text, plot.end())[0]
    short = re.sub(r"<tr>(?:(?!<tr>).)*</tr></tbody>", "</tbody>", table, count=1, flags=re.S)
    plants = {  # a plot box without its text alternative; no table; a table a row short
        "bare": text.replace(plot[0], re.sub(r' (role|aria-label)="[^"]*"', "", plot[0]), 1),
        "no-table": text.replace(table, "", 1),
        "short": text.replace(table, short, 1),
    }
    for folder, planted in plants.items():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "index.html").write_text(planted, encoding="utf-8")
    where = f"index.html:{line}: plot {name!r}"
    assert plot_text_errors(tmp_path) == [
        f'bare/{where}: no role="img"',
        f"bare/{where}: no aria-label describing its {n} data points",
        f"no-table/{where}: no 数据表 disclosure after it",
        f"short/{where}: its data table has {n - 1} rows for {n} data points",
    ]


# --------------------------------------------------------------------------- size budget
# What a page makes a reader download of its own, besides the text: the site's own scripts
# (docs/assets/*.js: those its <script> tags name, and calculator.js, which assets/loader.js adds
# on a page with a calculator), inline <script>s, and the plot data (each data-spec JSON and its
# 数据表).
# The vendored libraries (assets/vendor/: mermaid, KaTeX, Vega; Material's assets/javascripts/)
# are pinned by package-lock.json and the theme, cached across pages, and counted apart.
# PAGE_BUDGET is twice the largest page when it was set (docs/contributing.md says why).

LARGEST_AT_SETTING = 34_228  # bytes: posts/precision-alignment/ (3 plots, 102 data points)
PAGE_BUDGET = 2 * LARGEST_AT_SETTING
SCRIPT = re.compile(r"<script\b(?P<attrs>[^>]*)>(?P<body>.*?)</script>", re.S)
SRC = re.compile(r'\bsrc="(?P<src>[^"]+)"')
SPEC = re.compile(r'\bdata-spec="(?P<json>[^"]*)"')
VENDORED = ("assets/vendor/", "assets/javascripts/")
ON_DEMAND = {' data-calculator="': "assets/calculator.js"}  # in the page: what loader.js adds


def page_weight(site: Path, path: Path) -> dict[str, int]:
    """Bytes of one built page's own scripts, inline scripts, plot data, and (apart) vendored."""
    from html import unescape

    text = path.read_text(encoding="utf-8")
    prefix = urlparse(own_root()).path  # 404.html links its assets from the site root
    weight = dict.fromkeys(("scripts", "inline", "plot_data", "vendored"), 0)
    for m in SCRIPT.finditer(text):
        src = SRC.search(m["attrs"])
        if not src:
            weight["inline"] += len(m["body"].encode())
            continue
        url = src["src"].split("?")[0]
        file = site / url[len(prefix) :] if url.startswith(prefix) else path.parent / url
        rel = file.resolve().relative_to(site.resolve()).as_posix()
        weight["vendored" if rel.startswith(VENDORED) else "scripts"] += file.stat().st_size
    for needs, rel in ON_DEMAND.items():
        if needs in text:
            weight["scripts"] += (site / rel).stat().st_size
    weight["plot_data"] = sum(len(unescape(m["json"]).encode()) for m in SPEC.finditer(text))
    weight["plot_data"] += sum(len(m[0].encode()) for m in DETAILS.finditer(text))
    return weight


def own_root() -> str:
    return re.search(r"^site_url:\s*(\S+)", (ROOT / "mkdocs.yml").read_text("utf-8"), re.M)[1]


def budget_errors(site: Path, budget: int = PAGE_BUDGET) -> list[str]:
    found = []
    for path in sorted(site.rglob("*.html")):
        w = page_weight(site, path)
        own = w["scripts"] + w["inline"] + w["plot_data"]
        if own > budget:
            found.append(
                f"{path.relative_to(site)}: {own} bytes of its own JavaScript and data (scripts "
                f"{w['scripts']}, inline {w['inline']}, plot data {w['plot_data']}) is over the "
                f"budget of {budget} bytes (vendored libraries, {w['vendored']} bytes, apart)"
            )
    return found


def test_every_page_keeps_its_own_javascript_and_data_within_budget(site):
    found = budget_errors(site)
    assert not found, "\n".join(found)
    guide = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    assert f"**{PAGE_BUDGET} 字节**" in guide, "docs/contributing.md states another page budget"


def test_the_size_budget_sees_a_planted_heavy_page(site, tmp_path):
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "own.js").write_text("x" * 1000, encoding="utf-8")
    (tmp_path / "assets" / "vendor").mkdir()
    (tmp_path / "assets" / "vendor" / "lib.js").write_text("x" * 5000, encoding="utf-8")
    (tmp_path / "p").mkdir()
    spec = "{&quot;data&quot;: {&quot;values&quot;: [1, 2]}}"  # 28 bytes unescaped
    (tmp_path / "p" / "index.html").write_text(
        '<script src="../assets/own.js"></script><script src="../assets/vendor/lib.js"></script>'
        f'<script>{"y" * 200}</script><div class="result-plot" data-spec="{spec}"></div>',
        encoding="utf-8",
    )
    assert page_weight(tmp_path, tmp_path / "p" / "index.html") == {
        "scripts": 1000, "inline": 200, "plot_data": 28, "vendored": 5000}  # fmt: skip
    assert budget_errors(tmp_path, budget=1227) == [
        "p/index.html: 1228 bytes of its own JavaScript and data (scripts 1000, inline 200, plot "
        "data 28) is over the budget of 1227 bytes (vendored libraries, 5000 bytes, apart)"
    ]
    assert budget_errors(tmp_path, budget=1228) == []
    (tmp_path / "assets" / "calculator.js").write_text("z" * 300, encoding="utf-8")
    calc = tmp_path / "q" / "index.html"
    calc.parent.mkdir()
    calc.write_text('<form class="calc" data-calculator="mfu"></form>', encoding="utf-8")
    assert page_weight(tmp_path, calc) == {
        "scripts": 300, "inline": 0, "plot_data": 0, "vendored": 0}  # fmt: skip


# --------------------------------------------------------------------------- downloads, page head
# Each post offers its code as downloads/<slug>.py and .ipynb (hooks/downloads.py), and its head
# says how long it reads and when its code was last verified (hooks/posts.py).

ADDED, WAS = "  # 下载版添加", "  # 原为："  # how the download marks its edits of a file


def executed(page: Path) -> list[str]:
    """What the tests run of a page, in order: Sybil's evaluator for each Python fence
    (tests/pages.py) with the running recorded instead of done. A `gpu` fence counts (gpu_docs
    runs it), so does a `cpu` one (the CPU suite runs it); a `skip` fence does not."""
    from sybil import Sybil

    from tests import pages

    ran: list[str] = []
    parser = pages.PageParser(ROOT)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pages, "run_inline", lambda fence, ns: ran.append(fence.body))
        mp.setattr(pages, "run_include", lambda root, target, ns, where: ran.append(
            target.read_text(encoding="utf-8")))  # fmt: skip
        mp.setattr(pages, "_cuda", lambda: True)
        for example in Sybil(parsers=[parser]).parse(page):
            if example.region.evaluator == parser.evaluate:
                example.parsed.cpu = None  # CUDA is pretended for the gpu fences
                try:
                    parser.evaluate(example)
                except pytest.skip.Exception:
                    pass
    return [code.rstrip("\n") for code in ran]


def original(cell: str) -> str:
    """A code cell with the download's marked edits undone: added lines dropped, rewritten lines
    restored, and a `gpu` cell's code taken out of its `if download.gpu_cell(...):` (lines that
    start inside a multi-line string were not indented)."""
    import io
    import tokenize

    lines = cell.split("\n")
    guards = [i for i, line in enumerate(lines)
              if line.startswith("if download.gpu_cell(") and line.endswith(ADDED)]  # fmt: skip
    guard = guards[0] if guards else None
    inside = set()
    if guard is not None:
        for tok in tokenize.generate_tokens(io.StringIO(cell).readline):
            inside.update(range(tok.start[0] + 1, tok.end[0] + 1))
    out = []
    for row, line in enumerate(lines, 1):
        if line.endswith(ADDED):
            continue
        if guard is not None and row > guard + 1 and row not in inside:
            line = line.removeprefix("    ")
        new, marked, was = line.partition(WAS.strip())
        out.append(new[: len(new) - len(new.lstrip())] + was if marked else line)
    return "\n".join(out)


def download_errors(site: Path, root: Path) -> list[str]:
    import jupytext
    import nbformat

    found = []
    for page in sorted((root / "docs" / "posts").glob("*.md")):
        py, ipynb = (site / "downloads" / f"{page.stem}{ext}" for ext in (".py", ".ipynb"))
        missing = [str(p.relative_to(site)) for p in (py, ipynb) if not p.is_file()]
        if missing:
            found.append(f"{page.stem}: no {' or '.join(missing)} in the built site")
            continue
        script = py.read_text(encoding="utf-8")
        try:
            compile(script, str(py), "exec")
        except SyntaxError as exc:
            found.append(f"{py.relative_to(site)}:{exc.lineno}: does not compile: {exc.msg}")
        nb = nbformat.reads(ipynb.read_text(encoding="utf-8"), as_version=4)
        try:
            nbformat.validate(nb)
        except nbformat.ValidationError as exc:
            found.append(f"{ipynb.relative_to(site)}: not a valid notebook: {exc.message}")
        cells = [c.source for c in nb.cells if c.cell_type == "code"]
        from_py = [c.source for c in jupytext.reads(script, fmt="py:percent").cells
                   if c.cell_type == "code"]  # fmt: skip
        if [c.rstrip("\n") for c in from_py] != [c.rstrip("\n") for c in cells]:
            found.append(f"{py.relative_to(site)}: its code differs from the notebook's")
        want, got = executed(page), [original(c) for c in cells]
        if got != want:
            pairs = enumerate(zip(got, want, strict=False))
            i = next((i for i, (a, b) in pairs if a != b), min(len(got), len(want)))
            found.append(f"{ipynb.relative_to(site)}: code cell {i + 1} of {len(got)} is not the "
                         f"page's executed block {i + 1} of {len(want)}")  # fmt: skip
    return found


def test_every_post_downloads_as_the_code_its_tests_run(site):
    found = download_errors(site, ROOT)
    assert not found, "\n".join(found)


def head_errors(site: Path, root: Path) -> list[str]:
    """Every post's head has its reading time, its "last verified" line -- the newest GPU
    measurement's date, commit, GPU, torch and triton, or that it awaits a GPU run, or that it
    has none -- and links to both downloads."""
    import json

    from snippets.common import markup

    found = []
    for page in sorted((root / "docs" / "posts").glob("*.md")):
        slug = page.stem
        built = site / "posts" / slug / "index.html"
        head = re.search(r'<div class="page-head">(.*?)</div>', built.read_text(encoding="utf-8"),
                         re.S)  # fmt: skip
        if not head:
            found.append(f"posts/{slug}/: no page head")
            continue
        if not re.search(r'class="reading-time"[^>]*>阅读约 \d+ 分钟<', head[1]):
            found.append(f"posts/{slug}/: no reading time")
        records = [json.loads(p.read_text(encoding="utf-8"))
                   for p in sorted((root / "results" / slug).glob("*.json"))]  # fmt: skip
        measured = [r["provenance"] for r in records if r["kind"] == "measured"]
        if markup.post_meta(page).awaiting_gpu:
            want = ["待 GPU 运行"]
        elif measured:
            p = max(measured, key=lambda p: p["date"])
            want = [p["date"][:10], f"commit {p['commit'][:10]}", p["gpu"], f"torch {p['torch']}",
                    f"triton {p['triton']}"]  # fmt: skip
        else:
            want = ["在 CPU 上"]
        line = re.search(r'class="verified">([^<]*)<', head[1])
        missing = [w for w in want if not line or w not in line[1]]
        if missing:
            found.append(f"posts/{slug}/: the last-verified line lacks {missing}")
        for name in (f"{slug}.py", f"{slug}.ipynb"):
            if f'href="../../downloads/{name}"' not in head[1]:
                found.append(f"posts/{slug}/: no link to downloads/{name}")
    return found


def test_every_post_head_says_reading_time_last_verified_and_downloads(site):
    found = head_errors(site, ROOT)
    assert not found, "\n".join(found)


def newest_measurement(root: Path, slug: str) -> dict | None:
    import json

    records = [json.loads(p.read_text(encoding="utf-8"))
               for p in sorted((root / "results" / slug).glob("*.json"))]  # fmt: skip
    measured = [r["provenance"] for r in records if r["kind"] == "measured"]
    return max(measured, key=lambda p: p["date"]) if measured else None


def home_status_errors(site: Path, root: Path) -> list[str]:
    """Each post's row on the home page ends with its status: awaiting a GPU run, the date of
    its newest GPU measurement, or verified on the CPU (no GPU measurement)."""
    from snippets.common import markup

    rows = re.findall(r"<tr>(.*?)</tr>", (site / "index.html").read_text("utf-8"), re.S)
    found = []
    for meta in markup.series(root):
        row = next((r for r in rows if f'href="posts/{meta.slug}/"' in r), None)
        p = newest_measurement(root, meta.slug)
        want = ("待 GPU 测量" if meta.awaiting_gpu else
                f"GPU 实测 {p['date'][:10]}" if p else "CPU 上验证")  # fmt: skip
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row or "", re.S)
        if not cells or cells[-1].strip() != want:
            got = cells[-1].strip() if cells else None
            found.append(f"index.html: posts/{meta.slug}/ has status {got!r}, want {want!r}")
    return found


def footer_errors(site: Path, root: Path) -> list[str]:
    """The previous / next links at the foot of each post (Material's navigation.footer) lead
    to its neighbours in series order."""
    from snippets.common import markup

    order = [m.slug for m in markup.series(root)]
    found = []
    for i, slug in enumerate(order):
        text = (site / "posts" / slug / "index.html").read_text(encoding="utf-8")
        for kind, j in (("prev", i - 1), ("next", i + 1)):
            if not 0 <= j < len(order):
                continue
            m = re.search(rf'<a href="([^"]*)" class="md-footer__link md-footer__link--{kind}"',
                          text)  # fmt: skip
            want = f"../{order[j]}/"
            if not m or m[1] != want:
                found.append(f"posts/{slug}/: {kind} link {m[1] if m else None!r}, want {want!r}")
    return found


def related_errors(site: Path, root: Path) -> list[str]:
    """Each post's head links the other written posts that data/taxonomy.yaml lists in one of
    its categories (its prerequisites, linked just above, left out), and no others."""
    from snippets.common import markup
    from snippets.common.taxonomy import load_taxonomy

    metas = {m.slug: m for m in markup.series(root)}
    categories = load_taxonomy(root / "data" / "taxonomy.yaml").categories
    found = []
    for slug, meta in metas.items():
        want = []
        for c in categories:
            if slug in c.posts:
                want += [s for s in c.posts if s in metas and s != slug
                         and s not in meta.prerequisites and s not in want]  # fmt: skip
        text = (site / "posts" / slug / "index.html").read_text(encoding="utf-8")
        line = re.search(r"相关：(.*?)（在", text)
        got = re.findall(r'href="\.\./([^/"]+)/"', line[1]) if line else []
        if got != want:
            found.append(f"posts/{slug}/: related posts {got}, want {want}")
    return found


def test_every_post_links_its_related_posts(site):
    found = related_errors(site, ROOT)
    assert not found, "\n".join(found)


def test_the_home_page_gives_every_post_its_status(site):
    found = home_status_errors(site, ROOT)
    assert not found, "\n".join(found)


def test_every_post_links_its_series_neighbours(site):
    found = footer_errors(site, ROOT)
    assert not found, "\n".join(found)


def test_the_status_footer_and_related_checks_see_planted_faults(site, tmp_path):
    import shutil

    from snippets.common import markup

    order = [m.slug for m in markup.series(ROOT)]
    copy = tmp_path / "site"
    shutil.copytree(site / "posts", copy / "posts")
    home = (site / "index.html").read_text(encoding="utf-8")
    row = next(r for r in re.findall(r"<tr>.*?</tr>", home, re.S) if "CPU 上验证" in r)
    (copy / "index.html").write_text(home.replace(row, row.replace("CPU 上验证", "待 GPU 测量")),
                                     encoding="utf-8")  # fmt: skip
    page = copy / "posts" / order[1] / "index.html"
    text = page.read_text(encoding="utf-8")
    link = '" class="md-footer__link md-footer__link--next"'
    page.write_text(text.replace(f'href="../{order[2]}/{link}', f'href="../{order[3]}/{link}'),
                    encoding="utf-8")  # fmt: skip
    related = copy / "posts" / "gradient-accumulation" / "index.html"
    text = related.read_text(encoding="utf-8")
    related.write_text(text.replace('href="../gradient-checkpointing/">', 'href="#">', 1),
                       encoding="utf-8")  # fmt: skip
    errors = related_errors(copy, ROOT)  # the other related posts follow the taxonomy
    assert len(errors) == 1 and errors[0].startswith("posts/gradient-accumulation/: "), errors
    found, want = re.fullmatch(r".*related posts (\[.*\]), want (\[.*\])", errors[0]).groups()
    assert "'gradient-checkpointing'" in want and "'gradient-checkpointing'" not in found
    assert sorted(ast.literal_eval(want)) == sorted(
        [*ast.literal_eval(found), "gradient-checkpointing"]
    )
    status = home_status_errors(copy, ROOT)
    assert len(status) == 1, status
    assert status[0].endswith("has status '待 GPU 测量', want 'CPU 上验证'"), status
    assert footer_errors(copy, ROOT) == [
        f"posts/{order[1]}/: next link '../{order[3]}/', want '../{order[2]}/'"
    ]


def test_the_download_and_head_checks_see_planted_faults(site, tmp_path):
    import shutil

    import nbformat

    copy = tmp_path / "site"
    shutil.copytree(site / "downloads", copy / "downloads")
    shutil.copytree(site / "posts", copy / "posts")
    nb_path = copy / "downloads" / "metrics.ipynb"
    nb = nbformat.read(nb_path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[1].source = '--8<-- "snippets/metrics/qwen3.py:config"'  # the include line, not the code
    nbformat.write(nb, nb_path)
    (copy / "downloads" / "tech-map.py").write_text("def broken(:\n", encoding="utf-8")
    (copy / "downloads" / "cuda-graph.ipynb").unlink()
    import json

    from snippets.common import markup

    def gpu_measured(slug):  # its head names the newest GPU measurement's commit
        kinds = {json.loads(r.read_text(encoding="utf-8"))["kind"]
                 for r in (ROOT / "results" / slug).glob("*.json")}  # fmt: skip
        return "measured" in kinds and not markup.post_meta(
            ROOT / "docs" / "posts" / f"{slug}.md").awaiting_gpu  # fmt: skip

    measured = [p for p in sorted((copy / "posts").glob("*/index.html"))
                if gpu_measured(p.parent.name)]  # fmt: skip
    assert measured, "no post shows a measured commit: nothing to plant the fault in"
    page = measured[0]
    text = page.read_text(encoding="utf-8")
    page.write_text(re.sub(r"commit [0-9a-f]{10}", "commit 0123456789", text), encoding="utf-8")
    found = download_errors(copy, ROOT)
    assert "cuda-graph: no downloads/cuda-graph.ipynb in the built site" in found
    assert any(f.startswith("downloads/metrics.ipynb: code cell 2 of ") for f in found), found
    assert any(f.startswith("downloads/tech-map.py:1: does not compile") for f in found), found
    head = head_errors(copy, ROOT)
    slug = page.parent.name
    assert len(head) == 1 and head[0].startswith(
        f"posts/{slug}/: the last-verified line lacks ['commit "
    ), head
