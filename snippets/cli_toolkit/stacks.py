"""py-spy's raw output (collapsed stacks: `frame;frame;... count` per line) summarised: which
function the samples were in (self) and under (total)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# --8<-- [start:parse]
# one line of `py-spy record -f raw`: frames joined by ';', a space, the number of samples
LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")  # empty stack: no Python frame
NO_FRAME = "(no Python frame)"  # sampled while the interpreter started or exited
PROCESS = re.compile(r'^process \d+:".*"$')  # --subprocesses: the root frame names the process
FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Profile:
    samples: int
    self_: Counter  # function -> samples where it was the innermost frame
    total: Counter  # function -> samples where it was anywhere on the stack

    def top(self, n: int = 3, by: str = "self") -> list[tuple[str, float]]:
        counts = self.self_ if by == "self" else self.total
        return [(f, c / self.samples) for f, c in counts.most_common(n)]


def frame_name(frame: str, where: str) -> str:
    """`func (path/file.py:12)` -> `func (file.py)`: line numbers and paths vary, names not;
    `process 123:"cmd"` (added by --subprocesses) -> `(process)`: pids vary."""
    if PROCESS.match(frame.strip()):
        return "(process)"
    m = FRAME.match(frame.strip())
    if not m:
        raise ValueError(f"{where}: not a py-spy frame 'function (file:line)': {frame!r}")
    return f"{m['func']} ({Path(m['file']).name})"


def read_collapsed(path: Path) -> Profile:
    self_, total, samples = Counter(), Counter(), 0
    text = Path(path).read_text(encoding="utf-8")
    for i, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        m = LINE.match(raw.rstrip())
        if not m:
            raise ValueError(f"{path}:{i}: not a collapsed stack 'f1;f2;... <samples>': {raw!r}")
        count = int(m["count"])
        stack = m["stack"].strip()
        frames = [frame_name(f, f"{path}:{i}") for f in stack.split(";")] if stack else [NO_FRAME]
        samples += count
        self_[frames[-1]] += count
        for f in set(frames):  # recursion counts a function once per sample
            total[f] += count
    if samples == 0:
        raise ValueError(f"{path}: no samples (did the program run long enough to be sampled?)")
    return Profile(samples, self_, total)


# --8<-- [end:parse]
