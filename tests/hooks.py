"""Load a build hook (hooks/<name>.py) in a test, and a stand-in for the page it renders."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_hook(name: str):
    """hooks/<name>.py as a module; skipped where mkdocs is absent (gpu_docs has no docs build)."""
    pytest.importorskip("mkdocs", reason="the hooks run in the docs build")
    spec = importlib.util.spec_from_file_location(f"{name}_hook", ROOT / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_page(src_uri: str):
    """What the hooks read of an mkdocs Page: its URL and its source path."""
    stem = src_uri.removesuffix(".md")
    url = (
        "" if stem == "index" else stem.removesuffix("/index") + "/"
    )  # as mkdocs' use_directory_urls
    return SimpleNamespace(url=url, file=SimpleNamespace(src_uri=src_uri))
