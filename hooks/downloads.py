"""Each post's code as a download: docs/posts/<slug>.md → downloads/<slug>.py and <slug>.ipynb,
and the code they import as a wheel: downloads/xuntui_handbook-<version>-py3-none-any.whl.

The code cells are the page's Python fences in page order, as the tests run them (tests/pages.py):
an inline fence as written; an include fence (`--8<-- "file:section"`) as the whole included
file, the first time the page includes it (a file runs whole, once per page: a later include of
it adds nothing); a fence marked `gpu` as a cell tagged `gpu`; a fence marked `skip` not at all
(its reason and code are shown as text). The prose between them becomes markdown cells, which the
.py holds as comments; numbers from results are filled in, tables, plots and calculators are named.

A download runs anywhere once the wheel is installed (`pip install <its URL>`, which the
download's first cell names): the wheel holds the `snippets` package, data/ and results/ laid out
as in the repository (a .pth file puts that folder on the path), and the download's first lines
call snippets.common.download.start(), after which the run records nothing and spawned worker
processes import their function from the package (see that module). Tested by
tests/test_downloads_run.py; `nox -s gpu_docs` runs every post's download after the post.

jupytext writes the .py (percent format) from the same notebook. Edits let several files run as
one script, each marked on its line so that the original is always visible: `from __future__`
moves to the first line, and the first cell starts `download.start()`; a relative import names
its package; `__file__` in an included file names the installed copy of that file; an
`if __name__ == "__main__":` block, which never runs when the file is imported, becomes
`if False:`; a `gpu` cell is indented under `if download.gpu_cell(...):` (skipped without CUDA).
"""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import posixpath
import re
import sys
import tokenize
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from snippets.common import claims as cl  # noqa: E402
from snippets.common import markup  # noqa: E402
from snippets.common.results import results_dir  # noqa: E402

FOLDER = "downloads"  # site path of the files: downloads/<slug>.py, downloads/<slug>.ipynb
ADDED = "  # 下载版添加"  # a line the download adds
WAS = "  # 原为："  # a line the download rewrote: the original follows
INDENT = "    "  # a gpu cell's code, under its `if download.gpu_cell(...):`
DIST = "xuntui_handbook"  # the wheel: <DIST>-<version>-py3-none-any.whl
PACKAGED = ("snippets", "data", "results")  # what the wheel holds, in the repository's layout
REQUIRES = ("torch", "triton; sys_platform == 'linux'", "pyyaml")  # what snippets/ imports
FUTURE = re.compile(r"^from __future__ import .+$", re.M)
RELATIVE = re.compile(r"^(?P<indent>\s*)from (?P<dots>\.+)(?P<rest>\S*) import ", re.M)
MAIN = re.compile(r"^if __name__ == [\"']__main__[\"']:", re.M)  # the script is __main__
LINK = re.compile(r"\]\((?P<target>(?![a-z]+:|#)[^)\s]+)\)")


def file_names(text: str) -> dict[int, list[int]]:
    """Row -> columns of each `__file__` name in the code (not in strings or comments)."""
    found: dict[int, list[int]] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NAME and tok.string == "__file__":
            found.setdefault(tok.start[0], []).append(tok.start[1])
    return found


def script_edits(text: str, file: str) -> str:
    """An included file's text, edited (and marked) to run inside one script."""
    module = file.removesuffix(".py").replace("/", ".")
    text = FUTURE.sub(lambda m: f"{WAS.strip()}{m.group()}", text)
    names = file_names(text)

    def absolute(m: re.Match) -> str:
        package = module.split(".")[: -len(m["dots"])]
        name = ".".join([*package, m["rest"]] if m["rest"] else package)
        return f"{m['indent']}from {name} import "

    lines = []
    for row, line in enumerate(text.splitlines(), 1):
        new = line
        for col in sorted(names.get(row, []), reverse=True):
            new = f'{new[:col]}download.path("{file}"){new[col + len("__file__") :]}'
        new = MAIN.sub("if False:", RELATIVE.sub(absolute, new))
        lines.append(f"{new}{WAS}{line.lstrip()}" if new != line else line)
    return "\n".join(lines)


