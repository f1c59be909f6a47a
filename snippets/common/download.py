"""What a downloaded page calls so that it runs outside the repository.

hooks/downloads.py writes each post's code as downloads/<slug>.py and .ipynb. The code imports
this handbook's `snippets` package, which the reader installs from the wheel the site publishes
beside the downloads (the package, data/ and the published results/, laid out as in the
repository). The download's first lines call `start(slug)`; from then on:

- the run records nothing: a computed figure is compared with the page's published record and
  the run prints whether it agrees; a measurement is printed, not written (records are written
  by the repository's runner alone: snippets/common/results.py);
- spawned worker processes do not run the script again: as in a notebook, `__main__` has no file
  for them to re-import, so a worker function comes from a module of the installed package;
- without CUDA, Triton runs in its interpreter (TRITON_INTERPRET=1, set before Triton loads).

A cell that needs CUDA runs under `if gpu_cell(...)`: without CUDA it is skipped with one printed
line; a cell that records a measurement is also skipped where HANDBOOK_SKIP_BENCHMARKS=1 (gpu_docs
sets it: the page's own run has just measured the same code).
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository, or the installed copy of its files
DIST = "xuntui-handbook"  # the wheel's distribution name
SKIP_BENCHMARKS_ENV = "HANDBOOK_SKIP_BENCHMARKS"
RUNNING: str | None = None  # the slug of the download this process runs, set by start()


def start(slug: str, version: str | None = None) -> None:
    """Mark this process as a reader's run of the download of post `slug`."""
    global RUNNING
    from snippets.common import results

    RUNNING = results.READER = slug
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__spec__", None) is None:  # run as a script
        vars(main).pop("__file__", None)  # spawned workers would run the whole script again
    if "TRITON_INTERPRET" not in os.environ:  # before anything imports Triton
        import torch

        os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
    print(f"{slug}: the handbook's code from {ROOT} "
          f"(TRITON_INTERPRET={os.environ['TRITON_INTERPRET']})")  # fmt: skip
    try:
        installed = importlib.metadata.version(DIST)
    except importlib.metadata.PackageNotFoundError:
        installed = None  # the package sits in a repository checkout
    if version and installed and installed != version:
        print(f"{slug}: this download was written for {DIST} {version}, but {installed} is "
              "installed: the code may differ from the page's")  # fmt: skip


def gpu_cell(label: str, measures: bool = False) -> bool:
    """Whether to run a cell that needs CUDA; says why not when it is skipped."""
    import torch

    if not torch.cuda.is_available():
        print(f"skipped {label}: needs CUDA")
        return False
    if measures and os.environ.get(SKIP_BENCHMARKS_ENV) == "1":
        print(f"skipped {label}: it records a measurement and {SKIP_BENCHMARKS_ENV}=1 (gpu_docs "
              "has just measured this code on the page)")  # fmt: skip
        return False
    return True


def path(file: str) -> str:
    """The installed copy of a repository file (what `__file__` is for that file)."""
    return str(ROOT / file)
