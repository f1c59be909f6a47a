"""Browser checks for the built site, as plain functions (used by the suite and by scratch sites).

Each ``check_*`` function takes a Playwright page that shows a loaded page of the site and
returns a list of problems (empty when the page is fine). ``Visitor`` loads a page the way a
reader does (direct load or instant navigation, light or dark palette), runs every check and
saves a screenshot for each check that found something.

Material renders mermaid into a *closed* shadow root inside ``div.mermaid``; ``INIT_SCRIPT``
keeps a reference to every shadow root so that the checks can look inside.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urljoin, urlsplit

ROOT = Path(__file__).resolve().parents[2]
JS = Path(__file__).parent / "js"  # the in-page halves of the checks
CHROMIUM = os.environ.get("HANDBOOK_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium itself calls Google hosts.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SITE_DIR_ENV = "HANDBOOK_SITE_DIR"  # test this built site instead of building one
ALLOWED_HOST = "127.0.0.1"
VIEWPORT = {"width": 1280, "height": 900}  # wide enough for the sidebar nav and header search
READY_TIMEOUT_MS = 10_000
SCHEMES = {"light": "default", "dark": "slate"}  # Material's data-md-color-scheme per palette


def _js(name: str) -> str:
    return (JS / name).read_text(encoding="utf-8")


INIT_SCRIPT = _js("init.js")


# --------------------------------------------------------------------------- build and serve


def build_site(config: Path, dest: Path, *, strict: bool = True) -> Path:
    """``mkdocs build`` of ``config`` into ``dest``; raises with mkdocs' output on failure."""
    cmd = [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(config), "-d", str(dest)]
    if strict:
        cmd.append("--strict")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(cmd, cwd=config.parent, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    return dest


def built_pages(site_dir: Path) -> list[str]:
    """Every page of a built site, as its path below the site root ("" is the home page)."""
    pages = []
    for index in sorted(site_dir.rglob("index.html")):
        rel = index.parent.relative_to(site_dir).as_posix()
        pages.append("" if rel == "." else rel + "/")
    return pages


def source_pages(docs_dir: Path) -> list[str]:
    """The page paths MkDocs (use_directory_urls) makes of the Markdown files in ``docs_dir``."""
    pages = []
    for md in sorted(docs_dir.rglob("*.md")):
        rel = md.relative_to(docs_dir)
        if rel.name in ("index.md", "README.md"):
            path = rel.parent.as_posix()
        else:
            path = rel.with_suffix("").as_posix()
        pages.append("" if path == "." else path + "/")
    return sorted(set(pages))


def site_pages() -> list[str]:
    """The pages to test: of the built site in $HANDBOOK_SITE_DIR, else of docs/*.md."""
    if os.environ.get(SITE_DIR_ENV):
        return built_pages(Path(os.environ[SITE_DIR_ENV]))
    return source_pages(ROOT / "docs")


def page_id(path: str) -> str:
    """Test id / screenshot name of a page path: "" -> "index", "posts/x/" -> "posts/x"."""
    return path.strip("/") or "index"


def site_root_url(site_dir: Path) -> str | None:
    """The configured site_url, read back from the built sitemap (None when there is none)."""
    sitemap = site_dir / "sitemap.xml"
    if not sitemap.exists():
        return None
    locs = re.findall(r"<loc>\s*([^<\s]+)\s*</loc>", sitemap.read_text(encoding="utf-8"))
    locs = [loc for loc in locs if loc.startswith(("http://", "https://"))]
    if not locs:
        return None
    prefix = os.path.commonprefix(locs)  # noqa: RUF071 -- URLs, cut at the last "/" below
    return prefix[: prefix.rfind("/") + 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((ALLOWED_HOST, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(site_dir: Path, workdir: Path):
    """Serve ``site_dir`` with ``python -m http.server`` on 127.0.0.1; yield the site's base URL.

    The site is mounted under the path of its site_url (404.html links its assets absolutely,
    as on the real host). Material's instant navigation takes the page list from sitemap.xml
    and adopts only the scheme and host name of the current page, not its port, so the served
    sitemap.xml names the local origin -- what ``mkdocs serve`` does too. Nothing else changes.
    """
    site_dir = site_dir.resolve()
    root_url = site_root_url(site_dir)
    prefix = urlsplit(root_url).path if root_url else "/"
    port = free_port()
    origin = f"http://{ALLOWED_HOST}:{port}"
    www = workdir / "www"
    shutil.rmtree(www, ignore_errors=True)
    mount = www / prefix.strip("/")
    mount.mkdir(parents=True, exist_ok=True)
    for entry in site_dir.iterdir():
        if entry.name in ("sitemap.xml", "sitemap.xml.gz") and root_url:
            continue
        (mount / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    if root_url:
        text = (site_dir / "sitemap.xml").read_text(encoding="utf-8")
        local = text.replace(root_url, origin + prefix)
        (mount / "sitemap.xml").write_text(local, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", ALLOWED_HOST, str(port)],
        cwd=www,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = origin + prefix
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"http.server did not come up on {base}") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch(playwright):
    """Debian's Chromium, headless, with nothing that calls home."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


# --------------------------------------------------------------------------- network and console


class Guard:
    """Records every request, console error and page error of a page; blocks foreign hosts.

    All requests are recorded with ``page.on("request")``; ``page.route`` aborts those to any
    host but 127.0.0.1, so the test is hermetic and a CDN reference is caught, not fetched.
    """

    def __init__(self, page):
        self.requests: list[str] = []
        self.foreign: list[str] = []
        self.bad_responses: list[str] = []
        self.console: list[str] = []
        self.page_errors: list[str] = []
        page.on("request", self._on_request)
        page.on("response", self._on_response)
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.page_errors.append(str(exc).splitlines()[0]))
        page.route("**/*", self._route)

    @staticmethod
    def local(url: str) -> bool:
        parts = urlsplit(url)
        return parts.scheme in ("data", "blob", "about") or parts.hostname == ALLOWED_HOST

    def _on_request(self, request):
        self.requests.append(request.url)
        if not self.local(request.url) and request.url not in self.foreign:
            self.foreign.append(request.url)

    def _route(self, route):
        if self.local(route.request.url):
            route.continue_()
        else:
            if route.request.url not in self.foreign:
                self.foreign.append(route.request.url)
            route.abort("blockedbyclient")

    def _on_response(self, response):
        if response.status >= 400 and self.local(response.url):
            self.bad_responses.append(f"HTTP {response.status} for {response.url}")

    def _on_console(self, msg):
        # Vega and Vega-Lite log a spec they had to bend (a dropped property, a log domain
        # holding zero: an empty plot) as a console warning starting "WARN"
        if msg.type == "error" or (msg.type == "warning" and msg.text.startswith("WARN ")):
            where = (msg.location or {}).get("url", "")
            self.console.append(msg.text + (f" ({where})" if where else ""))

    def reset(self) -> None:
        """Forget what was recorded so far (before the next navigation in the same tab)."""
        for records in (self.requests, self.foreign, self.bad_responses, self.console):
            records.clear()
        self.page_errors.clear()

    def network_problems(self) -> list[str]:
        out = [f"request to a host other than {ALLOWED_HOST}: {url}" for url in self.foreign]
        return out + self.bad_responses

    def console_problems(self) -> list[str]:
        """Console errors and Vega warnings, less the "Failed to load" of foreign requests
        (reported as such)."""
        blocked = tuple(f"({url})" for url in self.foreign)
        out = [f"console error: {text}" for text in self.console if not text.endswith(blocked)]
        return out + [f"uncaught page error: {text}" for text in self.page_errors]


# --------------------------------------------------------------------------- the checks

_SOURCE_JS = _js("source.js")


def page_source(page) -> dict:
    """What the served HTML of the current page contains before any script ran."""
    return page.evaluate(_SOURCE_JS)


def wait_ready(page, timeout_ms: int = READY_TIMEOUT_MS) -> None:
    """Wait until every diagram and plot of the served HTML is drawn, every formula typeset and
    every calculator started.

    Gives up early when the page reports an error, and silently after the timeout: the checks
    then say what is missing.
    """
    expected = len(page_source(page)["mermaid"])
    start = page.evaluate("Date.now()")
    with contextlib.suppress(Exception):  # vega-embed draws asynchronously, or reports an error
        page.wait_for_function(
            """() => [...document.querySelectorAll(".result-plot")]
                       .every((b) => b.dataset.rendered === "1" || b.dataset.error)""",
            timeout=timeout_ms,
        )
    # calculator.js loads when the page has a form, and starts each one (or the form keeps why not)
    with contextlib.suppress(Exception):
        page.wait_for_function(
            """() => [...document.querySelectorAll("form[data-calculator]")]
                       .every((f) => f.dataset.ready || f.dataset.error)""",
            timeout=timeout_ms,
        )
    # KaTeX loads when the page has a formula and typesets them all at once, then sets
    # body[data-math]; mermaid renders asynchronously, or rejects.
    with contextlib.suppress(Exception):
        page.wait_for_function(
            """([n, start]) => document.readyState === "complete" &&
                 (window.__e2eErrors.length > 0 ||
                  [...document.querySelectorAll("div.mermaid")].filter((d) =>
                     (window.__e2eShadow.get(d) || d).querySelector("svg")).length >= n) &&
                 (window.__e2eErrors.length > 0 || Date.now() - start > 5000 ||
                  document.querySelectorAll(".arithmatex").length === 0 ||
                  document.body.dataset.math === "typeset")""",
            arg=[expected, start],
            timeout=timeout_ms,
        )
    with contextlib.suppress(Exception):
        page.evaluate("document.fonts.ready.then(() => true)")


_MERMAID_JS = _js("mermaid.js")


def check_mermaid(page) -> list[str]:
    """Every mermaid diagram of the served page renders to a readable SVG with no error text."""
    return page.evaluate(_MERMAID_JS, page_source(page)["mermaid"])


_KATEX_JS = _js("katex.js")


def check_katex(page) -> list[str]:
    """Every formula is typeset by KaTeX: no raw \\( \\[ $$ left, no KaTeX error spans."""
    return page.evaluate(_KATEX_JS)


_PLOTS_JS = _js("plots.js")


def check_plots(page) -> list[str]:
    """Every result plot is drawn (SVG with axes and marks) by vega-embed, without error."""
    return page.evaluate(_PLOTS_JS, page_source(page)["plots"])


_COPY_JS = _js("copy.js")


def check_calculators(page) -> list[str]:
    """Every calculator form of the page was started by calculator.js."""
    return page.evaluate(
        """() => [...document.querySelectorAll("form[data-calculator]")]
                   .filter((f) => !f.dataset.ready)
                   .map((f) => `calculator ${f.dataset.calculator} not started` +
                               (f.dataset.error ? `: ${f.dataset.error}` : ""))"""
    )


def check_copy_buttons(page) -> list[str]:
    """Every code block (.highlight pre > code) has Material's copy button."""
    return page.evaluate(_COPY_JS)


def check_scheme(page, scheme: str) -> list[str]:
    """The page shows the palette asked for ("light" or "dark")."""
    have = page.evaluate("document.body.getAttribute('data-md-color-scheme')")
    want = SCHEMES[scheme]
    return [] if have == want else [f"palette: data-md-color-scheme is {have!r}, want {want!r}"]


def set_scheme(page, scheme: str) -> None:
    """Choose a palette with Material's header toggle (stored for the whole browser context)."""
    want = SCHEMES[scheme]
    for _ in range(len(SCHEMES) + 1):
        if page.evaluate("document.body.getAttribute('data-md-color-scheme')") == want:
            return
        page.locator(
            "form[data-md-component=palette] label.md-header__button:not([hidden])"
        ).click()
        page.wait_for_timeout(100)
    raise AssertionError(f"the palette toggle never switched to {want!r}")


def navigate_instantly(page, url: str) -> list[str]:
    """Click the nav link to ``url`` and check that Material swapped the page in place."""
    target = url.split("#")[0]
    links = page.locator("nav.md-nav--primary a.md-nav__link")
    hrefs = links.evaluate_all("(as) => as.map((a) => a.href.split('#')[0])")
    if target not in hrefs:
        return [f"no link to {target} in the navigation of {page.url}"]
    link = links.nth(hrefs.index(target))
    page.evaluate(
        """() => { window.__e2eSameDocument = true; window.__e2eErrors = [];
                   document.querySelector("[data-md-component=container]").__e2eOld = true; }"""
    )
    if link.is_visible():
        link.click()
    else:  # in a collapsed section: a click event still goes through Material's handler
        link.evaluate("(a) => a.click()")
    try:
        page.wait_for_function(
            """(t) => location.href.split("#")[0] === t &&
                 !document.querySelector("[data-md-component=container]").__e2eOld""",
            arg=target,
            timeout=READY_TIMEOUT_MS,
        )
    except Exception:
        return [f"clicking the nav link did not show {target} (now at {page.url})"]
    if not page.evaluate("window.__e2eSameDocument === true"):
        return [f"the nav link to {target} made a full page load, not an instant navigation"]
    return []


# --------------------------------------------------------------------------- visiting pages

CHECKS = ("mermaid", "katex", "plots", "network", "console", "copy")


@dataclass
class Visit:
    """What one load of one page found, per check; messages name the page and the load."""

    page: str
    scheme: str
    via: str
    problems: dict[str, list[str]] = field(default_factory=dict)
    screenshots: dict[str, Path] = field(default_factory=dict)

    def messages(self, *checks: str) -> list[str]:
        out = []
        for check in checks:
            for problem in self.problems.get(check, []):
                shot = self.screenshots.get(check)
                suffix = f"  [screenshot: {shot}]" if shot else ""
                out.append(f"{page_id(self.page)} ({self.scheme}, {self.via}): {problem}{suffix}")
        return out


class Visitor:
    """Loads pages of one served site in one browser; one context per palette.

    Direct loads each get a fresh tab. Instant navigations run in one long-lived tab per
    palette that clicks from page to page through the nav, as a reader does: each page is
    reached from the one visited before it (the first from ``first_from``, loaded directly).
    """

    def __init__(self, browser, base: str, shots: Path, *, home: str = ""):
        self.browser = browser
        self.base = base
        self.shots = shots
        self.home = home
        self._contexts: dict[str, object] = {}
        self._tabs: dict[str, tuple[object, Guard]] = {}

    def url(self, path: str) -> str:
        return urljoin(self.base, path)

    def path_of(self, url: str) -> str:
        url = url.split("#")[0]
        return url[len(self.base) :] if url.startswith(self.base) else url

    def context(self, scheme: str):
        if scheme not in self._contexts:
            ctx = self.browser.new_context(viewport=VIEWPORT, color_scheme="light")
            ctx.set_default_timeout(15_000)
            ctx.add_init_script(INIT_SCRIPT)
            page = ctx.new_page()
            page.route("**/*", lambda r: r.continue_() if Guard.local(r.request.url) else r.abort())
            page.goto(self.url(self.home))
            set_scheme(page, scheme)  # Material keeps the choice in localStorage
            page.close()
            self._contexts[scheme] = ctx
        return self._contexts[scheme]

    def open(self, path: str, scheme: str = "light"):
        """A fresh tab with ``path`` loaded directly: (page, guard). Close the page after use."""
        page = self.context(scheme).new_page()
        guard = Guard(page)
        page.goto(self.url(path))
        wait_ready(page)
        return page, guard

    def _tab(self, scheme: str, first_from: str):
        tab = self._tabs.get(scheme)
        if tab is None or tab[0].is_closed():
            page, guard = self.open(first_from, scheme)
            tab = self._tabs[scheme] = (page, guard)
        return tab

    def visit(self, path: str, scheme: str = "light", via: str = "direct", *, first_from=""):
        """Load a page and run every check; screenshot each check that found something.

        via "direct": a page load in a fresh tab; via "instant": a nav click in the palette's
        navigation tab (from the page it shows, or from ``first_from`` when it has none yet).
        """
        if via == "direct":
            page, guard = self.open(path, scheme)
            how, nav_problems = "direct load", []
        else:
            page, guard = self._tab(scheme, first_from)
            if self.path_of(page.url) == path:  # already there: come back from elsewhere
                page.goto(self.url(first_from if first_from != path else self.home))
                wait_ready(page)
            how = f"instant navigation from {page_id(self.path_of(page.url))}"
            guard.reset()
            nav_problems = navigate_instantly(page, self.url(path))
            wait_ready(page)
        visit = Visit(path, scheme, how)
        try:
            visit.problems["mermaid"] = nav_problems + check_scheme(page, scheme)
            visit.problems["mermaid"] += check_mermaid(page)
            visit.problems["katex"] = check_katex(page)
            visit.problems["plots"] = check_plots(page)
            visit.problems["copy"] = check_copy_buttons(page)
            visit.problems["network"] = guard.network_problems()
            visit.problems["console"] = guard.console_problems()
            shot = None
            for check, found in visit.problems.items():
                if found:
                    name = f"{page_id(path).replace('/', '-')}-{check}-{scheme}-{via}.png"
                    if shot is None:
                        shot = self.screenshot(page, name)
                    else:
                        shutil.copyfile(shot, self.shots / name)
                    visit.screenshots[check] = self.shots / name
        finally:
            if via == "direct" or nav_problems:
                page.close()  # a failed navigation leaves the tab in an unknown state
        return visit

    def screenshot(self, page, name: str, *, full_page: bool = True) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / name
        page.screenshot(path=str(path), full_page=full_page)
        return path

    def close(self):
        for ctx in self._contexts.values():
            ctx.close()
        self._contexts.clear()
        self._tabs.clear()


def search(page, term: str) -> list[str]:
    """Type ``term`` into Material's search box; return the result pages' URLs, best first."""
    box = page.locator("input.md-search__input")
    box.click()
    box.fill(term)
    box.press("End")  # Material searches on keyup, as when a reader types
    page.wait_for_selector(".md-search-result__item", timeout=READY_TIMEOUT_MS)
    links = page.locator(".md-search-result__item > a")
    hrefs = links.evaluate_all("(as) => as.map((a) => a.href)")
    return [urljoin(href, urlsplit(href).path) for href in hrefs]  # without ?h=… and #…