def string_rows(code: str) -> set[int]:
    """1-based rows that begin inside a string spanning several rows: indenting them would
    change the string."""
    rows: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.start[0] < tok.end[0]:
            rows.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return rows


def gpu_guarded(code: str, label: str) -> str:
    """A `gpu` cell's code under `if download.gpu_cell(...):`, marked; a cell that records a
    measurement says so (gpu_docs skips those: the page has just measured the same code)."""
    measures = "write_result(" in code
    inside = string_rows(code)
    body = [INDENT + line if line.strip() and row not in inside else line
            for row, line in enumerate(code.split("\n"), 1)]  # fmt: skip
    if not ast.parse(code).body:  # comments only: an `if` needs a statement
        body.append(f"{INDENT}pass{ADDED}")
    guard = f"if download.gpu_cell({label!r}, measures={measures}):{ADDED}"
    return "\n".join([guard, *body])


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


def notebook(page: Path, site_url: str, pending: frozenset = frozenset(), wheel_url: str = "",
             version: str = ""):  # fmt: skip
    """The page as a notebook: its prose as markdown cells, its executed code as code cells."""
    import nbformat.v4 as nbf

    slug = page.stem
    meta = markup.post_meta(page)
    body = page.read_text(encoding="utf-8")
    front = markup._FRONT.match(body).end()
    lines_before = body[:front].count("\n")  # fence lines count from the end of the front matter
    body = body[front:]
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
        "运行前先安装本手册的代码包（页面导入的 `snippets` 包、`data/` 里的数据和已发布的"
        f"结果记录；依赖 torch、triton、PyYAML）：`pip install {wheel_url}`，"
        "然后在任意目录运行本文件。"
        "它不写任何文件：页面的计算结果与已发布的记录比较并打印是否一致，GPU 上的测量值只打印。"
        "没有 GPU 时 Triton 用解释器运行，标为 `gpu` 的单元打印一行后跳过。"
        "行尾的“下载版添加”“原为：”标出为了在一个脚本里运行而对源文件做的改动。"
    )
    cells, done, future, last, text = [nbf.new_markdown_cell(head)], set(), [], 0, []
    on_gpu: set[str] = set()  # included files whose whole text sits in a `gpu` cell

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
        where = f"docs/posts/{page.name}:{lines_before + fence.line + 1}"
        if not includes:
            code = fence.body.rstrip("\n")
            cells.append(nbf.new_code_cell(gpu_guarded(code, where) if fence.gpu else code,
                                           metadata=tags))  # fmt: skip
        for file, section in includes:
            if file in done:
                if file in on_gpu and not fence.gpu:
                    raise ValueError(
                        f"{where}: includes {file}, which the page first includes in a `gpu` "
                        "fence: its download would skip the file without CUDA, where the page "
                        "test runs it; include it first in a fence that runs on the CPU"
                    )
                shown = f"`{file}` 的 `{section}` 小节" if section else f"`{file}`"
                text.append(f"\n\n（页面在此展示 {shown}；该文件已在上面整体运行。）\n")
                continue
            done.add(file)
            on_gpu.update([file] if fence.gpu else [])
            source = (ROOT / file).read_text(encoding="utf-8")
            future += [m for m in FUTURE.findall(source) if m not in future]
            shown = f"（页面在此展示其中的 `{section}` 小节）" if section else ""
            cells.append(nbf.new_markdown_cell(f"`{file}` 全文{shown}"))
            code = script_edits(source, file)
            cells.append(nbf.new_code_cell(gpu_guarded(code, file) if fence.gpu else code,
                                           metadata=tags))  # fmt: skip
    text.append(body[last:])
    flush()
    first = next((c for c in cells if c.cell_type == "code"), None)
    if first is not None:  # `from __future__` first (a script may start with it only), then start
        start = [
            "try:",
            f"{INDENT}from snippets.common import download",
            "except ModuleNotFoundError as exc:  # the handbook's code is not installed",
            f'{INDENT}raise SystemExit(f"{{exc}}: pip install {wheel_url}") from None',
            f"download.start({slug!r}, {version!r})",
        ]
        first.source = "".join(f"{line}{ADDED}\n" for line in [*future, *start]) + first.source
    nb = nbf.new_notebook(cells=cells)
    python = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata |= {"kernelspec": python, "language_info": {"name": "python"}}
    nb.metadata["jupytext"] = {"notebook_metadata_filter": "-all", "cell_metadata_filter": "tags",
                             "comment_magics": False}  # fmt: skip
    return nb


