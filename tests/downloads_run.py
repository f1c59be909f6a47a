"""Run a post's download as a reader does: outside the repository, in a fresh folder, with the
handbook's code installed from the wheel that the download names (hooks/downloads.py).

Used by tests/test_downloads_run.py (CPU) and by `nox -s gpu_docs` (every post, on the GPU).
Stdlib only. The wheel goes in with `pip install --target` (no network, no virtual environment:
the download runs on the calling interpreter, which holds torch, triton and PyYAML), and the
folder that the wheel's .pth file names goes on PYTHONPATH, as Python does with a .pth file in
site-packages.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

WHEEL = re.compile(r"pip install \S*?/(?P<name>xuntui_handbook-[^\s/`]+\.whl)")
DIFFERS = "DIFFERS from the page's record"  # snippets/common/results.py prints it
TAIL_LINES = 40


def wheel_named_in(script: str) -> str:
    """The wheel file a download tells its reader to install."""
    m = WHEEL.search(script)
    if m is None:
        raise ValueError("the download names no wheel to `pip install`")
    return m["name"]


def install(wheel: Path, where: Path, python: str = sys.executable) -> list[str]:
    """Install the wheel into `where`; returns the sys.path entries it needs (its .pth lines)."""
    proc = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--no-compile",
         "--target", str(where), str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"pip could not install {wheel.name}: {proc.stderr.strip()[-2000:]}")
    entries = []
    for pth in sorted(where.glob("*.pth")):
        for line in pth.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith(("#", "import ")):
                entries.append(str((where / line.strip()).resolve()))
    if not entries:
        raise RuntimeError(f"{wheel.name} has no .pth file naming the folder of its files")
    return entries


def _snapshot(root: Path) -> dict[str, str]:
    """SHA-256 of the installed data and records (a download must not change them)."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for top in ("data", "results") for p in sorted((root / top).rglob("*")) if p.is_file()
    }  # fmt: skip


@dataclass
class Run:
    slug: str
    returncode: int | None
    output: str
    wall_s: float
    problems: list[str] = field(default_factory=list)

    def report(self) -> str:
        tail = "\n".join(self.output.rstrip().splitlines()[-TAIL_LINES:])
        return (f"downloads/{self.slug}.py: {'; '.join(self.problems)}\n"
                f"--- last {TAIL_LINES} lines of its output ---\n{tail}")  # fmt: skip


def run(script: Path, folder: Path, path: list[str], *, python: str = sys.executable,
        env: dict | None = None, timeout: float = 600) -> Run:  # fmt: skip
    """Copy `script` into the empty `folder` and run it there; say what went wrong, if anything:
    a non-zero exit, a figure that differs from the published record, code not loaded from the
    installed wheel, a file written into the folder, installed data or records changed."""
    slug = script.stem
    folder.mkdir(parents=True, exist_ok=True)
    if any(folder.iterdir()):
        raise ValueError(f"{folder} is not empty")
    (folder / script.name).write_bytes(script.read_bytes())
    installed = Path(path[0])
    before = _snapshot(installed)
    base = {k: v for k, v in os.environ.items() if not k.startswith("HANDBOOK_")}
    inherited = [base["PYTHONPATH"]] if base.get("PYTHONPATH") else []
    full_env = base | {"PYTHONPATH": os.pathsep.join([*path, *inherited])} | (env or {})
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([python, script.name], cwd=folder, env=full_env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code = None
        output = "".join(x.decode() if isinstance(x, bytes) else x or ""
                         for x in (exc.stdout, exc.stderr))  # fmt: skip
    result = Run(slug, code, output, time.perf_counter() - t0)
    if code is None:
        result.problems.append(f"ran longer than {timeout:.0f} s")
    elif code != 0:
        result.problems.append(f"exited with {code}")
    if DIFFERS in output:
        result.problems.append("a computed figure differs from the page's published record")
    if f"{slug}: the handbook's code from {installed}" not in output:
        result.problems.append(f"did not load the handbook's code from the wheel at {installed}")
    stray = sorted(p.name for p in folder.iterdir() if p.name != script.name)
    if stray:
        result.problems.append(f"wrote {', '.join(stray)} into its folder")
    after = _snapshot(installed)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        result.problems.append(f"changed the installed {', '.join(changed)}")
    return result
