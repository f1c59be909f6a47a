"""Run one command line as a reader would type it and keep what it printed, or the real error
it gave: a tool that is missing or fails is recorded as such, never left out."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # colour and cursor escapes of TUI tools
MAX_LINES = 16  # lines kept per command: the head of the output is what the page shows


# --8<-- [start:run]
@dataclass(frozen=True)
class Ran:
    command: str
    exit: int | None  # None: killed at the timeout
    lines: tuple[str, ...]  # stdout and stderr, interleaved as the tool wrote them

    @property
    def ok(self) -> bool:
        return self.exit == 0


def run(command: str, *, timeout: float = 30.0, cwd: Path | None = None) -> Ran:
    """`bash -c command` with stderr folded into stdout. First on PATH: the bin/ of the Python
    that runs this (where pip puts the scripts of pinned tools such as rg and py-spy), and the
    bin/ beside each PYTHONPATH folder (`pip install --target DIR` puts them in DIR/bin)."""
    if not command.strip():
        raise ValueError("run(): empty command")
    env = dict(os.environ)
    targets = [Path(p) / "bin" for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    first = [str(Path(sys.executable).parent), *(str(t) for t in targets if t.is_dir())]
    env["PATH"] = os.pathsep.join([*first, env.get("PATH", "")])
    env.setdefault("TERM", "xterm-256color")
    bash = shutil.which("bash") or "/bin/bash"
    try:
        proc = subprocess.run([bash, "-c", command], cwd=cwd, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout, errors="replace")  # fmt: skip
        code, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
        code, out = None, f"{out or ''}(killed after {timeout:g} s)\n"
    lines = [ANSI.sub("", ln).rstrip() for ln in out.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return Ran(command, code, tuple(lines[:MAX_LINES]))


# --8<-- [end:run]
