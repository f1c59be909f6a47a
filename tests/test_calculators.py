"""Calculators (snippets/common/calculator.py): the Python side, the vectors file and the JS twin.

For every ```calculator NAME fence on every page: tests/fixtures/calculators/NAME.json is what the
Python side computes now (`pytest --update-examples tests/test_calculators.py` rewrites it), the
spec agrees with it, and formulas[NAME] of docs/assets/calculator.js reproduces every vector
exactly in Node. The browser suite checks the same vectors through the form on the built page.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from snippets.common import calculator as calc
from snippets.common import markup
from snippets.common.results import UPDATE_ENV

ROOT = Path(__file__).resolve().parents[1]
JS = ROOT / "docs" / "assets" / "calculator.js"
DECLARED = calc.declared(ROOT)
NAMES = [f.argument for _, f in DECLARED]


def python_side(page: Path, name: str) -> calc.Calculator:
    """CALCULATORS[name] of snippets/<the page's package>/calculators.py."""
    module = f"snippets.{markup.package_of(page.stem)}.calculators"
    try:
        found = importlib.import_module(module).CALCULATORS
    except ModuleNotFoundError:
        pytest.fail(f"{markup.rel(page)}: calculator {name!r}: no module {module}")
    if name not in found:
        pytest.fail(f"{markup.rel(page)}: calculator {name!r}: not in {module}.CALCULATORS")
    return found[name]


def test_every_calculator_has_a_unique_name():
    assert NAMES, "no page declares a calculator"
    assert len(NAMES) == len(set(NAMES)), NAMES


@pytest.mark.parametrize(("page", "fence"), DECLARED, ids=NAMES)
def test_vectors_file_is_what_the_python_side_computes(page, fence):
    name = fence.argument
    fresh = json.loads(json.dumps(python_side(page, name).stored(name)))
    path = calc.stored_path(name)
    if os.environ.get(UPDATE_ENV) == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fresh, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    assert calc.load_stored(name) == fresh, f"{markup.rel(path)} is stale; run `{calc.UPDATE}`"
    calc.check(calc.parse(fence), fresh)  # the spec names the same inputs and outputs


def test_no_vectors_file_without_a_calculator():
    stored = {p.stem for p in calc.FIXTURES.glob("*.json")}
    assert stored == set(NAMES), f"vectors files without a ```calculator: {stored - set(NAMES)}"


def node_run(script: str) -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed; the browser suite checks the calculators")
    window = "global.window = {};"
    run = [node, "-e", f"{window} require({json.dumps(str(JS))}); {script}"]
    return subprocess.run(run, capture_output=True, text=True, check=True).stdout


