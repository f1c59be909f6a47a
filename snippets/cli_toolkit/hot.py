"""`python -m snippets.cli_toolkit.hot FILE`: the function most samples were in, from py-spy's
raw output (`-f raw`) or a cProfile dump (`-o`); prints only what does not vary run to run."""

import pstats
import sys
from pathlib import Path

from snippets.cli_toolkit.stacks import read_collapsed


# --8<-- [start:hot]
def hottest(path: Path) -> tuple[str, float]:
    """(function, share of the time spent in it, not in its callees)."""
    if path.suffix == ".prof":  # cProfile: tottime is the time in the function itself
        stats = pstats.Stats(str(path)).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
        total = sum(v[2] for v in stats.values())
        (file, _, func), v = max(stats.items(), key=lambda kv: kv[1][2])
        return f"{func} ({Path(file).name})", v[2] / total
    profile = read_collapsed(path)
    return profile.top(1)[0]


if __name__ == "__main__":
    func, share = hottest(Path(sys.argv[1]))
    print(f"hottest: {func}, {'most' if share > 0.5 else 'less than half'} of the samples")
# --8<-- [end:hot]
