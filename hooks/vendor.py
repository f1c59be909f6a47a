"""Serve pinned mermaid, KaTeX and Vega (vega, vega-lite, vega-embed) from the site itself (no CDN).

The files come from node_modules/, installed by `npm ci` from package-lock.json. The scripts are
loaded by docs/assets/loader.js, by these paths, only on pages that use them; KaTeX's stylesheet
is in mkdocs.yml's extra_css.
"""

from __future__ import annotations

import json
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
NODE = ROOT / "node_modules"

# site path -> path under node_modules
ASSETS = {
    "assets/vendor/mermaid/mermaid.min.js": "mermaid/dist/mermaid.min.js",
    "assets/vendor/katex/katex.min.js": "katex/dist/katex.min.js",
    "assets/vendor/katex/katex.min.css": "katex/dist/katex.min.css",
    "assets/vendor/katex/contrib/auto-render.min.js": "katex/dist/contrib/auto-render.min.js",
    "assets/vendor/vega/vega.min.js": "vega/build/vega.min.js",
    "assets/vendor/vega/vega-lite.min.js": "vega-lite/build/vega-lite.min.js",
    "assets/vendor/vega/vega-embed.min.js": "vega-embed/build/vega-embed.min.js",
}
FONT_DIR = "katex/dist/fonts"


def _check_pins() -> None:
    lock = json.loads((ROOT / "package-lock.json").read_text(encoding="utf-8"))
    wanted = json.loads((ROOT / "package.json").read_text(encoding="utf-8"))["dependencies"]
    for name in wanted:
        want = lock["packages"][f"node_modules/{name}"]["version"]
        manifest = NODE / name / "package.json"
        if not manifest.exists():
            raise PluginError(f"hooks/vendor.py: {manifest} missing; run `npm ci` first")
        have = json.loads(manifest.read_text(encoding="utf-8"))["version"]
        if have != want:
            raise PluginError(
                f"hooks/vendor.py: node_modules has {name} {have}, package-lock.json pins "
                f"{want}; run `npm ci`"
            )


def on_files(files: Files, config) -> Files:
    _check_pins()
    pairs = dict(ASSETS)
    for font in sorted((NODE / FONT_DIR).iterdir()):
        pairs[f"assets/vendor/katex/fonts/{font.name}"] = f"{FONT_DIR}/{font.name}"
    for uri, rel in pairs.items():
        files.append(File.generated(config, uri, abs_src_path=str(NODE / rel)))
    return files
