"""The experiment: the shared MoE as teacher, dense students of its active size, four ways to
train them, the same token budget, several seeds.

Each student is trained by the shared models' own loop (snippets/common/train.py: AdamW on
matrices with weight decay, warm-up then cosine, clipping, the same packed rows in the same
seeded order, bf16 autocast on the GPU) with one thing swapped: the loss.

  ce        next-token cross-entropy on the data (no teacher: the baseline)
  fkl       forward KL to the teacher's full distribution at every position (Hinton, T = 1)
  topk      forward KL to the teacher's top-k, renormalized (what an offline top-k store allows)
  onpolicy  fkl, then for the last `onpolicy_steps` steps on-policy reverse KL: the student
            continues prompts cut from the same rows, the teacher grades every position it
            wrote (GKD with lambda = 1, beta = 1). It starts from the fkl run's own state at
            that step, so the two differ only in the last phase (as Qwen3's lightweight models
            go off-policy first, on-policy second).

Every student is then measured on the held-out stream: its next-token loss (the trainer's
`evaluate`), its forward KL to the teacher and top-1 agreement with it (the quality-metrics
post's functions), and the reverse KL to the teacher on continuations it samples itself.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from snippets.common.corpus import token_streams
from snippets.common.models.qwen3 import Qwen3Config
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.train import (
    TrainConfig,
    Trainer,
    batch_order,
    build_model,
    deterministic,
    evaluate,
    init_weights,
    rows,
)
from snippets.cuda_graph.decode import StaticCache
from snippets.cuda_graph.graphs import GraphedDecoder
from snippets.moe_distillation.account import student_config
from snippets.moe_distillation.losses import forward_kl_loss, masked_mean, teacher_topk
from snippets.moe_distillation.onpolicy import eager_step, on_policy_loss, sample_continuations
from snippets.quality_metrics.divergence import forward_kl, kl, top1_agreement

METHODS = ("ce", "fkl", "topk", "onpolicy")


# --8<-- [start:budget]
@dataclass(frozen=True)
class Budget:
    steps: int  # optimizer steps per student
    warmup_steps: int
    topk: int  # teacher logits kept per position by the top-k method
    onpolicy_steps: int  # the on-policy method's last phase
    prompt_len: int  # on-policy prompts: each training row cut into rows of prompt_len
    gen_len: int  # tokens the student writes after each prompt
    seeds: int
    eval_prompts: int  # held-out prompts the students continue for the reverse-KL metric
    temperature: float = 1.0
    eval_tokens: int | None = None  # held-out tokens measured (None: the teacher's eval_tokens)

    def __post_init__(self):
        if not 1 <= self.onpolicy_steps < self.steps:
            raise ValueError(
                f"onpolicy_steps must be in [1, steps = {self.steps}): the "
                f"on-policy phase follows an fkl phase, got {self.onpolicy_steps}"
            )
        if not 1 <= self.topk or self.seeds < 1 or self.gen_len < 1 or self.prompt_len < 1:
            raise ValueError(f"topk, seeds, prompt_len and gen_len must be >= 1: {self}")


# On one H200 (an estimate from the trained-models run: a graphed draft step 9.3 ms, an MoE
# step 20.9 ms, so its forward ~7 ms): per seed ce 120 x 9.3 ms, fkl and topk 120 x ~17.5 ms
# (student step, teacher forward, an fp32 KL over 8,176 x 8,192), onpolicy 30 x ~65 ms (eager:
# 63 graphed decode steps, then forward and backward), ~0.3 s of warm-up and capture per
# student, ~0.25 s to measure one: ~9.5 s a seed, ~19 s for 2. The run at d00b949 took 58 s:
# 3 seeds, topk eager (its id check read the GPU, which a capture cannot), a teacher pass and
# a decoder capture per measured student.
GPU_BUDGET = Budget(steps=120, warmup_steps=12, topk=16, onpolicy_steps=30, prompt_len=32,
                    gen_len=32, seeds=2, eval_prompts=64)  # fmt: skip
CPU_BUDGET = Budget(steps=4, warmup_steps=1, topk=8, onpolicy_steps=2, prompt_len=16,
                    gen_len=16, seeds=2, eval_prompts=4, eval_tokens=1024)  # fmt: skip


def train_config(teacher_train: TrainConfig, budget: Budget, seed: int) -> TrainConfig:
    """The teacher's own training settings (batch, sequence length, learning rate, schedule
    shape), with the budget's steps and warm-up and the student's seed."""
    return replace(teacher_train, steps=budget.steps, warmup_steps=budget.warmup_steps, seed=seed)


# --8<-- [end:budget]


def autocast(device: torch.device):
    """bf16 autocast on the GPU (as the trainer runs), nothing on the CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