def downloads(page: Path, site_url: str, pending: frozenset = frozenset(), wheel_url: str = "",
              version: str = "") -> dict[str, str]:  # fmt: skip
    """{file name: text} of a post's two downloads."""
    import jupytext
    import nbformat

    nb = notebook(page, site_url, pending, wheel_url, version)
    script = jupytext.writes(nb, fmt="py:percent")
    del nb.metadata["jupytext"]
    return {f"{page.stem}.py": script, f"{page.stem}.ipynb": nbformat.writes(nb) + "\n"}


def packaged_files(root: Path = ROOT) -> list[Path]:
    """The repository files the wheel holds: the snippets package, data/, results/."""
    files = [p for top in PACKAGED for p in (root / top).rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]  # fmt: skip
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def wheel(root: Path = ROOT) -> tuple[str, bytes]:
    """(file name, bytes) of a wheel holding snippets/, data/ and results/ under <DIST>/, with a
    .pth file that puts <DIST>/ on sys.path: installed, the files sit as in the repository, so
    the code finds data/ and results/ where it always does. The version's local part is a hash
    of the files: another tree, another wheel."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    files = [(f"{DIST}/{p.relative_to(root).as_posix()}", p.read_bytes())
             for p in packaged_files(root)]  # fmt: skip
    content = hashlib.sha256()
    for name, data in files:
        content.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    version = f"{project['version']}+{content.hexdigest()[:12]}"
    info = f"{DIST}-{version}.dist-info"
    metadata = "\n".join([
        "Metadata-Version: 2.1", f"Name: {project['name']}", f"Version: {version}",
        f"Summary: {project['description']}", f"Requires-Python: {project['requires-python']}",
        *(f"Requires-Dist: {r}" for r in REQUIRES), "",
    ])  # fmt: skip
    files += [
        (f"{DIST}.pth", f"{DIST}\n".encode()),
        (f"{info}/METADATA", metadata.encode()),
        (f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: hooks/downloads.py\n"
                          b"Root-Is-Purelib: true\nTag: py3-none-any\n"),
        (f"{info}/top_level.txt", b"snippets\n"),
    ]  # fmt: skip
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files) + f"{info}/RECORD,,\n"
    files.append((f"{info}/RECORD", record.encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            entry = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))  # reproducible
            entry.external_attr = 0o644 << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(entry, data)
    return f"{DIST}-{version}-py3-none-any.whl", out.getvalue()


def build(site_url: str, pending: frozenset = frozenset(), root: Path = ROOT) -> dict:
    """{file name: text or bytes} of everything under downloads/: the wheel and each post's
    .py and .ipynb (which name the wheel)."""
    name, data = wheel(root)
    version = name.split("-")[1]
    out: dict[str, str | bytes] = {name: data}
    for page in sorted((root / "docs" / "posts").glob("*.md")):
        out |= downloads(page, site_url, pending, f"{site_url}{FOLDER}/{name}", version)
    return out


def on_files(files, config):
    from mkdocs.structure.files import File

    pending = cl.pending(ROOT, results_dir())
    for name, content in build(config["site_url"] or "/", pending).items():
        files.append(File.generated(config, f"{FOLDER}/{name}", content=content))
    return files
