"""On the H200: a real training step of the shared Qwen3 model; its TGS and MFU by the formulas."""

from dataclasses import replace

import torch

from snippets.common.bench import ceilings, time_ms
from snippets.common.hardware import gpu_for_device_name
from snippets.common.results import write_result
from snippets.metrics.training import flops_per_token_6n, flops_per_token_palm, mfu, tgs
from snippets.qwen3_fusion.model import QWEN3_8B, Qwen3ForCausalLM

# --8<-- [start:step]
CFG = replace(QWEN3_8B, num_hidden_layers=8)  # Qwen3-8B width, 8 of its 36 layers
BATCH, SEQ = 2, 4096
torch.manual_seed(0)
model = Qwen3ForCausalLM(CFG).to("cuda", torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
ids = torch.randint(0, CFG.vocab_size, (BATCH, SEQ), device="cuda")


def step():
    opt.zero_grad(set_to_none=True)
    model(ids, labels=ids).backward()  # next-token loss over the whole batch
    opt.step()


ms = time_ms(step, warmup=500, rep=3000)["median"]
# --8<-- [end:step]

# --8<-- [start:metrics]
# N for 6N: weights that multiply every token; the input embedding is a lookup, not a matmul.
n_matmul = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
tokens = BATCH * SEQ  # tokens per step (the loss covers SEQ - 1 of each row; FLOPs cover SEQ)
gpu = gpu_for_device_name(torch.cuda.get_device_name())
seconds = ms / 1e3
per_gpu = tgs(tokens, seconds, n_gpus=1)
flops_6n = flops_per_token_6n(n_matmul)
flops_palm = flops_per_token_palm(
    n_matmul, CFG.num_hidden_layers, CFG.num_attention_heads, CFG.head_dim, SEQ
)
rows = [
    {
        "convention": convention,
        "tflop_per_token": fpt / 1e12,
        "mfu_datasheet": mfu(per_gpu, fpt, 1, gpu.bf16_dense_tflops * 1e12),
        "mfu_measured_ceiling": mfu(per_gpu, fpt, 1, ceilings()["bf16_matmul_flop_per_s"]),
    }
    for convention, fpt in (("6N", flops_6n), ("6N + 12LHQT（PaLM）", flops_palm))
]
write_result(
    "metrics",
    "qwen3-training-step",
    title=(
        f"Qwen3（宽度同 8B，{CFG.num_hidden_layers} 层）一步训练：bf16，AdamW，{BATCH}×{SEQ} token"
    ),
    model=(
        "每 token FLOP = 6N 或 6N + 12·L·H·Q·T（N 为矩阵乘参数，不含输入嵌入）；"
        "MFU = TGS × 每 token FLOP ÷ 峰值"
    ),
    values={
        "layers": CFG.num_hidden_layers,
        "n_matmul_b": n_matmul / 1e9,
        "step_ms": ms,
        "tgs": per_gpu,
        "mfu_6n": rows[0]["mfu_datasheet"],
        "mfu_palm": rows[1]["mfu_datasheet"],
        "mfu_palm_measured_ceiling": rows[1]["mfu_measured_ceiling"],
        "datasheet_bf16_tflops": gpu.bf16_dense_tflops,
    },
    table={
        "columns": [
            {"key": "convention", "label": "FLOP 口径"},
            {"key": "tflop_per_token", "label": "每 token TFLOP", "format": ".4f"},
            {"key": "mfu_datasheet", "label": "MFU（对数据手册峰值）", "format": ".1%"},
            {"key": "mfu_measured_ceiling", "label": "对实测矩阵乘上限", "format": ".1%"},
        ],
        "rows": rows,
    },
    sources=[
        "snippets/metrics/bench_training.py",
        "snippets/metrics/training.py",
        "snippets/qwen3_fusion/model.py",
        "snippets/common/hardware.py",
        "data/hardware.yaml",
    ],
)
# --8<-- [end:metrics]
