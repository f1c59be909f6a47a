"""Four CPU processes over gloo run one expert-parallel MoE layer; compared with the same layer
in one process on all the tokens, forward and backward."""

import multiprocessing
import socket
import tempfile
from pathlib import Path

import torch
import torch.multiprocessing as mp

from snippets.moe_training.ep_worker import worker
from snippets.moe_training.layer import MoeConfig, MoeLayer


# --8<-- [start:launch]
def run_ep(cfg: MoeConfig, world: int, tokens: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        # forkserver: one fresh process imports torch once and forks the ranks from it (spawn
        # would import torch in each of them; plain fork would copy this process's threads)
        multiprocessing.set_forkserver_preload(["snippets.moe_training.ep_worker"])
        mp.start_processes(worker, args=(world, port, cfg, tokens, out), nprocs=world,
                           start_method="forkserver")  # fmt: skip
        return [torch.load(Path(out) / f"rank{r}.pt") for r in range(world)]


def single_process(cfg: MoeConfig, world: int, tokens: int) -> dict:
    torch.manual_seed(0)
    layer = MoeLayer(cfg).double()
    x = torch.randn(world, tokens, cfg.hidden, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1)).requires_grad_()  # fmt: skip
    out, _, _ = layer(x.view(-1, cfg.hidden))
    grad = torch.arange(1, world + 1, dtype=torch.float64).repeat_interleave(tokens)
    out.backward(grad[:, None].expand_as(out))
    return {"out": out.detach().view(world, tokens, -1), "dx": x.grad,
            "dgate_up": layer.gate_up_proj.grad, "ddown": layer.down_proj.grad,
            "dgate": layer.gate.weight.grad}  # fmt: skip


# --8<-- [end:launch]

# --8<-- [start:compare]
CFG, WORLD, TOKENS = MoeConfig(hidden=16, experts=8, top_k=2, inter=12), 4, 32
ranks = run_ep(CFG, WORLD, TOKENS)
ref = single_process(CFG, WORLD, TOKENS)
per = CFG.experts // WORLD
checks = {
    "out": all(torch.allclose(r["out"], ref["out"][i]) for i, r in enumerate(ranks)),
    "dx": all(torch.allclose(r["dx"], ref["dx"][i]) for i, r in enumerate(ranks)),
    "d_experts": all(
        torch.allclose(r["dgate_up"], ref["dgate_up"][i * per : (i + 1) * per])
        and torch.allclose(r["ddown"], ref["ddown"][i * per : (i + 1) * per])
        for i, r in enumerate(ranks)
    ),
    # the router is replicated: its gradient is the sum over ranks (what DP's all-reduce does)
    "d_router": torch.allclose(sum(r["dgate"] for r in ranks), ref["dgate"]),
}
print(checks)
#> {'out': True, 'dx': True, 'd_experts': True, 'd_router': True}
sent = torch.tensor([r["sent"] for r in ranks])  # rows rank i sent to rank j
print(sent.sum().item() == WORLD * TOKENS * CFG.top_k, (sent.sum() - sent.trace()).item())
#> True 208
# --8<-- [end:compare]
