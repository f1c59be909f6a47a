"""The kv-cache calculator's model menu, from data/kv_presets.yaml (the file says what it holds).

`load_kv_presets()` returns the menu in order, each entry with its config (data/kv_models.yaml or
data/qwen3.yaml, the files beside it) and its parameter count as printed (None for a Qwen3 model
of data/qwen3.yaml, whose parameters are counted from its config). Errors name the file and the
line: ``data/kv_presets.yaml:23: preset 'opt-13b': field 'params_b': a number as printed, quoted:
"13"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from snippets.common.models.kv_configs import KVDataError, load_kv_configs
from snippets.common.models.qwen3_configs import load_qwen3_configs

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "data" / "kv_presets.yaml"
COUNTS = ("params_b", "active_b")


@dataclass(frozen=True)
class Preset:
    id: str
    label: str  # the Hugging Face repository's name, from the config's source
    config: dict
    params_b: str | None  # as printed; None: count it from the (Qwen3) config
    active_b: str | None  # a mixture of experts: parameters one token is computed with
    sources: tuple[str, ...]  # the config's, then the count's


def _fail(path: Path, node: yaml.Node, preset: str, field: str, problem: str):
    line = node.start_mark.line + 1
    raise KVDataError(f"{path}:{line}: preset '{preset}': field '{field}': {problem}")


def load_kv_presets(path: Path | None = None) -> list[Preset]:
    path = Path(path) if path is not None else DEFAULT_PATH
    shared = load_kv_configs(path.parent / "kv_models.yaml")  # the files beside it
    qwen3 = load_qwen3_configs(path.parent / "qwen3.yaml")
    root = yaml.compose(path.read_text(encoding="utf-8"))
    menu = next((v for k, v in root.value if k.value == "menu"), None)
    if not isinstance(menu, yaml.MappingNode) or not menu.value:
        raise KVDataError(f"{path}:1: a top-level 'menu' mapping of presets is required")
    out = []
    for key, entry in menu.value:
        name = key.value
        given = {k.value: v for k, v in entry.value} if isinstance(entry, yaml.MappingNode) else {}
        if not isinstance(entry, yaml.MappingNode) or set(given) - {*COUNTS, "source"}:
            _fail(path, key, name, "-", f"a mapping of {', '.join(COUNTS)} and source")
        if name in shared:
            config, urls = shared[name]["config"], shared[name]["sources"]
        elif name in qwen3:
            config, urls = dict(qwen3[name].fields), list(qwen3[name].sources)
        else:
            _fail(path, key, name, "-", "no such model in kv_models.yaml or in qwen3.yaml")
        counts = {}
        for field in COUNTS:
            node = given.get(field)
            if node is None:
                continue
            if node.tag != "tag:yaml.org,2002:str" or not node.value.replace(".", "", 1).isdigit():
                _fail(path, node, name, field, f'a number as printed, quoted: "{node.value}"')
            counts[field] = node.value
        if name in qwen3 and name not in shared and (counts or "source" in given):
            _fail(path, key, name, "params_b", "a Qwen3 model of qwen3.yaml is counted from config")
        if name not in qwen3 and ("params_b" not in counts or "source" not in given):
            _fail(path, key, name, "params_b", "needed, with the source that prints it")
        if "source" in given and not given["source"].value.startswith("https://"):
            _fail(path, given["source"], name, "source", "an https:// URL")
        extra = [given["source"].value] if "source" in given else []
        label = urls[0].split("/")[4] if urls[0].startswith("https://huggingface.co/") else name
        out.append(Preset(name, label, config, counts.get("params_b"), counts.get("active_b"),
                          tuple([*urls, *extra])))  # fmt: skip
    return out
