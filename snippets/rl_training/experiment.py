"""Section 6's run: the shared draft model, a short supervised warm-up on the addition task, then
GRPO and DAPO from that one checkpoint with several RL seeds; held-out exact match before and
after.

One RL step, as in section 1's diagram:
  rollout     the rollout engine -- a bf16 copy of the policy -- samples `group` answers to each
              of `prompts` training problems through a static KV cache (on the GPU the
              cuda-graph post's GraphedDecoder replays the decode step) and keeps its own
              log-probability of every token it sampled;
  reward      1 for an answer whose line is exactly the sum, else 0 (task.py);
  advantage   within each group (losses.py);
  update      the trainer recomputes the log-probabilities (fp32 weights under bf16 autocast,
              the shared trainer's precision) and takes one optimizer step with this page's
              grpo_loss or dapo_loss, each token's surrogate weighted by the truncated
              importance ratio min(pi_trainer / pi_rollout, C) of section 3;
  weight sync the engine copies the new weights (fp32 -> bf16) in place.
One update per batch of rollouts (DeepSeekMath §4.2: "a single update following each
exploration stage"): pi_old is the policy itself, every ratio is 1 and the PPO clip never acts;
what is off-policy is only the engine-versus-trainer mismatch that the weights correct.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from snippets.common.train import TrainConfig, Trainer
from snippets.cuda_graph.decode import StaticCache, generate
from snippets.cuda_graph.graphs import GraphedDecoder
from snippets.moe_distillation.onpolicy import eager_step, sample_continuations
from snippets.rl_training.losses import dapo_loss, grpo_loss, informative_groups
from snippets.rl_training.offpolicy import tis_weights
from snippets.rl_training.task import AdditionTask, Problems, draw

VARIANTS = ("grpo", "dapo")


# --8<-- [start:budget]
@dataclass(frozen=True)
class Budget:
    seeds: int
    sft_batch: int  # problems per supervised step
    sft_max_steps: int
    sft_check_every: int  # steps between checks of the stop rule
    sft_target: float  # stop at the first check whose dev sampled exact match reaches this
    sft_lr: float
    dev: int  # dev problems for the stop rule (1 sample each)
    prompts: int  # problems per RL step
    group: int  # answers sampled per problem (G)
    rl_steps: int
    rl_lr: float
    warmup_steps: int  # linear warm-up of either phase; the learning rate is constant after it
    test: int  # held-out test problems
    test_samples: int  # sampled answers per test problem for the sampled exact match
    max_digits: int = 3
    temperature: float = 1.0
    beta: float = 0.04  # GRPO's KL coefficient (DeepSeekMath §4.2)
    tis_cap: float = 2.0  # C of the truncated importance weights
    curve_window: int = 5  # steps per point of the reward curve

    def __post_init__(self):
        if self.group < 2:
            raise ValueError(f"group must be >= 2 (a group is its own baseline), got {self.group}")
        if min(self.seeds, self.sft_batch, self.sft_max_steps, self.sft_check_every, self.dev,
               self.prompts, self.rl_steps, self.test, self.test_samples) < 1:  # fmt: skip
            raise ValueError(f"every count in the budget must be >= 1: {self}")
        if self.rl_steps % self.curve_window:
            raise ValueError(f"curve_window {self.curve_window} must divide rl_steps "
                             f"{self.rl_steps}")  # fmt: skip


# On one H200, estimated from operation counts (the shared draft model: a graphed training step
# of 16 x 512 tokens ~4 ms, eager ~22 ms, both bound by launching kernels; a graphed decode
# step ~1 ms). Sequences are 17 prompt + 12 answer tokens.
#   warm-up      <= 1000 graphed steps of 256 x 29 tokens, ~4 ms each (a draft step's launches,
#                fewer tokens): <= 4 s; a dev check every 25 steps, 256 prompts through 28
#                eager fp32 decode steps of ~2.5 ms: <= 2.8 s. It stops at the first check
#                that passes, usually long before (on a smaller CPU stand-in of the draft the
#                accuracy rose steeply within a few checks: hence checks this frequent).
#   RL step      2048 rollouts: 28 graphed decode replays ~28 ms + scoring on the host ~10 ms
#                + an eager forward and backward over 2048 x 29 tokens ~30 ms (~5 TFLOP of
#                bf16 matmuls: no longer launch-bound) + the reference's forward ~10 ms for
#                GRPO + the loss and the weight copy ~5 ms: ~83 ms GRPO, ~73 ms DAPO. 40 steps
#                of each, 3 seeds: ~19 s.
#   evaluation   greedy + 2 sampled passes over 512 test problems, 28 eager decode steps each:
#                ~0.2 s; the base model, the warm-up checkpoint and 6 runs: ~1.7 s.
# <= 28 s in all, ~23 s when the warm-up stops near step 300. The post also loads the draft
# (or trains it, ~10 s, when the trained-models post did not run first) and runs its page and
# tests (~8 s with the interpreter's and CUDA's start): <= ~46 s of its 60 s.
# The batch is large because the GPU is nearly idle at these sizes and the update needs it: on
# the CPU stand-in, 512 rollouts a step left the learning rate a choice between too slow
# (3e-4) and too noisy (1e-3, which lowered the reward); 2048 at 3e-4 raised it steadily.
GPU_BUDGET = Budget(seeds=3, sft_batch=256, sft_max_steps=1000, sft_check_every=25,
                    sft_target=0.3, sft_lr=2e-3, dev=256, prompts=256, group=8, rl_steps=40,
                    rl_lr=3e-4, warmup_steps=5, test=512, test_samples=2)  # fmt: skip
CPU_BUDGET = Budget(seeds=2, sft_batch=16, sft_max_steps=4, sft_check_every=2, sft_target=0.0,
                    sft_lr=1e-3, dev=8, prompts=4, group=4, rl_steps=4, rl_lr=1e-3,
                    warmup_steps=1, test=8, test_samples=1, curve_window=2)  # fmt: skip
# --8<-- [end:budget]


# --8<-- [start:logp]
def answer_logp(model, ids: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """[n, T] log-probability of each token after the prompt (position t predicts token t + 1);
    only those positions go through the LM head."""
    hidden = model.hidden_states(ids)[:, prompt_len - 1 : -1]
    logits = model.lm_head(hidden).float()
    return logits.log_softmax(-1).gather(-1, ids[:, prompt_len:, None])[..., 0]


def sft_loss_fn(model, task: AdditionTask):
    """Cross-entropy on the answer and its newline only (not the prompt, not the padding):
    static shapes and no host sync, so the shared trainer replays it as a CUDA graph."""
    p = task.prompt_len

    def loss_fn(ids):
        mask = task.response_mask(ids[:, p:])
        loss = -(answer_logp(model, ids, p) * mask).sum() / mask.sum()
        return loss, loss.detach()

    return loss_fn


# --8<-- [end:logp]


# --8<-- [start:evaluate]
@torch.no_grad()
def exact_match(model, task: AdditionTask, problems: Problems, prompts: torch.Tensor,
                generator: torch.Generator | None = None, samples: int = 1,
                temperature: float = 1.0) -> float:  # fmt: skip
    """Share of answers that are exactly the sum: greedy (generator None), or the mean over
    `samples` sampled answers per problem. The model decodes in its own precision (fp32) over
    the cuda-graph post's static KV cache, eagerly."""
    step = eager_step(model, len(prompts), task.prompt_len + task.max_new)
    if generator is None:
        out = generate(step, prompts, task.max_new)
        return task.score(problems, out[:, task.prompt_len :]).mean().item()
    total = 0.0
    for _ in range(samples):
        out = sample_continuations(step, prompts, task.max_new, generator, temperature)
        total += task.score(problems, out[:, task.prompt_len :]).mean().item()
    return total / samples


