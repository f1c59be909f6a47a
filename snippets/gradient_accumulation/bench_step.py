"""Measured on the GPU: peak memory and step time of one global batch split into k micro-batches."""

import torch

from snippets.common.bench import ceilings, rate, time_ms
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result

# --8<-- [start:model]
HIDDEN, LAYERS, TOKENS = 4096, 4, 16384  # one global batch: 16384 tokens of width 4096


class Block(torch.nn.Module):
    """A transformer-sized MLP block: 4096 -> 16384 -> 4096 with a residual."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(HIDDEN, 4 * HIDDEN, bias=False)
        self.down = torch.nn.Linear(4 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def make_step(k):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(LAYERS)]).cuda().bfloat16()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def step():
        opt.zero_grad(set_to_none=True)
        for xb in x.chunk(k):
            (model(xb).float().pow(2).mean() / k).backward()
        opt.step()

    n_params = sum(p.numel() for p in model.parameters())
    return step, n_params


# --8<-- [end:model]


# --8<-- [start:measure]
rows = []
for k in (1, 2, 4, 8, 16):
    step, n_params = make_step(k)
    step()  # warm-up: allocates optimizer state and grads
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    t = time_ms(step, warmup=300, rep=1500)
    flops = 6 * n_params * TOKENS  # matmul FLOPs: forward 2NT + backward 4NT
    achieved = rate(flops, t["median"])
    rows.append(
        {
            "k": k,
            "micro_tokens": TOKENS // k,
            "peak_gib": peak / 2**30,
            "ms": t["median"],
            "ms_p20": t["p20"],
            "ms_p80": t["p80"],
            "tflops": achieved / 1e12,
            "of_matmul_ceiling": achieved / ceilings()["bf16_matmul_flop_per_s"],
        }
    )
    del step
    torch.cuda.empty_cache()

gpu = gpu_for_device_name(torch.cuda.get_device_name())
by_k = {r["k"]: r for r in rows}
write_result(
    "gradient-accumulation",
    "accumulation-step",
    title="同一全局批（16384 token）切成 k 个微批：峰值显存与每步时间",
    model="FLOPs = 6 × 参数量 × token 数（只计矩阵乘：前向 2NT，反向 4NT）",
    values={
        "n_params_m": n_params / 1e6,
        "state_gib": n_params * 8 / 2**30,  # bf16 weight + grad + two AdamW moments: 8 B each
        "peak_gib_k1": by_k[1]["peak_gib"],
        "peak_gib_k16": by_k[16]["peak_gib"],
        "memory_saving_k16": 1 - by_k[16]["peak_gib"] / by_k[1]["peak_gib"],
        "slowdown_k16": by_k[16]["ms"] / by_k[1]["ms"] - 1,
        "matmul_ceiling_tflops": ceilings()["bf16_matmul_flop_per_s"] / 1e12,
        "copy_ceiling_tb_s": ceilings()["copy_bytes_per_s"] / 1e12,
        "datasheet_bf16_tflops": gpu.bf16_dense_tflops if gpu else None,
    },
    table={
        "columns": [
            {"key": "k", "label": "k"},
            {"key": "micro_tokens", "label": "微批 token 数"},
            {"key": "peak_gib", "label": "峰值显存 (GiB)", "format": ".2f"},
            {"key": "ms", "label": "每步时间 (ms, 中位数)", "format": ".1f"},
            {"key": "ms_p20", "label": "p20", "format": ".1f"},
            {"key": "ms_p80", "label": "p80", "format": ".1f"},
            {"key": "tflops", "label": "TFLOP/s", "format": ".0f"},
            {"key": "of_matmul_ceiling", "label": "占实测矩阵乘上限", "format": ".0%"},
        ],
        "rows": rows,
    },
    plot=[
        {"x": "k", "y": "peak_gib", "x_label": "累积步数 k", "y_label": "峰值显存 (GiB)"},
        {"x": "k", "y": "ms", "x_label": "累积步数 k", "y_label": "每步时间 (ms)"},
    ],
    sources=[
        "snippets/gradient_accumulation/bench_step.py",
        "snippets/common/hardware.py",
        "data/hardware.yaml",
    ],
)
# --8<-- [end:measure]
