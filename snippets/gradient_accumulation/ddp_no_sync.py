"""Launch two DDP ranks on the CPU (gloo) and compare accumulation with and without no_sync."""

import socket
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from .ddp_worker import worker

# --8<-- [start:launch]
WORLD, K = 2, 4
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
with tempfile.TemporaryDirectory() as out:
    # forkserver: the ranks fork from one clean server process that imports torch once (spawn
    # imports it in every rank, seconds each on a GPU machine); plain fork would copy this
    # process's CUDA state, which a child cannot use (DDP's set-up touched it and failed)
    mp.set_forkserver_preload(["torch"])
    mp.start_processes(worker, args=(WORLD, port, K, out), nprocs=WORLD,
                       start_method="forkserver")  # fmt: skip
    ranks = [torch.load(Path(out) / f"rank{r}.pt") for r in range(WORLD)]

for use_no_sync in (False, True):
    calls = ranks[0][use_no_sync][0]
    print(f"no_sync={use_no_sync}: {calls} all-reduce calls for {K} micro-batches")
    #> no_sync=False: 4 all-reduce calls for 4 micro-batches
    #> no_sync=True: 1 all-reduce calls for 4 micro-batches
same = [torch.allclose(r[True][1], ranks[0][False][1]) for r in ranks]
print(same)  # both ranks end with the same averaged gradient either way
#> [True, True]
# --8<-- [end:launch]
