"""Calculators on the pages: a form whose formula exists once in Python and once in JavaScript.

A page declares a calculator with a fence (hooks/calculators.py renders it into a form):

    ```calculator zero
    title: ZeRO 每卡模型状态
    inputs:                                        # in the order shown
      model: {label: 模型, preset: models}         # a menu of presets: each sets its inputs
      data_parallel: {label: 数据并行度, value: 8, step: 1, min: 1}
      k: {label: 优化器状态 K}                      # its value: the Python side's `defaults`
      op: {label: 操作, options: {all_reduce: all-reduce}}    # fixed choices, value: label
      ref: {label: 参考文本, text: true}             # a <textarea>: the formula gets a string
    outputs:                                       # shown as lines: label, number, unit
      total: {label: 合计, scale: 1.0e-9, digits: 1, unit: GB}    # or percent: true
      alignment: {label: 对齐, text: true}           # a string, shown as it is (preformatted)
    table:                                         # optional: outputs <row>_<column> as a grid
      rows: {stage0: 不切分}
      columns: {total: 合计}
      format: {scale: 1.0e-9, digits: 2, unit: GB}  # per column: columns: {share: {label, percent}}
    ```

Three more things make a calculator, each named by the fence's NAME:
  - the source of truth, `CALCULATORS[NAME] = Calculator(...)` in snippets/<package>/calculators.py:
    a Python function from keyword inputs (the form's input names) to {output name: number},
    the inputs of its test vectors, and its presets (computed from data/, never typed);
  - its twin, `formulas[NAME]` in docs/assets/calculator.js (same operations, same order);
  - tests/fixtures/calculators/NAME.json: presets, defaults and test vectors written from the
    Python side (`pytest --update-examples tests/test_calculators.py`). tests/test_calculators.py
    checks the file is current and the JavaScript formula reproduces it in Node; the browser suite
    types every vector's inputs into the form on the built page and compares the shown outputs.
Errors name the page and the line.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from snippets.common import markup

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "calculators"
LANG = "calculator"
UPDATE = "pytest --update-examples tests/test_calculators.py"
SPEC_KEYS = {"title", "inputs", "outputs", "table"}
INPUT_KEYS = {"label", "preset", "default", "options", "value", "step", "min", "text"}
FORMAT_KEYS = ("scale", "digits", "unit", "percent", "text")  # in this order on <output>


class CalculatorError(ValueError):
    """A calculator's spec, vectors or presets disagree; the message starts with page:line."""


@dataclass(frozen=True)
class Calculator:
    """The Python side of a calculator: the source of truth the JavaScript twin is tested on."""

    formula: Callable[..., dict]  # keyword inputs -> {output: number}
    cases: Sequence[dict]  # the inputs of the test vectors
    presets: dict[str, list[dict]] = field(default_factory=dict)  # menu -> [{id, label, values}]
    defaults: dict = field(default_factory=dict)  # input values the Python side defines

    def stored(self, name: str) -> dict:
        """What tests/fixtures/calculators/<name>.json holds."""
        return {
            "generated_by": f"CALCULATORS[{name!r}] (snippets/common/calculator.py): `{UPDATE}`",
            "presets": self.presets,
            "defaults": self.defaults,
            "vectors": [{"input": dict(c), "output": self.formula(**c)} for c in self.cases],
        }


def stored_path(name: str, root: Path = ROOT) -> Path:
    return root / FIXTURES.relative_to(ROOT) / f"{name}.json"


