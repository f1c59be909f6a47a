"""Published Qwen3 configs, loaded and validated from data/qwen3.yaml (the single source).

Each entry gives the config.json fields of Qwen3Config and the model card's parameter counts as
printed (strings such as "4.0", so a test knows their precision). Errors name the file and line:
``data/qwen3.yaml:52: model 'qwen3-4b': field 'hidden_size': expected int, got '2560'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import yaml

if TYPE_CHECKING:
    from snippets.common.models.qwen3 import Qwen3Config

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "qwen3.yaml"
CARD = ("total_b", "non_embedding_b")  # billions, as printed on the model card
# Qwen3Config's fields and types, spelled out so that validating the data (nox -s check) does not
# import torch; tests/snippets/test_qwen3_fusion.py checks that they agree with the dataclass.
FIELDS = {
    "vocab_size": int,
    "hidden_size": int,
    "intermediate_size": int,
    "num_hidden_layers": int,
    "num_attention_heads": int,
    "num_key_value_heads": int,
    "head_dim": int,
    "rms_norm_eps": float,
    "rope_theta": float,
    "tie_word_embeddings": bool,
}
_TYPES = {int: (int,), float: (int, float), bool: (bool,)}  # YAML ints are fine as floats
_CONFIG = {name: _TYPES[t] for name, t in FIELDS.items()}


class Qwen3DataError(ValueError):
    """Bad model data. Message: '<file>:<line>: model '<id>': field '<field>': <problem>'."""


@dataclass(frozen=True)
class Published:
    id: str
    fields: dict  # config.json's values of FIELDS
    card: dict[str, str]  # CARD -> the printed number
    sources: tuple[str, ...]

    @property
    def config(self) -> Qwen3Config:
        from snippets.common.models.qwen3 import Qwen3Config  # torch: only when a model is built

        return Qwen3Config(**self.fields)


def _fail(path: Path, node: yaml.Node | None, model: str, field: str, problem: str) -> NoReturn:
    line = node.start_mark.line + 1 if node is not None else 1
    raise Qwen3DataError(f"{path}:{line}: model '{model}': field '{field}': {problem}")


def _mapping(path, node, model, field) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        _fail(path, node, model, field, "expected a mapping")
    return {k.value: (k, v) for k, v in node.value}


def load_qwen3_configs(path: Path | None = None) -> dict[str, Published]:
    """Parse and validate the file: every Qwen3Config field, both card counts, https sources."""
    path = Path(path) if path is not None else DEFAULT_PATH
    loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    try:  # compose for line marks; construct once so that bad tags fail here too
        root = loader.get_single_node()
        loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise Qwen3DataError(f"{path}:{line}: malformed YAML: {exc}") from None
    top = _mapping(path, root, "-", "models") if root is not None else {}
    if "models" not in top:
        _fail(path, root, "-", "models", "top-level 'models' mapping required")
    _mapping(path, top["models"][1], "-", "models")
    out = {}
    for id_node, entry in top["models"][1].value:
        model = str(id_node.value)
        given = _mapping(path, entry, model, "-")
        if model in out or set(given) != {"config", "card", "sources"}:
            _fail(path, id_node, model, "-", "duplicate id, or not exactly config, card, sources")
        config = {}
        cfg_nodes = _mapping(path, given["config"][1], model, "config")
        for name in set(cfg_nodes) - set(_CONFIG):
            _fail(path, cfg_nodes[name][0], model, name, "unknown field")
        for name, types in _CONFIG.items():
            if name not in cfg_nodes:
                _fail(path, given["config"][0], model, name, "missing field")
            value = loader.construct_object(cfg_nodes[name][1])
            if isinstance(value, bool) != (types == (bool,)) or not isinstance(value, types):
                want = types[-1].__name__
                _fail(path, cfg_nodes[name][0], model, name, f"expected {want}, got {value!r}")
            if types != (bool,) and value <= 0:
                _fail(path, cfg_nodes[name][0], model, name, f"must be positive, got {value!r}")
            config[name] = float(value) if types == _TYPES[float] else value
        card_nodes = _mapping(path, given["card"][1], model, "card")
        if set(card_nodes) != set(CARD):
            _fail(path, given["card"][0], model, "card", f"need exactly {', '.join(CARD)}")
        card = {}
        for name, (key, node) in card_nodes.items():
            text = node.value if node.tag == "tag:yaml.org,2002:str" else None
            if text is None or not text.replace(".", "", 1).isdigit():
                _fail(path, key, model, f"card.{name}", 'a number as printed, quoted: "4.0"')
            card[name] = text
        seq = given["sources"][1]
        items = seq.value if isinstance(seq, yaml.SequenceNode) else []
        if not items or not all(
            isinstance(n, yaml.ScalarNode) and n.value.startswith("https://") for n in items
        ):
            _fail(path, given["sources"][0], model, "sources", "need a list of https URLs")
        urls = tuple(n.value for n in items)
        out[model] = Published(model, config, card, urls)
    return out
