"""One deterministic trainer for the shared models, and `trained(name)` to get one.

`trained("target" | "draft" | "moe")` returns the model of data/trained_models.yaml, trained on
the pinned corpus (snippets/common/corpus.py): loaded from the run's cache
($HANDBOOK_MODEL_CACHE, else <system temp>/handbook-models) when a checkpoint with the same key
is there, else trained now and cached. The key is a hash of everything the weights depend on:
the model's config and training settings, the corpus and tokenizer hashes, this code and the
model code, the device type and the torch version. Where there is no CUDA the entry's `cpu`
stand-in (a CPU-sized shape, a few steps) is trained instead, through the same code: pages run
everywhere, and only GPU runs publish numbers. `train_new(name, seed=...)` trains one now and
caches nothing (the GPU run's extra seeds, which only measure the spread of the loss); `save`
caches it.

The trainer: fixed seeds (the weights from one generator, the batch order from another),
strictly deterministic algorithms (an error where PyTorch has none: deterministic()), AdamW with
decoupled weight decay on matrices only, a linear warm-up then a cosine decay, gradient
clipping, and packed sequences: the token stream (files separated by the end-of-text token) cut
into seq_len-long rows, visited in a random order, one permutation per epoch. On CUDA the
weights and the optimizer state are fp32 and the forward and backward run under bf16 autocast;
on the CPU everything is fp32. The held-out loss is the mean next-token loss over the first
eval_tokens of the held-out stream, evaluated before and after training. The loop's wall clock
is read (after a synchronize) at STEP_CHUNKS + 1 evenly spaced steps: each chunk's time per step
is one repeat of the step time, as a training loop sees it (the first chunk holds the warm-up).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from snippets.common.corpus import cache_dir, load_tokenizer, token_streams
from snippets.common.device import DEVICE, ON_GPU
from snippets.common.models.qwen3 import Kernels, Qwen3Config, Qwen3ForCausalLM
from snippets.common.models.qwen3_moe import Qwen3MoeConfig, Qwen3MoeForCausalLM
from snippets.common.models.trained_configs import (
    TrainedSpec,
    _shown,
    load_trained_models,
)

HERE = Path(__file__).resolve().parent
CODE = [HERE / "train.py", HERE / "corpus.py", HERE / "models" / "qwen3.py",
        HERE / "models" / "qwen3_moe.py"]  # fmt: skip


STEP_CHUNKS = 46  # 45 repeats after the chunk that holds the warm-up and the capture
GRAPH_WARMUP = 3  # eager steps before the step that is captured (CUDA only)


class TrainingError(RuntimeError):
    """A trained model missed its held-out loss; the message names the data file and line."""


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 100
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    init_std: float = 0.02
    eval_tokens: int = 65536


def model_config(kind: str, config: dict, vocab_size: int) -> Qwen3Config:
    cls = {"dense": Qwen3Config, "moe": Qwen3MoeConfig}[kind]
    return cls(**config, vocab_size=vocab_size)


def build_model(cfg: Qwen3Config, kernels: Kernels | None = None) -> nn.Module:
    cls = Qwen3MoeForCausalLM if isinstance(cfg, Qwen3MoeConfig) else Qwen3ForCausalLM
    return cls(cfg, kernels)


def init_weights(model: nn.Module, std: float, seed: int) -> None:
    """Norm weights 1, every other tensor N(0, std), drawn in parameter order from one
    generator on the model's device (a tied head is the embedding: drawn once)."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, std, generator=gen)


