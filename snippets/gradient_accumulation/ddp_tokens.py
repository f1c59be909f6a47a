"""Data parallel + accumulation of a token-sum loss under DDP (gloo, CPU), and its reference."""

import contextlib
import os
import socket
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

WIDTH = 16  # features per token


# --8<-- [start:worker]
def token_loss_sum(model, x, y, valid):
    """Squared error summed over the real tokens of one micro-batch (padding has valid False)."""
    return (model(x[valid]) - y[valid]).pow(2).sum()


def accumulate(model, window, scale):
    """One window under DDP: backward of scale x (summed token losses) for each micro-batch."""
    model.zero_grad(set_to_none=True)
    for j, (x, y, valid) in enumerate(window):
        last = j == len(window) - 1
        with contextlib.nullcontext() if last else model.no_sync():  # one all-reduce a window
            (token_loss_sum(model, x, y, valid) * scale).backward()
    return [p.grad.clone() for p in model.parameters()]  # DDP divided the rank sum by W


def worker(rank, world, port, windows, state, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)  # CPU tensors over TCP
    model = torch.nn.Linear(WIDTH, 1)
    model.load_state_dict(state)  # the same fp32 weights as the single-process reference
    model = DDP(model)
    window = windows[rank]  # this rank's k micro-batches
    local = sum(int(valid.sum()) for *_, valid in window)  # T_r: real tokens on this rank
    total = torch.tensor(local)
    dist.all_reduce(total)  # T: summed over ranks and micro-batches, the same on every rank
    scales = {
        "per_rank_mean": 1 / local,  # section 2's fix applied on each rank
        "global_only": 1 / total.item(),  # the right count, but DDP's average divides by W
        "global_times_w": world / total.item(),  # what transformers' Trainer does
    }
    grads = {name: accumulate(model, window, scale) for name, scale in scales.items()}
    torch.save(grads, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()  # no rank tears down gloo while another still talks to it
    dist.destroy_process_group()


# --8<-- [end:worker]


# --8<-- [start:launch]
def launch(windows, model):
    """Rank r accumulates the micro-batches windows[r] (gloo, CPU); returns each rank's grads."""
    world = len(windows)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        args = (world, port, windows, model.state_dict(), out)
        mp.set_forkserver_preload(["torch"])  # as ddp_no_sync
        mp.start_processes(worker, args=args, nprocs=world, start_method="forkserver")
        return [torch.load(Path(out) / f"rank{r}.pt") for r in range(world)]


def micro_batch(gen, lengths, seq=8):
    """Rows of `seq` tokens; the first lengths[i] tokens of row i are real, the rest padding."""
    x = torch.randn(len(lengths), seq, WIDTH, generator=gen)
    y = torch.randn(len(lengths), seq, 1, generator=gen)
    return x, y, torch.arange(seq) < torch.tensor(lengths)[:, None]


def reference(windows, model32):
    """One process, one batch of every real token: fp32 gradient, fp64 gradient, fp32 bound."""
    from .equivalence import large_batch_grad, summation_bound  # here: the ranks need neither

    x = torch.cat([x[v] for window in windows for x, _, v in window])
    y = torch.cat([y[v] for window in windows for _, y, v in window])
    model64 = torch.nn.Linear(WIDTH, 1).double()
    model64.load_state_dict(model32.state_dict())
    x64, y64 = x.double(), y.double()
    bound = summation_bound(model64, x64, y64, unit_roundoff=2.0**-24)  # section 1.1
    return large_batch_grad(model32, x, y), large_batch_grad(model64, x64, y64), bound


# --8<-- [end:launch]
