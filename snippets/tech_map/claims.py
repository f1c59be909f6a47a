"""The tech-map page's claims about its own data, executed on every test run."""

import tempfile
from pathlib import Path

from snippets.common.taxonomy import (
    BOTTLENECKS,
    STAGES,
    TAXONOMY_PATH,
    DataError,
    load_all,
    load_taxonomy,
)
from snippets.common.taxonomy_render import Links, panorama

# --8<-- [start:load]
taxonomy, glossary = load_all()  # both files, schema-checked and cross-checked
print(len(taxonomy.categories), len(taxonomy.techniques()), len(glossary.terms))
#> 21 144 224
# --8<-- [end:load]

# --8<-- [start:reach]
# Every category is reachable from some symptom of the decision flow.
reached = {c for node in taxonomy.decision_flow for c in node.categories}
print([c.id for c in taxonomy.categories if c.id not in reached])
#> []
# --8<-- [end:reach]

# --8<-- [start:consistent]
# The flow and the classification agree: a symptom tagged with bottleneck b only leads to
# categories that the taxonomy also tags with b.
disagree = [
    (node.id, c)
    for node in taxonomy.decision_flow
    for c in node.categories
    if node.bottleneck not in taxonomy.category(c).bottlenecks
]
print(disagree)
#> []
# --8<-- [end:consistent]

# --8<-- [start:relieves]
# Finer than the category tags: each technique a symptom lists declares the bottlenecks it
# relieves, and must relieve that symptom's own one (checked again when the data is loaded).
print(
    [
        (node.id, t)
        for node in taxonomy.decision_flow
        for t in node.techniques
        if node.bottleneck not in taxonomy.relieves[t]
    ]
)
#> []
print(taxonomy.relieves["gqa"], taxonomy.relieves["grouped-gemm"])
#> ('memory',) ('compute',)
# --8<-- [end:relieves]

# --8<-- [start:coverage]
for b in BOTTLENECKS:
    nodes = [n for n in taxonomy.decision_flow if n.bottleneck == b]
    techniques = {t for n in nodes for t in n.techniques}
    tagged = [c for c in taxonomy.categories if b in c.bottlenecks]
    row = f"{b:<13} symptoms={len(nodes)} techniques={len(techniques):>2}"
    print(f"{row} categories={len(tagged):>2}")
    #> compute       symptoms=7 techniques=20 categories=14
    #> memory        symptoms=7 techniques=23 categories=16
    #> communication symptoms=1 techniques= 4 categories= 4
    #> launch        symptoms=1 techniques= 3 categories= 3
    #> io            symptoms=1 techniques= 3 categories= 1
# --8<-- [end:coverage]

# --8<-- [start:stages]
for s in STAGES:
    print(f"{s:<12} {sum(s in c.stages for c in taxonomy.categories):>2} categories")
    #> pre-training 12 categories
    #> fine-tuning  14 categories
    #> rl            9 categories
    #> serving      13 categories
# --8<-- [end:stages]

# --8<-- [start:links]
# Every sub-technique that has a glossary entry is linked to it in the rendered panorama.
links = Links(glossary="../glossary.md", posts="../posts/", written=frozenset())
table = panorama(taxonomy, glossary, links)
terms = glossary.by_id()
named = {t for t in taxonomy.techniques() if t in terms}
print(len(named), all(f"](../glossary.md#{t})" in table for t in named))
#> 112 True
# --8<-- [end:links]

# --8<-- [start:errors]
# A tag outside the closed vocabulary is an error that names the file, line, entry and field.
text = TAXONOMY_PATH.read_text(encoding="utf-8")
edit = "bottlenecks: [io]"
line = text[: text.index(edit)].count("\n") + 1  # the line we break
with tempfile.TemporaryDirectory() as tmp:
    broken = Path(tmp) / "taxonomy.yaml"
    broken.write_text(text.replace(edit, "bottlenecks: [disk]"), encoding="utf-8")
    try:
        load_taxonomy(broken)
    except DataError as exc:
        message = str(exc).replace(tmp, "<tmp>")
where = f"<tmp>/taxonomy.yaml:{line}: category 'data-io': field 'bottlenecks': "
print(message.startswith(where))
#> True
print(message.removeprefix(where).split(" (allowed")[0])
#> unknown bottleneck tag 'disk'
# --8<-- [end:errors]