def lr_factor(step: int, tc: TrainConfig) -> float:
    """The learning rate of optimizer step `step` (0-based) as a fraction of tc.lr."""
    if step < tc.warmup_steps:
        return (step + 1) / tc.warmup_steps
    progress = (step - tc.warmup_steps) / max(1, tc.steps - tc.warmup_steps)
    return tc.min_lr_ratio + (1 - tc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def rows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """A token stream cut into [n, seq_len] rows (the tail shorter than a row is dropped)."""
    n = stream.numel() // seq_len
    if n == 0:
        raise ValueError(f"{stream.numel()} tokens do not fill one row of {seq_len}")
    return stream[: n * seq_len].view(n, seq_len)


def batch_order(n_rows: int, tc: TrainConfig) -> torch.Tensor:
    """[steps, batch_size] row indices: a fresh permutation of the rows for every epoch."""
    gen = torch.Generator().manual_seed(tc.seed + 1)
    need = tc.steps * tc.batch_size
    epochs = [torch.randperm(n_rows, generator=gen) for _ in range(-(-need // n_rows))]
    return torch.cat(epochs)[:need].view(tc.steps, tc.batch_size)


def losses_of(model: nn.Module, ids: torch.Tensor):
    """(next-token loss, weighted router loss or None)."""
    if isinstance(model, Qwen3MoeForCausalLM):
        lm, aux = model.losses(ids, ids)
        return lm, model.config.router_aux_loss_coef * aux
    return model(ids, labels=ids), None


def _autocast(device: torch.device):
    if device.type == "cuda":  # no cast cache: a captured graph must not hold cached casts
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False)
    return nullcontext()


@torch.no_grad()
def evaluate(model: nn.Module, heldout: torch.Tensor, batch_size: int) -> float:
    """Mean next-token loss over the rows of `heldout` (each row weighs the same)."""
    was = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=heldout.device)
    for batch in heldout.split(batch_size):
        with _autocast(heldout.device):
            lm, _ = losses_of(model, batch.long())
        total += lm.double() * len(batch)
    model.train(was)
    return (total / len(heldout)).item()


@contextmanager
def deterministic():
    """Deterministic algorithms, and an error where PyTorch has none (warn_only=False). With
    warn_only=True, SDPA picks cuDNN's attention on the H200, whose backward is
    nondeterministic and only warns: the target trained twice on one machine ended at
    held-out losses 4.16856 and 4.16876 (run to run, the downstream posts' figures moved by
    several percent). With warn_only=False PyTorch keeps cuDNN out of SDPA's choice
    (check_cudnn_deterministic, sdp_utils.cpp) and SDPA takes its flash kernel, whose backward
    then runs deterministically (tests/test_train_gpu.py): two fresh processes trained the
    target and the MoE to bitwise-equal weights, at the same step time (48.7 against 48.5
    ms); the RL, distillation and balancing loops on Trainer ran under it (at their CPU
    budgets) with no error and results bitwise equal in two processes.
    cuBLAS needs CUBLAS_WORKSPACE_CONFIG: set here, when training
    starts, not at import (a test process that merely imports this module must keep cuBLAS's
    defaults for its timings); cuBLAS reads it when a handle is made."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())  # fmt: skip
    torch.use_deterministic_algorithms(True, warn_only=False)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def chunk_bounds(steps: int, chunks: int = STEP_CHUNKS) -> list[int]:
    """The steps at which the loop's clock is read: 0, evenly spaced steps, `steps`."""
    return sorted({round(k * steps / chunks) for k in range(chunks + 1)})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """The shared optimizer step around a loss: AdamW with decoupled weight decay on matrices
    only, the warm-up + cosine schedule, gradient clipping. `loss_fn(ids)` returns (the loss
    to minimise, what to log: detached tensors). On CUDA the first GRAPH_WARMUP steps run
    eagerly on a side stream (lazy initialisation, cuBLAS workspaces, the optimizer's state),
    the next one is captured as one CUDA graph (the cuda-graph post's whole-step capture) and
    every later step copies its batch into the static `ids`, writes the learning rate into the
    tensor the optimizer reads, and replays: the small models' eager steps were bound by
    launching ~1000 kernels from Python. If capture fails, the steps stay eager and
    `graph_error` says why. graph=False keeps every step eager."""

    def __init__(self, model: nn.Module, tc: TrainConfig, loss_fn, *, graph: bool = True):
        self.model, self.tc, self.loss_fn = model, tc, loss_fn
        device = next(model.parameters()).device
        self.device, self.cuda = device, device.type == "cuda"
        self.params = list(model.parameters())
        mats = [p for p in self.params if p.ndim >= 2]
        vecs = [p for p in self.params if p.ndim < 2]
        groups = [{"params": mats, "weight_decay": tc.weight_decay},
                  {"params": vecs, "weight_decay": 0.0}]  # fmt: skip
        lr = torch.tensor(tc.lr, device=device) if self.cuda else tc.lr  # a replay reads it
        self.opt = torch.optim.AdamW(groups, lr=lr, betas=(tc.beta1, tc.beta2),
                                     fused=self.cuda, capturable=self.cuda)  # fmt: skip
        self.ids = torch.zeros(tc.batch_size, tc.seq_len, dtype=torch.long, device=device)
        self.graphing = graph and self.cuda
        self.graph = self.out = self.graph_error = None
        self.done = 0

    def set_lr(self, step: int) -> None:
        value = self.tc.lr * lr_factor(step, self.tc)
        for group in self.opt.param_groups:
            if self.cuda:
                group["lr"].fill_(value)
            else:
                group["lr"] = value

    def _step(self):
        self.opt.zero_grad(set_to_none=True)  # in capture: the gradients go to the graph's pool
        with deterministic():  # every loop on this trainer (RL, distillation, balancing) too
            with _autocast(self.device):
                loss, logged = self.loss_fn(self.ids)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, self.tc.grad_clip)
            self.opt.step()
        return logged

    def step(self, i: int, batch: torch.Tensor):
        """Optimizer step i (its learning rate) on `batch` [batch_size, seq_len]; what
        loss_fn logs (on CUDA after capture: the graph's output tensors, read them before
        the next step)."""
        self.set_lr(i)
        self.ids.copy_(batch)
        self.done += 1
        if self.graph is not None:
            self.graph.replay()
            return self.out
        if not self.graphing or self.graph_error is not None:
            return self._step()
        if self.done <= GRAPH_WARMUP:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self._step()
            torch.cuda.current_stream().wait_stream(side)
            return out
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                out = self._step()
        except RuntimeError as exc:  # recorded in the stats; the run goes on eagerly
            self.graph_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            torch.cuda.synchronize()
            return self._step()
        self.graph, self.out = graph, out
        graph.replay()  # capture records the step; the replay runs it
        return out


def lm_loss_fn(model: nn.Module):
    """The trainer's own loss: next-token loss (+ the weighted router loss of a MoE)."""

    def loss_fn(ids):
        lm, aux = losses_of(model, ids)
        logged = (lm.detach(), None if aux is None else aux.detach())
        return (lm if aux is None else lm + aux), logged

    return loss_fn


def train(model: nn.Module, train_stream, heldout_stream, tc: TrainConfig, *,
          graph: bool = True) -> dict:  # fmt: skip
    """Train `model` (on its device) in place from its current weights; returns the stats.
    graph=False keeps every CUDA step eager (tests compare the two)."""
    device = next(model.parameters()).device
    seqs = rows(train_stream, tc.seq_len).to(device)
    held = rows(heldout_stream, tc.seq_len)[: max(1, tc.eval_tokens // tc.seq_len)].to(device)
    order = batch_order(len(seqs), tc).to(device)
    run = Trainer(model, tc, lm_loss_fn(model), graph=graph)
    params = run.params
    with deterministic():
        init_loss = evaluate(model, held, tc.batch_size)
        lm_losses = torch.zeros(tc.steps, device=device)
        aux_losses = torch.zeros(tc.steps, device=device)
        model.train()
        bounds = chunk_bounds(tc.steps)
        marks = []  # perf_counter at each bound
        for i in range(tc.steps):
            if i in bounds:
                _sync(device)
                marks.append(time.perf_counter())
            lm, aux = run.step(i, seqs[order[i]])
            lm_losses[i] = lm
            if aux is not None:
                aux_losses[i] = aux
        _sync(device)
        marks.append(time.perf_counter())
        wall = marks[-1] - marks[0]
        chunks = zip(itertools.pairwise(marks), itertools.pairwise(bounds), strict=True)
        step_ms = [(b - a) * 1e3 / (m - n) for (a, b), (n, m) in chunks]
        final_loss = evaluate(model, held, tc.batch_size)
    model.eval()
    tokens = tc.steps * tc.batch_size * tc.seq_len
    return {
        "params": sum(p.numel() for p in params),
        "seed": tc.seed,
        "steps": tc.steps,
        "tokens": tokens,
        "epochs": tokens / seqs.numel(),
        "heldout_tokens": held.numel(),
        "heldout_loss_init": init_loss,
        "heldout_loss": final_loss,
        "train_loss": lm_losses.tolist(),
        "router_loss": aux_losses.tolist() if isinstance(model, Qwen3MoeForCausalLM) else None,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "step_ms": step_ms,
        "graphed": run.graph is not None,
        "graph_error": run.graph_error,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "precision": "bf16 autocast, fp32 weights" if device.type == "cuda" else "fp32",
        "torch": str(torch.__version__),
    }


@dataclass
class Trained:
    name: str
    model: nn.Module  # in eval mode, on DEVICE
    config: Qwen3Config
    train: TrainConfig
    stats: dict
    path: Path  # the checkpoint
    tokenizer: object  # tokenizers.Tokenizer


def cache_key(name: str, cfg: Qwen3Config, tc: TrainConfig, spec: TrainedSpec, device) -> str:
    code = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in CODE}
    fields_ = {"name": name, "model": type(cfg).__name__, "config": asdict(cfg),
               "train": asdict(tc), "corpus": spec.corpus.content_sha256,
               "tokenizer": spec.tokenizer.sha256, "code": code, "device": device.type,
               "torch": torch.__version__}  # fmt: skip
    return hashlib.sha256(json.dumps(fields_, sort_keys=True).encode()).hexdigest()


def settings(name: str, spec: TrainedSpec, seed: int | None = None):
    """(entry, model config, training config) of model `name` on this machine."""
    if name not in spec.models:
        raise KeyError(f"no model {name!r} in {_shown(spec.path)}; known: {', '.join(spec.models)}")
    entry = spec.models[name]
    config, train_fields = entry.resolved(ON_GPU)
    tc = TrainConfig(**(train_fields | ({} if seed is None else {"seed": seed})))
    return entry, model_config(entry.kind, config, spec.tokenizer.vocab_size), tc


def checkpoint_path(name: str, cfg: Qwen3Config, tc: TrainConfig, spec: TrainedSpec) -> Path:
    return cache_dir() / f"{name}-{cache_key(name, cfg, tc, spec, DEVICE)[:16]}.pt"


def train_new(name: str, *, seed: int | None = None, spec: TrainedSpec | None = None) -> Trained:
    """Model `name` trained now from its initial weights (its CPU stand-in without CUDA); the
    cache is not read, and nothing is written to it (`save` does)."""
    spec = spec or load_trained_models()
    _, cfg, tc = settings(name, spec, seed)
    with torch.device(DEVICE):
        model = build_model(cfg)
    train_stream, heldout_stream = token_streams(spec)
    init_weights(model, tc.init_std, tc.seed)
    stats = train(model, train_stream, heldout_stream, tc)
    model.eval()
    path = checkpoint_path(name, cfg, tc, spec)
    return Trained(name, model, cfg, tc, stats, path, load_tokenizer(spec))


def save(run: Trained) -> Path:
    """Cache a trained model where `trained` looks for it."""
    tmp = run.path.with_name(f".{run.path.name}.{os.getpid()}.tmp")
    torch.save({"state_dict": run.model.state_dict(), "stats": run.stats}, tmp)
    os.replace(tmp, run.path)
    return run.path


def check_loss(name: str, stats: dict, spec: TrainedSpec | None = None) -> None:
    """TrainingError where model `name`, trained on CUDA, missed its max_heldout_loss."""
    spec = spec or load_trained_models()
    entry = spec.models[name]
    limit, loss = entry.max_heldout_loss, stats["heldout_loss"]
    if stats["device"] != "cpu" and limit is not None and loss > limit:
        raise TrainingError(f"{_shown(spec.path)}:{entry.limit_line}: model '{name}' (seed "
                            f"{stats['seed']}): held-out loss {loss:.4f} after {stats['steps']} "
                            f"steps is above its max_heldout_loss {limit}")  # fmt: skip


def trained(name: str, *, seed: int | None = None, spec: TrainedSpec | None = None) -> Trained:
    """The trained model `name` of data/trained_models.yaml (its CPU stand-in without CUDA)."""
    spec = spec or load_trained_models()
    _, cfg, tc = settings(name, spec, seed)
    path = checkpoint_path(name, cfg, tc, spec)
    if path.is_file():
        with torch.device(DEVICE):
            model = build_model(cfg)
        saved = torch.load(path, map_location=DEVICE, weights_only=True)
        model.load_state_dict(saved["state_dict"])
        model.eval()
        run = Trained(name, model, cfg, tc, saved["stats"], path, load_tokenizer(spec))
    else:
        run = train_new(name, seed=seed, spec=spec)
        save(run)
    check_loss(name, run.stats, spec)
    return run


# A dense model smaller in every dimension than each of data/trained_models.yaml's: trained on
# the CPU with a model's own GPU schedule, its held-out loss is that model's max_heldout_loss.
ESTIMATE_CONFIG = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 2,
                   "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}  # fmt: skip


def estimate(name: str, spec: TrainedSpec | None = None) -> dict:
    """ESTIMATE_CONFIG trained on the CPU (fp32) with model `name`'s training settings -- its
    GPU ones, not its stand-in's: same steps, batch, sequence length and schedule."""
    spec = spec or load_trained_models()
    entry = spec.models[name]
    shared = ("rms_norm_eps", "rope_theta", "tie_word_embeddings")
    config = {k: entry.config[k] for k in shared} | ESTIMATE_CONFIG
    cfg = model_config("dense", config, spec.tokenizer.vocab_size)
    tc = TrainConfig(**entry.train)
    with torch.device("cpu"):
        model = build_model(cfg)
    init_weights(model, tc.init_std, tc.seed)
    train_stream, heldout_stream = token_streams(spec)
    return train(model, train_stream, heldout_stream, tc)


if __name__ == "__main__":
    # python -m snippets.common.train [NAME ...]: train (or load) them and report;
    # python -m snippets.common.train --estimate NAME: the CPU estimate of its max_heldout_loss
    import sys

    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    for name in names or list(load_trained_models().models):
        t0 = time.perf_counter()
        stats = estimate(name) if "--estimate" in sys.argv else trained(name).stats
        lists = ("train_loss", "router_loss", "step_ms")
        shown = {k: v for k, v in stats.items() if k not in lists}
        print(f"{name}: {time.perf_counter() - t0:.1f} s with loading; {json.dumps(shown)}")
