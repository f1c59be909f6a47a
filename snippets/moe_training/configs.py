"""MoE model configs and their published parameter counts, from data/moe_models.yaml.

Each entry keeps the fields of the model's Hugging Face config.json that the accounting reads,
spelled as that file spells them, and the figures its authors printed ("30.5B"). Errors name the
file and the line: ``data/moe_models.yaml:24: model 'qwen3-30b-a3b': field 'num_experts':
expected a positive int, got '128'``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import yaml

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "moe_models.yaml"
_COMMON = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
           "num_experts_per_tok", "tie_word_embeddings")  # fmt: skip
FAMILIES = {  # family -> the config fields it requires (no others are accepted)
    "qwen3_moe": (*_COMMON,"num_key_value_heads", "head_dim", "num_experts",
                            "moe_intermediate_size", "norm_topk_prob"),
    "mixtral": (*_COMMON,"num_key_value_heads", "num_local_experts", "intermediate_size"),
    "deepseek_v3": (*_COMMON,"intermediate_size", "moe_intermediate_size",
                              "first_k_dense_replace", "q_lora_rank", "kv_lora_rank",
                              "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                              "n_routed_experts", "n_shared_experts", "n_group", "topk_group",
                              "routed_scaling_factor", "scoring_func", "norm_topk_prob"),
}  # fmt: skip
KINDS = {
    "tie_word_embeddings": bool,
    "norm_topk_prob": bool,
    "scoring_func": str,
    "routed_scaling_factor": float,
}  # fmt: skip  (every other field: a positive int)
FIGURES = ("total", "active", "non_embedding")
PRINTED = re.compile(r"^(\d+(?:\.(\d+))?)B$")  # "30.5B": billions, as printed


class MoeDataError(ValueError):
    """Bad model data. Message: '<file>:<line>: model '<id>': field '<field>': <problem>'."""


# --8<-- [start:config]
@dataclass(frozen=True)
class Published:
    """A printed figure: its value and the unit of its last printed digit (both in params)."""

    printed: str
    value: float
    unit: float
    source: str


@dataclass(frozen=True)
class MoeModel:
    id: str
    family: str
    config: dict
    published: dict[str, Published]
    sources: tuple[str, ...]
    line: int


# --8<-- [end:config]


def _fail(path: Path, node, model: str, field: str, problem: str) -> NoReturn:
    line = node.start_mark.line + 1 if isinstance(node, yaml.Node) else 1
    try:
        shown = path.resolve().relative_to(DEFAULT_PATH.parents[1]).as_posix()
    except ValueError:
        shown = str(path)
    raise MoeDataError(f"{shown}:{line}: model '{model}': field '{field}': {problem}")


def _mapping(path: Path, node, model: str, field: str) -> dict:
    if not isinstance(node, yaml.MappingNode):
        _fail(path, node, model, field, "expected a mapping")
    return {k.value: (k, v) for k, v in node.value}


def _value(node):
    return yaml.safe_load(yaml.serialize(node))


def parse_printed(text: str) -> tuple[float, float]:
    """'30.5B' -> (30.5e9, 0.1e9): the value and the unit of its last digit."""
    m = PRINTED.match(text)
    if not m:
        raise ValueError(f"expected a count in billions such as '30.5B', got {text!r}")
    decimals = len(m.group(2) or "")
    return float(m.group(1)) * 1e9, 10.0 ** (9 - decimals)


def _config(path, node, model, family) -> dict:
    fields = _mapping(path, node, model, "config")
    need = FAMILIES[family]
    out = {}
    for name, (key, at) in fields.items():
        if name not in need:
            _fail(path, key, model, name, f"unknown field for {family}; known: {', '.join(need)}")
        value, kind = _value(at), KINDS.get(name, int)
        if kind is float and type(value) is int:
            value = float(value)
        ok = type(value) is kind and (kind not in (int, float) or value > 0)
        if not ok:
            what = {int: "a positive int", float: "a positive number", bool: "true or false",
                    str: "a string"}[kind]  # fmt: skip
            _fail(path, at, model, name, f"expected {what}, got {at.value!r}")
        out[name] = value
    for name in need:
        if name not in out:
            _fail(path, node, model, name, "missing")
    experts = out.get("num_experts", out.get("num_local_experts", out.get("n_routed_experts")))
    if out["num_experts_per_tok"] > experts:
        _fail(path, fields["num_experts_per_tok"][1], model, "num_experts_per_tok",
              f"{out['num_experts_per_tok']} experts per token, but only {experts} "
              "experts")  # fmt: skip
    if family == "deepseek_v3":
        if out["scoring_func"] not in ("sigmoid", "softmax"):
            _fail(path, fields["scoring_func"][1], model, "scoring_func", "sigmoid or softmax")
        if experts % out["n_group"] or out["topk_group"] > out["n_group"]:
            _fail(path, fields["n_group"][1], model, "n_group",
                  "must divide n_routed_experts, and topk_group <= n_group")  # fmt: skip
    return out


def load_moe_models(path: Path | None = None) -> dict[str, MoeModel]:
    """model id -> MoeModel, every field validated."""
    path = Path(path) if path is not None else DEFAULT_PATH
    loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        _fail(path, mark.line + 1 if mark else 1, "-", "-", f"malformed YAML: {exc}")
    top = _mapping(path, root, "-", "models")
    if "models" not in top:
        _fail(path, root, "-", "models", "missing")
    models = {}
    for model, (key, entry) in _mapping(path, top["models"][1], "-", "models").items():
        fields = _mapping(path, entry, model, "-")
        for name, (k, _) in fields.items():
            if name not in ("family", "config", "published", "sources"):
                _fail(path, k, model, name, "unknown field; known: family, config, published, "
                      "sources")  # fmt: skip
        for name in ("family", "config", "published", "sources"):
            if name not in fields:
                _fail(path, key, model, name, "missing")
        family = _value(fields["family"][1])
        if family not in FAMILIES:
            _fail(path, fields["family"][1], model, "family", f"one of {', '.join(FAMILIES)}")
        config = _config(path, fields["config"][1], model, family)
        published = {}
        for name, (k, at) in _mapping(path, fields["published"][1], model, "published").items():
            if name not in FIGURES:
                _fail(path, k, model, name, f"unknown figure; known: {', '.join(FIGURES)}")
            figure = _mapping(path, at, model, name)
            if set(figure) != {"value", "source"}:
                _fail(path, at, model, name, "expected exactly {value, source}")
            text, source = _value(figure["value"][1]), _value(figure["source"][1])
            try:
                value, unit = parse_printed(str(text))
            except ValueError as exc:
                _fail(path, figure["value"][1], model, name, str(exc))
            if not str(source).startswith("https://"):
                _fail(path, figure["source"][1], model, name, "source: an https:// URL")
            published[name] = Published(str(text), value, unit, source)
        for name in ("total", "active"):
            if name not in published:
                _fail(path, fields["published"][1], model, name, "missing")
        sources = _value(fields["sources"][1])
        if not (isinstance(sources, list) and sources
                and all(str(s).startswith("https://") for s in sources)):  # fmt: skip
            _fail(path, fields["sources"][1], model, "sources", "a list of https:// URLs")
        models[model] = MoeModel(model, family, config, published, tuple(sources),
                                 key.start_mark.line + 1)  # fmt: skip
    return models
