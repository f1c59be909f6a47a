"""Everything about the series is derived from the posts' own front matter (markup.PostMeta):

- the nav: the "系列文章" section of mkdocs.yml is filled with every docs/posts/*.md in series
  order (Material's navigation.footer then gives each post its previous / next links);
- the top of every post: what the reader will be able to do (summary) and the posts it builds on;
- `<!-- data: posts -->` on a page: the list of posts with their summaries (the home page).
A post without valid front matter fails the build with the page and line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import markup  # noqa: E402

SECTION = "系列文章"
MARKER = "<!-- data: posts -->"


def posts(docs: Path) -> list[markup.PostMeta]:
    try:
        return markup.series(docs.parent)
    except markup.PageError as exc:
        raise PluginError(str(exc)) from None


def on_config(config):
    docs = Path(config["docs_dir"])
    entries = [{p.title: f"posts/{p.slug}.md"} for p in posts(docs)]
    nav = config["nav"] or []
    for item in nav:
        if isinstance(item, dict) and SECTION in item:
            item[SECTION] = entries
            return config
    raise PluginError(f"mkdocs.yml: the nav needs a '{SECTION}: []' section for the posts")


def _link(slug: str, title: str, page) -> str:
    up = "" if page.file.src_uri.startswith("posts/") else "posts/"
    return f"[{title}]({up}{slug}.md)"


def post_list(metas: list[markup.PostMeta], page) -> str:
    rows = ["| # | 文章 | 读完你能 |", "|---:|---|---|"]
    for i, p in enumerate(metas, 1):
        summary = p.summary.replace("|", "\\|")
        rows.append(f"| {i} | {_link(p.slug, p.heading, page)} | {summary} |")
    return "\n".join(rows)


def header(meta: markup.PostMeta, by_slug: dict, page) -> str:
    """An admonition under the title: what the reader will be able to do, what it assumes."""
    lines = ['!!! abstract "读完本文"', "", f"    {meta.summary}"]
    if meta.prerequisites:
        links = "、".join(_link(s, by_slug[s].heading, page) for s in meta.prerequisites)
        lines += ["", f"    先读：{links}"]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs = Path(config["docs_dir"])
    metas = None
    if page.file.src_uri.startswith("posts/"):
        metas = posts(docs)
        by_slug = {p.slug: p for p in metas}
        meta = by_slug[Path(page.file.src_uri).stem]
        head, sep, rest = markdown.partition("\n")  # the H1 (front matter is already gone)
        markdown = f"{head}{sep}\n{header(meta, by_slug, page)}\n{rest}"
    if MARKER in markdown:
        metas = metas or posts(docs)
        markdown = markdown.replace(MARKER, post_list(metas, page))
    return markdown
