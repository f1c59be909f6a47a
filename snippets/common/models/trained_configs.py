"""The shared trained models' pins and shapes, loaded and validated from data/trained_models.yaml.

One file says everything that makes a trained model reproducible: the corpus (one pinned wheel,
its sha256, the rule that selects its text files, the held-out split and the hashes that the
selection must reproduce), the tokenizer (library version, vocabulary size, the hash of its JSON)
and each model (its kind, its config without `vocab_size`, which is the tokenizer's, its training
settings, how many seeds the GPU run trains it with, the held-out loss it must reach, the
stand-in shape and steps used where there is no CUDA). Imports no torch: `nox -s
check` validates the file without it. Errors name the file and the line:
``data/trained_models.yaml:61: model 'draft': field 'config.hidden_size': expected int, got '512'``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import yaml

from snippets.common.models.qwen3_configs import FIELDS as DENSE_FIELDS

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "trained_models.yaml"
ROOT = DEFAULT_PATH.parents[1]
# Qwen3MoeConfig's own fields (snippets/common/models/qwen3_moe.py; a test checks they agree).
MOE_FIELDS = {
    "num_experts": int,
    "num_experts_per_tok": int,
    "moe_intermediate_size": int,
    "norm_topk_prob": bool,
    "router_aux_loss_coef": float,
}
CONFIG_FIELDS = {  # vocab_size is the tokenizer's; a MoE's layers are all sparse (no dense MLP)
    "dense": {k: t for k, t in DENSE_FIELDS.items() if k != "vocab_size"},
    "moe": {k: t for k, t in DENSE_FIELDS.items() if k not in ("vocab_size", "intermediate_size")}
    | MOE_FIELDS,
}
TRAIN_FIELDS = {
    "seed": int,
    "steps": int,
    "batch_size": int,
    "seq_len": int,
    "lr": float,
    "min_lr_ratio": float,
    "warmup_steps": int,
    "weight_decay": float,
    "beta1": float,
    "beta2": float,
    "grad_clip": float,
    "init_std": float,
    "eval_tokens": int,
}
CORPUS_FIELDS = {
    "package": str,
    "version": str,
    "wheel": str,
    "sha256": str,
    "url": str,
    "prefix": str,
    "suffix": str,
    "exclude_dirs": list,
    "heldout_modulus": int,
    "files": int,
    "heldout_files": int,
    "bytes": int,
    "files_sha256": str,
    "content_sha256": str,
}
TOKENIZER_FIELDS = {
    "library": str,
    "version": str,
    "kind": str,
    "vocab_size": int,
    "min_frequency": int,
    "eos": str,
    "sha256": str,
}
MODEL_KEYS = ("kind", "config", "train", "seeds", "max_heldout_loss", "cpu")
ZERO_OK = {"weight_decay", "min_lr_ratio", "warmup_steps", "seed", "router_aux_loss_coef"}
_TYPES = {int: (int,), float: (int, float), bool: (bool,), str: (str,), list: (list,)}


class TrainedDataError(ValueError):
    """Bad data. Message: '<file>:<line>: <section>: field '<field>': <problem>'."""


def _shown(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


def _fail(path: Path, node, where: str, field: str, problem: str) -> NoReturn:
    line = node.start_mark.line + 1 if isinstance(node, yaml.Node) else 1
    raise TrainedDataError(f"{_shown(path)}:{line}: {where}: field '{field}': {problem}")


def _mapping(path: Path, node, where: str, field: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    if not isinstance(node, yaml.MappingNode):
        _fail(path, node, where, field, "expected a mapping")
    return {k.value: (k, v) for k, v in node.value}


@dataclass(frozen=True)
class Pin:
    """A validated section: its values, and the line of each field for errors about it."""

    path: Path
    section: str
    values: dict
    lines: dict[str, int]

    def __getattr__(self, name):
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def error(self, field: str, problem: str) -> str:
        """'<file>:<line>: <section>: field '<field>': <problem>', for a fact found later (a
        wheel whose files do not hash as pinned): the caller raises it as its own error."""
        line = self.lines.get(field, 1)
        return f"{_shown(self.path)}:{line}: {self.section}: field '{field}': {problem}"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # "dense" (snippets/common/models/qwen3.py) or "moe" (qwen3_moe.py)
    config: dict  # the config's fields, vocab_size excluded
    train: dict  # the training section's defaults with this model's overrides
    seeds: int  # the GPU run trains seeds train["seed"] .. + seeds - 1; the first is cached
    max_heldout_loss: float | None  # None: not set yet (first GPU run)
    cpu: dict  # {"config": {...}, "train": {...}}: overrides where there is no CUDA
    line: int
    limit_line: int = 0  # the line of max_heldout_loss

    def resolved(self, on_gpu: bool) -> tuple[dict, dict]:
        """(config, train) for this machine: the GPU's, or the CPU stand-in's overrides."""
        if on_gpu:
            return dict(self.config), dict(self.train)
        return self.config | self.cpu["config"], self.train | self.cpu["train"]


@dataclass(frozen=True)
class TrainedSpec:
    path: Path
    corpus: Pin
    tokenizer: Pin
    models: dict[str, ModelSpec]


def _values(path, node, where, fields: dict, *, partial=False, loader) -> tuple[dict, dict]:
    given = _mapping(path, node, where, "-")
    values, lines = {}, {}
    for name, (key, _) in given.items():
        if name not in fields:
            _fail(path, key, where, name, f"unknown field; known: {', '.join(fields)}")
    for name, kind in fields.items():
        if name not in given:
            if partial:
                continue
            _fail(path, node, where, name, "missing field")
        key, at = given[name]
        value = loader.construct_object(at, deep=True)
        types = _TYPES[kind]
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, types):
            _fail(path, key, where, name, f"expected {kind.__name__}, got {value!r}")
        if kind in (int, float) and (value < 0 or (value == 0 and name not in ZERO_OK)):
            _fail(path, key, where, name, f"must be positive, got {value!r}")
        if kind is str and not value.strip():
            _fail(path, key, where, name, "expected a non-empty string")
        values[name] = float(value) if kind is float else value
        lines[name] = key.start_mark.line + 1
    return values, lines


def _check_corpus(path, node, corpus: dict) -> None:
    given = {k.value: k for k, _ in node.value}
    for name in ("sha256", "files_sha256", "content_sha256"):
        text = corpus[name]
        if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
            _fail(path, given[name], "corpus", name, "expected 64 lowercase hex digits")
    if not all(isinstance(d, str) and d and "/" not in d for d in corpus["exclude_dirs"]):
        _fail(path, given["exclude_dirs"], "corpus", "exclude_dirs", "a list of folder names")
    want = f"{corpus['package']}-{corpus['version']}-py3-none-any.whl"
    if corpus["wheel"] != want:
        _fail(path, given["wheel"], "corpus", "wheel", f"a pure-Python wheel: expected {want}")
    if not corpus["url"].startswith("https://"):
        _fail(path, given["url"], "corpus", "url", "an https:// URL")
    if not 0 < corpus["heldout_files"] < corpus["files"]:
        _fail(path, given["heldout_files"], "corpus", "heldout_files", "between 0 and files")


def load_trained_models(path: Path | None = None) -> TrainedSpec:
    """Parse and validate the whole file (no file is read but this one)."""
    path = Path(path) if path is not None else DEFAULT_PATH
    loader = yaml.SafeLoader(path.read_text(encoding="utf-8"))
    try:
        root = loader.get_single_node()
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise TrainedDataError(f"{_shown(path)}:{line}: malformed YAML: {exc}") from None
    top = _mapping(path, root, "-", "-")
    for name in ("corpus", "tokenizer", "training", "models"):
        if name not in top:
            _fail(path, root, "-", name, "missing section")
    for name, (key, _) in top.items():
        if name not in ("corpus", "tokenizer", "training", "models"):
            _fail(path, key, "-", name, "unknown section")
    node = top["corpus"][1]
    corpus = Pin(path, "corpus", *_values(path, node, "corpus", CORPUS_FIELDS, loader=loader))
    _check_corpus(path, node, corpus.values)
    values, lines = _values(path, top["tokenizer"][1], "tokenizer", TOKENIZER_FIELDS,
                            loader=loader)  # fmt: skip
    tokenizer = Pin(path, "tokenizer", values, lines)
    if values["kind"] != "byte-level-bpe" or values["library"] != "tokenizers":
        _fail(path, top["tokenizer"][1], "tokenizer", "kind", "byte-level-bpe from tokenizers")
    defaults, _ = _values(path, top["training"][1], "training", TRAIN_FIELDS, loader=loader)
    models = {}
    for name, (key, entry) in _mapping(path, top["models"][1], "models", "-").items():
        where = f"model '{name}'"
        given = _mapping(path, entry, where, "-")
        if set(given) != set(MODEL_KEYS):
            _fail(path, key, where, "-", f"expected exactly {', '.join(MODEL_KEYS)}")
        kind = given["kind"][1].value
        if kind not in CONFIG_FIELDS:
            _fail(path, given["kind"][1], where, "kind", f"dense or moe, got {kind!r}")
        fields = CONFIG_FIELDS[kind]
        config, _ = _values(path, given["config"][1], f"{where} config", fields, loader=loader)
        train, _ = _values(path, given["train"][1], f"{where} train", TRAIN_FIELDS,
                           partial=True, loader=loader)  # fmt: skip
        seeds = loader.construct_object(given["seeds"][1])
        if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
            _fail(path, given["seeds"][0], where, "seeds", f"a positive int, got {seeds!r}")
        limit = loader.construct_object(given["max_heldout_loss"][1])
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float)
                                  or limit <= 0):  # fmt: skip
            _fail(path, given["max_heldout_loss"][0], where, "max_heldout_loss",
                  f"a positive number, or null until the first GPU run; got {limit!r}")  # fmt: skip
        cpu_given = _mapping(path, given["cpu"][1], f"{where} cpu", "-")
        if set(cpu_given) - {"config", "train"}:
            _fail(path, given["cpu"][0], where, "cpu", "only config and train overrides")
        cpu = {"config": {}, "train": {}}
        for part, known in (("config", fields), ("train", TRAIN_FIELDS)):
            if part in cpu_given:
                cpu[part], _ = _values(path, cpu_given[part][1], f"{where} cpu.{part}", known,
                                       partial=True, loader=loader)  # fmt: skip
        merged = config | cpu["config"]
        for cfg in (config, merged):
            if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
                _fail(path, given["config"][0], where, "num_key_value_heads",
                      "must divide num_attention_heads")  # fmt: skip
            if kind == "moe" and cfg["num_experts_per_tok"] > cfg["num_experts"]:
                _fail(path, given["config"][0], where, "num_experts_per_tok",
                      "at most num_experts")  # fmt: skip
        models[name] = ModelSpec(name, kind, config, defaults | train, seeds, limit, cpu,
                                 key.start_mark.line + 1,
                                 given["max_heldout_loss"][0].start_mark.line + 1)  # fmt: skip
    return TrainedSpec(path, corpus, tokenizer, models)
