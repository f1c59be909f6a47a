"""What a page says about its results: numbers, tables, plots and claims, checked.

References (in prose, specs and claims) are NAME:path into results/<slug>/NAME.json's values:
  copy_tb_s                         a value
  slowdown.full                     a nested value
  decode[model=small,batch=1].ms    the `ms` of the one row of list `decode` with those fields
  decode[model=small].ms            the `ms` of every matching row, in stored order
  decode[*].ms                      every row
A timing is an interval (lo..hi around its median). A claim is an expression over references,
numbers and strings, with + - * /, comparisons, and/or/not and all, any, min, max, abs,
increasing, decreasing (spaces around a binary minus: a path may hold "-"); it is judged
at the unfavourable end of every interval: `a < b` holds
only when a's highest repeat is below b's lowest. Lists compare element by element and hold
when every element does.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from snippets.common import markup
from snippets.common.results import (
    ROOT,
    ResultError,
    Stat,
    commit_known,
    is_stat,
    load_result,
    results_dir,
    stale_sources,
)

CLAIM_REF = re.compile(
    r"(?<![\w\"'/.])(?P<name>(?:[a-z][a-z0-9-]*/)?[a-z0-9][a-z0-9-]*)"
    r":(?P<path>[A-Za-z_][\w-]*(?:\[[^\]\s]*\])?(?:\.[\w-]+(?:\[[^\]\s]*\])?)*)"
)
_SEGMENT = re.compile(r"(?P<key>[\w-]+)?(?:\[(?P<sel>[^\]]*)\])?$")
TABLE_KEYS = {"rows", "caption", "note", "columns", "compare", "where"}
PLOT_KEYS = {"rows", "caption", "note", "map", "roof", "where"}  # besides Vega-Lite's own
MARKS = {"arc", "area", "bar", "boxplot", "circle", "errorband", "errorbar", "geoshape", "image",
         "line", "point", "rect", "rule", "square", "text", "tick", "trail"}  # fmt: skip


class SpecError(ValueError):
    """A reference, spec or claim is wrong; the message starts with page:line. `offset`: how
    many lines below the directive's first line the fault is (a line inside a plot spec)."""

    offset = 0


def compare_keys(within) -> list:
    """A table's `compare: {within: ...}`: no key, one key, or a list of keys."""
    return [] if within is None else list(within) if isinstance(within, list) else [within]


class Pending(SpecError):
    """A reference into the results of a post that declares `awaiting_gpu` and is due."""


# --------------------------------------------------------------------------- lookup


def split_path(path: str) -> list[tuple[str | None, str | None]]:
    parts, depth, cur = [], 0, ""
    for ch in path:
        if ch == "." and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        m = _SEGMENT.match(p)
        if not p or not m or (m["key"] is None and m["sel"] is None):
            raise KeyError(f"malformed path {path!r}")
        out.append((m["key"], m["sel"]))
    return out


def normalized(path: str) -> tuple[str, set[str]]:
    """`decode[model=small].ms` -> ("decode[].ms", {"decode[].model"}): the value read and the
    fields its selector reads."""
    out, used, prefix = [], set(), ""
    for key, sel in split_path(path):
        if key:
            prefix = f"{prefix}.{key}" if prefix else key
        if sel is not None:
            prefix += "[]"
            for cond in filter(None, sel.split(",")):
                if "=" in cond:
                    used.add(f"{prefix}.{cond.split('=', 1)[0].strip()}")
        out.append(prefix)
    return prefix, used


def _matches(row, sel: str) -> bool:
    for cond in filter(None, (c.strip() for c in sel.split(","))):
        key, eq, want = cond.partition("=")
        if not eq:
            raise KeyError(f"selector [{sel}]: write field=value")
        want = want.strip().strip("\"'")
        have = row.get(key.strip()) if isinstance(row, dict) else None
        if have is None or (str(have) != want and not _num_equal(have, want)):
            return False
    return True


def _num_equal(have, want: str) -> bool:
    try:
        return not isinstance(have, bool) and float(want) == float(have)
    except (TypeError, ValueError):
        return False


