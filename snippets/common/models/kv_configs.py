"""Attention shapes of published models for KV-cache accounting, from data/kv_models.yaml.

Each entry is a subset of the model's Hugging Face config.json (plain dict, as the formulas read
it). Errors name the file and line:
``data/kv_models.yaml:12: model 'opt-13b': field 'hidden_size': expected a positive int, got
'5120'``. ``kv_config`` also reads the Qwen3 models of data/qwen3.yaml (qwen3_configs.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import yaml

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "kv_models.yaml"
REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size")
OPTIONAL = (
    "num_key_value_heads",
    "head_dim",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "sliding_window",
    "sliding_window_pattern",
    "max_position_embeddings",
)
TOGETHER = (("kv_lora_rank", "qk_rope_head_dim"),)  # MLA needs both


class KVDataError(ValueError):
    """Bad model data. Message: '<file>:<line>: model '<id>': field '<field>': <problem>'."""


def _fail(path: Path, node: yaml.Node | None, model: str, field: str, problem: str) -> NoReturn:
    line = node.start_mark.line + 1 if node is not None else 1
    raise KVDataError(f"{path}:{line}: model '{model}': field '{field}': {problem}")


def _mapping(path: Path, node: yaml.Node | None, model: str, field: str) -> dict:
    if not isinstance(node, yaml.MappingNode):
        _fail(path, node, model, field, "expected a mapping")
    return {k.value: (k, v) for k, v in node.value}


def load_kv_configs(path: Path | None = None) -> dict[str, dict]:
    """model id -> {"config": {...}, "sources": [...]}, validated."""
    path = Path(path) if path is not None else DEFAULT_PATH
    loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise KVDataError(f"{path}:{mark.line + 1 if mark else 1}: malformed YAML: {exc}") from None
    top = _mapping(path, root, "-", "models")
    if "models" not in top:
        _fail(path, root, "-", "models", "missing")
    out = {}
    for model, (key, entry) in _mapping(path, top["models"][1], "-", "models").items():
        fields = _mapping(path, entry, model, "config/sources")
        if "config" not in fields or "sources" not in fields:
            _fail(path, key, model, "config/sources", "both are required")
        config = {}
        for name, (k, v) in _mapping(path, fields["config"][1], model, "config").items():
            if name not in REQUIRED + OPTIONAL:
                _fail(
                    path, k, model, name, f"unknown field; known: {', '.join(REQUIRED + OPTIONAL)}"
                )
            value = yaml.safe_load(yaml.serialize(v))
            if type(value) is not int or value <= 0:
                _fail(path, v, model, name, f"expected a positive int, got {v.value!r}")
            config[name] = value
        for name in REQUIRED:
            if name not in config:
                _fail(path, fields["config"][0], model, name, "missing")
        for group in TOGETHER:
            if any(g in config for g in group) and not all(g in config for g in group):
                _fail(path, fields["config"][0], model, "/".join(group), "give all or none")
        sources = fields["sources"][1]
        urls = yaml.safe_load(yaml.serialize(sources))
        if (
            not isinstance(urls, list)
            or not urls
            or not all(isinstance(u, str) and u.startswith("https://") for u in urls)
        ):
            _fail(path, sources, model, "sources", "expected a non-empty list of https:// URLs")
        out[model] = {"config": config, "sources": urls}
    return out


def kv_config(model: str) -> dict:
    """The config dict of a model in data/kv_models.yaml or data/qwen3.yaml."""
    models = load_kv_configs()
    if model in models:
        return dict(models[model]["config"])
    from snippets.common.models.qwen3_configs import load_qwen3_configs

    qwen3 = load_qwen3_configs()
    if model in qwen3:
        return dict(qwen3[model].fields)
    raise KeyError(f"unknown model {model!r}; known: {', '.join([*models, *qwen3])}")
