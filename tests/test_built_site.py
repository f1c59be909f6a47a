"""The built site requests no third-party host: scripts, stylesheets, CSS imports and url()s
all point into the site itself (the canonical link to our own site_url is allowed)."""

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
    assert list((site / "assets/vendor/katex/fonts").glob("*.woff2"))
