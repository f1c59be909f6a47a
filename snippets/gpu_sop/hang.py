"""A collective hang reproduced with torch.distributed on the CPU (gloo, three processes) and a
report of which rank waited where.

Every rank appends to its own ledger, before and after each collective: the sequence number,
the operation and the tensor shape. That is what NCCL's flight recorder keeps in a ring buffer
per rank (TORCH_FR_BUFFER_SIZE) and what `torchfrtrace` reads back; here it is a JSON-lines
file, so the analysis runs on any machine. The analysis finds the first sequence number that
not every rank entered, or entered with a different operation or shape.
"""

from __future__ import annotations

import faulthandler
import json
import multiprocessing as mp
import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

WORLD, TIMEOUT_S = 3, 2.0


# --8<-- [start:ledger]
def note(ledger, **entry) -> None:
    ledger.write(json.dumps(entry) + "\n")
    ledger.flush()  # a hung or killed rank still leaves what it got to


def collective(ledger, seq: int, op: str, t: torch.Tensor) -> None:
    note(ledger, seq=seq, op=op, shape=list(t.shape), state="started")
    if op == "broadcast":
        dist.broadcast(t, src=0)
    else:
        dist.all_reduce(t)
    note(ledger, seq=seq, op=op, shape=list(t.shape), state="completed")


# --8<-- [end:ledger]


# --8<-- [start:worker]
def train(rank: int, port: int, folder: str, fault: str) -> None:
    faulthandler.disable()  # gloo aborts a rank on a size mismatch: no Python dump for that
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=TIMEOUT_S))  # fmt: skip
    with open(Path(folder) / f"rank{rank}.jsonl", "w") as ledger:
        try:
            for step in range(3):
                grad = torch.ones(8 if (fault == "shape" and rank == 2 and step == 1) else 4)
                if fault == "straggler" and rank == 2 and step == 1:
                    time.sleep(1.5 * TIMEOUT_S)  # stuck outside any collective (a data stall)
                    break
                collective(ledger, 2 * step, "all_reduce", grad)
                collective(ledger, 2 * step + 1, "broadcast", torch.zeros(4))
        except RuntimeError as exc:  # gloo: the collective timed out or a peer went away
            note(ledger, error=str(exc).splitlines()[0][:200])
    os._exit(0)  # no teardown: the other ranks may be gone


# --8<-- [end:worker]


# --8<-- [start:analyze]
def read_ledgers(folder: Path) -> dict[int, list[dict]]:
    out = {}
    for path in sorted(folder.glob("rank*.jsonl")):
        rows = []
        for i, line in enumerate(path.read_text().splitlines(), 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{i}: not a JSON ledger line: {line!r}") from None
        out[int(path.stem.removeprefix("rank"))] = rows
    if not out:
        raise FileNotFoundError(f"{folder}: no rank*.jsonl ledgers")
    return out


def analyze(ledgers: dict[int, list[dict]]) -> str:
    """The first collective the ranks disagree on: who entered it, with what, who never did."""
    entered = {r: {e["seq"]: (e["op"], tuple(e["shape"]))
                   for e in rows if e.get("state") == "started"}
               for r, rows in ledgers.items()}  # fmt: skip
    done = {r: {e["seq"] for e in rows if e.get("state") == "completed"}
            for r, rows in ledgers.items()}  # fmt: skip
    for seq in sorted(set().union(*entered.values())):
        calls = {r: entered[r].get(seq) for r in ledgers}
        missing = sorted(r for r, c in calls.items() if c is None)
        kinds = {c for c in calls.values() if c is not None}
        if missing:
            waiting = sorted(r for r, c in calls.items() if c is not None and seq not in done[r])
            last = {r: max(done[r], default=-1) for r in missing}
            lasts = ", ".join(f"rank {r} #{s}" for r, s in last.items())
            return (
                f"collective #{seq} {sorted(kinds)[0][0]}: ranks {waiting} waited; ranks "
                f"{missing} never entered it (last completed: {lasts})"
            )
        if len(kinds) > 1:
            by = {f"{op}{list(shape)}": sorted(r for r, c in calls.items() if c == (op, shape))
                  for op, shape in kinds}  # fmt: skip
            listed = "; ".join(f"{k} on ranks {v}" for k, v in sorted(by.items()))
            return f"collective #{seq}: ranks disagree: {listed}"
    return "no hang: every rank completed the same collectives"


# --8<-- [end:analyze]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(fault: str) -> str:
    with tempfile.TemporaryDirectory(prefix=f"handbook-hang-{fault}-") as folder:
        ctx = mp.get_context("fork")
        port = free_port()
        procs = [ctx.Process(target=train, args=(r, port, folder, fault)) for r in range(WORLD)]
        for p in procs:
            p.start()
        # the slowest rank, the straggler, is done after 1.5 T asleep + T for its own timed-out
        # collective; 5 T leaves 2.5 T (5 s) for starting gloo and exiting
        deadline = time.monotonic() + 5 * TIMEOUT_S
        for p in procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()  # its ledger file closed before the folder goes
        return analyze(read_ledgers(Path(folder)))


# --8<-- [start:demo]
for fault in ("none", "straggler", "shape"):
    for i, clause in enumerate(run(fault).split("; ")):
        print(f"{fault if i == 0 else '':9} | {clause}")
        #> none      | no hang: every rank completed the same collectives
        #> straggler | collective #2 all_reduce: ranks [0, 1] waited
        #>           | ranks [2] never entered it (last completed: rank 2 #1)
        #> shape     | collective #2: ranks disagree: all_reduce[4] on ranks [0, 1]
        #>           | all_reduce[8] on ranks [2]
# --8<-- [end:demo]
