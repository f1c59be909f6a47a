"""nvidia-smi's CSV query output read into numbers with their units.

`nvidia-smi --query-gpu=F1,F2,... --format=csv` prints a header of the field names, each with
its unit in brackets where it has one (`memory.total [MiB]`), then one line per GPU; a value the
GPU does not report is `[N/A]` or `[Not Supported]` (nvidia-smi(1), "--format" and
"--query-gpu"). The output format is not promised to stay the same across driver releases
(the same page), so the parser checks the header instead of assuming an order.
"""

from __future__ import annotations

import csv
import io
import re

# --8<-- [start:parse]
UNIT = re.compile(r"^(?P<field>[\w.]+)(?: \[(?P<unit>[^\]]+)\])?$")
MISSING = {"[N/A]", "N/A", "[Not Supported]", "[Unknown Error]", "[Insufficient Permissions]"}
QUERY = ("name", "driver_version", "memory.total", "memory.used", "utilization.gpu",
         "clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu")  # fmt: skip
COMMAND = f"nvidia-smi --query-gpu={','.join(QUERY)} --format=csv"


def parse_query(text: str, where: str = "nvidia-smi") -> list[dict]:
    """One dict per GPU: field -> float (with the unit stripped from the value), str or None."""
    rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if r]
    if not rows:
        raise ValueError(f"{where}: no output (is there a GPU and a driver?)")
    header = []
    for col in rows[0]:
        m = UNIT.match(col.strip())
        if not m:
            raise ValueError(f"{where}:1: not a query header field: {col!r} (use --format=csv, "
                             "with the header)")  # fmt: skip
        header.append((m["field"], m["unit"]))
    gpus = []
    for i, row in enumerate(rows[1:], 2):
        if len(row) != len(header):
            raise ValueError(f"{where}:{i}: {len(row)} values for {len(header)} fields")
        gpu = {}
        for (field, unit), raw in zip(header, row, strict=True):
            raw = raw.strip()
            if raw in MISSING:
                gpu[field] = None
            elif unit:
                number = raw.removesuffix(unit).strip()  # "141 MiB" or, with nounits, "141"
                try:
                    gpu[field] = float(number)
                except ValueError:
                    raise ValueError(f"{where}:{i}: {field} = {raw!r} is not a number in "
                                     f"{unit}") from None  # fmt: skip
            else:
                gpu[field] = raw
        gpus.append(gpu)
    return gpus


# --8<-- [end:parse]
