"""The load-balancing experiment: the shared MoE's shape and training recipe
(data/trained_models.yaml `moe`; its CPU stand-in where there is no CUDA), trained from the
same initial weights four ways:

    aux-loss      softmax routing + the Switch load-balancing loss (coefficient 0.001), as the
                  shared model is trained
    aux-free      sigmoid routing + DeepSeek-V3's bias update (gamma 0.001), no balancing loss
    aux-free-10x  the same with gamma 0.01: DeepSeek-V3's gamma is set for 2.3-2.6e5 steps, and in
                  60 steps it moves a bias by at most 0.06
    none          sigmoid routing, no balancing at all (the control)

Every step records the LM loss and, per layer, the busiest expert's load over the mean load; the
held-out loss is measured at the end. Also: the load of the shared trained model itself on
held-out tokens.
"""

from __future__ import annotations

from contextlib import nullcontext
from statistics import median

import torch
from torch import nn

from snippets.common.corpus import token_streams
from snippets.common.device import DEVICE
from snippets.common.models.qwen3_moe import Qwen3MoeForCausalLM, load_balancing_loss
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.train import Trainer, batch_order, init_weights, rows, settings
from snippets.moe_training.balance import max_over_mean, update_bias
from snippets.moe_training.layer import MoeConfig, route

GAMMA = 0.001  # DeepSeek-V3 §4.2: the bias update speed for the first 14.3T tokens
METHODS = {  # name: (scoring, balancing, bias update speed)
    "aux-loss": ("softmax", "aux", 0.0),
    "aux-free": ("sigmoid", "bias", GAMMA),
    "aux-free-10x": ("sigmoid", "bias", 10 * GAMMA),
    "none": ("sigmoid", None, 0.0),
}


# --8<-- [start:swap]
class RoutedMlp(nn.Module):
    """A shared decoder layer's MoE block with layer.py's routing (softmax or sigmoid; the
    aux-free bias for the choice only): the block's router weight and experts are used as they
    are (one padded batched matmul, no host sync while a CUDA graph is captured). Returns
    (out, router logits) as the shared block does, and keeps the step's expert load on the
    device (a scatter-add: bincount would sync to size its output)."""

    def __init__(self, block, cfg: MoeConfig):
        super().__init__()
        self.gate, self.experts, self.cfg, self.load = block.gate, block.experts, cfg, None
        self.register_buffer("bias", torch.zeros(cfg.experts, device=block.gate.weight.device))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        r = route(self.gate(flat), self.cfg, self.bias)  # bias 0: the plain top-k
        ids = r.experts.flatten()
        self.load = torch.zeros(self.cfg.experts, device=x.device).index_add_(
            0, ids, torch.ones(ids.shape, device=x.device))  # fmt: skip
        return self.experts(flat, r.weights, r.experts).view_as(x), r.logits


def with_routing(model: Qwen3MoeForCausalLM, scoring: str) -> list[RoutedMlp]:
    """Route every layer's MoE block with `scoring`, on the block's own weights."""
    cfg = model.config
    moe = MoeConfig(cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok,
                    cfg.moe_intermediate_size, scoring=scoring,
                    norm_topk_prob=cfg.norm_topk_prob)  # fmt: skip
    swapped = []
    for layer in model.model.layers:
        layer.mlp = RoutedMlp(layer.mlp, moe)
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
    scoring, balancing, gamma = METHODS[method]
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

    def loss_fn(ids):  # one step's loss; the bias update rides along (see below)
        h, logits = model.hidden_states(ids)
        lm = model.kernels.loss(h[:, :-1], model.lm_head.weight, ids[:, 1:])
        loss = lm
        if balancing == "aux":
            aux = load_balancing_loss(logits, cfg.num_experts, cfg.num_experts_per_tok)
            loss = lm + cfg.router_aux_loss_coef * aux
        load = torch.stack([m.load for m in mlps])
        if balancing == "bias":  # from this step's load, for the next step's choice
            for m in mlps:  # (DeepSeek-V3 §2.1.2); the bias has no gradient and the
                update_bias(m.bias, m.load, gamma)  # backward reads no bias: done here
        return loss, (lm.detach(), load)

    trainer = Trainer(model, tc, loss_fn)  # the shared optimizer step; on CUDA graph replay
    lm_curve = torch.zeros(steps, device=DEVICE)
    load_curve = torch.zeros(steps, len(mlps), cfg.num_experts, device=DEVICE)
    model.train()
    for step in range(steps):
        lm, load = trainer.step(step, seqs[order[step % len(order)]])
        lm_curve[step], load_curve[step] = lm, load  # copies: a replay overwrites its outputs
    per_step = (load_curve.amax(-1) / load_curve.mean(-1)).cpu()  # max/mean per layer
    held = rows(heldout_stream, tc.seq_len)[: max(1, eval_tokens // tc.seq_len)].to(DEVICE)
    return {"method": method, "seed": seed, "steps": steps,
            "lm_loss": lm_curve.cpu().tolist(), "graph_error": trainer.graph_error,
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
            out.append({"method": method, "step": step,
                        "max_over_mean": median(m[step] for m in mine)})  # fmt: skip
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
