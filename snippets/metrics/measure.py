"""The page's two GPU measurements, as functions: bf16 matmuls rated against the roofline, and
one training step of the shared Qwen3 model turned into TGS and MFU by the page's formulas.

bench_matmul.py and bench_training.py run them on the GPU with the handbook's timers;
tests/snippets/test_metrics.py runs them on the CPU at tiny shapes, and at the real shapes on
the meta device, with a stand-in timer.
"""

from dataclasses import replace

import torch

from snippets.common.bench import rate
from snippets.common.models.qwen3 import QWEN3_8B, Qwen3ForCausalLM
from snippets.metrics.roofline import (
    arithmetic_intensity,
    attainable_flops,
    matmul_bytes,
    matmul_flops,
)
from snippets.metrics.training import flops_per_token_6n, flops_per_token_palm, mfu, tgs

# --8<-- [start:matmul]
SQUARE = (256, 512, 1024, 2048, 4096, 8192)  # n x n x n
MLP = (12288, 4096)  # (n, k) of Qwen3-8B's MLP up-projection, 4096 -> 12288
MLP_TOKENS = (1, 16, 64, 256, 1024)  # m tokens through it: decode to prefill


def matmul_point(m, n, k, timer, peak, bandwidth, ceiling, device="cuda") -> dict:
    """Time a bf16 (m x k) @ (k x n) with `timer` (fn -> Stat in ms) and rate it against the
    roofline min(peak, intensity x bandwidth) and against a measured matmul ceiling (FLOP/s)."""
    torch.manual_seed(0)
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)  # random data, never zeros
    b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: a @ b)
    flops = matmul_flops(m, n, k)
    intensity = arithmetic_intensity(flops, matmul_bytes(m, n, k))
    achieved = rate(flops, ms)  # a Stat: the timing's range carries over
    return {
        "intensity": intensity,
        "ms": ms,
        "tflops": achieved / 1e12,
        "of_roofline": achieved / attainable_flops(intensity, peak, bandwidth),
        "of_matmul_ceiling": achieved / ceiling,
    }


def matmul_sweep(timer, peak, bandwidth, ceilings, device="cuda", square=SQUARE,
                 tokens=MLP_TOKENS, mlp=MLP) -> dict:  # fmt: skip
    """Every shape as a row, with the ceilings measured in the same run (`ceilings()`)."""
    flop_ceiling = ceilings["bf16_matmul_flop_per_s"]
    rows = []
    for n in square:
        point = matmul_point(n, n, n, timer, peak, bandwidth, flop_ceiling, device)
        rows.append({"family": "square", "n": n, **point})
    n, k = mlp
    for m in tokens:
        point = matmul_point(m, n, k, timer, peak, bandwidth, flop_ceiling, device)
        # the weight matrix is larger than the L2: every call reads it from HBM again
        point["tb_per_s"] = rate(matmul_bytes(m, n, k), point["ms"]) / 1e12
        rows.append({"family": "mlp", "m": m, **point})
    return {
        "rows": rows,
        "matmul_ceiling_tflops": flop_ceiling / 1e12,
        "copy_tb_s": ceilings["copy_bytes_per_s"] / 1e12,
    }


# --8<-- [end:matmul]


# --8<-- [start:step]
STEP_CFG = replace(QWEN3_8B, num_hidden_layers=8)  # Qwen3-8B width, 8 of its 36 layers
BATCH, SEQ = 2, 4096


def make_step(cfg, batch, seq, device="cuda"):
    """One full training step of a Qwen3 model with random bf16 weights: forward, next-token
    loss, backward, fused AdamW. Returns it and N, the weights that multiply every token."""
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: an 8B-wide model is slow to init on a CPU
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
        ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def step():
        opt.zero_grad(set_to_none=True)
        model(ids, labels=ids).backward()  # next-token loss over the whole batch
        opt.step()

    # N for 6N: every parameter but the input embedding, which is a lookup, not a matmul. A tied
    # LM head is that same tensor (parameters() yields it once), yet it multiplies every token.
    embedding = model.model.embed_tokens.weight
    n_matmul = sum(p.numel() for p in model.parameters()) - embedding.numel()
    if model.lm_head.weight is embedding:
        n_matmul += embedding.numel()
    return step, n_matmul


def step_metrics(ms, tokens, n_matmul, cfg, seq, peak, ceiling) -> dict:
    """TGS and MFU of one GPU doing `tokens` tokens per step in `ms` (a Stat). FLOPs per token
    counted two ways (6N; PaLM's 6N + 12LHQT), each over the datasheet peak and over the matmul
    ceiling measured in the same run (both FLOP/s)."""
    per_gpu = tgs(tokens, ms / 1e3, n_gpus=1)
    per_token = {
        "6n": flops_per_token_6n(n_matmul),
        "palm": flops_per_token_palm(
            n_matmul, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.head_dim, seq
        ),
    }
    return {
        "step_ms": ms,
        "tgs": per_gpu,
        "flops": [
            {
                "count": count,
                "tflop_per_token": f / 1e12,
                "mfu": mfu(per_gpu, f, 1, peak),
                "of_matmul_ceiling": mfu(per_gpu, f, 1, ceiling),
            }
            for count, f in per_token.items()
        ],
    }


# --8<-- [end:step]