def lookup(values, path: str):
    """The value at `path`; a list where a selector matched several rows (KeyError if none)."""
    current, many = values, False
    for key, sel in split_path(path):
        items = current if many else [current]
        nxt = []
        for item in items:
            if key:
                if not isinstance(item, dict) or key not in item or is_stat(item):
                    raise KeyError(f"no {key!r} in {path!r}")
                item = item[key]
            if sel is None:
                nxt.append(item)
                continue
            if not isinstance(item, list):
                raise KeyError(f"[{sel}] in {path!r} selects from a value that is not a list")
            if sel == "*":
                nxt += item
            elif sel.isdigit():
                if int(sel) >= len(item):
                    raise KeyError(f"[{sel}] in {path!r}: only {len(item)} rows")
                nxt.append(item[int(sel)])
            else:
                found = [r for r in item if _matches(r, sel)]
                if not found:
                    raise KeyError(f"no row matches [{sel}] in {path!r}")
                nxt += found
            many = many or sel == "*" or not sel.isdigit()
        current = nxt if many else nxt[0]
    if many and isinstance(current, list) and len(current) == 1:
        return current[0]
    return current


def as_stat(value):
    """A recorded timing or number as a Stat (numbers as points); other values unchanged."""
    if is_stat(value):
        return Stat(value["median"], value["lo"], value["hi"], value["n"], value.get("clock"),
                    drawn=value.get("drawn"))  # fmt: skip
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Stat(value, value, value, 0)
    if isinstance(value, list):
        return [as_stat(v) for v in value]
    return value


def show(value) -> str:
    if isinstance(value, Stat):
        if value.lo == value.hi:
            return f"{value.median:.6g}"
        return f"{value.median:.4g} [{value.lo:.4g}, {value.hi:.4g}] (n={value.n})"
    if isinstance(value, list):
        return "[" + ", ".join(show(v) for v in value) + "]"
    return repr(value)


# --------------------------------------------------------------------------- results


DATA = "hardware"  # {{ hardware:h200-sxm.bf16_dense_tflops }} reads data/hardware.yaml


def hardware_record() -> dict:
    """data/hardware.yaml as a record-like dict, so pages and claims read its constants."""
    from dataclasses import asdict

    from snippets.common.hardware import load_hardware

    gpus = {gid: {k: v for k, v in asdict(g).items() if k not in ("id", "sources")}
            for gid, g in load_hardware().items()}  # fmt: skip
    return {"kind": "data", "slug": "", "name": DATA, "values": gpus}


@dataclass
class Results:
    """Loads results/<slug>/<name>.json once; `base` may be a scratch folder (--verify)."""

    base: Path = field(default_factory=results_dir)
    loaded: dict = field(default_factory=dict)
    pending: frozenset = frozenset()  # posts awaiting a GPU run: their due records are not shown
    root: Path = ROOT  # the repository the records' sources and commits are checked against
    due: dict = field(default_factory=dict)  # record path -> record_due, asked once per record

    def record(self, slug: str, name: str) -> dict:
        if "/" in name:
            slug, name = name.split("/", 1)
        if name == DATA:
            return hardware_record()
        path = self.base / slug / f"{name}.json"
        if slug in self.pending and path not in self.due:  # its import closure, git: seconds
            self.due[path] = record_due(path, self.root)
        if slug in self.pending and self.due[path]:
            raise Pending(f"results/{slug}/{name}.json awaits a GPU run (`nox -s gpu_docs -- "
                          f"{slug}`)")  # fmt: skip
        key = (slug, name)
        if key not in self.loaded:
            path = self.base / slug / f"{name}.json"
            try:
                self.loaded[key] = load_result(path)
            except ResultError as exc:  # name the file from the repository's root
                shown = f"{self.base.name}/{slug}/{name}.json"
                raise ResultError(str(exc).replace(str(path), shown)) from None
        return self.loaded[key]


@dataclass
class Directive:
    kind: str  # number | table | plot | claim
    line: int
    name: str | None  # result name (number, table, plot)
    text: str  # path (number), YAML body (table, plot), expression (claim)
    fmt: str | None = None
    start: int = 0  # offsets of what the hook replaces
    end: int = 0
    spec: dict | None = None