def evaluate(model, task, problems, prompts, budget: Budget) -> dict:
    """Greedy and sampled exact match on the test problems; every evaluation seeds its
    sampling generator alike, so all models are scored on the same random numbers."""
    gen = torch.Generator(prompts.device).manual_seed(10_000)
    return {"greedy": exact_match(model, task, problems, prompts),
            "sampled": exact_match(model, task, problems, prompts, gen, budget.test_samples,
                                   budget.temperature)}  # fmt: skip


# --8<-- [end:evaluate]


def phase_config(budget: Budget, task: AdditionTask, seed: int, rl: bool) -> TrainConfig:
    """The shared trainer's settings for one phase: constant learning rate after the warm-up
    (min_lr_ratio 1), so that where the warm-up stops does not depend on a schedule's length."""
    return TrainConfig(
        seed=seed, steps=budget.rl_steps if rl else budget.sft_max_steps,
        batch_size=budget.prompts * budget.group if rl else budget.sft_batch,
        seq_len=task.prompt_len + task.max_new, lr=budget.rl_lr if rl else budget.sft_lr,
        min_lr_ratio=1.0, warmup_steps=budget.warmup_steps,
    )  # fmt: skip


# --8<-- [start:sft]
def supervised(model, task: AdditionTask, budget: Budget, seed: int, dev: Problems,
               dev_prompts: torch.Tensor) -> dict:  # fmt: skip
    """The format warm-up: the shared trainer (a replayed CUDA graph on the GPU) on fresh
    training problems each step, until the dev problems' sampled exact match reaches
    budget.sft_target or sft_max_steps have run."""
    device = dev_prompts.device
    trainer = Trainer(model, phase_config(budget, task, seed, rl=False), sft_loss_fn(model, task))
    problems_gen = torch.Generator().manual_seed(seed)
    check_gen = torch.Generator(device).manual_seed(seed)
    model.train()
    dev_match = 0.0
    for i in range(budget.sft_max_steps):
        rows = task.rows(draw(budget.sft_batch, "train", problems_gen, budget.max_digits), True)
        trainer.step(i, rows.to(device))
        if (i + 1) % budget.sft_check_every == 0:
            dev_match = exact_match(model, task, dev, dev_prompts, check_gen, 1, budget.temperature)
            if dev_match >= budget.sft_target:
                break
    model.zero_grad(set_to_none=True)
    return {"steps": i + 1, "dev_sampled": dev_match, "graphed": trainer.graph is not None}


