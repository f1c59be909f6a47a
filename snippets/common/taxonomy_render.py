"""Render the tech-map data as Markdown: tables, tabs, glossary entries and mermaid diagrams.

Pure functions of the loaded data; hooks/datapages.py calls them when the site is built, and
the tests call them directly. Links are relative to the page being rendered (``Links``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from snippets.common.taxonomy import HW, Glossary, Taxonomy, Term

TIERS = (("must", "必做"), ("recommended", "推荐"), ("optional", "可选"))
DIMENSIONS = {"stage": "stages", "bottleneck": "bottlenecks", "layer": "layers"}


@dataclass(frozen=True)
class Links:
    """Where the glossary and the posts are, seen from the page being rendered."""

    glossary: str  # "../glossary.md" from a post; "" on the glossary page itself
    posts: str  # prefix of post pages: "../posts/" from a post, "posts/" from the docs root
    written: frozenset  # slugs whose page exists (planned posts are not linked)

    def term(self, term_id: str) -> str:
        return f"{self.glossary}#{term_id}"

    def post(self, slug: str) -> str:
        return f"{self.posts}{slug}.md"


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def technique(tid: str, name: str, glossary: Glossary, links: Links) -> str:
    """A technique name, linked to its glossary entry when it has one."""
    return f"[{name}]({links.term(tid)})" if tid in glossary.by_id() else name


def post_ref(slug: str, taxonomy: Taxonomy, links: Links) -> str:
    """A post by its short title (before the first full-width colon), linked once it exists."""
    title = next(p.title for p in taxonomy.series if p.slug == slug).split("：")[0]
    if slug in links.written:
        return f"[{title}]({links.post(slug)})"
    return f"{title}（计划中）"


# ------------------------------------------------------------------ tables


def panorama(taxonomy: Taxonomy, glossary: Glossary, links: Links) -> str:
    """One row per category: tags, sub-techniques, representative tools, scenarios, posts."""
    rows = ["| 大类 | 子技术 | 代表实现 / 工具 · 典型场景 · 相关文章 |", "|---|---|---|"]
    for c in taxonomy.categories:
        tags = " / ".join(
            "、".join(taxonomy.label(dim, t) for t in getattr(c, dim))
            for dim in ("stages", "bottlenecks", "layers")
        )
        techs = " · ".join(technique(t, n, glossary, links) for t, n in c.techniques.items())
        tools = " · ".join(f"[{t.name}]({t.url})" for t in c.tools) or "—"
        posts = "、".join(post_ref(s, taxonomy, links) for s in c.posts) or "—"
        first = f"**{c.name}**<br>{c.summary}<br><small>{tags}</small>"
        last = f"{tools}<br>场景：{'、'.join(c.scenarios) or '—'}<br>文章：{posts}"
        rows.append(f"| {cell(first)} | {cell(techs)} | {cell(last)} |")
    return "\n".join(rows)


def classification(taxonomy: Taxonomy, dimension: str) -> str:
    """The categories grouped by one dimension: stage, bottleneck or layer."""
    key = DIMENSIONS[dimension]
    heading = {"stages": "目标", "bottlenecks": "判断信号", "layers": "例子"}[key]
    rows = [f"| {dimension_label(key)} | {heading} | 大类 |", "|---|---|---|"]
    for tag, entry in taxonomy.vocabularies[key].items():
        detail = next(v for k, v in entry.items() if k != "label")
        names = "、".join(c.name for c in taxonomy.categories if tag in getattr(c, key))
        rows.append(f"| **{entry['label']}** | {cell(detail)} | {cell(names)} |")
    return "\n".join(rows)


def dimension_label(key: str) -> str:
    return {"stages": "阶段", "bottlenecks": "瓶颈", "layers": "层（自顶向下）"}[key]


def flow_table(taxonomy: Taxonomy, glossary: Glossary, links: Links) -> str:
    names = {tid: name for tid, (name, _) in taxonomy.techniques().items()}
    rows = ["| 症状 | 瓶颈 | 先看的大类 | 首选技术 |", "|---|---|---|---|"]
    for node in taxonomy.decision_flow:
        cats = "、".join(taxonomy.category(c).name for c in node.categories)
        techs = " · ".join(technique(t, names[t], glossary, links) for t in node.techniques)
        label = taxonomy.label("bottlenecks", node.bottleneck)
        rows.append(f"| {cell(node.symptom)} | {label} | {cell(cats)} | {cell(techs)} |")
    return "\n".join(rows)


def scenarios(taxonomy: Taxonomy, glossary: Glossary, links: Links) -> str:
    """One content tab per scenario, with its must / recommended / optional techniques."""
    names = {tid: name for tid, (name, _) in taxonomy.techniques().items()}
    out = []
    for s in taxonomy.scenarios:
        out.append(f'=== "{s.name}"')
        out.append("")
        for attr, label in TIERS:
            items = " · ".join(technique(t, names[t], glossary, links) for t in getattr(s, attr))
            out.append(f"    - **{label}**：{items}")
        out += ["", f"    {s.note}", ""]
    return "\n".join(out).rstrip() + "\n"


def series_map(taxonomy: Taxonomy, links: Links, extra=()) -> str:
    """Every post of the series, its place on the map, and whether it is written yet; `extra`
    (slug, title) pairs are written posts the plan does not list, appended."""
    rows = ["| 文章 | 地图上的位置 | 对应大类 | 状态 |", "|---|---|---|---|"]
    for p in taxonomy.series:
        cats = "、".join(taxonomy.category(c).name for c in taxonomy.posts_of(p.slug)) or "—"
        written = p.slug in links.written
        title = f"[{p.title}]({links.post(p.slug)})" if written else p.title
        status = "已发布" if written else "计划中"
        rows.append(f"| {cell(title)} | {cell(p.region)} | {cell(cats)} | {status} |")
    for slug, title in extra:
        rows.append(f"| {cell(f'[{title}]({links.post(slug)})')} | — | — | 已发布 |")
    return "\n".join(rows)


# ------------------------------------------------------------------ the glossary


def fill_hardware(text: str, hardware: dict) -> str:
    """Replace [[hw:gpu.field]] by the value in data/hardware.yaml (the single source)."""

    def value(m: re.Match) -> str:
        v = getattr(hardware[m[1]], m[2])
        return f"{v:g}" if isinstance(v, float) else str(v)

    return HW.sub(value, text)


def glossary_page(glossary: Glossary, taxonomy: Taxonomy, hardware: dict, links: Links) -> str:
    """All terms, grouped (basic groups first, then the taxonomy's categories), with anchors."""
    order = [*glossary.groups, *(c.id for c in taxonomy.categories)]
    names = {**glossary.groups, **{c.id: c.name for c in taxonomy.categories}}
    by_id = glossary.by_id()
    out = []
    for group in order:
        terms = [t for t in glossary.terms if t.category == group]
        if not terms:
            continue
        out += [f"## {names[group]} {{#cat-{group}}}", ""]
        for t in terms:
            out += glossary_entry(t, by_id, taxonomy, hardware, links)
    return "\n".join(out)


def glossary_entry(t: Term, by_id: dict, taxonomy: Taxonomy, hardware: dict, links: Links):
    lines = [f"### {t.term} {{#{t.id}}}", ""]
    if t.aliases:
        lines += ["别名：" + " · ".join(t.aliases), ""]
    lines += [fill_hardware(t.definition, hardware), ""]
    refs = [f"来源：[{t.source}]({t.source_url})"]
    if t.posts:
        refs.append("相关文章：" + "、".join(post_ref(s, taxonomy, links) for s in t.posts))
    if t.see:
        refs.append("另见：" + "、".join(f"[{by_id[s].term}]({links.term(s)})" for s in t.see))
    return [*lines, " · ".join(refs), ""]


def anchor_registry(glossary: Glossary, taxonomy: Taxonomy) -> str:
    """The explicit anchors that docs/glossary.md declares for the structure check."""
    groups = [g for g in [*glossary.groups, *(c.id for c in taxonomy.categories)]
              if any(t.category == g for t in glossary.terms)]  # fmt: skip
    ids = [f"{{#cat-{g}}}" for g in groups] + [f"{{#{t.id}}}" for t in glossary.terms]
    lines, line = [], ""
    for a in ids:
        if len(line) + len(a) + 1 > 96:
            lines.append(line)
            line = ""
        line = f"{line} {a}".strip()
    return "\n".join([*lines, line])


# ------------------------------------------------------------------ mermaid

# --8<-- [start:mermaid]
LAYER_CLASS = {  # node colour by a category's first layer tag
    "serving-system": "system", "scheduling": "system", "compiler": "framework",
    "framework": "framework", "kernel-library": "kernel", "custom-kernel": "kernel",
    "architecture": "model", "precision": "model", "hardware": "hardware",
}  # fmt: skip
CLASS_STYLE = {
    "system": "fill:#FDE8A9,stroke:#C9A43B,color:#222",
    "framework": "fill:#CFE0F3,stroke:#6F97C9,color:#222",
    "kernel": "fill:#D4E8CF,stroke:#7FAF73,color:#222",
    "model": "fill:#F6CED0,stroke:#C7787C,color:#222",
    "hardware": "fill:#E2E2E2,stroke:#8A8A8A,color:#222",
}


def node_id(prefix: str, ident: str) -> str:
    """Mermaid node ids stay ASCII: 'c' + 'long-context' -> 'c_long_context'."""
    return f"{prefix}_{ident.replace('-', '_')}"


def label(*parts: str) -> str:
    """A quoted mermaid label; lines joined by <br/>, characters mermaid would parse removed."""
    safe = [
        p.replace('"', "'").replace("#", "＃").replace("<", "‹").replace(">", "›") for p in parts
    ]
    return '"' + "<br/>".join(safe) + '"'


# --8<-- [end:mermaid]


def relation_graph(taxonomy: Taxonomy) -> str:
    """Every category as a node (coloured by its first layer), every relation as an edge."""
    lines = ["flowchart TD"]
    for c in taxonomy.categories:
        lines.append(f"    {node_id('c', c.id)}[{label(c.name)}]")
    for r in taxonomy.relations:
        src, dst = node_id("c", r.source), node_id("c", r.target)
        lines.append(f"    {src} -->|{label(r.label)}| {dst}")
    lines += _classes({node_id("c", c.id): LAYER_CLASS[c.layers[0]] for c in taxonomy.categories})
    return "```mermaid\n" + "\n".join(lines) + "\n```"


def decision_graph(taxonomy: Taxonomy) -> str:
    """Profile, pick the symptom, go to the techniques."""
    names = {tid: name for tid, (name, _) in taxonomy.techniques().items()}
    lines = [
        "flowchart LR",
        f"    start([{label('训练或推理慢', '或者 OOM')}])",
        f"    start --> prof[{label('用 profiler 定位主瓶颈')}]",
    ]
    for node in taxonomy.decision_flow:
        d, t = node_id("d", node.id), node_id("t", node.id)
        edge = label(taxonomy.label("bottlenecks", node.bottleneck))
        lines.append(f"    prof -->|{edge}| {d}[{label(node.symptom)}]")
        lines.append(f"    {d} --> {t}[{label(' · '.join(names[x] for x in node.techniques))}]")
    styles = {"compute": "model", "memory": "framework", "communication": "system",
              "launch": "kernel", "io": "hardware"}  # fmt: skip
    lines += _classes({node_id("d", n.id): styles[n.bottleneck] for n in taxonomy.decision_flow})
    return "```mermaid\n" + "\n".join(lines) + "\n```"


def _classes(assign: dict[str, str]) -> list[str]:
    used = sorted(set(assign.values()))
    out = [f"    classDef {name} {CLASS_STYLE[name]}" for name in used]
    for name in used:
        out.append(f"    class {','.join(n for n, c in assign.items() if c == name)} {name}")
    return out


GLOSSARY_PAGE = "docs/glossary.md"
_REGISTRY = re.compile(r"^<!--\s*anchors:.*?-->", re.M | re.S)


def registry_comment(glossary: Glossary, taxonomy: Taxonomy) -> str:
    return (
        "<!-- anchors: ids that hooks/datapages.py renders from data/glossary.yaml, declared here\n"
        "for the structure check; refresh:\n"
        "python -m snippets.common.taxonomy_render --write-anchors\n"
        f"{anchor_registry(glossary, taxonomy)}\n-->"
    )


if __name__ == "__main__":  # python -m snippets.common.taxonomy_render --write-anchors
    import sys
    from pathlib import Path

    from snippets.common.taxonomy import ROOT, load_all

    if sys.argv[1:] != ["--write-anchors"]:
        sys.exit("usage: python -m snippets.common.taxonomy_render --write-anchors")
    page = ROOT / GLOSSARY_PAGE
    text = page.read_text(encoding="utf-8")
    new = registry_comment(*reversed(load_all()))
    text = _REGISTRY.sub(lambda _: new, text) if _REGISTRY.search(text) else f"{text}\n{new}\n"
    Path(page).write_text(text, encoding="utf-8")
    print(f"rewrote the anchors of {GLOSSARY_PAGE}")