def directives(path: Path, text: str | None = None) -> list[Directive]:
    """A page's numbers, tables, plots and claims in page order."""
    text = path.read_text(encoding="utf-8") if text is None else text
    fences = markup.scan(path, text)
    where = markup.rel(path)
    found = []
    for f in fences:
        if f.lang in markup.DIRECTIVES:
            markup.check_language(f)
            try:
                spec = yaml.safe_load(f.body) or {}
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                line = f.line + 1 + (mark.line if mark else 0)
                raise SpecError(f"{where}:{line}: malformed YAML in ```{f.lang}: {exc}") from None
            if not isinstance(spec, dict):
                raise SpecError(f"{where}:{f.line}: ```{f.lang} needs a YAML mapping")
            found.append(Directive(f.lang, f.line, f.argument, f.body, None, f.start, f.end, spec))
    if path.parent.name == "posts":  # a post's number in a code span would show as its source
        shown = markup.prose(text, fences)
        for m in markup.INLINE.finditer(markup.prose(text, fences, spans=False)):
            if m.group() not in shown[m.start() : m.end()]:
                line = markup.line_of(text, m.start())
                raise SpecError(f"{where}:{line}: {m.group()} is inside a code span, where it "
                                "would show as written: take it out of the backticks")  # fmt: skip
    for m in markup.INLINE.finditer(markup.prose(text, fences)):  # not in comments either
        line = markup.line_of(text, m.start())
        found.append(Directive("number", line, m["name"], m["path"], m["fmt"], m.start(), m.end()))
    for m in markup.CLAIM.finditer(markup.prose(text, fences, comments=False)):
        line = markup.line_of(text, m.start())
        found.append(Directive("claim", line, None, m["expr"].strip(), None, m.start(), m.end()))
    return sorted(found, key=lambda d: d.start)


# --------------------------------------------------------------------------- claims


def _cmp(op, a, b):
    if isinstance(a, list) or isinstance(b, list):
        xs = a if isinstance(a, list) else [a] * len(b)
        ys = b if isinstance(b, list) else [b] * len(a)
        if len(xs) != len(ys):
            raise SpecError(f"comparing lists of {len(xs)} and {len(ys)} values")
        return [_cmp(op, x, y) for x, y in zip(xs, ys, strict=True)]
    if isinstance(a, Stat) and isinstance(b, Stat):
        return {
            ast.Lt: lambda: a.hi < b.lo, ast.LtE: lambda: a.hi <= b.lo,
            ast.Gt: lambda: a.lo > b.hi, ast.GtE: lambda: a.lo >= b.hi,
            ast.Eq: lambda: a.lo == a.hi == b.lo == b.hi,
            ast.NotEq: lambda: a.hi < b.lo or b.hi < a.lo,
        }[op]()  # fmt: skip
    if op is ast.Eq:
        return a == b
    if op is ast.NotEq:
        return a != b
    raise SpecError(f"cannot order {show(a)} and {show(b)}")


def _arith(op, a, b):
    if isinstance(a, list) or isinstance(b, list):
        xs = a if isinstance(a, list) else [a] * len(b)
        ys = b if isinstance(b, list) else [b] * len(a)
        return [_arith(op, x, y) for x, y in zip(xs, ys, strict=True)]
    if not isinstance(a, Stat) or not isinstance(b, Stat):
        raise SpecError(f"arithmetic needs numbers, got {show(a)} and {show(b)}")
    if op is ast.Add:
        return a + b
    if op is ast.Sub:
        return a - b
    return a * b if op is ast.Mult else a / b


def _abs(x):
    if isinstance(x, list):
        return [_abs(v) for v in x]
    lo, hi = (x.lo, x.hi) if x.lo >= 0 else (-x.hi, -x.lo) if x.hi <= 0 else (0.0, max(-x.lo, x.hi))
    return Stat(abs(x.median), lo, hi, x.n, x.clock, derived=True)


def _extreme(pick, *args):
    xs = [x for a in args for x in (a if isinstance(a, list) else [a])]
    return Stat(pick(x.median for x in xs), pick(x.lo for x in xs), pick(x.hi for x in xs),
                min(x.n for x in xs), None, derived=True)  # fmt: skip


def _truth(x) -> bool:
    if isinstance(x, list):
        return bool(x) and all(_truth(v) for v in x)
    if isinstance(x, bool):
        return x
    raise SpecError(f"a claim must compare; {show(x)} is not true or false")


def _monotone(xs, op):
    if not isinstance(xs, list) or len(xs) < 2:
        raise SpecError("increasing()/decreasing() need a list of at least two values")
    return [_cmp(op, a, b) for a, b in itertools.pairwise(xs)]


