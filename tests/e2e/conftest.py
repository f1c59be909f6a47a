"""Browser suite: build the site once, serve it on 127.0.0.1, drive Debian's Chromium headless.

HANDBOOK_SITE_DIR=<dir> tests an already built site instead of building one.
Screenshots go to .e2e/screenshots/ (HANDBOOK_E2E_SHOTS overrides); the path is printed at the end.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.e2e import checks

E2E_DIR = Path(__file__).parent
SHOTS = Path(os.environ.get("HANDBOOK_E2E_SHOTS", checks.ROOT / ".e2e" / "screenshots"))
SITE_DIR_ENV = checks.SITE_DIR_ENV


def pytest_generate_tests(metafunc):
    if "page_path" in metafunc.fixturenames:
        pages = checks.site_pages()
        metafunc.parametrize("page_path", pages, ids=[checks.page_id(p) for p in pages])


def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if E2E_DIR in Path(item.path).parents]
    reason = None
    if not Path(checks.CHROMIUM).exists():
        reason = (
            f"browser suite: {checks.CHROMIUM} is missing; `apt-get install -y "
            "--no-install-recommends chromium fonts-noto-cjk` (as root), or run `nox -s e2e`"
        )
    elif importlib.util.find_spec("playwright") is None:
        reason = "browser suite: the playwright package is missing (dependency group 'browser')"
    if reason:
        for item in mine:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_terminal_summary(terminalreporter):
    if SHOTS.exists() and any(SHOTS.rglob("*.png")):
        terminalreporter.write_line(f"browser screenshots: {SHOTS}")


@pytest.fixture(scope="session")
def shots() -> Path:
    """The screenshot folder, emptied of the previous run's screenshots."""
    for old in SHOTS.rglob("*.png"):
        old.unlink()
    SHOTS.mkdir(parents=True, exist_ok=True)
    print(f"browser screenshots: {SHOTS}")
    return SHOTS


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory) -> Path:
    """The built site: HANDBOOK_SITE_DIR, or a strict build of this repository."""
    if os.environ.get(SITE_DIR_ENV):
        path = Path(os.environ[SITE_DIR_ENV]).resolve()
        if not (path / "index.html").exists():
            pytest.fail(f"{SITE_DIR_ENV}={path} is not a built site (no index.html)")
        return path
    return checks.build_site(checks.ROOT / "mkdocs.yml", tmp_path_factory.mktemp("site") / "site")


@pytest.fixture(scope="session")
def base_url(site_dir, tmp_path_factory):
    """http://127.0.0.1:<free port>/<site_url path>/ serving the built site."""
    with checks.serve(site_dir, tmp_path_factory.mktemp("serve")) as base:
        yield base


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = checks.launch(playwright)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def visitor(browser, base_url, shots):
    visitor = checks.Visitor(browser, base_url, shots)
    yield visitor
    visitor.close()
