"""Result records: results/<slug>/<name>.json with values, provenance and source hashes.

Written on the GPU by benchmarks (through `nox -s gpu_docs`); read on the CPU by the MkDocs
hook (tables, plots, numbers in prose) and by the freshness gate in tests/test_results.py.
Imports no torch at module level: the docs build has none.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Every measurement depends on these besides its own sources (this file only stores numbers).
HARNESS = ("snippets/common/bench.py", "snippets/common/device.py")
# In a page:  <!-- result: table NAME -->  <!-- result: plot NAME -->  and inline {{ NAME:key }}
# or {{ NAME:key:.1f }} for a number from the result's "values".
BLOCK = re.compile(r"^<!--\s*result:\s*(?P<kind>table|plot)\s+(?P<name>[\w-]+)\s*-->\s*$", re.M)
INLINE = re.compile(r"\{\{\s*(?P<name>[\w-]+):(?P<key>[\w.-]+)(?::(?P<fmt>[^}\s]+))?\s*\}\}")
_FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,}).*?^\1\2[ \t]*$", re.M | re.S)
REQUIRED = ("slug", "name", "title", "model", "values", "provenance", "sources")


class ResultError(ValueError):
    """A result file is missing, malformed or stale; the message names the file."""


def references(text: str) -> list[re.Match]:
    """Result references outside fenced code, as matches of BLOCK or INLINE, in page order.

    Fenced code is blanked out first (same length, newlines kept), so positions and line
    numbers are those of the original text.
    """
    masked = _FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    found = [*BLOCK.finditer(masked), *INLINE.finditer(masked)]
    return sorted(found, key=lambda m: m.start())


def result_path(slug: str, name: str, root: Path = ROOT) -> Path:
    return root / "results" / slug / f"{name}.json"


def refresh_command(slug: str) -> str:
    return f"nox -s gpu_docs -- {slug}"


def file_hash(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def hash_sources(files: list[str], root: Path = ROOT) -> dict[str, str]:
    missing = [f for f in files if not (root / f).is_file()]
    if missing:
        raise ResultError(f"result sources do not exist: {', '.join(missing)}")
    return {f: file_hash(root / f) for f in sorted(set(files))}


def provenance() -> dict:
    """Where and with what a measurement ran (call on the measuring machine)."""
    import torch
    import triton

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    commit = os.environ.get("HANDBOOK_COMMIT") or _git("rev-parse", "--short=12", "HEAD")
    return {
        "gpu": torch.cuda.get_device_name(),
        "driver": smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "unknown",
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"),
        "commit": commit or "unknown",
    }


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT)
    except FileNotFoundError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def write_result(
    slug: str,
    name: str,
    *,
    title: str,
    model: str,
    values: dict,
    sources: list[str],
    table: dict | None = None,
    plot: dict | None = None,
    prov: dict | None = None,
    root: Path = ROOT,
) -> Path:
    """Record a measurement. `model` states the byte or FLOP model behind derived rates."""
    record = {
        "slug": slug, "name": name, "title": title, "model": model, "values": values,
        "table": table, "plot": plot, "provenance": prov or provenance(),
        "sources": hash_sources([*sources, *HARNESS], root),
    }  # fmt: skip
    path = result_path(slug, name, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return path


def load_result(path: Path) -> dict:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultError(f"{path}: no such result") from None
    except json.JSONDecodeError as exc:
        raise ResultError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    missing = [k for k in REQUIRED if k not in record]
    if missing:
        raise ResultError(f"{path}: missing field(s) {', '.join(missing)}")
    return record


def stale_sources(record: dict, root: Path = ROOT) -> list[str]:
    """Source files whose content changed (or vanished) since the result was measured."""
    changed = []
    for file, digest in record["sources"].items():
        path = root / file
        if not path.is_file() or file_hash(path) != digest:
            changed.append(file)
    return changed


def lookup(record: dict, key: str):
    value = record["values"]
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value