# --8<-- [end:sft]


# --8<-- [start:engine]
class RolloutEngine:
    """The inference side: a copy of the policy in `dtype` that samples over a static KV cache
    (replayed as a CUDA graph on the GPU; its graph reads the weights in place, so `sync`
    needs no new capture) and returns its own log-probability of each sampled token."""

    def __init__(self, policy, batch: int, max_len: int, dtype=torch.bfloat16):
        self.model = copy.deepcopy(policy).to(dtype).eval().requires_grad_(False)
        w = next(self.model.parameters())
        if w.device.type == "cuda":
            cache = StaticCache.empty(self.model.config, batch, max_len, dtype, w.device)
            self.step = GraphedDecoder(self.model, cache, [batch])
        else:
            self.step = eager_step(self.model, batch, max_len)

    @torch.no_grad()
    def sync(self, policy) -> None:
        """Weight sync: the trainer's fp32 weights, rounded to the engine's dtype, in place."""
        for dst, src in zip(self.model.parameters(), policy.parameters(), strict=True):
            dst.copy_(src)

    @torch.no_grad()
    def sample(self, prompts, new_tokens: int, generator, temperature: float = 1.0):
        """(tokens [n, new_tokens], their log-probabilities under the engine [n, new_tokens]):
        sample_continuations of the distillation post, with each sampling step's
        log-softmax kept."""
        p, kept, calls = prompts.shape[1], [], 0

        def step(tokens, pos):
            nonlocal calls
            logits = self.step(tokens, pos)
            if calls >= p - 1:  # the last prompt token and every sampled one: these sample
                kept.append((logits.float() / temperature).log_softmax(-1))
            calls += 1
            return logits

        new = sample_continuations(step, prompts, new_tokens, generator, temperature)[:, p:]
        logp = torch.stack(kept, 1).gather(-1, new[..., None])[..., 0]
        return new, logp


