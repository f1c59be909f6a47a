"""Everything about the series is derived from the posts' own front matter (markup.PostMeta):

- the nav: the "系列文章" section of mkdocs.yml is filled with every docs/posts/*.md in series
  order (Material's navigation.footer then gives each post its previous / next links);
- the top of every post: its reading time, when and where its code was last verified (from its
  results' provenance), links to download its code (hooks/downloads.py), what the reader will be
  able to do (summary), the posts it builds on, and related posts: the other written posts that
  data/taxonomy.yaml lists in a category with it;
- `<!-- data: posts -->` on a page: the list of posts with their summaries and status (the home
  page).
A post without valid front matter fails the build with the page and line.
"""

from __future__ import annotations

import functools
import html
import json
import re
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import markup  # noqa: E402
from snippets.common.results import results_dir  # noqa: E402
from snippets.common.taxonomy import DataError, load_taxonomy  # noqa: E402

SECTION = "系列文章"
MARKER = "<!-- data: posts -->"
DOWNLOADS = "downloads"  # where hooks/downloads.py puts <slug>.py and <slug>.ipynb
# Reading time is an estimate of the prose alone (code, tables, plots and formulas not counted):
# Chinese at CJK_PER_MINUTE characters a minute -- an assumed rate for attentive reading of
# technical Chinese, not a measured one -- and English words at 238 a minute, the mean silent
# reading rate of English non-fiction in Brysbaert (2019), J. Mem. Lang. 109, 104047.
CJK_PER_MINUTE = 300
WORDS_PER_MINUTE = 238
CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
WORD = re.compile(r"[A-Za-z][A-Za-z0-9'-]*")


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
    rows = ["| # | 文章 | 读完你能 | 状态 |", "|---:|---|---|---|"]
    for i, p in enumerate(metas, 1):
        summary = p.summary.replace("|", "\\|")
        rows.append(f"| {i} | {_link(p.slug, p.heading, page)} | {summary} | {status(p)} |")
    return "\n".join(rows)


def reading(text: str) -> tuple[int, int, int]:
    """(minutes, Chinese characters, English words) of a page's prose."""
    text = markup.prose(markup._FRONT.sub("", text, count=1))  # fences, spans, comments blanked
    text = re.sub(r"\$\$.*?\$\$|\$[^$\n]+\$|\]\([^)]*\)|\{\{.*?\}\}", " ", text, flags=re.S)
    cjk, words = len(CJK.findall(text)), len(WORD.findall(text))
    return max(1, round(cjk / CJK_PER_MINUTE + words / WORDS_PER_MINUTE)), cjk, words


def newest_measurement(meta: markup.PostMeta) -> dict | None:
    """The provenance of the post's newest GPU measurement, or None."""
    records = [json.loads(p.read_text(encoding="utf-8"))
               for p in sorted((results_dir() / meta.slug).glob("*.json"))]  # fmt: skip
    measured = [r["provenance"] for r in records if r.get("kind") == "measured"]
    return max(measured, key=lambda p: p["date"]) if measured else None


def status(meta: markup.PostMeta) -> str:
    """The post's state in a few words, for the list of posts: awaiting a GPU run, the date of
    its newest GPU measurement, or (no GPU measurement) its code verified on the CPU."""
    if meta.awaiting_gpu:
        return "待 GPU 测量"
    p = newest_measurement(meta)
    return f"GPU 实测 {p['date'][:10]}" if p else "CPU 上验证"


def verified(meta: markup.PostMeta) -> str:
    """The "last verified" line, from the provenance of the post's newest GPU measurement."""
    if meta.awaiting_gpu:
        return "最近验证：待 GPU 运行——本页的代码改动之后还没有在 GPU 上重新测量（见下方提示）"
    p = newest_measurement(meta)
    if p is None:
        return "最近验证：在 CPU 上——本页没有 GPU 测量，它的代码块在每次 CI 中运行"
    dirty = "（工作区有未提交的改动）" if p["dirty"] else ""
    return (f"最近验证：{p['date'][:10]} · commit {p['commit'][:10]}{dirty} · {p['gpu']} · "
            f"torch {p['torch']} · triton {p['triton']}")  # fmt: skip


@functools.cache
def _categories() -> tuple[tuple[str, tuple[str, ...]], ...]:
    try:
        return tuple((c.name, c.posts) for c in load_taxonomy().categories)
    except DataError as exc:
        raise PluginError(str(exc)) from None


def related(meta: markup.PostMeta, by_slug: dict) -> list[str]:
    """Written posts that share a taxonomy category with this one (in the taxonomy's order),
    leaving out the post itself and its prerequisites (listed already)."""
    out: list[str] = []
    for _, posts in _categories():
        if meta.slug in posts:
            out += [s for s in posts if s in by_slug and s != meta.slug
                    and s not in meta.prerequisites and s not in out]  # fmt: skip
    return out


def header(meta: markup.PostMeta, by_slug: dict, page, text: str = "") -> str:
    """Under the title: reading time and the "last verified" line, the code's downloads, and an
    admonition with what the reader will be able to do and what it assumes."""
    minutes, cjk, words = reading(text)
    rate = (f"正文约 {cjk} 个汉字、{words} 个英文词，按每分钟 {CJK_PER_MINUTE} 字、"
            f"{WORDS_PER_MINUTE} 词估算；代码、表、图与公式不计")  # fmt: skip
    files = [f"{meta.slug}.py", f"{meta.slug}.ipynb"]
    icons = [":material-language-python:", ":material-notebook-outline:"]
    buttons = " ".join(
        f'[{icon} 下载 {Path(f).suffix}](../{DOWNLOADS}/{f}){{ .md-button download="{f}" '
        f'title="本页按测试顺序执行的全部代码，正文为注释" }}'
        for icon, f in zip(icons, files, strict=True)
    )
    lines = [
        '<div class="page-head" markdown>',
        f'<p class="page-meta"><span class="reading-time" title="{html.escape(rate)}">'
        f'阅读约 {minutes} 分钟</span> · <span class="verified">'
        f"{html.escape(verified(meta))}</span></p>",
        "",
        buttons,
        "</div>",
        "",
        '!!! abstract "读完本文"', "", f"    {meta.summary}",
    ]  # fmt: skip
    if meta.prerequisites:
        links = "、".join(_link(s, by_slug[s].heading, page) for s in meta.prerequisites)
        lines += ["", f"    先读：{links}"]
    if also := related(meta, by_slug):
        links = "、".join(_link(s, by_slug[s].heading, page) for s in also)
        lines += ["", f"    相关：{links}（在{_link('tech-map', '技术地图', page)}上同属一类）"]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    docs = Path(config["docs_dir"])
    metas = None
    if page.file.src_uri.startswith("posts/"):
        metas = posts(docs)
        by_slug = {p.slug: p for p in metas}
        meta = by_slug[Path(page.file.src_uri).stem]
        source = (docs / page.file.src_uri).read_text(encoding="utf-8")
        head, sep, rest = markdown.partition("\n")  # the H1 (front matter is already gone)
        markdown = f"{head}{sep}\n{header(meta, by_slug, page, source)}\n{rest}"
    if MARKER in markdown:
        metas = metas or posts(docs)
        markdown = markdown.replace(MARKER, post_list(metas, page))
    return markdown
