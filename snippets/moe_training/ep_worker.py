"""Expert parallelism with torch.distributed: every rank holds E / world experts and its own
tokens; dispatch sends each (token, expert) row to the expert's rank with one all-to-all, the
experts run there, combine sends the outputs back with a second all-to-all. Runs on CPUs over
gloo (the tests spawn 4 processes); on GPUs the same calls go over NCCL.
"""

import os

import torch
import torch.distributed as dist

from snippets.moe_training.layer import MoeConfig, MoeLayer, expert_mlp, route


# --8<-- [start:alltoall]
class AllToAll(torch.autograd.Function):
    """Rows to every rank: send `send[r]` rows to rank r, receive `recv[r]` from it. Its
    backward is the same exchange the other way: a dispatch's gradient travels like a combine."""

    @staticmethod
    def forward(ctx, x, recv: list[int], send: list[int]):
        ctx.recv, ctx.send = recv, send
        out = x.new_empty(sum(recv), *x.shape[1:])
        dist.all_to_all_single(out, x.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx, grad):
        dx = grad.new_empty(sum(ctx.send), *grad.shape[1:])
        dist.all_to_all_single(dx, grad.contiguous(), ctx.send, ctx.recv)
        return dx, None, None


# --8<-- [end:alltoall]


# --8<-- [start:ep]
def ep_moe(x, gate, gate_up_local, down_local, cfg: MoeConfig, world: int):
    """One MoE layer, experts split over `world` ranks (rank r holds experts r*E/world ...).
    x [T, H] are this rank's tokens; returns (out [T, H], rows sent to each rank)."""
    t, k = x.shape[0], cfg.top_k
    per_rank = cfg.experts // world
    r = route(gate(x), cfg)
    slots = r.experts.flatten()
    order = torch.argsort(slots, stable=True)  # by expert, hence by rank
    dest = slots[order] // per_rank
    send = torch.bincount(dest, minlength=world)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)  # every rank learns how many rows it will receive
    send_n, recv_n = send.tolist(), recv.tolist()
    # dispatch: the rows and, beside them, which of the receiver's experts each is for
    rows = AllToAll.apply(x[order // k], recv_n, send_n)
    local_e = torch.empty(sum(recv_n), dtype=slots.dtype)
    dist.all_to_all_single(local_e, (slots[order] % per_rank).contiguous(), recv_n, send_n)
    # the receiver groups what it got (from every source) by its own experts
    by_expert = torch.argsort(local_e, stable=True)
    counts = torch.bincount(local_e, minlength=per_rank).tolist()
    y = expert_mlp(rows[by_expert], counts, gate_up_local, down_local)[torch.argsort(by_expert)]
    # combine: back to the senders, in the order they sent, then back to slot order
    back = AllToAll.apply(y, send_n, recv_n)[torch.argsort(order)]
    out = (back.view(t, k, -1) * r.weights.unsqueeze(-1)).sum(dim=1)
    return out, send_n


# --8<-- [end:ep]


# --8<-- [start:worker]
def worker(rank, world, port, cfg: MoeConfig, tokens: int, out_dir: str):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)  # 4 processes share the CPU: one thread each, no oversubscription
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # every rank builds the same full layer, then keeps its experts
    full = MoeLayer(cfg).double()
    lo, hi = rank * cfg.experts // world, (rank + 1) * cfg.experts // world
    gate_up = full.gate_up_proj[lo:hi].detach().clone().requires_grad_()
    down = full.down_proj[lo:hi].detach().clone().requires_grad_()
    x_all = torch.randn(world, tokens, cfg.hidden, dtype=torch.float64,
                        generator=torch.Generator().manual_seed(1))  # fmt: skip
    x = x_all[rank].clone().requires_grad_()
    out, sent = ep_moe(x, full.gate, gate_up, down, cfg, world)
    grad_out = torch.ones_like(out) * (rank + 1)  # a different upstream gradient per rank
    out.backward(grad_out)
    torch.save({"out": out.detach(), "dx": x.grad, "dgate_up": gate_up.grad, "ddown": down.grad,
                "dgate": full.gate.weight.grad, "sent": sent},
               os.path.join(out_dir, f"rank{rank}.pt"))  # fmt: skip
    dist.barrier()  # no rank tears down gloo while another still talks to it
    dist.destroy_process_group()


# --8<-- [end:worker]
