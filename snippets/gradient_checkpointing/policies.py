"""Checkpointing policies on the shared Qwen3 model, applied from outside: the model
(snippets/common/models/qwen3.py) is unchanged.

A policy says which layers are checkpointed and, inside a checkpointed layer, which operator
outputs are kept (selective activation checkpointing, SAC); everything else is recomputed in
backward. Layers are wrapped in place: model.model.layers[i] = Checkpointed(layer, ...).
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from snippets.gradient_checkpointing.measure import is_attention

# --8<-- [start:sac]
# The aten.mm calls of DecoderLayer.forward, in order: a policy names matmuls by position.
MATMULS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def sac_context(saves: frozenset) -> Callable:
    """context_fn for torch.utils.checkpoint: keep the outputs of the named matmuls and, with
    "attention", of the attention kernel; recompute every other op (norms, RoPE, SiLU, ...)."""

    def context_fn():  # called once per checkpointed call: fresh counters for each layer
        seen = {False: 0, True: 0}  # matmuls met in the forward / in the recomputation

        def policy(ctx, op, *args, **kwargs):
            if op is torch.ops.aten.mm.default:
                name = MATMULS[seen[ctx.is_recompute] % len(MATMULS)]
                seen[ctx.is_recompute] += 1
            else:
                name = "attention" if is_attention(op) else None
            keep = name in saves
            return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


# --8<-- [end:sac]


# --8<-- [start:wrapper]
class Checkpointed(nn.Module):
    """One decoder layer run under torch.utils.checkpoint. saves=frozenset(): recompute the
    whole layer; otherwise keep those outputs (sac_context). Qwen3 has no dropout, so there is
    no RNG state to stash and restore."""

    def __init__(self, layer: nn.Module, saves: frozenset = frozenset()):
        super().__init__()
        self.layer, self.saves = layer, saves
        self.context_fn = sac_context(saves) if saves else None

    def forward(self, x, cos, sin):
        kwargs = {"context_fn": self.context_fn} if self.context_fn else {}
        return checkpoint(
            self.layer, x, cos, sin, use_reentrant=False, preserve_rng_state=False, **kwargs
        )


# --8<-- [end:wrapper]


# --8<-- [start:policies]
@dataclass(frozen=True)
class Policy:
    name: str
    layers: Callable[[int, int], bool]  # (layer index, number of layers) -> checkpoint it?
    saves: frozenset = frozenset()  # in checkpointed layers: outputs kept (empty: none)

    @property
    def key(self) -> str:
        """The name as a results key: "sac: attention + q/k/v/o" -> sac_attention_q_k_v_o."""
        return re.sub(r"\W+", "_", self.name).strip("_")

    def modes(self, n_layers: int) -> list[frozenset | None]:
        """Per layer: None (not checkpointed) or the set of outputs it keeps."""
        return [self.saves if self.layers(i, n_layers) else None for i in range(n_layers)]

    def types(self, n_layers: int) -> list[str]:
        """Per layer: "none", "full", or "sac: ..." with the outputs it keeps."""
        return [layer_type(m) for m in self.modes(n_layers)]


def layer_type(saves: frozenset | None) -> str:
    if saves is None:
        return "none"
    return "sac: " + " + ".join(sorted(saves)) if saves else "full"


def every(_i, _n):
    return True


def never(_i, _n):
    return False


ATTENTION = frozenset({"attention"})
QKVO = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
ALL_MATMULS = frozenset(MATMULS)
POLICIES = [
    Policy("none", never),
    Policy("full", every),
    Policy("all but last", lambda i, n: i < n - 1),
    Policy("even layers", lambda i, n: i % 2 == 0),
    Policy("odd layers", lambda i, n: i % 2 == 1),
    Policy("sac: attention", every, ATTENTION),
    Policy("sac: attention + q/k/v/o", every, ATTENTION | QKVO),
    Policy("sac: attention + gate/up", every, ATTENTION | {"gate_proj", "up_proj"}),
    Policy("sac: all matmuls + attention", every, ATTENTION | ALL_MATMULS),
    Policy("sac: all but down_proj", every, ATTENTION | ALL_MATMULS - {"down_proj"}),
]


def apply_policy(model, policy: Policy):
    """Wrap (or unwrap) model.model.layers in place; returns the model."""
    layers = model.model.layers
    base = [m.layer if isinstance(m, Checkpointed) else m for m in layers]
    for i, (layer, saves) in enumerate(zip(base, policy.modes(len(base)), strict=True)):
        layers[i] = layer if saves is None else Checkpointed(layer, saves)
    return model


# --8<-- [end:policies]
