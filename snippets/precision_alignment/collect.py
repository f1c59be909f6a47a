"""The GPU run, as functions: the three gates for our Triton kernels in bf16 on the Qwen3 model
and the GPU-only sources (TF32, atomics), each returning the values of one result record.
bench_gpu.py calls them with the H200 plan; tests/snippets/test_precision_alignment.py runs them
with a tiny plan on the CPU and checks that what they return is what the page reads.
"""

from dataclasses import dataclass, replace

from snippets.common.models.qwen3 import QWEN3_8B, TINY, Kernels, Qwen3Config
from snippets.precision_alignment import e2e_gate as e2e
from snippets.precision_alignment import model_gate as mg
from snippets.precision_alignment import op_gate as og
from snippets.precision_alignment import planted, sources
from snippets.precision_alignment.techniques import one_at_a_time, strict_numerics
from snippets.triton_kernels.numerics import gamma
from snippets.triton_kernels.qwen3 import TRITON, fused_loss

SLUG = "precision-alignment"


# --8<-- [start:plan]
@dataclass(frozen=True)
class Plan:
    op_cases: tuple  # (case builder, args[, kwargs]) at these shapes
    model: Qwen3Config  # the model of the model gate and of the end-to-end gate
    model_tokens: tuple  # (batch, seq) of the model gate
    e2e_data: tuple  # (sequences, seq, batch) of the end-to-end gate's task
    e2e_steps: int
    e2e_lr: float
    e2e_runs: int  # perturbed eager runs behind the band
    repeat_steps: int  # steps of a second, identical eager run (is the run reproducible?)
    every: int  # a loss-curve row every this many steps, and one for the last step
    matmul: tuple  # (m, k, n) of the TF32 measurement
    index_add: int  # values added into 64 bins


H200 = Plan(
    op_cases=(  # Qwen3-8B's widths: hidden 4096, MLP 12288, 32:8 heads of 128, a 32k vocabulary
        (og.rmsnorm_case, (4096, 4096)),
        (og.rmsnorm_case, (4096, 4096), {"residual": True}),
        (og.swiglu_case, (2048, 12288)),
        (og.rope_case, (2, 32, 8, 512, 128)),
        (og.cross_entropy_case, (1024, 1024, 32_000)),
    ),
    model=replace(
        QWEN3_8B,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=512,
    ),
    model_tokens=(2, 512),
    e2e_data=(4096, 128, 16),
    e2e_steps=50,  # the band at step t reads steps <= t only: a longer run extends the curves
    e2e_lr=1e-3,
    e2e_runs=8,
    repeat_steps=10,  # a nondeterministic backward would already change the second step's loss
    every=5,
    matmul=(1024, 4096, 1024),
    index_add=1 << 22,
)
CPU_SMOKE = Plan(  # the same code at CPU sizes (the TINY model's widths), for the unit test
    op_cases=(
        (og.rmsnorm_case, (9, 64)),
        (og.rmsnorm_case, (9, 64), {"residual": True}),
        (og.swiglu_case, (3, 192)),
        (og.rope_case, (1, 4, 2, 5, 16)),
        (og.cross_entropy_case, (10, 48, 1000)),
    ),
    model=TINY,
    model_tokens=(1, 6),
    e2e_data=(16, 6, 2),
    e2e_steps=3,
    e2e_lr=3e-3,
    e2e_runs=2,
    repeat_steps=2,
    every=2,
    matmul=(16, 256, 16),
    index_add=1 << 10,
)
# --8<-- [end:plan]


# --8<-- [start:gates]
def source_values(plan: Plan, device) -> dict:
    """TF32 off and on: max |C - C_fp64| / (|A||B|) and the bound derived for it; index_add_
    with atomic adds and with deterministic algorithms: distinct results of 8 identical calls."""
    m, k, n = plan.matmul
    err = sources.matmul_errors(device, m, k, n)
    bound = {"ieee": gamma(k), "tf32": 2 * 2.0**-10 + 2.0**-20 + gamma(k)}
    calls = {mode: sources.index_add_distinct(device, mode == "deterministic", n=plan.index_add)
             for mode in ("atomic", "deterministic")}  # fmt: skip
    return {
        "matmul": [{"precision": p, "error": err[p], "bound": bound[p]} for p in err],
        "tf32_over_ieee": err["tf32"] / err["ieee"],
        "index_add": [{"mode": mode, "distinct": d} for mode, d in calls.items()],
    }


