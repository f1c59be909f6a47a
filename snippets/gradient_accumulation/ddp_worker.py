"""One DDP rank: accumulate k micro-batches, with or without `no_sync`, and count all-reduces."""

import contextlib
import os

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP


# --8<-- [start:worker]
def counting_allreduce(calls, bucket):
    calls.append(bucket.index())  # one entry per bucket all-reduce
    return default_hooks.allreduce_hook(dist.group.WORLD, bucket)


def worker(rank, world, port, k, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)  # CPU tensors over TCP
    torch.manual_seed(0)  # same initial weights on every rank
    model = DDP(torch.nn.Linear(16, 1).double())
    data = torch.randn(world, k, 8, 16, dtype=torch.float64)  # [rank, micro-batch, row, feature]
    result = {}
    for use_no_sync in (False, True):
        calls = []
        model.register_comm_hook(calls, counting_allreduce)
        model.zero_grad(set_to_none=True)
        for j, xb in enumerate(data[rank]):
            last = j == k - 1
            ctx = model.no_sync() if use_no_sync and not last else contextlib.nullcontext()
            with ctx:  # inside no_sync, backward only accumulates locally
                (model(xb).pow(2).mean() / k).backward()
        result[use_no_sync] = (len(calls), model.module.weight.grad.clone())
        model = DDP(model.module)  # a fresh wrapper: a comm hook can be registered only once
    torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no rank tears down gloo while another still talks to it
    dist.destroy_process_group()


# --8<-- [end:worker]
