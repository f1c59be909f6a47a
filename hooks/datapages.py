"""Render the tech-map data (data/taxonomy.yaml, data/glossary.yaml) into pages at build time.

A marker on its own line, outside code fences, is replaced by generated Markdown:
  <!-- data: panorama -->                 the panorama table (one row per category)
  <!-- data: classification stage -->    categories by stage | bottleneck | layer
  <!-- data: graph -->                    mermaid graph of the relations between categories
  <!-- data: decision-flow -->            mermaid decision flow, then its table
  <!-- data: scenarios -->                tabs per scenario: must, recommended, optional
  <!-- data: series-map -->               every post of the series, its place, written or planned
  <!-- data: glossary -->                 every term, grouped, with an anchor per term
The glossary page also declares its anchors in an ``<!-- anchors: ... -->`` comment (the structure
check reads Markdown sources only); the build fails when that list differs from the data.
A malformed data file or an unknown marker fails the build with the file and the line.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import markup  # noqa: E402
from snippets.common import taxonomy_render as render  # noqa: E402
from snippets.common.hardware import HardwareDataError, load_hardware  # noqa: E402
from snippets.common.taxonomy import DataError, load_all  # noqa: E402

MARKER = re.compile(r"^[ \t]*<!--\s*data\s*:\s*(?P<body>.*?)\s*-->[ \t]*$", re.M)
REGISTRY = re.compile(r"^<!--\s*anchors:.*?-->[ \t]*\n?", re.M | re.S)
REFRESH = "python -m snippets.common.taxonomy_render --write-anchors"
KINDS = {
    "panorama": (), "classification": tuple(render.DIMENSIONS), "graph": (),
    "decision-flow": (), "scenarios": (), "series-map": (), "glossary": (),
}  # fmt: skip

_data: dict = {}


def load() -> dict:
    try:
        taxonomy, glossary = load_all()
        hardware = load_hardware()
    except (DataError, HardwareDataError) as exc:
        raise PluginError(f"tech-map data: {exc}") from None
    return {"taxonomy": taxonomy, "glossary": glossary, "hardware": hardware}


def on_pre_build(config) -> None:
    _data.clear()
    _data.update(load())


def on_serve(server, config, builder):
    server.watch(str(ROOT / "data"))
    return server


def links_for(page, files) -> render.Links:
    depth = page.file.src_uri.count("/")
    up = "../" * depth
    written = frozenset(
        Path(f.src_uri).stem
        for f in files
        if f.src_uri.startswith("posts/") and f.src_uri.endswith(".md")
    )
    glossary = "" if page.file.src_uri == "glossary.md" else f"{up}glossary.md"
    return render.Links(glossary=glossary, posts=f"{up}posts/", written=written)


def markers(markdown: str):
    """(match, line) for every data marker outside fenced code."""
    visible = markup.prose(markdown, comments=False)
    return [(m, markup.line_of(markdown, m.start())) for m in MARKER.finditer(visible)]


def expand(kind: str, arg: str | None, links: render.Links) -> str:
    t, g, hw = _data["taxonomy"], _data["glossary"], _data["hardware"]
    if kind == "panorama":
        return render.panorama(t, g, links)
    if kind == "classification":
        return render.classification(t, arg)
    if kind == "graph":
        return render.relation_graph(t)
    if kind == "decision-flow":
        return render.decision_graph(t) + "\n\n" + render.flow_table(t, g, links)
    if kind == "scenarios":
        return render.scenarios(t, g, links)
    if kind == "series-map":
        planned = set(t.slugs())
        extra = [(p.slug, p.heading) for p in markup.series(ROOT) if p.slug not in planned]
        return render.series_map(t, links, extra)
    return render.glossary_page(g, t, hw, links)


def check_registry(markdown: str, where: str) -> str:
    """On the glossary page: the declared anchors must equal the data's; drop the comment."""
    found = REGISTRY.search(markdown)
    if found is None:
        raise PluginError(f"{where}: the glossary page needs an <!-- anchors: --> list ({REFRESH})")
    declared = set(re.findall(r"\{#[\w-]+\}", found[0]))
    if declared != set(render.anchor_registry(_data["glossary"], _data["taxonomy"]).split()):
        raise PluginError(
            f"{where}:{markdown.count(chr(10), 0, found.start()) + 1}: the <!-- anchors: --> list "
            f"differs from data/glossary.yaml; refresh it with `{REFRESH}`"
        )
    return markdown[: found.start()] + markdown[found.end() :]


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = f"docs/{page.file.src_uri}"
    found = markers(markdown)
    if not found:
        return markdown
    if not _data:
        _data.update(load())
    links = links_for(page, files)
    out, last = [], 0
    for m, line in found:
        kind, _, arg = m["body"].partition(" ")
        arg = arg.strip() or None
        if kind not in KINDS:
            raise PluginError(
                f"{where}:{line}: unknown data marker {kind!r} (known: {', '.join(KINDS)})"
            )
        allowed = KINDS[kind]
        if (arg is None) != (not allowed) or (arg is not None and arg not in allowed):
            need = f"one of {', '.join(allowed)}" if allowed else "no argument"
            raise PluginError(f"{where}:{line}: data marker {kind!r} takes {need}, got {arg!r}")
        out += [markdown[last : m.start()], expand(kind, arg, links)]
        last = m.end()
    markdown = "".join([*out, markdown[last:]])
    if any(m["body"].split()[0] == "glossary" for m, _ in found):
        markdown = check_registry(markdown, where)
    return markdown