FUNCS = {
    "all": lambda xs: _truth(xs),
    "any": lambda xs: any(_truth(x) for x in (xs if isinstance(xs, list) else [xs])),
    "min": lambda *a: _extreme(min, *a),
    "max": lambda *a: _extreme(max, *a),
    "abs": _abs,
    "increasing": lambda xs: _monotone(xs, ast.Lt),
    "decreasing": lambda xs: _monotone(xs, ast.Gt),
}


def _eval(node, env):
    if isinstance(node, ast.Expression):
        return _eval(node.body, env)
    if isinstance(node, ast.Constant) and isinstance(node.value, bool | str):
        return node.value
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return as_stat(node.value)
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        raise SpecError(f"unknown name {node.id!r} (a reference is NAME:path)")
    if isinstance(node, ast.List | ast.Tuple):
        return [_eval(e, env) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _eval(node.operand, env)
        return [-x for x in v] if isinstance(v, list) else -v
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _truth(_eval(node.operand, env))
    if isinstance(node, ast.BinOp) and type(node.op) in (ast.Add, ast.Sub, ast.Mult, ast.Div):
        return _arith(type(node.op), _eval(node.left, env), _eval(node.right, env))
    if isinstance(node, ast.BoolOp):
        vals = (_truth(_eval(v, env)) for v in node.values)
        return all(vals) if isinstance(node.op, ast.And) else any(vals)
    if isinstance(node, ast.Compare):
        left, out = _eval(node.left, env), []
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, env)
            out.append(_cmp(type(op), left, right))
            left = right
        return out[0] if len(out) == 1 else [_truth(o) for o in out]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCS:
        if node.keywords:
            raise SpecError(f"{node.func.id}() takes no keywords")
        return FUNCS[node.func.id](*(_eval(a, env) for a in node.args))
    raise SpecError(f"unsupported in a claim: {ast.unparse(node)!r}")


def evaluate(expr: str, slug: str, results: Results) -> tuple[bool, str]:
    """(holds, explanation) of a claim on a page of `slug`."""
    env, shown = {"True": True, "False": False}, []

    def sub(m):
        name = f"_r{len(shown)}"
        value = as_stat(resolve(slug, m["name"], m["path"], results))
        env[name] = value
        shown.append(f"{m['name']}:{m['path']} = {show(value)}")
        return name

    code = CLAIM_REF.sub(sub, expr)
    if not shown:
        raise SpecError(f"claim {expr!r} reads no result (a reference is NAME:path)")
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as exc:
        raise SpecError(f"claim {expr!r} is not an expression: {exc.msg}") from None
    try:
        holds = _truth(_eval(tree, env))
    except ZeroDivisionError as exc:
        raise SpecError(f"claim {expr!r}: {exc}") from None
    return holds, "; ".join(shown)


def resolve(slug: str, name: str, path: str, results: Results):
    try:
        record = results.record(slug, name)
    except ResultError as exc:
        error = SpecError(f"result {name!r}: {exc}")
        error.unreadable = name
        raise error from None
    try:
        return lookup(record["values"], path)
    except KeyError as exc:
        raise SpecError(f"result {name!r}: {exc.args[0]}") from None


# --------------------------------------------------------------------------- specs


def spec_ref(slug: str, d: Directive, path: str, results: Results):
    """A path in a spec: inside the spec's own result, or `NAME:path` of another (hardware:...)."""
    m = CLAIM_REF.fullmatch(path.strip())
    if m:
        return resolve(slug, m["name"], m["path"], results)
    return resolve(slug, d.name, path, results)


def rows_of(slug: str, d: Directive, results: Results) -> list[dict]:
    spec = d.spec
    if "rows" not in spec:
        raise SpecError(f"```{d.kind} {d.name} needs `rows:`, the path of a list of rows")
    rows = resolve(slug, d.name, spec["rows"], results)
    rows = rows if isinstance(rows, list) else [rows]
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise SpecError(f"rows {spec['rows']!r} is not a list of rows")
    where = spec.get("where") or {}
    if not isinstance(where, dict):
        raise SpecError("where: needs a mapping field: value")
    sel = ",".join(f"{k}={v}" for k, v in where.items())
    return [r for r in rows if _matches(r, sel)] if sel else rows


