"""Small published-data tables of data/: a top-level key mapping entries, each with a name, a few
positive numbers and 1-3 sources (url and what). Errors name the file, the line, the entry and
the field: ``data/hardware.yaml:129: link 'pcie-gen5-x16': field 'total_gb_per_s': expected a
positive number, got 'fast'``.

- data/request_lengths.yaml: mean request lengths of published serving workloads;
- data/hardware.yaml's `host_links`: peak bandwidth of the links between a GPU and its host's
  memory (its `gpus` are snippets/common/hardware.py's).
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import yaml

DATA = Path(__file__).resolve().parents[2] / "data"
REQUEST_LENGTHS = DATA / "request_lengths.yaml"
HARDWARE = DATA / "hardware.yaml"  # its `host_links` section


class DataFileError(ValueError):
    """Bad data. Message: '<file>:<line>: <kind> '<id>': field '<field>': <problem>'."""


def _fail(path: Path, node, kind: str, entry: str, field: str, problem: str) -> NoReturn:
    line = node.start_mark.line + 1 if isinstance(node, yaml.Node) else 1
    raise DataFileError(f"{path}:{line}: {kind} '{entry}': field '{field}': {problem}")


def _mapping(path: Path, node, kind: str, entry: str, field: str) -> dict:
    if not isinstance(node, yaml.MappingNode):
        _fail(path, node, kind, entry, field, "expected a mapping")
    return {k.value: (k, v) for k, v in node.value}


def load_entries(path: Path, top: str, kind: str, numbers: tuple[str, ...]) -> dict[str, dict]:
    """entry id -> {"name": str, <each of numbers>: float, "sources": [(url, what), ...]}."""
    try:
        root = yaml.SafeLoader(path.read_text(encoding="utf-8")).get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise DataFileError(f"{path}:{mark.line + 1 if mark else 1}: malformed YAML: "
                            f"{getattr(exc, 'problem', exc)}") from None  # fmt: skip
    entries = _mapping(path, root, kind, "-", top)
    if top not in entries:
        _fail(path, root, kind, "-", top, "missing")
    out = {}
    for entry, (key, node) in _mapping(path, entries[top][1], kind, "-", top).items():
        fields = _mapping(path, node, kind, entry, "-")
        for name, (k, _) in fields.items():
            if name not in ("name", "sources", *numbers):
                _fail(path, k, kind, entry, name, f"unknown field; known: name, sources, "
                      f"{', '.join(numbers)}")  # fmt: skip
        values: dict = {}
        for name in ("name", *numbers, "sources"):
            if name not in fields:
                _fail(path, key, kind, entry, name, "missing")
            at = fields[name][1]
            value = yaml.safe_load(yaml.serialize(at))
            if name == "name" and not (isinstance(value, str) and value.strip()):
                _fail(path, at, kind, entry, name, "expected a non-empty string")
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if name in numbers and not (number and value > 0):
                _fail(path, at, kind, entry, name, f"expected a positive number, got {value!r}")
            values[name] = value
        sources = values["sources"]
        pairs = isinstance(sources, list) and 1 <= len(sources) <= 3
        if not pairs or not all(isinstance(s, dict) and set(s) == {"url", "what"} for s in sources):
            _fail(path, fields["sources"][1], kind, entry, "sources",
                  "expected 1-3 entries, each exactly {url, what}")  # fmt: skip
        if not all(str(s["url"]).startswith("https://") and str(s["what"]).strip()
                   for s in sources):  # fmt: skip
            _fail(path, fields["sources"][1], kind, entry, "sources",
                  "each url must be https:// and each what non-empty")  # fmt: skip
        values["sources"] = [(s["url"], s["what"]) for s in sources]
        out[entry] = values
    return out


def load_request_lengths(path: Path | None = None) -> dict[str, dict]:
    """Workload id -> name, mean_input_tokens, mean_output_tokens, sources."""
    return load_entries(Path(path or REQUEST_LENGTHS), "workloads", "workload",
                        ("mean_input_tokens", "mean_output_tokens"))  # fmt: skip


def load_host_links(path: Path | None = None) -> dict[str, dict]:
    """Link id -> name, total_gb_per_s (both directions together), sources: the `host_links`
    section of data/hardware.yaml (or of the hardware file at `path`)."""
    return load_entries(Path(path or HARDWARE), "host_links", "link", ("total_gb_per_s",))
