"""Tests for the tech-map data (data/taxonomy.yaml, data/glossary.yaml), its renderers and hook."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from snippets.common import taxonomy_render as render
from snippets.common.device import ON_GPU
from snippets.common.taxonomy import (
    ARXIV,
    GLOSSARY_PATH,
    HTTPS,
    ROOT,
    TAXONOMY_PATH,
    DataError,
    check_links,
    load_all,
    load_glossary,
    load_taxonomy,
    name_key,
)
from tests.hooks import fake_page, load_hook

# Data, renderers and the hook: nothing here touches a device.
pytestmark = pytest.mark.skipif(ON_GPU, reason="CPU-only checks; they ran in nox -s tests")


@pytest.fixture(scope="module")
def data():
    return load_all()


@pytest.fixture(scope="module")
def links():
    written = frozenset(p.stem for p in (ROOT / "docs" / "posts").glob("*.md"))
    return render.Links(glossary="../glossary.md", posts="../posts/", written=written)


# ------------------------------------------------------------------ the data itself


def test_data_loads_with_the_expected_shape(data):
    taxonomy, glossary = data
    assert 18 <= len(taxonomy.categories) <= 24
    assert {c.id for c in taxonomy.categories} == {c for r in taxonomy.relations for c in
                                                   (r.source, r.target)}  # fmt: skip
    assert [s.id for s in taxonomy.scenarios] == ["pre-training", "sft", "serving"]
    assert len(glossary.terms) >= 200


def test_terms_and_aliases_are_unique_case_insensitively():
    raw = yaml.safe_load(GLOSSARY_PATH.read_text(encoding="utf-8"))["terms"]
    names = [name_key(n) for t in raw for n in (t["term"], *t["aliases"])]
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, repeated


def test_every_source_is_an_arxiv_id_or_an_https_url(data):
    bad = [(t.id, t.source) for t in data[1].terms
           if not (ARXIV.fullmatch(t.source) or HTTPS.fullmatch(t.source))]  # fmt: skip
    assert not bad
    assert all(t.source_url.startswith("https://") for t in data[1].terms)


def test_every_tool_url_is_https(data):
    assert all(HTTPS.fullmatch(tool.url) for c in data[0].categories for tool in c.tools)


def test_related_posts_are_series_slugs(data):
    taxonomy, glossary = data
    slugs = set(taxonomy.slugs())
    assert {s for c in taxonomy.categories for s in c.posts} <= slugs
    assert {s for t in glossary.terms for s in t.posts} <= slugs


def test_a_post_outside_the_plan_still_appears_on_the_series_map(data, links):
    """A new post needs no edit of data/taxonomy.yaml: the map lists it from its front matter."""
    table = render.series_map(data[0], links, extra=[("demo-post", "演示文章")])
    assert table.splitlines()[-1] == "| [演示文章](../posts/demo-post.md) | — | — | 已发布 |"


def test_decision_flow_agrees_with_the_classification(data):
    taxonomy, _ = data
    for node in taxonomy.decision_flow:
        for c in node.categories:
            assert node.bottleneck in taxonomy.category(c).bottlenecks, (node.id, c)
    reached = {c for n in taxonomy.decision_flow for c in n.categories}
    assert reached == {c.id for c in taxonomy.categories}
    assert {n.bottleneck for n in taxonomy.decision_flow} == set(
        taxonomy.vocabularies["bottlenecks"]
    )


def test_each_flow_technique_relieves_the_bottleneck_it_is_listed_under(data):
    """The rule in the header of data/taxonomy.yaml, checked on the data as committed."""
    taxonomy, _ = data
    tagged: dict[str, set[str]] = {}  # technique -> bottlenecks of the categories that list it
    for c in taxonomy.categories:
        for t in c.techniques:
            tagged.setdefault(t, set()).update(c.bottlenecks)
    flow = {t for n in taxonomy.decision_flow for t in n.techniques}
    assert set(taxonomy.relieves) == flow
    for t, relieved in taxonomy.relieves.items():
        assert set(relieved) <= tagged[t], (t, relieved, tagged[t])
    wrong = [(n.id, t, taxonomy.relieves[t]) for n in taxonomy.decision_flow
             for t in n.techniques if n.bottleneck not in taxonomy.relieves[t]]  # fmt: skip
    assert not wrong
    # the two placements issue #21 found: GQA saves KV bytes, Grouped GEMM is a compute kernel
    assert taxonomy.relieves["gqa"] == ("memory",)
    assert taxonomy.relieves["grouped-gemm"] == ("compute",)


@pytest.mark.parametrize(
    ("old", "new", "where", "problem"),
    [  # the placements before issue #21, then one edit per other clause of the rule
        ("    techniques: [fp8, fp4, moe]", "    techniques: [fp8, fp4, moe, gqa]",
         "decision 'compute-bound': field 'techniques'",
         "'gqa' relieves memory, not this symptom's bottleneck 'compute'"),
        ("    techniques: [comm-overlap, zero-plus-plus, deepep, a2a-overlap]",
         "    techniques: [comm-overlap, zero-plus-plus, deepep, a2a-overlap, grouped-gemm]",
         "decision 'communication-bound': field 'techniques'",
         "'grouped-gemm' relieves compute, not this symptom's bottleneck 'communication'"),
        ("  gqa: [memory]", "  gqa: [memory, io]", "technique 'gqa': field 'relieves'",
         "'io' is not a bottleneck of its categories (['compute', 'memory'])"),
        ("  cuda-graph: [launch]", "  lora: [memory]", "technique 'lora': field 'relieves'",
         "no symptom of decision_flow lists this technique"),
        ("    categories: [data-io]", "    categories: [data-io, peft]",
         "decision 'io-bound': field 'categories'",
         "category 'peft' is not tagged with this symptom's bottleneck 'io'"),
    ],
)  # fmt: skip
def test_planted_breaks_of_the_flow_rule(tmp_path, old, new, where, problem):
    path, line = planted(tmp_path, TAXONOMY_PATH, old, new)
    with pytest.raises(DataError) as err:
        load_taxonomy(path)
    assert str(err.value).endswith(f"taxonomy.yaml:{line}: {where}: {problem}"), str(err.value)


def test_a_flow_technique_without_an_entry_in_relieves(tmp_path):
    path, _ = planted(tmp_path, TAXONOMY_PATH, "  cuda-graph: [launch]\n", "")
    with pytest.raises(DataError) as err:
        load_taxonomy(path)
    text = path.read_text(encoding="utf-8")
    line = text[: text.index("    techniques: [cuda-graph,")].count("\n") + 1
    msg = "decision 'launch-bound': field 'techniques': 'cuda-graph' has no entry in relieves"
    assert str(err.value).endswith(f"taxonomy.yaml:{line}: {msg}")


def test_every_glossary_technique_is_linked_wherever_it_is_rendered(data, links):
    taxonomy, glossary = data
    ids = glossary.by_id()
    pages = {
        "panorama": (render.panorama(taxonomy, glossary, links), taxonomy.techniques()),
        "flow": (render.flow_table(taxonomy, glossary, links),
                 {t for n in taxonomy.decision_flow for t in n.techniques}),
        "scenarios": (render.scenarios(taxonomy, glossary, links),
                      {t for s in taxonomy.scenarios
                       for t in (*s.must, *s.recommended, *s.optional)}),
    }  # fmt: skip
    for where, (text, techniques) in pages.items():
        missing = [t for t in techniques if t in ids and f"](../glossary.md#{t})" not in text]
        assert not missing, (where, missing)


def test_glossary_latency_relations_hold_in_the_metrics_code(data):
    """What the TPOT and ITL entries say about each other, checked with snippets/metrics/serving.py.

    The old ITL entry said "TPOT 是它的平均": true for one request streamed one token per chunk,
    false for a run of several requests (and for a request whose chunks carry several tokens).
    """
    from statistics import fmean

    from snippets.metrics.serving import Request, e2e, itls, pooled_itls, tpot, trace, ttft

    terms = data[1].by_id()
    itl, per_request = terms["itl"].definition, terms["tpot"].definition
    assert "TPOT 是它的平均" not in itl  # the old, unqualified relation
    # one request, one token per chunk, uneven gaps: its mean ITL is its TPOT
    one = Request(sent=0, chunks=(100.0, 130.0, 150.0, 190.0, 195.0))
    assert "对单个请求，若每个分块只带一个 token，它的 ITL 均值正好等于它的 TPOT" in itl
    assert fmean(itls(one)) == pytest.approx(tpot(one))
    # ... not when a chunk carries two tokens (request C of the metrics post's trace)
    c = trace[2]
    assert c.n_out - 1 == 2 * len(itls(c)) and fmean(itls(c)) == pytest.approx(2 * tpot(c))
    # several requests of different lengths: one sample per request vs one per gap
    run = [one, Request(sent=0, chunks=(50.0, 110.0, 170.0))]
    assert "跨请求汇总时两者一般不等" in itl
    assert fmean(pooled_itls(run)) != pytest.approx(fmean([tpot(r) for r in run]))
    assert fmean(pooled_itls(trace)) != pytest.approx(fmean([tpot(r) for r in trace]))
    # NIM's and AIPerf's "ITL" is (E2E - TTFT) / (n - 1) per request: vLLM's (and our) TPOT
    assert "也就是 vLLM 的 TPOT" in itl and "NIM" in per_request and "叫 ITL" in per_request
    assert "(端到端延迟 − TTFT) ÷ (输出 token 数 − 1)" in per_request
    for r in (*trace, one):
        assert (e2e(r) - ttft(r)) / (r.n_out - 1) == tpot(r)


def test_glossary_mla_figure_follows_from_the_two_papers_configs(data):
    """DeepSeek-V2 (arXiv:2405.04434 §2.1.4, §3.1.2, §3.2.3) against DeepSeek 67B (arXiv:2401.02954,
    Table 2): the 93.3 % holds for V2's KV cache at 6 bits per element and 67B's at 16 bits."""
    from snippets.common.models.kv_configs import kv_config
    from snippets.kv_cache.formulas import elements_per_token_layer, kv_bytes_per_token

    v2, dense_67b = kv_config("deepseek-v2"), kv_config("deepseek-llm-67b")  # data/kv_models.yaml
    text = data[1].by_id()["mla"].definition
    deployed = 1 - kv_bytes_per_token(v2, 6) / kv_bytes_per_token(dense_67b, "bf16")
    assert f"{deployed:.1%}" == "93.3%"
    assert "V2 按 6 bit、67B 按 16 bit 计正好少 93.3%" in text
    same = 1 - kv_bytes_per_token(v2) / kv_bytes_per_token(dense_67b)
    assert round(100 * same) == 82 and "同按 16 bit 计只少约 82%" in text
    assert elements_per_token_layer(v2) / (2 * 128) == 2.25 and "2.25 组" in text


def test_technique_named_like_a_term_uses_its_id(data):
    taxonomy, glossary = data
    check_links(taxonomy, glossary)  # the real data passes
    by_name = glossary.by_name()
    named = [(t, n) for c in taxonomy.categories for t, n in c.techniques.items()
             if name_key(n) in by_name]  # fmt: skip
    assert named and all(by_name[name_key(n)].id == t for t, n in named)


def test_planted_technique_with_a_term_name_but_another_id(tmp_path, data):
    text = TAXONOMY_PATH.read_text(encoding="utf-8")
    path = tmp_path / "taxonomy.yaml"
    path.write_text(text.replace("      mqa: MQA\n", "      multi-query: MQA\n"), "utf-8")
    with pytest.raises(DataError) as err:
        check_links(load_taxonomy(path), data[1])
    line = text[: text.index("      mqa: MQA\n")].count("\n") + 1
    assert f"taxonomy.yaml:{line}: category 'architecture': field 'techniques'" in str(err.value)
    assert "glossary term 'mqa'" in str(err.value)


# ------------------------------------------------------------------ rendered pages


NODE = r'[A-Za-z][A-Za-z0-9_]*(?:\["[^"]*"\]|\(\["[^"]*"\]\))?'  # id, optional quoted label
MERMAID_LINE = re.compile(
    rf"^    (?:(?P<node>{NODE})"
    rf'|(?P<a>{NODE}) -->(?:\|"[^"]*"\|)? (?P<b>{NODE})'
    r"|classDef [a-z]+ [a-z-]+:#[0-9A-Fa-f]{6}(?:,[a-z-]+:#[0-9A-Fa-f]{3,6})*"
    r"|class [A-Za-z0-9_,]+ [a-z]+"
    r")$"
)
IDENT = re.compile(r"^[A-Za-z][A-Za-z0-9_]*")


def mermaid_problems(block: str) -> list[str]:
    """A strict subset of mermaid flowchart syntax: what our renderers may emit."""
    lines = block.splitlines()
    if lines[0] != "```mermaid" or lines[-1] != "```":
        return ["not a ```mermaid fence"]
    if lines[1] not in ("flowchart LR", "flowchart TD"):
        return [f"unexpected header {lines[1]!r}"]
    problems, defined, used = [], set(), set()
    for line in lines[2:-1]:
        m = MERMAID_LINE.match(line)
        if not m:
            problems.append(f"unparsed: {line!r}")
            continue
        for group in ("node", "a", "b"):
            if m[group]:
                ident = IDENT.match(m[group])[0]
                (defined if m[group] != ident else used).add(ident)
                used.add(ident)
        if not line.isascii():
            ids = re.sub(r'"[^"]*"', '""', line)
            if not ids.isascii():
                problems.append(f"non-ASCII outside a quoted label: {line!r}")
    problems += [f"edge to undefined node {n}" for n in sorted(used - defined)]
    return problems


def test_generated_mermaid_is_plausible(data):
    taxonomy, _ = data
    for block in (render.relation_graph(taxonomy), render.decision_graph(taxonomy)):
        assert mermaid_problems(block) == []


def test_the_mermaid_check_sees_planted_faults(data):
    good = render.relation_graph(data[0])
    assert mermaid_problems(good.replace("c_moe_training", "c_moe-training", 1))
    assert mermaid_problems(good.replace('["分布式并行"]', "[分布式并行]"))
    assert mermaid_problems(good.replace("flowchart TD", "graph"))


def test_mermaid_labels_drop_what_mermaid_would_parse():
    assert render.label('a "b"', "c#d", "<e>") == "\"a 'b'<br/>c＃d<br/>‹e›\""
    assert render.node_id("t", "long-context") == "t_long_context"


def test_glossary_renders_one_anchor_per_term_and_fills_hardware(data, links):
    from snippets.common.hardware import load_hardware

    taxonomy, glossary = data
    hardware = load_hardware()
    gl = render.Links(glossary="", posts="posts/", written=links.written)
    page = render.glossary_page(glossary, taxonomy, hardware, gl)
    anchors = re.findall(r"\{#([\w-]+)\}", page)
    assert len(anchors) == len(set(anchors))
    assert {t.id for t in glossary.terms} <= set(anchors)
    assert "[[hw:" not in page
    assert f"H100 SXM 启用 {hardware['h100-sxm'].sms} 个 SM" in page


def test_glossary_page_declares_the_current_anchors(data):
    text = (ROOT / render.GLOSSARY_PAGE).read_text(encoding="utf-8")
    declared = set(re.findall(r"\{#[\w-]+\}", text))
    want = set(render.anchor_registry(data[1], data[0]).split())
    assert declared == want, (
        "docs/glossary.md <!-- anchors: --> is stale; run "
        "`python -m snippets.common.taxonomy_render --write-anchors`"
    )


def test_series_map_links_only_written_posts(data, links):
    table = render.series_map(data[0], links)
    for p in data[0].series:
        linked = f"]({links.post(p.slug)})" in table
        assert linked == (p.slug in links.written), p.slug


# ------------------------------------------------------------------ planted faults


def planted(tmp_path, source: Path, old: str, new: str) -> tuple[Path, int]:
    """A copy of a data file with one edit; returns it and the 1-based line of the edit."""
    text = source.read_text(encoding="utf-8")
    assert old in text, old
    path = tmp_path / source.name
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return path, text[: text.index(old)].count("\n") + 1 + old[
        : len(old) - len(old.lstrip())
    ].count("\n")


def test_planted_duplicate_alias(tmp_path, data):
    path, line = planted(tmp_path, GLOSSARY_PATH, "aliases: [Multi-Query Attention, 多查询注意力]",
                         "aliases: [Multi-Query Attention, grouped-query attention]")  # fmt: skip
    with pytest.raises(DataError) as err:
        load_glossary(path, data[0])
    msg = str(err.value)
    assert f"glossary.yaml:{line}: term 'mqa': field 'aliases'" in msg
    assert "already used by term 'gqa'" in msg


def test_planted_bad_source(tmp_path, data):
    path, line = planted(
        tmp_path, GLOSSARY_PATH, "source: arXiv:2305.13245", "source: arxiv 2305.13245"
    )
    with pytest.raises(DataError) as err:
        load_glossary(path, data[0])
    assert f"glossary.yaml:{line}: term 'gqa': field 'source'" in str(err.value)
    path, _ = planted(tmp_path, GLOSSARY_PATH, "source: arXiv:2305.13245", "source: http://x.org/a")
    with pytest.raises(DataError, match="neither an arXiv id"):
        load_glossary(path, data[0])


def test_planted_unknown_post(tmp_path, data):
    path, line = planted(tmp_path, GLOSSARY_PATH, "posts: [kv-cache, qwen3-fusion]",
                         "posts: [kv-cache, no-such-post]")  # fmt: skip
    with pytest.raises(DataError) as err:
        load_glossary(path, data[0])
    assert f"glossary.yaml:{line}: term 'gqa': field 'posts': unknown post 'no-such-post'" in str(
        err.value
    )
    path, line = planted(tmp_path, TAXONOMY_PATH, "posts: [rl-training]", "posts: [rl-trainig]")
    with pytest.raises(DataError) as err:
        load_taxonomy(path)
    assert f"taxonomy.yaml:{line}: category 'rl-training': field 'posts'" in str(err.value)


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("stages: [rl]", "stages: [reinforcement]", "stages"),
        ("bottlenecks: [io]", "bottlenecks: [disk]", "bottlenecks"),
        ("layers: [scheduling]", "layers: [scheduler]", "layers"),
    ],
)
def test_planted_unknown_tag(tmp_path, old, new, field):
    path, line = planted(tmp_path, TAXONOMY_PATH, old, new)
    with pytest.raises(DataError) as err:
        load_taxonomy(path)
    msg = str(err.value)
    assert re.search(rf"taxonomy\.yaml:{line}: category '[a-z-]+': field '{field}': unknown", msg)


def test_planted_vocabulary_extension(tmp_path):
    path, line = planted(tmp_path, TAXONOMY_PATH, "    io:\n", "    disk:\n")
    with pytest.raises(DataError) as err:
        load_taxonomy(path)
    assert f"taxonomy.yaml:{line}: vocabulary 'bottlenecks': field 'disk'" in str(err.value)


def test_planted_flow_technique_outside_its_categories(tmp_path):
    path, line = planted(tmp_path, TAXONOMY_PATH, "    techniques: [sharded-dataset, gpu",
                         "    techniques: [flash-attention, gpu")  # fmt: skip
    with pytest.raises(DataError) as err:
        load_taxonomy(path)
    assert f"taxonomy.yaml:{line}: decision 'io-bound': field 'techniques'" in str(err.value)


def test_planted_unknown_category_and_see(tmp_path, data):
    path, line = planted(tmp_path, GLOSSARY_PATH, "category: kernel-fusion", "category: kernels")
    with pytest.raises(DataError) as err:
        load_glossary(path, data[0])
    assert f"glossary.yaml:{line}:" in str(err.value) and "field 'category'" in str(err.value)
    path, line = planted(
        tmp_path, GLOSSARY_PATH, "see: [mqa, attention-head]", "see: [mqa, nope-x]"
    )
    with pytest.raises(DataError) as err:
        load_glossary(path, data[0])
    assert f"glossary.yaml:{line}: term 'gqa': field 'see'" in str(err.value)


def test_planted_hardware_placeholder(tmp_path, data):
    path, _ = planted(tmp_path, GLOSSARY_PATH, "[[hw:h100-sxm.sms]]", "[[hw:h100-sxm.cores]]")
    with pytest.raises(DataError, match=r"\[\[hw:h100-sxm.cores\]\] names no numeric field"):
        load_glossary(path, data[0])


def test_planted_malformed_yaml_and_duplicate_key(tmp_path, data):
    path, line = planted(tmp_path, GLOSSARY_PATH, "    term: MQA\n", "    term: [MQA\n")
    with pytest.raises(DataError, match=r"glossary\.yaml:\d+: malformed YAML"):
        load_glossary(path, data[0])
    path, line = planted(
        tmp_path, GLOSSARY_PATH, "    term: MQA\n", "    term: MQA\n    term: MQB\n"
    )
    with pytest.raises(DataError) as err:
        load_glossary(path, data[0])
    assert f"glossary.yaml:{line + 1}:" in str(err.value) and "duplicate key" in str(err.value)


# ------------------------------------------------------------------ the MkDocs hook


@pytest.fixture(scope="module")
def hook():
    """The build hook (CPU build side: skipped where mkdocs is not installed, e.g. gpu_docs)."""
    module = load_hook("datapages")
    module.on_pre_build(None)
    return module


FILES = [SimpleNamespace(src_uri="posts/gradient-accumulation.md"), SimpleNamespace(src_uri="x.md")]


def test_hook_expands_markers_outside_fences_only(hook):
    md = "# t\n\n<!-- data: graph -->\n\n```text\n<!-- data: nonsense -->\n```\n"
    out = hook.on_page_markdown(md, fake_page("posts/tech-map.md"), None, FILES)
    assert "```mermaid\nflowchart TD" in out and "<!-- data: nonsense -->" in out


def test_hook_links_relative_to_the_page(hook):
    out = hook.on_page_markdown("<!-- data: scenarios -->\n", fake_page("posts/t.md"), None, FILES)
    assert "](../glossary.md#flash-attention)" in out
    out = hook.on_page_markdown("<!-- data: series-map -->\n", fake_page("index.md"), None, FILES)
    assert "](posts/gradient-accumulation.md)" in out


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ("<!-- data: panorma -->", "unknown data marker 'panorma'"),
        ("<!-- data: classification -->", "takes one of stage, bottleneck, layer, got None"),
        ("<!-- data: classification phase -->", "got 'phase'"),
        ("<!-- data: graph big -->", "takes no argument"),
    ],
)
def test_hook_rejects_bad_markers_with_page_and_line(hook, marker, problem):
    with pytest.raises(hook.PluginError) as err:
        hook.on_page_markdown(f"# t\n\ntext\n{marker}\n", fake_page("posts/t.md"), None, FILES)
    assert str(err.value).startswith("docs/posts/t.md:4: ") and problem in str(err.value)


def test_hook_checks_the_glossary_anchor_list(hook):
    text = (ROOT / render.GLOSSARY_PAGE).read_text(encoding="utf-8")
    out = hook.on_page_markdown(text, fake_page("glossary.md"), None, FILES)
    assert "<!-- anchors" not in out and "### KV Cache {#kv-cache}" in out
    with pytest.raises(hook.PluginError, match=r"differs from data/glossary\.yaml"):
        hook.on_page_markdown(text.replace(" {#mqa}", ""), fake_page("glossary.md"), None, FILES)


def test_hook_reports_malformed_data_with_file_and_line(hook, tmp_path, monkeypatch):
    path, line = planted(tmp_path, TAXONOMY_PATH, "stages: [rl]", "stages: [rlhf]")
    original = hook.load_all  # the hook's own module (pages may re-execute snippets modules)
    monkeypatch.setattr(hook, "load_all", lambda: original(taxonomy_path=path))
    with pytest.raises(hook.PluginError) as err:
        hook.on_pre_build(None)
    assert f"taxonomy.yaml:{line}: category 'rl-training': field 'stages'" in str(err.value)
    monkeypatch.undo()
    hook.on_pre_build(None)