def table_columns(d: Directive) -> list[tuple[str, dict]]:
    unknown = set(d.spec) - TABLE_KEYS
    if unknown:
        raise SpecError(f"```table: unknown key(s) {', '.join(sorted(unknown))} (known: "
                        f"{', '.join(sorted(TABLE_KEYS))})")  # fmt: skip
    columns = d.spec.get("columns")
    if not isinstance(columns, dict) or not columns:
        raise SpecError("```table needs `columns:`, a mapping key: label or {label, format, map}")
    out = []
    for key, col in columns.items():
        col = {"label": col} if isinstance(col, str) else col
        if not isinstance(col, dict) or set(col) - {"label", "format", "map", "scale"}:
            raise SpecError(f"column {key!r}: a label, or {{label, format, map, scale}}")
        if not isinstance(col.get("scale", 1), int | float) or isinstance(col.get("scale"), bool):
            raise SpecError(f"column {key!r}: scale must be a number (e.g. 1000 for ms -> µs)")
        out.append((str(key), {"label": str(col.get("label", key))} | col))
    return out


def plot_fields(spec) -> set[str]:
    """Every data field a Vega-Lite spec names (encodings, sorts, transforms' datum.X)."""
    found = set()
    if isinstance(spec, dict):
        for k, v in spec.items():
            if k == "field" and isinstance(v, str):
                found.add(v)
            elif k in ("filter", "calculate") and isinstance(v, str):
                found |= set(re.findall(r"datum\.(\w+)", v))
            elif k != "data":
                found |= plot_fields(v)
    elif isinstance(spec, list):
        for v in spec:
            found |= plot_fields(v)
    return found


def produced_fields(spec) -> set[str]:
    """Fields a spec's transforms create (`as`)."""
    found = set()
    if isinstance(spec, dict):
        for k, v in spec.items():
            if k == "as" and isinstance(v, str):
                found.add(v)
            elif k == "as" and isinstance(v, list):
                found |= {x for x in v if isinstance(x, str)}
            else:
                found |= produced_fields(v)
    elif isinstance(spec, list):
        for v in spec:
            found |= produced_fields(v)
    return found


def check_axes(spec, rows: list[dict]) -> None:
    """Axes of non-negative quantities start at zero or are log-scaled."""
    for enc in _encodings(spec):
        for channel in ("x", "y"):
            ch = enc.get(channel)
            if not isinstance(ch, dict) or ch.get("type") != "quantitative" or "field" not in ch:
                continue
            vals = [as_stat(r.get(ch["field"])) for r in rows]
            lows = [v.lo for v in vals if isinstance(v, Stat)]
            if not lows or min(lows) < 0:
                continue
            scale = ch.get("scale") or {}
            if scale.get("type") in ("log", "symlog"):
                continue
            domain = scale.get("domain")
            lowest = domain[0] if isinstance(domain, list) and domain else None
            if scale.get("zero") is False or (isinstance(lowest, int | float) and lowest > 0):
                raise SpecError(
                    f"axis {channel} ({ch['field']}) of a non-negative quantity must start at "
                    "zero or use scale: {type: log}"
                )


def _encodings(spec):
    yield from (enc for _, enc in _encodings_at(spec))


def _encodings_at(spec, path: tuple = ()):
    """(path of the encoding in the spec, the encoding), top level then layers."""
    if isinstance(spec, dict):
        if isinstance(spec.get("encoding"), dict):
            yield (*path, "encoding"), spec["encoding"]
        layers = spec.get("layer") if isinstance(spec.get("layer"), list) else []
        for i, v in enumerate(layers):
            yield from _encodings_at(v, (*path, "layer", i))


# A quantitative axis of positive values spanning more than LOG_SPAN (max/min, medians) is
# log-scaled. Why 100: on a linear axis from zero, a value max/R sits h/R above the axis; with
# the default plot height h = 300 px (hooks/results.py) that is 3 px at R = 100, the radius of
# a default point mark (size 30 px^2): beyond two decades the small values touch the axis and
# cannot be told from each other. A page that wants a linear axis anyway writes
# `scale: {type: linear}` on that channel with a comment saying why on the same line.
LOG_SPAN = 100


