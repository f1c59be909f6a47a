"""Each post's code as a download: docs/posts/<slug>.md → downloads/<slug>.py and <slug>.ipynb.

The code cells are the page's Python fences in page order, as the tests run them (tests/pages.py):
an inline fence as written; an include fence (`--8<-- "file:section"`) as the whole included
file, the first time the page includes it (a file runs whole, once per page: a later include of
it adds nothing); a fence marked `gpu` as a cell tagged `gpu`; a fence marked `skip` not at all
(its reason and code are shown as text). The prose between them becomes markdown cells, which the
.py holds as comments; numbers from results are filled in, tables, plots and calculators are named.

jupytext writes the .py (percent format) from the same notebook. Four edits let several files
run as one script, each marked on its line so that the original is always visible:
`from __future__` moves to the first line; a relative import names its package; a file that
reads `__file__` first sets it (relative to the repository's root); an `if __name__ == "__main__":`
block, which never runs when the file is imported, becomes `if False:`.
"""

from __future__ import annotations

import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import claims as cl  # noqa: E402
from snippets.common import markup  # noqa: E402
from snippets.common.results import results_dir  # noqa: E402

FOLDER = "downloads"  # site path of the files: downloads/<slug>.py, downloads/<slug>.ipynb
ADDED = "  # 下载版添加"  # a line the download adds
WAS = "  # 原为："  # a line the download rewrote: the original follows
FUTURE = re.compile(r"^from __future__ import .+$", re.M)
RELATIVE = re.compile(r"^(?P<indent>\s*)from (?P<dots>\.+)(?P<rest>\S*) import ", re.M)
MAIN = re.compile(r"^if __name__ == [\"']__main__[\"']:", re.M)  # the script is __main__
LINK = re.compile(r"\]\((?P<target>(?![a-z]+:|#)[^)\s]+)\)")


def script_edits(text: str, file: str) -> str:
    """An included file's text, edited (and marked) to run inside one script."""
    module = file.removesuffix(".py").replace("/", ".")
    text = FUTURE.sub(lambda m: f"{WAS.strip()}{m.group()}", text)

    def absolute(m: re.Match) -> str:
        package = module.split(".")[: -len(m["dots"])]
        name = ".".join([*package, m["rest"]] if m["rest"] else package)
        return f"{m['indent']}from {name} import "

    lines = []
    for line in text.splitlines():
        new = MAIN.sub("if False:", RELATIVE.sub(absolute, line))
        lines.append(f"{new}{WAS}{line.lstrip()}" if new != line else line)
    if re.search(r"(?<![.\w])__file__\b", text):
        lines.insert(0, f'__file__ = "{file}"{ADDED}')
    return "\n".join(lines)


def plain(value, spec: str | None) -> str:
    stat = cl.as_stat(value)
    value = stat.median if hasattr(stat, "median") else value
    if isinstance(value, float) and not spec:
        return f"{value:.3g}"
    return format(value, spec) if spec else str(value)


def prose(text: str, slug: str, results: cl.Results, site_url: str) -> str:
    """Markdown between two code cells: comments dropped, numbers filled in, links absolute."""

    def link(m: re.Match) -> str:
        target, _, anchor = m["target"].partition("#")
        path = posixpath.normpath(posixpath.join("posts", target)) if target else f"posts/{slug}"
        path = re.sub(r"(^|/)index\.md$", r"\1", path).removesuffix(".md")
        path = f"{path}/" if path and not path.endswith("/") and "." not in path else path
        return f"]({site_url}{path}{'#' + anchor if anchor else ''})"

    return re.sub(r"\n{3,}", "\n\n", LINK.sub(link, text)).strip()