def op_values(plan: Plan, dtype, device) -> dict:
    """Gate 1: error / bound of every output and gradient; where a kernel promises eager's
    rounding, the fraction of elements that differ from eager, the fraction allowed and the
    largest gap in ULPs."""
    rows = []
    for builder, args, *kw in plan.op_cases:
        case = builder(*args, dtype, device, **(kw[0] if kw else {}))
        with strict_numerics():  # the cross-entropy bound assumes fp32 accumulation in cuBLAS
            report = og.op_gate(case, og.OURS[case.name])
        for key, ratio in report.ratios.items():
            row = {"op": case.name, "tensor": key, "ratio": ratio}
            if key in report.parity:
                mismatch, max_ulp, allowed = report.parity[key]
                row |= {"mismatch": mismatch, "allowed": allowed, "max_ulp": max_ulp}
            rows.append(row)
    return {"tensors": rows}


KINDS = {"activation": "activation", "loss": "loss", "gradient": "gradient",
         "parameter gradient": "param"}  # fmt: skip


def model_values(plan: Plan, dtype, device) -> dict:
    """Gate 2 with all kernels (and the fused add + RMSNorm forward), site by site; then one
    kernel at a time; then planted bug 4 (RoPE tables in bf16)."""
    batch, seq = plan.model_tokens
    ids = e2e.sequences(batch, seq, plan.model.vocab_size, seed=1).to(device)
    eager = e2e.initial_model(plan.model, None, dtype, device)

    def gate(kernels, forward=None):
        fused = e2e.initial_model(plan.model, kernels, dtype, device)  # the same weights
        return mg.model_gate(eager, fused, ids, ids, forward)

    def worst(report):
        return max(s.fused / s.bound for s in report.sites)

    report = gate(TRITON, fused_loss)
    sites = [{"site": s.name, "kind": KINDS[s.kind], "eager": s.eager, "fused": s.fused,
              "of_bound": s.fused / s.bound} for s in report.sites]  # fmt: skip
    ablation = [{"kernel": name, "worst": worst(gate(kernels))}
                for name, kernels in one_at_a_time(TRITON)]  # fmt: skip
    bug = gate(Kernels(rope=planted.rope_bf16_tables(plan.model.rope_theta)))
    rope_bug = {"first": bug.first_failure("activation"), "worst": worst(bug)}
    return {"sites": sites, "ablation": ablation, "rope_bug": rope_bug}


def e2e_runs(plan: Plan, dtype, device) -> dict:
    """Gate 3: the fused candidate and planted bug 4 against one band; a second, identical
    eager run (its first steps); an eager run from another initial seed."""
    n, seq, batch = plan.e2e_data
    steps = e2e.batches(e2e.sequences(n, seq, plan.model.vocab_size), plan.e2e_steps, batch)
    lr = plan.e2e_lr
    runs = e2e.eager_runs(plan.model, steps, lr, dtype, device, runs=plan.e2e_runs)
    fused = e2e.e2e_gate(plan.model, TRITON, steps, lr, dtype, device, fused_loss, runs)
    rope_bug = Kernels(rope=planted.rope_bf16_tables(plan.model.rope_theta))  # planted bug 4
    bug = e2e.e2e_gate(plan.model, rope_bug, steps, lr, dtype, device, runs=runs)

    def eager(seed=0):
        return e2e.initial_model(plan.model, None, dtype, device, seed=seed)

    repeat = e2e.train(eager(), steps[: plan.repeat_steps], lr)
    return {"fused": fused, "bug": bug, "repeat": repeat,
            "other_seed": e2e.train(eager(seed=1), steps, lr)}  # fmt: skip


def e2e_values(runs: dict, every: int) -> dict:
    """The loss curves every `every` steps (and at the last), the largest |fused - eager| /
    band over all steps, the same for the bug, and how far the repeat and the other seed go."""
    fused = runs["fused"]
    last = len(fused.eager) - 1
    curve = [{"step": t, "eager": fused.eager[t].item(), "fused": fused.fused[t].item(),
              "deviation": (fused.fused[t] - fused.eager[t]).abs().item(),
              "band": fused.band[t].item(), "ratio": fused.ratio[t].item()}
             for t in sorted({*range(0, last, every), last})]  # fmt: skip
    repeat = runs["repeat"]
    seed_spread = (runs["other_seed"] - fused.eager).abs().max().item()
    return {
        "curve": curve,
        "worst_ratio": fused.ratio.max().item(),
        "bug_worst_ratio": runs["bug"].ratio.max().item(),
        "repeat_max": (repeat - fused.eager[: len(repeat)]).abs().max().item(),
        "seed_spread": seed_spread,
        "seed_over_band": seed_spread / fused.band.max().item(),
    }


# --8<-- [end:gates]