def axis_values(field: str, spec, rows: list[dict]) -> list[float]:
    """The plotted values of a field: the rows' numbers (a timing's median), or for a field a
    fold transform produces, the numbers of the fields it folds."""
    sources = [field]
    for t in _transforms_in(spec):
        if "fold" in t and isinstance(t.get("as"), list) and len(t["as"]) == 2:
            if t["as"][1] == field:
                sources = [str(f) for f in t["fold"]]
    out = []
    for r in rows:
        for f in sources:
            v = as_stat(r.get(f))
            v = v.median if isinstance(v, Stat) else v
            if isinstance(v, int | float) and not isinstance(v, bool):
                out.append(float(v))
    return out


def _transforms_in(spec):
    if isinstance(spec, dict):
        yield from (t for t in spec.get("transform") or [] if isinstance(t, dict))
        for v in spec.get("layer", []) if isinstance(spec.get("layer"), list) else []:
            yield from _transforms_in(v)


def _yaml_node(root, path: tuple):
    """The node at a path of keys and list indices in a composed YAML document, or None."""
    node = root
    for key in path:
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == key), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
            node = node.value[key] if key < len(node.value) else None
        else:
            return None
    return node


def check_log_axes(spec, rows: list[dict], text: str) -> None:
    """Quantitative x/y axes of positive values that span more than LOG_SPAN are log-scaled,
    or say why not: `scale: {type: linear}  # why` (the SpecError's offset is the channel's
    line in the spec `text`, the YAML body of the fence)."""
    root = None
    for path, enc in _encodings_at(spec):
        for channel in ("x", "y"):
            ch = enc.get(channel)
            if not isinstance(ch, dict) or ch.get("type") != "quantitative" or "field" not in ch:
                continue
            values = axis_values(ch["field"], spec, rows)
            if not values or min(values) <= 0 or max(values) / min(values) <= LOG_SPAN:
                continue
            scale = ch.get("scale") if isinstance(ch.get("scale"), dict) else {}
            if scale.get("type") in ("log", "symlog"):
                continue
            root = root if root is not None else yaml.compose(text)
            encoding = _yaml_node(root, path)
            node = next((k for k, _ in getattr(encoding, "value", []) if k.value == channel), None)
            kind = _yaml_node(root, (*path, channel, "scale", "type"))
            if scale.get("type") == "linear" and kind is not None:
                line = text.splitlines()[kind.end_mark.line]
                if re.search(r"#\s*\S", line[kind.end_mark.column :]):
                    continue  # linear on purpose, and the page says why
            span = max(values) / min(values)
            exc = SpecError(
                f"axis {channel} ({ch['field']}) spans {min(values):.3g}..{max(values):.3g}, "
                f"{span:.0f}x > {LOG_SPAN}x (more than two decades): use scale: {{type: log}}, "
                "or write `scale: {type: linear}  # why` on that line"
            )
            exc.offset = 1 + (node.start_mark.line if node is not None else 0)
            raise exc


# --------------------------------------------------------------------------- a page


def slug_of(page: Path) -> str:
    return page.stem


