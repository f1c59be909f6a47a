"""Render each ```calculator NAME fence into its form (snippets/common/calculator.py says how).

The presets and the Python defaults come from tests/fixtures/calculators/NAME.json, which the
Python side writes; the build never imports a post's package. docs/assets/calculator.js brings
the form to life. A malformed spec or a vectors file that disagrees with it fails the build with
the page and the line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import calculator as calc  # noqa: E402
from snippets.common import markup  # noqa: E402


def on_page_markdown(markdown: str, page, config, files) -> str:
    path = ROOT / "docs" / page.file.src_uri
    source = path.read_text(encoding="utf-8") if path.is_file() else markdown
    shift = source[: source.find(markdown)].count("\n") if markdown in source else 0  # front matter
    out, last = [], 0
    for fence in markup.scan(path, markdown):
        if fence.lang != calc.LANG:
            continue
        where = f"docs/{page.file.src_uri}:{fence.line + shift}"
        try:
            spec = calc.parse(fence, where)
            html = calc.render(spec, calc.load_stored(spec.name))
        except calc.CalculatorError as exc:
            raise PluginError(str(exc)) from None
        out += [markdown[last : fence.start], html, "\n"]
        last = fence.end
    return "".join([*out, markdown[last:]])
