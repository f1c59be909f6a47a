"""Fork and copy-on-write: a worker that only reads a list of Python objects still copies it.

A forked DataLoader worker shares the parent's memory pages until one of them writes to a page.
Reading a Python object writes to it: the interpreter increments and decrements its reference
count, which lives in the object's header, so every page holding such objects becomes private
to the worker. A numpy array is one object whose data pages are never written by reading.
Measured from the kernel's own accounting: Private_Dirty in /proc/<pid>/smaps_rollup.
"""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import numpy as np


# --8<-- [start:cow]
def private_dirty_kib(pid: str = "self") -> int:
    path = Path(f"/proc/{pid}/smaps_rollup")
    if not path.exists():
        raise OSError(f"{path}: this kernel does not report smaps_rollup (Linux >= 4.14 does)")
    for line in path.read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise OSError(f"{path}: no Private_Dirty line")


def _touch(data, out) -> None:
    before = private_dirty_kib()
    total = 0
    for x in data:  # read every element, as a Dataset's __getitem__ would over an epoch
        total += 1 if x else 0
    out.put(private_dirty_kib() - before)


def copied_by_reading(data) -> int:
    """KiB that a forked child made private by reading every element of `data`."""
    ctx = mp.get_context("fork")  # the Linux default for DataLoader workers up to Python 3.13
    out = ctx.Queue()
    child = ctx.Process(target=_touch, args=(data, out))
    child.start()
    grown = out.get(timeout=60)
    child.join()
    return grown


N = 2_000_000
as_list = [i * 1.5 for i in range(N)]  # 2 M Python floats: 24 B objects + 8 B pointers
as_array = np.arange(N, dtype=np.float64) * 1.5  # the same numbers, one buffer
list_kib = (N * (24 + 8)) // 1024  # the objects and the list's pointer array
grown_list, grown_array = copied_by_reading(as_list), copied_by_reading(as_array)
print(f"list: the child copied more than half of it: {grown_list > list_kib / 2}")
#> list: the child copied more than half of it: True
array_kib = as_array.nbytes / 1024
print(f"numpy array: the child copied less than 5 % of it: {grown_array < 0.05 * array_kib}")
#> numpy array: the child copied less than 5 % of it: True
# --8<-- [end:cow]