def check_directive(slug: str, d: Directive, results: Results) -> str | None:
    """Validate one directive; for a claim, return why it fails (None when it holds)."""
    if d.kind == "number":
        value = resolve(slug, d.name, d.text, results)
        if isinstance(value, list):
            raise SpecError(f"{d.name}:{d.text} matches {len(value)} rows; a number needs one")
        if d.fmt:
            try:
                format(as_stat(value), d.fmt)
            except (ValueError, TypeError) as exc:
                raise SpecError(f"format {d.fmt!r} does not fit {show(value)}: {exc}") from None
        return None
    if d.kind == "table":
        cols = table_columns(d)
        rows = rows_of(slug, d, results)
        for key, col in cols:
            if not any(key in r for r in rows):
                raise SpecError(f"column {key!r} is in no row of {d.name}:{d.spec['rows']}")
            if col.get("format"):
                sample = next(as_stat(r[key]) for r in rows if r.get(key) is not None)
                try:
                    format(sample, col["format"])
                except (ValueError, TypeError) as exc:
                    raise SpecError(f"column {key!r}: format {col['format']!r}: {exc}") from None
        compare = d.spec.get("compare")
        if isinstance(compare, dict):
            if set(compare) - {"column", "within"} or "column" not in compare:
                raise SpecError("compare: needs [columns] or {column: key, within: key or [keys]}")
            keys = [compare["column"], *compare_keys(compare.get("within"))]
        else:
            keys = list(compare or [])
        for key in keys:
            if not any(key in r for r in rows):
                raise SpecError(f"compare: {key!r} is in no row")
        return None
    if d.kind == "plot":
        rows = rows_of(slug, d, results)
        keys = set().union(*(r.keys() for r in rows))
        stats = {k for r in rows for k, v in r.items() if is_stat(v)}
        known = keys | {f"{k}_{e}" for k in stats for e in ("lo", "hi")} | produced_fields(d.spec)
        missing = plot_fields({k: v for k, v in d.spec.items() if k not in PLOT_KEYS}) - known
        if missing:
            raise SpecError(f"plot field(s) {', '.join(sorted(missing))} in no row of "
                            f"{d.name}:{d.spec['rows']}")  # fmt: skip
        if "mark" not in d.spec and "layer" not in d.spec:
            raise SpecError("```plot needs a Vega-Lite `mark:` (or `layer:`)")
        for layer in [d.spec, *(d.spec.get("layer") or [])]:
            mark = layer.get("mark") if isinstance(layer, dict) else None
            kind = mark.get("type") if isinstance(mark, dict) else mark
            if mark is not None and kind not in MARKS:
                known = ", ".join(sorted(MARKS))
                raise SpecError(f"unknown Vega-Lite mark {kind!r} (one of {known})")
        roof = d.spec.get("roof")
        if roof is not None:
            if not isinstance(roof, dict) or set(roof) != {"bandwidth", "peak"}:
                raise SpecError("roof: needs {bandwidth: path, peak: path} (same units as x·y)")
            for p in roof.values():
                spec_ref(slug, d, str(p), results)
        check_axes(d.spec, rows)
        check_log_axes(d.spec, rows, d.text)
        return None
    holds, shown = evaluate(d.text, slug, results)
    return None if holds else f"claim does not hold: {d.text}  ({shown})"


def spec_problem(d: Directive) -> str | None:
    """What can be checked of a directive without its results (a post awaiting a GPU run)."""
    try:
        if d.kind == "claim":
            if not CLAIM_REF.search(d.text):
                return f"claim {d.text!r} reads no result (a reference is NAME:path)"
            ast.parse(CLAIM_REF.sub("_r", d.text), mode="eval")
        elif d.kind == "table":
            table_columns(d)
        if d.kind in ("table", "plot") and "rows" not in d.spec:
            return f"```{d.kind} {d.name} needs `rows:`, the path of a list of rows"
        if d.kind == "plot" and "mark" not in d.spec and "layer" not in d.spec:
            return "```plot needs a Vega-Lite `mark:` (or `layer:`)"
    except SyntaxError as exc:
        return f"claim {d.text!r} is not an expression: {exc.msg}"
    except SpecError as exc:
        return str(exc)
    return None


def page_errors(page: Path, results: Results | None = None, shown: str | None = None) -> list[str]:
    """Every problem of a page's numbers, tables, plots and claims, as "page:line: problem"."""
    results = results or Results()
    slug, where = slug_of(page), shown or markup.rel(page)
    try:
        found = directives(page)
    except (SpecError, markup.PageError) as exc:
        return [str(exc).replace(markup.rel(page), where, 1)]
    errors, unreadable = [], set()
    for d in found:
        line = d.line
        try:
            problem = check_directive(slug, d, results)
        except Pending:
            problem = spec_problem(d)  # no results to check against: the spec alone
        except SpecError as exc:
            problem = str(exc)
            line += exc.offset
            if getattr(exc, "unreadable", None):  # a broken record: say so once per page
                if exc.unreadable in unreadable:
                    continue
                unreadable.add(exc.unreadable)
        if problem:
            errors.append(f"{where}:{line}: {problem}")
    return errors


def claims(page: Path, results: Results | None = None) -> list[tuple[int, str, bool | None, str]]:
    """(line, expression, holds, values) for each claim on a page (a problem counts as false;
    None: it reads a post awaiting a GPU run)."""
    results = results or Results()
    out = []
    for d in directives(page):
        if d.kind != "claim":
            continue
        try:
            holds, shown = evaluate(d.text, slug_of(page), results)
        except Pending as exc:
            holds, shown = None, str(exc)
        except SpecError as exc:
            holds, shown = False, str(exc)
        out.append((d.line, d.text, holds, shown))
    return out