def load_stored(name: str, root: Path = ROOT) -> dict:
    path = stored_path(name, root)
    if not path.is_file():
        raise CalculatorError(f"{markup.rel(path)}: missing; write it with `{UPDATE}`")
    return json.loads(path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- the spec


@dataclass
class Spec:
    name: str
    where: str  # page:line of the fence
    title: str
    inputs: dict[str, dict]
    outputs: dict[str, dict]  # every output, with its format (table cells included)
    table: dict | None


def declared(root: Path = ROOT) -> list[tuple[Path, markup.Fence]]:
    """Every calculator fence of every page, in page order."""
    pages = sorted((root / "docs").rglob("*.md"))
    return [(p, f) for p in pages for f in markup.scan(p) if f.lang == LANG]


def _fail(where: str, problem: str):
    raise CalculatorError(f"{where}: {problem}")


def _format(where: str, what: str, fmt) -> dict:
    if not isinstance(fmt, dict) or set(fmt) - {*FORMAT_KEYS, "label"}:
        _fail(where, f"{what}: a mapping of label and {', '.join(FORMAT_KEYS)}")
    return {k: fmt[k] for k in FORMAT_KEYS if k in fmt}


def parse(fence: markup.Fence, where: str | None = None) -> Spec:
    """The fence's YAML, checked: known keys, a label for every input and output."""
    where = where or fence.where
    if not fence.argument:
        _fail(where, "```calculator needs a name after it (tests/fixtures/calculators/NAME.json)")
    try:
        spec = yaml.safe_load(fence.body) or {}
    except yaml.YAMLError as exc:
        _fail(where, f"malformed YAML in ```calculator: {exc}")
    if not isinstance(spec, dict) or set(spec) - SPEC_KEYS or not spec.get("title"):
        keys = ", ".join(sorted(SPEC_KEYS - {"title"}))
        _fail(where, f"a calculator spec has a title and {keys}")
    inputs = spec.get("inputs") or {}
    for key, inp in inputs.items():
        if not isinstance(inp, dict) or "label" not in inp or set(inp) - INPUT_KEYS:
            _fail(where, f"input {key!r}: a label and any of {', '.join(sorted(INPUT_KEYS))}")
    outputs = {}
    for key, out in (spec.get("outputs") or {}).items():
        if not isinstance(out, dict) or "label" not in out:
            _fail(where, f"output {key!r}: needs a label")
        outputs[key] = {"label": out["label"], **_format(where, f"output {key!r}", out)}
    table = spec.get("table")
    if table is not None:
        if (
            not isinstance(table, dict)
            or set(table) - {"rows", "columns", "format"}
            or not (table.get("rows") and table.get("columns"))
        ):
            _fail(where, "table: rows and columns (name: label), and a format")
        common = _format(where, "table format", table.get("format") or {})
        for col, head in table["columns"].items():
            own = _format(where, f"column {col!r}", head) if isinstance(head, dict) else {}
            for row in table["rows"]:
                outputs[f"{row}_{col}"] = {"label": f"{table['rows'][row]} {col}", **common, **own}
    if not outputs:
        _fail(where, "a calculator shows at least one output")
    return Spec(fence.argument, where, str(spec["title"]), inputs, outputs, table)


def check(spec: Spec, stored: dict) -> None:
    """The spec, the presets and the vectors name the same inputs and outputs."""
    menus = {k: v["preset"] for k, v in spec.inputs.items() if "preset" in v}
    fields = [k for k in spec.inputs if k not in menus]
    for key, menu in menus.items():
        choices = stored["presets"].get(menu)
        if not choices:
            _fail(spec.where, f"input {key!r}: no presets {menu!r} in the vectors file")
        default = spec.inputs[key].get("default", choices[0]["id"])
        if default not in [c["id"] for c in choices]:
            _fail(spec.where, f"input {key!r}: default {default!r} is not one of its presets")
        for choice in choices:
            unknown = set(choice["values"]) - set(fields)
            if unknown:
                what = f"preset {choice['id']!r} sets {sorted(unknown)}"
                _fail(spec.where, f"{what}, not inputs here")
    for i, vector in enumerate(stored["vectors"]):
        if set(vector["input"]) != set(fields) or set(vector["output"]) != set(spec.outputs):
            _fail(
                spec.where,
                f"vector {i} of {spec.name}.json has inputs {sorted(vector['input'])} and outputs "
                f"{sorted(vector['output'])}; the form has {sorted(fields)} and "
                f"{sorted(spec.outputs)}",
            )
    if not stored["vectors"]:
        _fail(spec.where, f"{spec.name}.json has no test vectors")


def initial_values(spec: Spec, stored: dict) -> dict:
    """What the form shows before the reader types: default presets, Python defaults, spec."""
    values, origin = {}, {}
    for inp in spec.inputs.values():
        if "preset" in inp:
            choices = stored["presets"][inp["preset"]]
            chosen = next(c for c in choices if c["id"] == inp.get("default", choices[0]["id"]))
            for k, v in chosen["values"].items():
                values[k], origin[k] = v, f"preset {chosen['id']!r}"
    typed = {k: v["value"] for k, v in spec.inputs.items() if "value" in v}
    for source, given in (("defaults", stored.get("defaults") or {}), ("spec", typed)):
        for k, v in given.items():
            if k in origin:
                _fail(spec.where, f"input {k!r} is set by {origin[k]} and by the {source} too")
            values[k], origin[k] = v, source
    return values


# --------------------------------------------------------------------------- the form


def _attrs(**attrs) -> str:
    return "".join(
        f' {k.replace("_", "-")}="{html.escape(str(v), quote=True)}"'
        for k, v in attrs.items()
        if v is not None
    )


def _output(name: str, fmt: dict) -> str:
    data = {f"data_{k}": (1 if v is True else v) for k, v in fmt.items() if k != "label"}
    return f"<output{_attrs(name=name, **data)}>—</output>"


def render(spec: Spec, stored: dict) -> str:
    """The form, as one block of HTML (no blank line, so Markdown leaves it alone)."""
    check(spec, stored)
    values = initial_values(spec, stored)
    parts = [f'<form class="calc"{_attrs(data_calculator=spec.name)} autocomplete="off">',
             f"<fieldset><legend>{html.escape(spec.title)}</legend>"]  # fmt: skip
    for key, inp in spec.inputs.items():
        label = html.escape(str(inp["label"]))
        if "preset" in inp:
            choices = stored["presets"][inp["preset"]]
            default = inp.get("default", choices[0]["id"])
            options = "".join(
                f"<option{_attrs(value=c['id'], data_values=json.dumps(c['values']))}"
                f"{' selected' if c['id'] == default else ''}>{html.escape(c['label'])}</option>"
                for c in choices
            )
            parts.append(f"<label>{label} <select{_attrs(name=key, data_preset=inp['preset'])}>"
                         f"{options}</select></label>")  # fmt: skip
        elif "options" in inp:
            options = "".join(
                f"<option{_attrs(value=v)}{' selected' if v == values.get(key) else ''}>"
                f"{html.escape(str(text))}</option>"
                for v, text in inp["options"].items()
            )
            parts.append(f"<label>{label} <select{_attrs(name=key)}>{options}</select></label>")
        elif inp.get("text"):  # newlines as references: no blank line ends the HTML block
            text = html.escape(str(values.get(key, "")), quote=False)
            text = text.replace("\r", "&#13;").replace("\n", "&#10;")
            parts.append(f"<label>{label} <textarea{_attrs(name=key, rows=3)}>{text}</textarea>"
                         "</label>")  # fmt: skip
        else:
            attrs = _attrs(name=key, type="number", step=inp.get("step", "any"),
                           min=inp.get("min"), value=values.get(key))  # fmt: skip
            parts.append(f"<label>{label} <input{attrs}></label>")
    in_table = set()
    if spec.table:
        rows, cols = spec.table["rows"], spec.table["columns"]
        heads = "".join(
            f"<th>{html.escape(str(c['label'] if isinstance(c, dict) else c))}</th>"
            for c in cols.values()
        )
        body = []
        for row, text in rows.items():
            cells = "".join(
                f"<td>{_output(f'{row}_{col}', spec.outputs[f'{row}_{col}'])}</td>" for col in cols
            )
            body.append(f"<tr><th>{html.escape(str(text))}</th>{cells}</tr>")
            in_table |= {f"{row}_{col}" for col in cols}
        parts.append(f"<table><thead><tr><th></th>{heads}</tr></thead>"
                     f"<tbody>{''.join(body)}</tbody></table>")  # fmt: skip
    for key, out in spec.outputs.items():
        if key not in in_table:
            parts.append(f"<p>{html.escape(str(out['label']))}：{_output(key, out)}</p>")
    parts.append("</fieldset></form>")
    return "\n".join(parts)