# --8<-- [start:loop]
class Student:
    """One student and the shared trainer (snippets/common/train.py's `Trainer`: optimizer,
    schedule, clipping; on the GPU a replayed CUDA graph of the whole step) with
    loss_fn(ids) in place of the next-token loss, over the trainer's seeded batch order.
    `use(loss_fn)` binds the loss before the first step (a captured step holds it)."""

    def __init__(self, cfg: Qwen3Config, seqs: torch.Tensor, tc: TrainConfig):
        with torch.device(seqs.device):
            self.model = build_model(cfg)
        init_weights(self.model, tc.init_std, tc.seed)
        self.seqs, self.tc = seqs, tc
        self.order = batch_order(len(seqs), tc).to(seqs.device)
        self.trainer = None

    def use(self, loss_fn, *, graph: bool = True) -> None:
        def logged(ids):
            loss = loss_fn(ids)
            return loss, loss.detach()

        self.trainer = Trainer(self.model, self.tc, logged, graph=graph)

    def step(self, i: int) -> torch.Tensor:
        self.model.train()
        return self.trainer.step(i, self.seqs[self.order[i]])

    def state(self) -> dict:
        return copy.deepcopy({"model": self.model.state_dict(),
                              "opt": self.trainer.opt.state_dict()})  # fmt: skip

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.trainer.opt.load_state_dict(state["opt"])


# --8<-- [end:loop]


# --8<-- [start:losses]
def captured_topk_kl(student_logits, top_values, top_idx, temperature: float = 1.0):
    """losses.py's topk_kl_loss over every position, the same operations less its checks: its
    id range check reads the ids back to the host, a wait that a CUDA graph cannot capture (the
    step would run eagerly, ~3x slower). The ids come from teacher_topk, in range by
    construction; the tests hold this bit for bit equal to topk_kl_loss."""
    s = student_logits.float()
    every = torch.ones(s.shape[0], dtype=torch.bool, device=s.device)
    logq = (s / temperature).log_softmax(-1).gather(-1, top_idx.long())
    logp = (top_values.to(s.dtype) / temperature).log_softmax(-1).detach()
    return temperature**2 * masked_mean(kl(logp, logq), every)


def loss_fns(student, teacher, budget: Budget, decoder=None, generator=None) -> dict:
    """loss_fn(ids) of each method; the teacher runs without gradients."""
    temp = budget.temperature

    def teacher_logits(ids):
        with torch.no_grad():
            return teacher(ids)[:, :-1].flatten(0, 1)

    def ce(ids):
        return student(ids, labels=ids)  # the trainer's own loss

    def fkl(ids):
        return forward_kl_loss(student(ids)[:, :-1].flatten(0, 1), teacher_logits(ids),
                               temperature=temp)  # fmt: skip

    def topk(ids):
        values, idx = teacher_topk(teacher_logits(ids), budget.topk)  # bf16 values, int32 ids
        return captured_topk_kl(student(ids)[:, :-1].flatten(0, 1), values, idx, temp)

    def onpolicy(ids):
        prompts = ids.reshape(-1, budget.prompt_len)  # each row cut into prompts
        sampled = sample_continuations(decoder, prompts, budget.gen_len, generator, temp)
        return on_policy_loss(student, teacher, sampled, budget.prompt_len, beta=1.0)

    return {"ce": ce, "fkl": fkl, "topk": topk, "onpolicy": onpolicy}


# --8<-- [end:losses]


