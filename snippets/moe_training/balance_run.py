"""The load-balancing experiment: the shared MoE's shape and training recipe
(data/trained_models.yaml `moe`; its CPU stand-in where there is no CUDA), trained from the
same initial weights three ways:

    aux-loss   softmax routing + the Switch load-balancing loss (coefficient 0.001), as the
               shared model is trained
    aux-free   sigmoid routing + DeepSeek-V3's bias update (gamma 0.001), no balancing loss
    none       sigmoid routing, no balancing at all (the control)

Every step records the LM loss and, per layer, the busiest expert's load over the mean load; the
held-out loss is measured at the end. Also: the load of the shared trained model itself on
held-out tokens.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from torch import nn

from snippets.common.corpus import token_streams
from snippets.common.device import DEVICE
from snippets.common.models.qwen3_moe import Qwen3MoeForCausalLM, load_balancing_loss
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.train import batch_order, init_weights, lr_factor, rows, settings
from snippets.moe_training.balance import max_over_mean, update_bias
from snippets.moe_training.layer import MoeConfig, MoeLayer, expert_load

METHODS = {  # name: (scoring, balancing)
    "aux-loss": ("softmax", "aux"),
    "aux-free": ("sigmoid", "bias"),
    "none": ("sigmoid", None),
}
GAMMA = 0.001  # DeepSeek-V3 §4.2: the bias update speed for the first 14.3T tokens


# --8<-- [start:swap]
class RoutedMlp(nn.Module):
    """The reference MoeLayer in a shared decoder layer's place: returns (out, router logits)
    as the shared block does, and keeps the last step's expert load."""

    def __init__(self, moe: MoeLayer):
        super().__init__()
        self.moe, self.load = moe, None

    def forward(self, x):
        out, r, _ = self.moe(x)
        self.load = expert_load(r.experts.detach(), self.moe.cfg.experts)
        return out, r.logits


def with_routing(model: Qwen3MoeForCausalLM, scoring: str) -> list[RoutedMlp]:
    """Put a MoeLayer with `scoring` in every layer, with the shared block's weights."""
    cfg = model.config
    swapped = []
    for layer in model.model.layers:
        moe = MoeLayer(MoeConfig(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
                                 cfg.moe_intermediate_size, scoring=scoring,
                                 norm_topk_prob=cfg.norm_topk_prob))  # fmt: skip
        moe.to(layer.mlp.gate.weight.device)
        with torch.no_grad():
            moe.gate.weight.copy_(layer.mlp.gate.weight)
            moe.gate_up_proj.copy_(layer.mlp.experts.gate_up_proj)
            moe.down_proj.copy_(layer.mlp.experts.down_proj)
        layer.mlp = RoutedMlp(moe)
        swapped.append(layer.mlp)
    return swapped


# --8<-- [end:swap]


_STREAMS: dict = {}


def streams(spec):
    """The corpus's token streams, loaded once per process."""
    key = (spec.corpus.content_sha256, spec.tokenizer.sha256)
    if key not in _STREAMS:
        _STREAMS[key] = token_streams(spec)
    return _STREAMS[key]