# --8<-- [end:engine]


# --8<-- [start:rl]
def rl_loss_fn(policy, ref, task: AdditionTask, budget: Budget, variant: str, batch: dict):
    """loss_fn(ids) for the shared trainer; `batch` holds this step's rewards [P, G], response
    mask and the engine's log-probabilities [P, G, T]."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    shape = (budget.prompts, budget.group, task.max_new)

    def loss_fn(ids):
        logp = answer_logp(policy, ids, task.prompt_len).view(shape)
        old = logp.detach()  # one update per batch: pi_old is the policy being trained
        mask, rewards, rollout = batch["mask"], batch["rewards"], batch["rollout_logp"]
        w = tis_weights(old, rollout, mask, budget.tis_cap)
        if variant == "grpo":
            with torch.no_grad():
                ref_logp = answer_logp(ref, ids, task.prompt_len).view(shape)
            loss = grpo_loss(logp, old, ref_logp, mask, rewards, beta=budget.beta, is_weights=w)
        else:  # DAPO: dynamic sampling drops the all-correct and all-wrong groups
            keep = informative_groups(rewards)
            loss = dapo_loss(logp[keep], old[keep], mask[keep], rewards[keep], is_weights=w[keep])
        log_rho = (old - rollout) * mask  # log(pi_trainer / pi_rollout) per response token
        n = mask.sum()
        logged = {
            "log_ratio_abs": log_rho.abs().sum() / n,
            "truncated": ((log_rho > math.log(budget.tis_cap)) * mask).sum() / n,
        }
        return loss, logged

    return loss_fn


def reinforce(policy, ref, engine: RolloutEngine, task: AdditionTask, budget: Budget,
              variant: str, seed: int) -> list[dict]:  # fmt: skip
    """budget.rl_steps RL steps on `policy`; per step the batch's mean reward and the logged
    mismatch figures. The problems and the engine's random numbers depend on the seed only, so
    both variants of a seed start from the same rollouts."""
    device = next(policy.parameters()).device
    g, batch = budget.group, {}
    loss_fn = rl_loss_fn(policy, ref, task, budget, variant, batch)
    trainer = Trainer(policy, phase_config(budget, task, seed, rl=True), loss_fn, graph=False)
    problems_gen = torch.Generator().manual_seed(seed)
    sample_gen = torch.Generator(device).manual_seed(seed)
    engine.sync(policy)
    policy.train()
    log = []
    for i in range(budget.rl_steps):
        problems = draw(budget.prompts, "train", problems_gen, budget.max_digits)
        each = Problems(problems.a.repeat_interleave(g), problems.b.repeat_interleave(g))
        prompts = task.rows(problems).repeat_interleave(g, 0).to(device)
        tokens, rollout_logp = engine.sample(prompts, task.max_new, sample_gen, budget.temperature)
        rewards = task.score(each, tokens).to(device).view(budget.prompts, g)
        informative = informative_groups(rewards).float().mean().item()
        row = {"reward": rewards.mean().item(), "informative": informative}
        if variant == "dapo" and informative == 0:
            log.append(row)  # DAPO samples more prompts here; this run skips the update
            continue
        batch.update(rewards=rewards, mask=task.response_mask(tokens).view(*rewards.shape, -1),
                     rollout_logp=rollout_logp.view(*rewards.shape, -1))  # fmt: skip
        logged = trainer.step(i, torch.cat([prompts, tokens], 1))
        engine.sync(policy)  # weight sync: the next rollouts come from the new policy
        log.append(row | {k: v.item() for k, v in logged.items()})
    policy.zero_grad(set_to_none=True)
    return log


def mismatch(log: list[dict]) -> dict:
    """The mean share of informative groups over the steps; over the steps that updated, the
    mean |log(pi_trainer / pi_rollout)| per token and the largest share of tokens whose weight
    was truncated."""
    took = [s for s in log if "log_ratio_abs" in s] or [{"log_ratio_abs": 0.0, "truncated": 0.0}]
    return {"log_ratio_abs": sum(s["log_ratio_abs"] for s in took) / len(took),
            "truncated": max(s["truncated"] for s in took),
            "informative": sum(s["informative"] for s in log) / len(log)}  # fmt: skip


# --8<-- [end:rl]


# --8<-- [start:run]
def median(values) -> float:
    xs = sorted(values)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def run_experiment(model, tokenizer, budget: Budget) -> dict:
    """The shared draft model (`trained("draft")`'s model and tokenizer): its exact match as it
    is, one warm-up checkpoint and its exact match ("before"), then from that checkpoint each
    variant with each RL seed: one row per (variant, seed) with the exact match after, and per
    variant its median and spread over the seeds and the reward curve (median over the seeds
    of each window's mean reward)."""
    device = next(model.parameters()).device
    task = AdditionTask(tokenizer, budget.max_digits).to(device)
    data_gen = torch.Generator().manual_seed(2024)
    test, dev = draw(budget.test, "test", data_gen), draw(budget.dev, "dev", data_gen)
    test_prompts, dev_prompts = task.rows(test).to(device), task.rows(dev).to(device)
    engine = RolloutEngine(model, budget.prompts * budget.group, task.prompt_len + task.max_new)
    base = evaluate(model, task, test, test_prompts, budget)
    policy = copy.deepcopy(model)
    warm = supervised(policy, task, budget, 0, dev, dev_prompts)  # seed 0: the warm-up's
    before = evaluate(policy, task, test, test_prompts, budget)
    start = copy.deepcopy(policy.state_dict())
    ref = copy.deepcopy(policy).eval().requires_grad_(False)  # GRPO's KL reference
    runs, rewards = [], {v: [] for v in VARIANTS}
    for seed in range(1, budget.seeds + 1):
        for variant in VARIANTS:
            policy.load_state_dict(start)
            log = reinforce(policy, ref, engine, task, budget, variant, seed)
            after = evaluate(policy, task, test, test_prompts, budget)
            rewards[variant].append([s["reward"] for s in log])
            runs.append({
                "variant": variant, "seed": seed,
                "after_greedy": after["greedy"], "after_sampled": after["sampled"],
                "gain_greedy": after["greedy"] - before["greedy"],
                "gain_sampled": after["sampled"] - before["sampled"],
                **mismatch(log),
            })  # fmt: skip
    w = budget.curve_window
    curve = [{"variant": v, "step": k + w, "reward": median(sum(r[k : k + w]) / w for r in rs)}
             for v, rs in rewards.items() for k in range(0, budget.rl_steps, w)]  # fmt: skip
    return {"base": base, "warmup": {"steps": warm["steps"], **before}, "runs": runs,
            "variants": [summary(runs, v) for v in VARIANTS], "curve": curve}  # fmt: skip


def summary(runs: list[dict], variant: str) -> dict:
    """One variant over its seeds: the median exact match after RL and the spread (max - min)."""
    out = {"variant": variant}
    for key in ("after_greedy", "after_sampled"):
        xs = [r[key] for r in runs if r["variant"] == variant]
        out[key], out[key.replace("after", "spread")] = median(xs), max(xs) - min(xs)
    return out


# --8<-- [end:run]