def make_decoder(model, batch: int, max_len: int):
    """The student's decode step for sampling: replayed as a CUDA graph on the GPU (the
    cuda-graph post's GraphedDecoder; it reads the weights in place, so it follows training),
    the eager step elsewhere."""
    w = next(model.parameters())
    if w.device.type != "cuda":
        return eager_step(model, batch, max_len)
    cache = StaticCache.empty(model.config, batch, max_len, w.dtype, w.device)
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled())  # fmt: skip
    torch.use_deterministic_algorithms(False)  # capture the plain kernels (the step has no
    try:  # reduction whose order could vary: the cache write puts each row in its own slot)
        return GraphedDecoder(model, cache, [batch])
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


# --8<-- [start:measure]
@torch.no_grad()
def teacher_logprobs(teacher, held: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """The teacher's fp32 log-probs at every held-out position, one tensor per batch of rows:
    computed once, read by every student's measurement and by `teacher_tail`."""
    out = []
    for batch in held.split(batch_size):
        with autocast(held.device):
            out.append(teacher(batch.long())[:, :-1].float().log_softmax(-1))
    return out


class Sampler:
    """The students' continuations for the reverse-KL metric: one decoder (on the GPU one
    captured graph) over a model of the students' shape; each student's weights are copied
    into it before it samples (the graph reads the weights in place)."""

    def __init__(self, cfg: Qwen3Config, n_prompts: int, max_len: int, device,
                 dtype=torch.float32):  # fmt: skip
        with torch.device(device):
            self.model = build_model(cfg).to(dtype)  # the students' weights are fp32
        self.model.eval()
        self.decoder = make_decoder(self.model, n_prompts, max_len)

    def __call__(self, student, prompts, new_tokens: int, generator, temperature: float):
        self.model.load_state_dict(student.state_dict())
        return sample_continuations(self.decoder, prompts, new_tokens, generator, temperature)


@torch.no_grad()
def measure(student, teacher, held: torch.Tensor, prompts: torch.Tensor, budget: Budget,
            batch_size: int, seed: int = 0, teacher_logp=None, sampler=None) -> dict:  # fmt: skip
    """A trained student on the held-out rows: its next-token loss, forward KL to the teacher
    and top-1 agreement with it at every position; and the reverse KL to the teacher at the
    positions of continuations it samples from held-out prompts (a fixed generator per seed).
    teacher_logp and sampler are shared by all students (made here when not given)."""
    student.eval()
    if teacher_logp is None:
        teacher_logp = teacher_logprobs(teacher, held, batch_size)
    if sampler is None:
        sampler = Sampler(student.config, len(prompts), budget.prompt_len + budget.gen_len,
                          held.device, next(student.parameters()).dtype)  # fmt: skip
    kl_sum = agree = n = 0.0
    for batch, t in zip(held.split(batch_size), teacher_logp, strict=True):
        with autocast(held.device):
            s = student(batch.long())[:, :-1].float()
        positions = s.shape[0] * s.shape[1]
        kl_sum += forward_kl(t, s.log_softmax(-1)).double().sum().item()
        agree += top1_agreement(t, s) * positions
        n += positions
    gen = torch.Generator(held.device).manual_seed(seed)
    sampled = sampler(student, prompts, budget.gen_len, gen, budget.temperature)
    with autocast(held.device):
        rkl = on_policy_loss(student, teacher, sampled, budget.prompt_len, beta=1.0)
    return {"heldout_loss": evaluate(student, held, batch_size), "kl_teacher": kl_sum / n,
            "top1": agree / n, "rkl_samples": rkl.item()}  # fmt: skip


def teacher_tail(teacher_logp: list[torch.Tensor], k: int) -> float:
    """The teacher's mean probability outside its top-k on the held-out positions: the mass
    the top-k method drops before renormalizing."""
    total = n = 0.0
    for t in teacher_logp:
        total += (1 - t.topk(k, dim=-1).values.exp().sum(-1)).double().sum().item()
        n += t.shape[0] * t.shape[1]
    return total / n


# --8<-- [end:measure]


# --8<-- [start:seed]
def run_seed(teacher, teacher_train: TrainConfig, seqs, held, prompts, budget: Budget,
             seed: int, teacher_logp, sampler: Sampler) -> list[dict]:  # fmt: skip
    """The four students of one seed: same initial weights, same batches. The on-policy
    student resumes the fkl student's state at step steps - onpolicy_steps."""
    tc = train_config(teacher_train, budget, seed)
    cfg = student_config(teacher.config)
    switch = budget.steps - budget.onpolicy_steps
    out, saved = [], None
    with deterministic():
        for method in ("ce", "fkl", "topk", "onpolicy"):
            st = Student(cfg, seqs, tc)
            gen = torch.Generator(seqs.device).manual_seed(seed)
            decoder = None
            if method == "onpolicy":
                n_prompts = tc.batch_size * tc.seq_len // budget.prompt_len
                decoder = make_decoder(st.model, n_prompts, budget.prompt_len + budget.gen_len)
            fns = loss_fns(st.model, teacher, budget, decoder, gen)
            # sampling replays graphs of its own: the on-policy step stays eager
            st.use(fns[method], graph=method != "onpolicy")
            start = 0
            if method == "onpolicy":
                st.load(saved)
                start = switch
            for i in range(start, budget.steps):
                if method == "fkl" and i == switch:
                    saved = st.state()
                st.step(i)
            if st.trainer.graph_error is not None:  # the run is valid, but ~3x slower
                warnings.warn(f"{method}, seed {seed}: steps ran eagerly, the capture failed: "
                              f"{st.trainer.graph_error}", stacklevel=1)  # fmt: skip
            row = measure(st.model, teacher, held, prompts, budget, tc.batch_size, seed,
                          teacher_logp, sampler)  # fmt: skip
            out.append({"method": method, "seed": seed, **row})
            del st, fns, decoder
    return out


# --8<-- [end:seed]


# --8<-- [start:run]
def median(values) -> float:
    """The median over the seeds (the result files take a median-and-range only for timings
    of >= 5 repeats; the per-seed rows carry the spread)."""
    xs = sorted(values)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def run_experiment(teacher, teacher_train: TrainConfig, budget: Budget, spec=None) -> dict:
    """Every seed's four students, and per method the median over seeds. `teacher`
    and `teacher_train` are the shared MoE's model and training settings (trained("moe"))."""
    spec = spec or load_trained_models()
    device = next(teacher.parameters()).device
    train_stream, heldout_stream = token_streams(spec)
    seq_len, batch = teacher_train.seq_len, teacher_train.batch_size
    if seq_len % budget.prompt_len:
        raise ValueError(f"prompt_len {budget.prompt_len} must divide seq_len {seq_len}: "
                         "each training row is cut into on-policy prompts")  # fmt: skip
    seqs = rows(train_stream, seq_len).to(device)
    n_held = max(1, (budget.eval_tokens or teacher_train.eval_tokens) // seq_len)
    held = rows(heldout_stream, seq_len)[:n_held].to(device)
    after = rows(heldout_stream[n_held * seq_len :], budget.prompt_len)  # held out, after `held`
    prompts = after[: budget.eval_prompts].long().to(device)
    teacher = teacher.eval()
    with deterministic():  # cuBLAS's workspace setting before its first matmul
        teacher_logp = teacher_logprobs(teacher, held, batch)  # once for every student
        sampler = Sampler(student_config(teacher.config), len(prompts),
                          budget.prompt_len + budget.gen_len, device)  # fmt: skip
    runs = []
    for seed in range(teacher_train.seed, teacher_train.seed + budget.seeds):
        runs += run_seed(teacher, teacher_train, seqs, held, prompts, budget, seed,
                         teacher_logp, sampler)  # fmt: skip
    keys = ("heldout_loss", "kl_teacher", "top1", "rkl_samples")
    methods = [{"method": m, **{k: median([r[k] for r in runs if r["method"] == m])
                                for k in keys}} for m in METHODS]  # fmt: skip
    return {
        "teacher": {"heldout_loss": evaluate(teacher, held, batch),
                    "tail_mass": teacher_tail(teacher_logp, budget.topk)},
        "runs": runs, "methods": methods,
    }  # fmt: skip


# --8<-- [end:run]
