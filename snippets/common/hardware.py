"""GPU hardware constants, loaded and validated from data/hardware.yaml (the single source)."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, NoReturn

import yaml

DEFAULT_PATH = Path(__file__).resolve().parents[2] / "data" / "hardware.yaml"
Sources = tuple[tuple[str, str], ...]  # (url, what) pairs


class HardwareDataError(ValueError):
    """Bad hardware data. Message: '<file>:<line>: gpu '<id>': field '<field>': <problem>'."""


@dataclass(frozen=True)
class GPU:
    id: str
    name: str
    architecture: str
    sms: int
    memory_gb: float
    hbm_tb_per_s: float
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None
    fp32_tflops: float
    tdp_w: int
    sources: Sources
    notes: str


# YAML schema derived from GPU's annotations: every entry has exactly these fields.
_NUM = (int, float)  # a YAML int is fine where a float is expected; bools are rejected
_TYPES = {"str": (str,), "int": (int,), "float": _NUM, "float | None": (*_NUM, type(None))}
_FIELDS = {f.name: _TYPES.get(f.type, (list,)) for f in fields(GPU) if f.name != "id"}
_STR = "tag:yaml.org,2002:str"


def _fail(path: Path, at: yaml.Node | int, gpu_id: str, field: str, problem: str) -> NoReturn:
    line = at if isinstance(at, int) else at.start_mark.line + 1  # marks are 0-based
    raise HardwareDataError(f"{path}:{line}: gpu '{gpu_id}': field '{field}': {problem}")


def _context(text: str, line: int) -> tuple[str, str]:
    """Best-effort (gpu id, field) for a 1-based line, assuming the file's 2-space layout."""
    lines = text.splitlines()[:line]
    m = re.match(r"\s*-?\s*([\w-]+)\s*:", lines[-1]) if lines else None
    gpu_ids = (re.match(r" {2}([\w-]+):\s*$", ln) for ln in reversed(lines))
    return next((g.group(1) for g in gpu_ids if g), "?"), m.group(1) if m else "?"


def load_hardware(path: Path | None = None) -> dict[str, GPU]:
    """Parse and validate the hardware file; errors name the file, line, gpu id and field.

    The line is the offending field's own line, or the entry's id line for a missing field.
    """
    path = Path(path) if path is not None else DEFAULT_PATH
    text = path.read_text(encoding="utf-8")
    loader = yaml.SafeLoader(text)
    try:  # compose for line marks; construct once so bad tags fail here too
        root = loader.get_single_node()
        loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:  # re-raise malformed YAML with file and line
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        line = mark.line + 1 if mark else 1
        problem = getattr(exc, "problem", None) or exc
        _fail(path, line, *_context(text, line), f"malformed YAML: {problem}")
    top = {k.value: (k, v) for k, v in root.value} if isinstance(root, yaml.MappingNode) else {}
    if "gpus" not in top or not isinstance(top["gpus"][1], yaml.MappingNode):
        _fail(path, root or 1, "-", "gpus", "top-level 'gpus' mapping required")
    out: dict[str, GPU] = {}
    for id_node, entry in top["gpus"][1].value:
        gpu_id = str(id_node.value)
        if gpu_id in out or not isinstance(entry, yaml.MappingNode):
            _fail(path, id_node, gpu_id, "-", "duplicate id or entry is not a mapping")
        given = {k.value: (k, v) for k, v in entry.value}
        for name in [f for f in given if f not in _FIELDS]:
            _fail(path, given[name][0], gpu_id, name, "unknown field")
        values: dict[str, Any] = {}
        for name, types in _FIELDS.items():
            if name not in given:
                _fail(path, id_node, gpu_id, name, "missing field")
            key, node = given[name]
            value = loader.construct_object(node, deep=True)
            if isinstance(value, bool) or not isinstance(value, types):
                want = "/".join(t.__name__ for t in types)
                _fail(path, key, gpu_id, name, f"expected {want}, got {value!r}")
            if isinstance(value, _NUM) and value <= 0:
                _fail(path, key, gpu_id, name, f"must be positive, got {value!r}")
            values[name] = value
        values["sources"] = _sources(path, gpu_id, *given["sources"])
        out[gpu_id] = GPU(id=gpu_id, **values)
    return out


def _sources(path: Path, gpu_id: str, key: yaml.Node, seq: yaml.SequenceNode) -> Sources:
    if not 1 <= len(seq.value) <= 3:
        _fail(path, key, gpu_id, "sources", f"need 1-3 sources, got {len(seq.value)}")
    pairs = []
    for item in seq.value:
        kv = {k.value: v for k, v in item.value} if isinstance(item, yaml.MappingNode) else {}
        if set(kv) != {"url", "what"} or any(n.tag != _STR or not n.value for n in kv.values()):
            _fail(path, item, gpu_id, "sources", "each source needs exactly url and what strings")
        if not kv["url"].value.startswith("https://"):
            _fail(path, kv["url"], gpu_id, "sources.url", f"not https: {kv['url'].value}")
        pairs.append((kv["url"].value, kv["what"].value))
    return tuple(pairs)


def ridge_point(gpu: GPU, dtype: str = "bf16") -> float:
    """FLOP per HBM byte above which a kernel is compute-bound (dense peak / bandwidth)."""
    tflops = {"bf16": gpu.bf16_dense_tflops, "fp8": gpu.fp8_dense_tflops}.get(dtype)
    if tflops is None:  # unknown dtype, or no such Tensor Core format (A100 has no FP8)
        raise ValueError(f"{gpu.id} has no dense peak for dtype {dtype!r} (bf16 or fp8)")
    return tflops * 1e12 / (gpu.hbm_tb_per_s * 1e12)


# Matching rule: case-insensitive regexes over the CUDA device name, first hit wins.
# Variants not in the table (H100/H200 NVL, A100 40GB or PCIe, GB200) map to None.
_NAME_RULES = (
    (r"\bH200\b(?!.*\bNVL\b)", "h200-sxm"),  # "NVIDIA H200"
    (r"\bH100\b.*\bPCIe\b", "h100-pcie"),  # "NVIDIA H100 PCIe"
    (r"\bH100\b(?!.*\b(?:NVL|PCIe)\b).*\b(?:HBM3|SXM\d?)\b", "h100-sxm"),  # "... 80GB HBM3"
    (r"\bA100\b.*\bSXM\d?\b.*\b80GB\b", "a100-sxm-80gb"),  # "NVIDIA A100-SXM4-80GB"
    (r"\bB200\b", "b200"),  # "NVIDIA B200"; "GB200" has no word boundary before B
)


def gpu_for_device_name(name: str, gpus: dict[str, GPU] | None = None) -> GPU | None:
    """Map a torch.cuda.get_device_name() string to its entry, or None if not in the table."""
    table = gpus if gpus is not None else load_hardware()
    hit = next((gid for rx, gid in _NAME_RULES if re.search(rx, name, re.IGNORECASE)), None)
    return table.get(hit) if hit else None