def reads(page: Path) -> dict[tuple[str, str], set[str]]:
    """(slug, result name) -> the value paths a page reads, lists written `[]`."""
    slug = slug_of(page)
    out: dict[tuple[str, str], set[str]] = {}

    def add(name, path):
        s, n = name.split("/", 1) if "/" in name else (slug, name)
        if n == DATA:
            return
        value, used = normalized(path)
        out.setdefault((s, n), set()).update({value, *used})

    for d in directives(page):
        if d.kind == "number":
            add(d.name, d.text)
        elif d.kind == "claim":
            for m in CLAIM_REF.finditer(d.text):
                add(m["name"], m["path"])
        elif d.kind in ("table", "plot"):
            rows = d.spec.get("rows", "")
            own = {k: v for k, v in d.spec.items() if k not in PLOT_KEYS}
            fields = set(d.spec.get("columns") or {}) if d.kind == "table" else plot_fields(own)
            fields |= set(d.spec.get("where") or {})
            compare = d.spec.get("compare") or []
            if isinstance(compare, dict):
                compare = [compare.get("column"), *compare_keys(compare.get("within"))]
            fields |= {str(f) for f in compare if f is not None}
            for f in fields:
                base = re.sub(r"_(lo|hi)$", "", f)
                where = f"{rows}.{base}" if rows.endswith("]") else f"{rows}[*].{base}"
                add(d.name, where if rows else base)
            for p in (d.spec.get("roof") or {}).values():
                m = CLAIM_REF.fullmatch(str(p).strip())
                add(m["name"], m["path"]) if m else add(d.name, p)
    return out


# --------------------------------------------------------------------------- due and pending


def record_due(path: Path, root: Path) -> bool:
    """A record that is missing or cannot be loaded, is from an unknown commit, or whose
    sources changed. (Of a post awaiting a GPU run, only these wait: a fresh record -- e.g.
    one the CPU suite computed -- is shown and its claims are checked.)"""
    try:
        record = load_result(path)
    except ResultError:
        return True
    return commit_known(record["provenance"]["commit"], root) is False or bool(
        stale_sources(record, root)
    )


def due(root: Path, base: Path, slugs=None) -> set[str]:
    """Posts (of `slugs`, or all) whose results are missing, invalid or stale."""
    posts = sorted((root / "docs" / "posts").glob("*.md"))
    wanted = {p.stem for p in posts} if slugs is None else set(slugs)
    out = {f.parent.name for f in sorted(base.glob("*/*.json"))
           if f.parent.name in wanted and record_due(f, root)}  # fmt: skip
    for page in sorted((root / "docs").rglob("*.md")):
        try:
            read = reads(page)
        except (SpecError, markup.PageError):
            continue
        missing = {(s, n) for s, n in read if n != DATA and not (base / s / f"{n}.json").is_file()}
        out |= {s for s, _ in missing if s in wanted}
    return {s for s in out if (root / "docs" / "posts" / f"{s}.md").is_file()}


def awaiting(root: Path) -> dict[str, markup.PostMeta]:
    """Posts whose front matter says their results wait for a GPU run."""
    out = {}
    for page in sorted((root / "docs" / "posts").glob("*.md")):
        try:
            meta = markup.post_meta(page)
        except markup.PageError:
            continue  # the build and the page checks report it
        if meta.awaiting_gpu:
            out[meta.slug] = meta
    return out


def pending(root: Path, base: Path) -> frozenset:
    """The posts shown as awaiting a GPU run: they say so and their results are due. A post
    that says so while its results are complete and fresh is an error (pending_errors)."""
    declared = awaiting(root)
    return frozenset(due(root, base, declared)) if declared else frozenset()


def pending_errors(root: Path, base: Path) -> list[str]:
    declared = awaiting(root)
    ready = set(declared) - due(root, base, declared)
    return [
        f"docs/posts/{s}.md:{declared[s].awaiting_line}: awaiting_gpu is set, but "
        f"results/{s}/ are complete and fresh: remove the key so the page shows them"
        for s in sorted(ready)
    ]