def test_javascript_has_one_formula_per_calculator():
    names = json.loads(
        node_run("console.log(JSON.stringify(Object.keys(window.handbookCalculator.formulas)))")
    )
    assert sorted(names) == sorted(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_javascript_formula_reproduces_the_vectors_in_node(name):
    """The browser suite's check without the form: formulas[name](input) == output, exactly."""
    script = (
        f"const v = require({json.dumps(str(calc.stored_path(name)))}).vectors;"
        f"const f = window.handbookCalculator.formulas[{json.dumps(name)}];"
        "const bad = [];"
        "for (const [i, c] of v.entries()) { const got = f(c.input);"
        "  for (const [k, want] of Object.entries(c.output))"
        "    if (got[k] !== want) bad.push({vector: i, output: k, got: got[k], want}); }"
        "console.log(JSON.stringify(bad));"
    )
    bad = json.loads(node_run(script))
    assert not bad, f"{len(bad)} outputs differ from the Python side, first: {bad[:3]}"


# --------------------------------------------------------------------------- the spec


def fence_of(body: str, name: str = "demo") -> markup.Fence:
    text = f"# Page\n\n```calculator {name}\n{body}```\n"
    return markup.scan(Path("docs/posts/demo.md"), text)[0]


STORED = {
    "presets": {"models": [{"id": "a", "label": "A", "values": {"x": 1}}]},
    "defaults": {"k": 12},
    "vectors": [{"input": {"x": 1, "k": 12}, "output": {"y": 2.0}}],
}
GOOD = (
    "title: Demo\ninputs:\n  model: {label: 模型, preset: models}\n  x: {label: X}\n"
    "  k: {label: K}\noutputs:\n  y: {label: Y, digits: 1, unit: GB, scale: 1.0e-9}\n"
)


def test_a_good_spec_renders_its_form():
    html = calc.render(calc.parse(fence_of(GOOD)), STORED)
    assert html.startswith('<form class="calc" data-calculator="demo"')
    assert '<select name="model" data-preset="models"><option value="a" data-values=' in html
    assert '<input name="x" type="number" step="any" value="1">' in html  # from the preset
    assert '<input name="k" type="number" step="any" value="12">' in html  # the Python default
    assert '<output name="y" data-scale="1e-09" data-digits="1" data-unit="GB">' in html
    assert "\n\n" not in html  # one block of HTML for Markdown


def test_a_table_names_its_outputs_row_column():
    body = (
        "title: T\ninputs:\n  x: {label: X}\n  k: {label: K}\ntable:\n  rows: {r0: 行}\n"
        "  columns: {y: 列, s: {label: 占比, percent: true}}\n  format: {digits: 2}\n"
    )
    spec = calc.parse(fence_of(body))
    assert spec.outputs == {
        "r0_y": {"label": "行 y", "digits": 2},
        "r0_s": {"label": "行 s", "digits": 2, "percent": True},
    }


def test_text_inputs_and_outputs_render_as_textarea_and_preformatted_output():
    """A text input is a <textarea> holding its initial value, newlines as character
    references (a blank line would end Markdown's HTML block); a text output is marked so that
    calculator.js shows the string as it is."""
    body = ("title: T\ninputs:\n  ref: {label: 参考, text: true}\n"
            "outputs:\n  drawing: {label: 对齐, text: true}\n")  # fmt: skip
    stored = {"presets": {}, "defaults": {"ref": "a <b>\n\nc"},
              "vectors": [{"input": {"ref": "x"}, "output": {"drawing": "REF: x"}}]}  # fmt: skip
    html = calc.render(calc.parse(fence_of(body)), stored)
    assert '<textarea name="ref" rows="3">a &lt;b&gt;&#10;&#10;c</textarea>' in html
    assert '<output name="drawing" data-text="1">' in html
    assert "\n\n" not in html


BAD_SPECS = {  # spec, stored changes, the error after "docs/posts/demo.md:3: "
    "no-title": (GOOD.replace("title: Demo\n", ""), {}, "a calculator spec has a title"),
    "unknown-key": (GOOD + "colour: red\n", {}, "a calculator spec has a title"),
    "no-label": (GOOD.replace("x: {label: X}", "x: {value: 3}"), {}, "input 'x': a label"),
    "bad-yaml": (GOOD + "  z: [\n", {}, "malformed YAML"),
    "no-outputs": (GOOD.split("outputs:")[0], {}, "at least one output"),
    "bad-format": (GOOD.replace("digits: 1", "digts: 1"), {}, "output 'y': a mapping"),
    "unknown-menu": (GOOD.replace("preset: models", "preset: gpus"), {},
                     "input 'model': no presets 'gpus'"),
    "missing-input": (GOOD.replace("  x: {label: X}\n", ""), {},
                      "preset 'a' sets ['x'], not inputs here"),
    "vector-output": (GOOD, {"vectors": [{"input": {"x": 1, "k": 12}, "output": {"z": 2.0}}]},
                      "vector 0 of demo.json has inputs ['k', 'x'] and outputs ['z']"),
    "set-twice": (GOOD.replace("k: {label: K}", "k: {label: K, value: 8}"), {},
                  "input 'k' is set by defaults and by the spec too"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_SPECS))
def test_a_bad_spec_is_an_error_naming_the_page_and_line(case):
    body, changes, error = BAD_SPECS[case]
    with pytest.raises(calc.CalculatorError) as info:
        calc.render(calc.parse(fence_of(body)), {**STORED, **changes})
    assert str(info.value).startswith("docs/posts/demo.md:3: ")
    assert error in str(info.value)


def test_a_missing_vectors_file_says_how_to_write_it(tmp_path):
    with pytest.raises(calc.CalculatorError, match=r"missing; write it with `pytest --update"):
        calc.load_stored("nothing-here", root=tmp_path)


def test_a_fence_without_a_name_is_a_page_error():
    fence = fence_of(GOOD, name="")
    with pytest.raises(markup.PageError, match="```calculator needs a calculator name"):
        markup.check_language(fence)