# --8<-- [start:run]
def run(method: str, seed: int, steps: int | None = None, spec=None, eval_tokens=None) -> dict:
    """Train the shared MoE's shape with one balancing method; per-step LM loss and load."""
    scoring, balancing = METHODS[method]
    spec = spec or load_trained_models()
    _, cfg, tc = settings("moe", spec, seed)
    steps, eval_tokens = steps or tc.steps, eval_tokens or tc.eval_tokens
    with torch.device(DEVICE):
        model = Qwen3MoeForCausalLM(cfg)
    init_weights(model, tc.init_std, tc.seed)  # the same weights for every method
    mlps = with_routing(model, scoring)
    train_stream, heldout_stream = streams(spec)
    seqs = rows(train_stream, tc.seq_len).to(DEVICE)
    order = batch_order(len(seqs), tc).to(DEVICE)
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": tc.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]  # fmt: skip
    opt = torch.optim.AdamW(groups, lr=tc.lr, betas=(tc.beta1, tc.beta2),
                            fused=DEVICE.type == "cuda")  # fmt: skip
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, tc))
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if DEVICE.type == "cuda"
                else nullcontext())  # fmt: skip
    lm_curve, load_curve = [], []
    model.train()
    for step in range(steps):
        ids = seqs[order[step % len(order)]].long()
        with autocast:
            h, logits = model.hidden_states(ids)
            lm = model.kernels.loss(h[:, :-1], model.lm_head.weight, ids[:, 1:])
            loss = lm
            if balancing == "aux":
                aux = load_balancing_loss(logits, cfg.num_experts, cfg.num_experts_per_tok)
                loss = lm + cfg.router_aux_loss_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
        opt.step()
        sched.step()
        if balancing == "bias":  # after the step, from this step's load (DeepSeek-V3 §2.1.2)
            for m in mlps:
                update_bias(m.moe.bias, m.load, GAMMA)
        lm_curve.append(lm.detach())
        load_curve.append(torch.stack([m.load for m in mlps]))
    loads = torch.stack(load_curve).float()  # [steps, layers, experts]
    per_step = (loads.amax(-1) / loads.mean(-1)).cpu()  # max/mean per layer
    held = rows(heldout_stream, tc.seq_len)[: max(1, eval_tokens // tc.seq_len)].to(DEVICE)
    return {"method": method, "seed": seed, "steps": steps,
            "lm_loss": torch.stack(lm_curve).float().cpu().tolist(),
            "max_over_mean": per_step.mean(-1).tolist(),  # averaged over layers
            "heldout_loss": heldout_loss(model, held, tc.batch_size)}  # fmt: skip


@torch.no_grad()
def heldout_loss(model, held, batch_size) -> float:
    model.eval()
    total = 0.0
    for batch in held.split(batch_size):
        ids = batch.long()
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if ids.is_cuda else nullcontext()
        with ctx:
            h, _ = model.hidden_states(ids)
            lm = model.kernels.loss(h[:, :-1], model.lm_head.weight, ids[:, 1:])
            total += lm.item() * len(batch)
    model.train()
    return total / len(held)


# --8<-- [end:run]


# --8<-- [start:summary]
def summarize(runs: list[dict], tail: int) -> list[dict]:
    """Per run: max/mean over the last `tail` steps (mean), and the held-out loss."""
    out = []
    for r in runs:
        last = r["max_over_mean"][-tail:]
        out.append({"method": r["method"], "seed": r["seed"],
                    "max_over_mean": sum(last) / len(last),
                    "first_max_over_mean": r["max_over_mean"][0],
                    "heldout_loss": r["heldout_loss"]})  # fmt: skip
    return out


def curves(runs: list[dict], every: int) -> list[dict]:
    """The median over seeds of max/mean, every `every` steps, per method (for the plot)."""
    out = []
    for method in METHODS:
        mine = [r["max_over_mean"] for r in runs if r["method"] == method]
        if not mine:
            continue
        for step in range(0, len(mine[0]), every):
            vals = sorted(m[step] for m in mine)
            out.append({"method": method, "step": step, "max_over_mean": vals[len(vals) // 2]})
    return out


@torch.no_grad()
def trained_load(model: Qwen3MoeForCausalLM, held: torch.Tensor, batch_size: int) -> list[dict]:
    """The shared trained MoE's expert load per layer on held-out tokens: max/mean, min/mean."""
    cfg = model.config
    counts = torch.zeros(cfg.num_hidden_layers, cfg.num_experts, device=held.device)
    for batch in held.split(batch_size):
        _, logits = model.hidden_states(batch.long())
        for i, lg in enumerate(logits):
            chosen = torch.softmax(lg.float(), -1).topk(cfg.num_experts_per_tok, -1).indices
            counts[i] += torch.bincount(chosen.flatten(), minlength=cfg.num_experts)
    return [{"layer": i, "max_over_mean": max_over_mean(c),
             "min_over_mean": (c.min() / c.mean()).item()}
            for i, c in enumerate(counts)]  # fmt: skip


# --8<-- [end:summary]