def notebook(page: Path, site_url: str, pending: frozenset = frozenset()):
    """The page as a notebook: its prose as markdown cells, its executed code as code cells."""
    import nbformat.v4 as nbf

    slug = page.stem
    meta = markup.post_meta(page)
    body = page.read_text(encoding="utf-8")
    body = body[markup._FRONT.match(body).end() :]
    results = cl.Results(pending=pending)
    events = []  # (start, end, kind, payload), in page order
    for f in markup.scan(page, body):
        if f.lang in markup.PYTHON:
            events.append((f.start, f.end, "code", f))
        elif f.lang in markup.WIDGETS:  # a calculator: a form on the page
            title = re.search(r"^title:\s*(.+)$", f.body, re.M)
            name = title[1].strip() if title else f.argument
            events.append((f.start, f.end, "text", f"*（计算器：{name}——见网页）*\n"))
    for d in cl.directives(page, body):
        if d.kind == "number":
            try:
                shown = plain(cl.resolve(slug, d.name, d.text, results), d.fmt)
            except cl.SpecError:
                shown = "（待测）"
            events.append((d.start, d.end, "text", shown))
        elif d.kind in ("table", "plot"):
            what = {"table": "表", "plot": "图"}[d.kind]
            caption = d.spec.get("caption") or d.name
            events.append((d.start, d.end, "text", f"*（{what}：{caption}——见网页）*\n"))
    blanked = markup.prose(body, comments=False)  # fences and code spans blanked
    for m in re.finditer(r"<!--.*?-->", blanked, re.S):
        events.append((m.start(), m.end(), "text", ""))
    url = f"{site_url}posts/{slug}/"
    head = (
        f"本文件由网页《{meta.heading}》（{url}）的代码块生成："
        "Python 代码块按测试运行它们的顺序排列，被 include 的文件以全文出现在页面第一次引用它的"
        "地方（测试也把它整体运行一次）。\n\n"
        "把文件放进仓库的根目录再运行（代码导入仓库里的 `snippets` 包）；没有 GPU 时先设 "
        "`TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES=`。标签为 `gpu` 的单元需要 CUDA；写测量结果的单元"
        "还需要 `HANDBOOK_RESULTS_DIR=<一个目录>`。行尾的“下载版添加”“原为：”标出为了在一个脚本里"
        "运行而对源文件做的改动。"
    )
    cells, done, future, last, text = [nbf.new_markdown_cell(head)], set(), [], 0, []

    def flush():
        md = prose("".join(text), slug, results, site_url)
        if md:
            cells.append(nbf.new_markdown_cell(md))
        text.clear()

    for start, end, kind, payload in sorted(events, key=lambda e: e[0]):
        text.append(body[last:start])
        last = end
        if kind == "text":
            text.append(payload)
            continue
        fence = payload
        if fence.skip:
            text.append(f"\n\n（下面的代码块不运行：{fence.skip}）\n\n```python\n{fence.body}```\n")
            continue
        includes = fence.includes()
        if fence.gpu and any(file not in done for file, _ in includes or [("", None)]):
            text.append(f"\n\n（下一个单元需要 CUDA：{fence.gpu}）\n")
        flush()
        tags = {"tags": ["gpu"]} if fence.gpu else {}
        if not includes:
            cells.append(nbf.new_code_cell(fence.body.rstrip("\n"), metadata=tags))
        for file, section in includes:
            if file in done:
                shown = f"`{file}` 的 `{section}` 小节" if section else f"`{file}`"
                text.append(f"\n\n（页面在此展示 {shown}；该文件已在上面整体运行。）\n")
                continue
            done.add(file)
            source = (ROOT / file).read_text(encoding="utf-8")
            future += [m for m in FUTURE.findall(source) if m not in future]
            shown = f"（页面在此展示其中的 `{section}` 小节）" if section else ""
            cells.append(nbf.new_markdown_cell(f"`{file}` 全文{shown}"))
            cells.append(nbf.new_code_cell(script_edits(source, file), metadata=tags))
    text.append(body[last:])
    flush()
    if future:  # a script may start with them only
        first = next(c for c in cells if c.cell_type == "code")
        first.source = "".join(f"{f}{ADDED}\n" for f in future) + first.source
    nb = nbf.new_notebook(cells=cells)
    python = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata |= {"kernelspec": python, "language_info": {"name": "python"}}
    nb.metadata["jupytext"] = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags",
                             "comment_magics": False}  # fmt: skip
    return nb


def downloads(page: Path, site_url: str, pending: frozenset = frozenset()) -> dict[str, str]:
    """{file name: text} of a post's two downloads."""
    import jupytext
    import nbformat

    nb = notebook(page, site_url, pending)
    script = jupytext.writes(nb, fmt="py:percent")
    del nb.metadata["jupytext"]
    return {f"{page.stem}.py": script, f"{page.stem}.ipynb": nbformat.writes(nb) + "\n"}


def on_files(files: Files, config) -> Files:
    pending = cl.pending(ROOT, results_dir())
    for page in sorted((ROOT / "docs" / "posts").glob("*.md")):
        for name, text in downloads(page, config["site_url"] or "/", pending).items():
            files.append(File.generated(config, f"{FOLDER}/{name}", content=text))
    return files
