"""The tech map as data: load and validate data/taxonomy.yaml and data/glossary.yaml.

Every error names the file, the line, the entry and the field, e.g.
``data/glossary.yaml:812: term 'gqa': field 'source': ...``. No torch here: the MkDocs hook
(hooks/datapages.py) imports this module when the site is built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NoReturn

import yaml

ROOT = Path(__file__).resolve().parents[2]
TAXONOMY_PATH = ROOT / "data" / "taxonomy.yaml"
GLOSSARY_PATH = ROOT / "data" / "glossary.yaml"

# --8<-- [start:vocab]
# The three classifications are closed vocabularies: a tag outside them is a data error.
STAGES = ("pre-training", "fine-tuning", "rl", "serving")
BOTTLENECKS = ("compute", "memory", "communication", "launch", "io")
LAYERS = (
    "serving-system", "scheduling", "compiler", "framework", "kernel-library",
    "custom-kernel", "architecture", "precision", "hardware",
)  # fmt: skip
ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # ids double as URL anchors
ARXIV = re.compile(r"arXiv:\d{4}\.\d{4,5}")  # a source is an arXiv id ...
HTTPS = re.compile(r"https://[A-Za-z0-9.-]+\.[A-Za-z]{2,}(/\S*)?")  # ... or an https URL
HW = re.compile(r"\[\[hw:([a-z0-9-]+)\.([a-z0-9_]+)\]\]")  # a constant from hardware.yaml
# --8<-- [end:vocab]


class DataError(ValueError):
    """Bad tech-map data. Message: '<file>:<line>: <kind> '<id>': field '<field>': <problem>'."""


def name_key(name: str) -> str:
    """How names are compared: case-insensitive, whitespace-normalised."""
    return " ".join(name.casefold().split())


# ------------------------------------------------------------------ YAML with line numbers


class Map(dict):
    """A YAML mapping; ``line`` is where it starts, ``lines[key]`` where each key is."""

    line: int
    lines: dict


class Seq(list):
    """A YAML sequence; ``line`` is where it starts, ``lines[i]`` where each item is."""

    line: int
    lines: list


class _Doc:
    """One YAML file, parsed into Map / Seq / scalars that remember their line numbers."""

    def __init__(self, path: Path):
        self.path = Path(path)
        resolved = self.path.resolve()  # data/<name>.yaml of whichever repository holds it
        in_data = resolved.parent.name == "data"
        self.shown = resolved.relative_to(resolved.parents[1]).as_posix() if in_data else str(path)
        try:
            text = self.path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DataError(f"{self.shown}:1: cannot read: {exc.strerror}") from None
        self.loader = yaml.SafeLoader(text)
        try:
            node = self.loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
            line = mark.line + 1 if mark else 1
            problem = getattr(exc, "problem", None) or exc
            raise DataError(f"{self.shown}:{line}: malformed YAML: {problem}") from None
        if node is None:
            raise DataError(f"{self.shown}:1: the file is empty")
        self.root = self._plain(node)

    def fail(self, line: int, kind: str, ident: str, name: str, problem: str) -> NoReturn:
        raise DataError(f"{self.shown}:{line}: {kind} '{ident}': field '{name}': {problem}")

    def _plain(self, node: yaml.Node) -> Any:
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out = Map()
            out.line, out.lines = line, {}
            for key_node, value_node in node.value:
                key = self._plain(key_node)
                if not isinstance(key, str):
                    self.fail(
                        key_node.start_mark.line + 1, "mapping", "-", str(key), "keys must be text"
                    )
                if key in out:
                    self.fail(key_node.start_mark.line + 1, "mapping", "-", key, "duplicate key")
                out[key] = self._plain(value_node)
                out.lines[key] = key_node.start_mark.line + 1
            return out
        if isinstance(node, yaml.SequenceNode):
            out = Seq(self._plain(item) for item in node.value)
            out.line, out.lines = line, [item.start_mark.line + 1 for item in node.value]
            return out
        try:
            return self.loader.construct_object(node, deep=True)
        except yaml.YAMLError as exc:
            raise DataError(f"{self.shown}:{line}: malformed YAML value: {exc}") from None


class _Entry:
    """Field access on one mapping entry, with errors that name file, line, entry and field."""

    def __init__(self, doc: _Doc, m: Any, kind: str, ident: str, line: int):
        self.doc, self.kind, self.ident = doc, kind, ident
        if not isinstance(m, Map):
            doc.fail(line, kind, ident, "-", f"expected a mapping, got {type(m).__name__}")
        self.m = m

    def fail(self, name: str, problem: str, line: int | None = None) -> NoReturn:
        self.doc.fail(
            line or self.m.lines.get(name, self.m.line), self.kind, self.ident, name, problem
        )

    def only(self, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> None:
        for name in self.m:
            if name not in required + optional:
                self.fail(name, f"unknown field (allowed: {', '.join(required + optional)})")
        for name in required:
            if name not in self.m:
                self.fail(name, "missing field", self.m.line)

    def text(self, name: str) -> str:
        value = self.m[name]
        if not isinstance(value, str) or not value.strip():
            self.fail(name, f"expected non-empty text, got {value!r}")
        return value.strip()

    def ident_of(self, name: str) -> str:
        value = self.text(name)
        if not ID.fullmatch(value):
            self.fail(name, f"{value!r} is not a lowercase-hyphenated id")
        return value

    def items(self, name: str, allowed=None, what="value", empty=False) -> tuple[str, ...]:
        """A list of text items; each one in ``allowed`` if given; no duplicates."""
        seq = self.m.get(name, Seq())
        if not isinstance(seq, Seq):
            self.fail(name, f"expected a list, got {seq!r}")
        if not seq and not empty:
            self.fail(name, "must not be empty")
        out: list[str] = []
        for value, line in zip(seq, getattr(seq, "lines", []), strict=True):
            if not isinstance(value, str) or not value.strip():
                self.fail(name, f"expected text items, got {value!r}", line)
            if allowed is not None and value not in allowed:
                shown = (
                    ", ".join(sorted(allowed)) if len(allowed) <= 12 else f"{len(allowed)} known"
                )
                self.fail(name, f"unknown {what} {value!r} (allowed: {shown})", line)
            if value in out:
                self.fail(name, f"{value!r} is listed twice", line)
            out.append(value)
        return tuple(out)

    def one(self, name: str, allowed, what: str) -> str:
        """One text value from a closed set."""
        value = self.text(name)
        if value not in allowed:
            self.fail(name, f"unknown {what} {value!r}")
        return value

    def line_of_item(self, name: str, index: int) -> int:
        return self.m[name].lines[index]


# ------------------------------------------------------------------ the taxonomy


@dataclass(frozen=True)
class Tool:
    name: str
    url: str


@dataclass(frozen=True)
class Category:
    id: str
    name: str
    summary: str
    stages: tuple[str, ...]
    bottlenecks: tuple[str, ...]
    layers: tuple[str, ...]
    techniques: dict  # technique id -> display name, in file order
    tools: tuple[Tool, ...]
    scenarios: tuple[str, ...]
    posts: tuple[str, ...]
    line: int = field(compare=False)
    technique_lines: dict = field(compare=False, repr=False)


@dataclass(frozen=True)
class Relation:
    source: str
    target: str
    label: str


@dataclass(frozen=True)
class FlowNode:
    id: str
    bottleneck: str
    symptom: str
    categories: tuple[str, ...]
    techniques: tuple[str, ...]


@dataclass(frozen=True)
class Scenario:
    id: str
    name: str
    must: tuple[str, ...]
    recommended: tuple[str, ...]
    optional: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class Post:
    slug: str
    title: str
    region: str


@dataclass(frozen=True)
class Taxonomy:
    path: str
    vocabularies: dict  # "stages" | "bottlenecks" | "layers" -> {tag: {"label": ..., ...}}
    categories: tuple[Category, ...]
    relations: tuple[Relation, ...]
    decision_flow: tuple[FlowNode, ...]
    scenarios: tuple[Scenario, ...]
    series: tuple[Post, ...]
    relieves: dict  # decision-flow technique id -> the bottlenecks it relieves (tuple)

    def category(self, ident: str) -> Category:
        return next(c for c in self.categories if c.id == ident)

    def label(self, dimension: str, tag: str) -> str:
        return self.vocabularies[dimension][tag]["label"]

    def techniques(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """technique id -> (display name, ids of the categories that list it)."""
        out: dict[str, tuple[str, tuple[str, ...]]] = {}
        for c in self.categories:
            for tid, name in c.techniques.items():
                first, cats = out.get(tid, (name, ()))
                out[tid] = (first, (*cats, c.id))
        return out

    def slugs(self) -> tuple[str, ...]:
        return tuple(p.slug for p in self.series)

    def posts_of(self, slug: str) -> tuple[str, ...]:
        """Ids of the categories that list a post: its place on the map."""
        return tuple(c.id for c in self.categories if slug in c.posts)


VOCABULARIES = {"stages": STAGES, "bottlenecks": BOTTLENECKS, "layers": LAYERS}
_VOCAB_DETAIL = {"stages": "goal", "bottlenecks": "signal", "layers": "examples"}


def load_taxonomy(path: Path | None = None) -> Taxonomy:
    """Parse and validate the taxonomy; errors name the file, line, entry and field."""
    doc = _Doc(path or TAXONOMY_PATH)
    top = _Entry(doc, doc.root, "file", doc.shown, 1)
    sections = ("vocabularies", "categories", "relations", "decision_flow", "relieves")
    top.only((*sections, "scenarios", "series"))

    vocab = _Entry(doc, top.m["vocabularies"], "vocabularies", "-", top.m.lines["vocabularies"])
    vocab.only(tuple(VOCABULARIES))
    vocabularies: dict[str, dict] = {}
    for dim, closed in VOCABULARIES.items():
        tags = _Entry(doc, vocab.m[dim], "vocabulary", dim, vocab.m.lines[dim])
        for tag in tags.m:
            if tag not in closed:
                tags.fail(tag, f"not in the closed vocabulary ({', '.join(closed)})")
        tags.only(closed)
        vocabularies[dim] = {}
        for tag in closed:
            entry = _Entry(doc, tags.m[tag], "vocabulary", f"{dim}.{tag}", tags.m.lines[tag])
            entry.only(("label", _VOCAB_DETAIL[dim]))
            vocabularies[dim][tag] = {k: entry.text(k) for k in ("label", _VOCAB_DETAIL[dim])}

    series = _series(doc, top)
    slugs = {p.slug for p in series}
    categories = _categories(doc, top, slugs)
    by_id = {c.id: c for c in categories}
    techniques = {tid for c in categories for tid in c.techniques}

    relations = []
    for m, line in _list(doc, top, "relations"):
        e = _Entry(doc, m, "relation", f"line {line}", line)
        e.only(("from", "to", "label"))
        ends = [e.one(name, by_id, "category") for name in ("from", "to")]
        relations.append(Relation(ends[0], ends[1], e.text("label")))

    flow, seen = [], set()
    for m, line in _list(doc, top, "decision_flow"):
        ident = m.get("id", "?") if isinstance(m, Map) else "?"
        e = _Entry(doc, m, "decision", ident, line)
        e.only(("id", "bottleneck", "symptom", "categories", "techniques"))
        ident = e.ident_of("id")
        if ident in seen:
            e.fail("id", "duplicate decision id")
        seen.add(ident)
        bottleneck = e.one("bottleneck", BOTTLENECKS, "bottleneck")
        cats = e.items("categories", by_id, "category")
        techs = e.items("techniques", techniques, "technique")
        for i, c in enumerate(cats):
            if bottleneck not in by_id[c].bottlenecks:
                problem = f"category {c!r} is not tagged with this symptom's bottleneck"
                e.fail("categories", f"{problem} {bottleneck!r}", e.line_of_item("categories", i))
        offered = {t for c in cats for t in by_id[c].techniques}
        for i, t in enumerate(techs):
            if t not in offered:
                problem = f"technique {t!r} belongs to none of the categories {list(cats)}"
                e.fail("techniques", problem, e.line_of_item("techniques", i))
        flow.append(FlowNode(ident, bottleneck, e.text("symptom"), cats, techs))
    relieves = _relieves(doc, top, categories, flow)

    scenarios, seen = [], set()
    for m, line in _list(doc, top, "scenarios"):
        ident = m.get("id", "?") if isinstance(m, Map) else "?"
        e = _Entry(doc, m, "scenario", ident, line)
        e.only(("id", "name", "must", "recommended", "optional", "note"))
        ident = e.ident_of("id")
        if ident in seen:
            e.fail("id", "duplicate scenario id")
        seen.add(ident)
        tiers = [e.items(t, techniques, "technique") for t in ("must", "recommended", "optional")]
        scenarios.append(Scenario(ident, e.text("name"), *tiers, e.text("note")))

    return Taxonomy(
        doc.shown, vocabularies, tuple(categories), tuple(relations), tuple(flow),
        tuple(scenarios), tuple(series), relieves,
    )  # fmt: skip


def _list(doc: _Doc, top: _Entry, name: str) -> list[tuple[Any, int]]:
    seq = top.m[name]
    if not isinstance(seq, Seq) or not seq:
        top.fail(name, "expected a non-empty list")
    return list(zip(seq, seq.lines, strict=True))


def _relieves(doc: _Doc, top: _Entry, categories: list[Category], flow: list) -> dict:
    """The rule that ties a symptom to its techniques (stated in the header of taxonomy.yaml).

    Each technique of the decision flow declares the bottlenecks it relieves; they must be
    bottlenecks of the categories that list it, and a symptom may only list techniques that
    relieve the symptom's own bottleneck.
    """
    e = _Entry(doc, top.m["relieves"], "relieves", "-", top.m.lines["relieves"])
    tagged: dict[str, set[str]] = {}  # technique -> bottlenecks of the categories listing it
    for c in categories:
        for t in c.techniques:
            tagged.setdefault(t, set()).update(c.bottlenecks)
    used = {t for node in flow for t in node.techniques}
    out: dict[str, tuple[str, ...]] = {}
    for t, relieved in e.m.items():
        line = e.m.lines[t]

        def fail(problem: str, at: int = line, t: str = t) -> NoReturn:
            doc.fail(at, "technique", t, "relieves", problem)

        if t not in tagged:
            fail("not a technique of any category")
        if t not in used:
            fail("no symptom of decision_flow lists this technique")
        if not isinstance(relieved, Seq) or not relieved:
            fail(f"expected a non-empty list of bottleneck tags, got {relieved!r}")
        for b, at in zip(relieved, relieved.lines, strict=True):
            if b not in BOTTLENECKS:
                fail(f"unknown bottleneck {b!r} (allowed: {', '.join(BOTTLENECKS)})", at)
            if b not in tagged[t]:
                fail(f"{b!r} is not a bottleneck of its categories ({sorted(tagged[t])})", at)
        if len(set(relieved)) != len(relieved):
            fail("a bottleneck is listed twice")
        out[t] = tuple(relieved)
    for node, (m, line) in zip(flow, _list(doc, top, "decision_flow"), strict=True):
        d = _Entry(doc, m, "decision", node.id, line)
        for i, t in enumerate(node.techniques):
            at = d.line_of_item("techniques", i)
            if t not in out:
                d.fail("techniques", f"{t!r} has no entry in relieves", at)
            if node.bottleneck not in out[t]:
                problem = (
                    f"{t!r} relieves {', '.join(out[t])}, not this symptom's "
                    f"bottleneck {node.bottleneck!r}"
                )
                d.fail("techniques", problem, at)
    return out


def _series(doc: _Doc, top: _Entry) -> list[Post]:
    out: list[Post] = []
    for m, line in _list(doc, top, "series"):
        e = _Entry(doc, m, "post", m.get("slug", "?") if isinstance(m, Map) else "?", line)
        e.only(("slug", "title", "region"))
        slug = e.ident_of("slug")
        if slug in {p.slug for p in out}:
            e.fail("slug", "duplicate post slug")
        out.append(Post(slug, e.text("title"), e.text("region")))
    return out


def _categories(doc: _Doc, top: _Entry, slugs: set[str]) -> list[Category]:
    out: list[Category] = []
    for m, line in _list(doc, top, "categories"):
        e = _Entry(doc, m, "category", m.get("id", "?") if isinstance(m, Map) else "?", line)
        names = ("id", "name", "summary", "stages", "bottlenecks", "layers", "techniques")
        e.only((*names, "tools", "scenarios", "posts"))
        ident = e.ident_of("id")
        if ident in {c.id for c in out}:
            e.fail("id", "duplicate category id")
        techs = e.m["techniques"]
        if not isinstance(techs, Map) or not techs:
            e.fail("techniques", "expected a non-empty mapping of technique id to name")
        for tid, tname in techs.items():
            if not ID.fullmatch(tid):
                e.fail(
                    "techniques",
                    f"technique id {tid!r} is not lowercase-hyphenated",
                    techs.lines[tid],
                )
            if not isinstance(tname, str) or not tname.strip():
                e.fail("techniques", f"technique {tid!r} needs a name", techs.lines[tid])
        tools = []
        seq = e.m.get("tools", Seq())
        if not isinstance(seq, Seq):
            e.fail("tools", "expected a list of {name, url}")
        for i, tool in enumerate(seq):
            at = e.line_of_item("tools", i)
            ok = isinstance(tool, Map) and set(tool) == {"name", "url"}
            if not ok or not all(isinstance(v, str) and v.strip() for v in tool.values()):
                e.fail("tools", "each tool needs exactly a name and a url (text)", at)
            if not HTTPS.fullmatch(tool["url"]):
                e.fail("tools", f"tool url is not an https URL: {tool['url']!r}", at)
            tools.append(Tool(tool["name"].strip(), tool["url"]))
        out.append(
            Category(
                ident,
                e.text("name"),
                e.text("summary"),
                e.items("stages", STAGES, "stage tag"),
                e.items("bottlenecks", BOTTLENECKS, "bottleneck tag"),
                e.items("layers", LAYERS, "layer tag"),
                {k: v.strip() for k, v in techs.items()},
                tuple(tools),
                e.items("scenarios", None, empty=True),
                e.items("posts", slugs, "post", empty=True),
                line,
                dict(techs.lines),
            )
        )
    return out


# ------------------------------------------------------------------ the glossary


@dataclass(frozen=True)
class Term:
    id: str
    term: str
    aliases: tuple[str, ...]
    category: str
    definition: str
    source: str
    posts: tuple[str, ...]
    see: tuple[str, ...]
    line: int = field(compare=False)

    @property
    def source_url(self) -> str:
        if ARXIV.fullmatch(self.source):
            return f"https://arxiv.org/abs/{self.source.removeprefix('arXiv:')}"
        return self.source


@dataclass(frozen=True)
class Glossary:
    path: str
    groups: dict  # group id -> name, for the groups that are not taxonomy categories
    terms: tuple[Term, ...]

    def by_id(self) -> dict[str, Term]:
        return {t.id: t for t in self.terms}

    def by_name(self) -> dict[str, Term]:
        """name_key(term or alias) -> term."""
        return {name_key(n): t for t in self.terms for n in (t.term, *t.aliases)}


_TERM_FIELDS = tuple(f.name for f in fields(Term) if f.name not in ("line", "see"))


def load_glossary(
    path: Path | None = None, taxonomy: Taxonomy | None = None, hardware: dict | None = None
) -> Glossary:
    """Parse and validate the glossary against the taxonomy (categories, post slugs)."""
    taxonomy = taxonomy or load_taxonomy()
    if hardware is None:
        from snippets.common.hardware import load_hardware

        hardware = load_hardware()
    doc = _Doc(path or GLOSSARY_PATH)
    top = _Entry(doc, doc.root, "file", doc.shown, 1)
    top.only(("groups", "terms"))
    groups_e = _Entry(doc, top.m["groups"], "groups", "-", top.m.lines["groups"])
    categories = {c.id for c in taxonomy.categories}
    for gid in groups_e.m:
        if not ID.fullmatch(gid) or gid in categories:
            groups_e.fail(gid, "group ids are lowercase-hyphenated and differ from category ids")
    groups = {gid: groups_e.text(gid) for gid in groups_e.m}

    slugs = set(taxonomy.slugs())
    terms: list[Term] = []
    names: dict[str, tuple[str, int]] = {}  # name_key -> (term id, line)
    for m, line in _list(doc, top, "terms"):
        e = _Entry(doc, m, "term", m.get("id", "?") if isinstance(m, Map) else "?", line)
        e.only(_TERM_FIELDS, ("see",))
        ident = e.ident_of("id")
        if ident in {t.id for t in terms}:
            e.fail("id", "duplicate term id")
        term = e.text("term")
        aliases = e.items("aliases", None, empty=True)
        for i, name in enumerate((term, *aliases)):
            at = e.m.lines["term"] if i == 0 else e.line_of_item("aliases", i - 1)
            key = name_key(name)
            if key in names and names[key][0] != ident:
                other, other_line = names[key]
                problem = f"name {name!r} is already used by term '{other}' (line {other_line})"
                e.fail("term" if i == 0 else "aliases", problem, at)
            if key in names:
                e.fail("aliases", f"name {name!r} repeats the term or another alias", at)
            names[key] = (ident, at)
        category = e.text("category")
        if category not in categories and category not in groups:
            e.fail("category", f"unknown category {category!r} (a taxonomy category or a group)")
        source = e.text("source")
        if not (ARXIV.fullmatch(source) or HTTPS.fullmatch(source)):
            problem = f"{source!r} is neither an arXiv id (arXiv:NNNN.NNNNN) nor an https URL"
            e.fail("source", problem)
        definition = " ".join(e.text("definition").split())
        for hw in HW.finditer(definition):
            gpu = hardware.get(hw[1])
            if gpu is None or not isinstance(getattr(gpu, hw[2], None), int | float):
                e.fail("definition", f"{hw[0]} names no numeric field of data/hardware.yaml")
        posts = e.items("posts", slugs, "post", empty=True)
        see = e.items("see", None, empty=True)
        terms.append(Term(ident, term, aliases, category, definition, source, posts, see, line))

    known = {t.id for t in terms}
    for t, (m, line) in zip(terms, _list(doc, top, "terms"), strict=True):
        e = _Entry(doc, m, "term", t.id, line)
        for i, other in enumerate(t.see):
            if other not in known or other == t.id:
                e.fail("see", f"{other!r} is not another term id", e.line_of_item("see", i))
    return Glossary(doc.shown, groups, tuple(terms))


def check_links(taxonomy: Taxonomy, glossary: Glossary) -> None:
    """A technique named like a glossary term or alias must carry that term's id (so it links)."""
    by_name = glossary.by_name()
    for c in taxonomy.categories:
        for tid, name in c.techniques.items():
            term = by_name.get(name_key(name))
            if term is not None and term.id != tid:
                raise DataError(
                    f"{taxonomy.path}:{c.technique_lines[tid]}: category '{c.id}': field "
                    f"'techniques': {name!r} is glossary term '{term.id}'; use that id, not {tid!r}"
                )


def load_all(
    taxonomy_path: Path | None = None, glossary_path: Path | None = None
) -> tuple[Taxonomy, Glossary]:
    """Both files, each validated, and the links between them checked."""
    taxonomy = load_taxonomy(taxonomy_path)
    glossary = load_glossary(glossary_path, taxonomy)
    check_links(taxonomy, glossary)
    return taxonomy, glossary
