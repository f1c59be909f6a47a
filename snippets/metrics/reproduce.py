"""Reproductions: feed the functions the inputs a paper published, compare with what it printed.

A printed number only says which interval the true value lies in. `Printed("46.2")` stands for
[46.15, 46.25]; a formula evaluated at every corner of its printed inputs' intervals gives the
interval the published result must fall in (the formulas here are monotone in each input), and
a reproduction passes when the two intervals overlap. No tolerance is chosen by hand.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from snippets.common.hardware import load_hardware
from snippets.common.results import computed_result
from snippets.metrics.memory import zero_model_state_bytes
from snippets.metrics.qwen3 import QWEN3_8B, qwen3_params
from snippets.metrics.serving import disaggregated_goodput
from snippets.metrics.training import (
    flops_per_token_6n,
    flops_per_token_palm,
    megatron_flops_per_iteration,
    megatron_params,
    mfu,
    training_days,
    utilization,
)


# --8<-- [start:printed]
@dataclass(frozen=True)
class Printed:
    """A number as a paper printed it, e.g. Printed("46.2"); truncated=True when the source
    sometimes cuts digits instead of rounding them (then 4011 may stand for 4011.7)."""

    text: str
    truncated: bool = False

    @property
    def value(self) -> float:
        return float(self.text)

    @property
    def interval(self) -> tuple[float, float]:
        decimals = len(self.text.partition(".")[2])
        unit = 10.0**-decimals
        top = unit if self.truncated else unit / 2
        return self.value - unit / 2, self.value + top


def span(f, *args) -> tuple[float, float]:
    """Smallest and largest f over the corners of the Printed arguments' intervals."""
    choices = [a.interval if isinstance(a, Printed) else (a,) for a in args]
    values = [f(*corner) for corner in itertools.product(*choices)]
    return min(values), max(values)


def point(x: float) -> tuple[float, float]:
    """An exactly computed value, as an interval."""
    return x, x


def reproduces(computed: tuple[float, float], published: Printed) -> bool:
    """True when the computed interval overlaps the interval the published number stands for."""
    lo, hi = published.interval
    eps = 1e-9 * max(abs(lo), abs(hi), 1.0)  # the edges themselves, despite float rounding
    return computed[0] <= hi + eps and computed[1] >= lo - eps


# --8<-- [end:printed]


# --8<-- [start:palm]
# PaLM (Chowdhery et al. 2022, arXiv:2204.02311). Table 1: 540B model, 118 layers, 48 heads,
# head size 256, sequence 2048. Appendix B: 238.3K tokens/s on 6144 TPU v4 chips, each 275
# peak TFLOP/s; "45.7% without self-attention ... or 46.2% with it".
def palm_mfu(k_tokens_per_s, attention: bool) -> float:
    n = 540e9  # App. B writes the 6N term with N = 540 (billion)
    f = flops_per_token_palm(n, 118, 48, 256, 2048) if attention else flops_per_token_6n(n)
    return 100 * mfu(k_tokens_per_s * 1e3, f, n_chips=6144, peak_flops=275e12)


throughput = Printed("238.3")  # K tokens/s
for attention, published in ((False, Printed("45.7")), (True, Printed("46.2"))):
    lo, hi = span(lambda x, a=attention: palm_mfu(x, a), throughput)
    print(f"{lo:.2f}..{hi:.2f} %", published.text, reproduces((lo, hi), published))
    #> 45.69..45.71 % 45.7 True
    #> 46.19..46.21 % 46.2 True
# --8<-- [end:palm]


# --8<-- [start:zero]
# ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054) Table 1: per-device model-state memory in GB
# for stages P_os, P_os+g, P_os+g+p at DP degree 1 ... 1024. Large cells are truncated
# (4011.7 is printed 4011), small ones rounded (21.5625 is printed 21.6).
ZERO_TABLE1 = {  # model -> {DP degree: (P_os, P_os+g, P_os+g+p)}
    7.5e9: {1: ("120", "120", "120"), 4: ("52.5", "41.3", "30"), 16: ("35.6", "21.6", "7.5"),
            64: ("31.4", "16.6", "1.88"), 256: ("30.4", "15.4", "0.47"),
            1024: ("30.1", "15.1", "0.12")},
    128e9: {1: ("2048", "2048", "2048"), 4: ("896", "704", "512"), 16: ("608", "368", "128"),
            64: ("536", "284", "32"), 256: ("518", "263", "8"), 1024: ("513", "257", "2")},
    1e12: {1: ("16000", "16000", "16000"), 4: ("7000", "5500", "4000"),
           16: ("4750", "2875", "1000"), 64: ("4187", "2218", "250"),
           256: ("4046", "2054", "62.5"), 1024: ("4011", "2013", "15.6")},
}  # fmt: skip
cells = [
    (psi, nd, stage, Printed(text, truncated=True))
    for psi, rows in ZERO_TABLE1.items()
    for nd, texts in rows.items()
    for stage, text in zip((1, 2, 3), texts, strict=True)
]
ok = [reproduces(point(zero_model_state_bytes(psi, nd, s) / 1e9), c) for psi, nd, s, c in cells]
print(len(cells), all(ok))
#> 54 True
# Figure 1: 7.5B parameters, 64-way data parallelism: 120 GB -> 31.4 / 16.6 / 1.9 GB
print([round(zero_model_state_bytes(7.5e9, 64, stage) / 1e9, 1) for stage in range(4)])
#> [120.0, 31.4, 16.6, 1.9]
# --8<-- [end:zero]


# --8<-- [start:megatron]
# Megatron-LM (Narayanan et al. 2021, arXiv:2104.04473) Table 1: GPT models with V = 51200,
# s = 2048; "Number of parameters (billion)" against eq. 2 from (layers, hidden size).
MEGATRON_TABLE1 = [  # (parameters printed, layers, hidden)
    ("1.7", 24, 2304), ("3.6", 30, 3072), ("7.5", 36, 4096), ("18.4", 40, 6144),
    ("39.1", 48, 8192), ("76.1", 60, 10240), ("145.6", 80, 12288), ("310.1", 96, 16384),
    ("529.6", 105, 20480), ("1008.0", 128, 25600),
]  # fmt: skip
ok = [
    reproduces(point(megatron_params(l, h, 51200, 2048) / 1e9), Printed(text))
    for text, l, h in MEGATRON_TABLE1
]
print(all(ok))
#> True
# §5.1 and eq. 4: GPT-3 (175B, 300B tokens, 1024 GPUs at 140 TFLOP/s) "34 days"; the 1T model
# (450B tokens, 3072 GPUs at 163 TFLOP/s) "84 days".
gpt3 = span(lambda x: training_days(300e9, 175e9, 1024, x * 1e12), Printed("140"))
print(f"{gpt3[0]:.2f}..{gpt3[1]:.2f}", reproduces(gpt3, Printed("34")))
#> 33.79..34.03 True
days_1t = {}  # "1 trillion" only reproduces with Table 1's 1008.0B model
for params in (1e12, 1008.0e9):
    t = days_1t[params] = span(
        lambda x, p=params: training_days(450e9, p, 3072, x * 1e12), Printed("163")
    )
    print(f"{params / 1e9:.0f}B: {t[0]:.2f}..{t[1]:.2f}", reproduces(t, Printed("84")))
    #> 1000B: 82.96..83.47 False
    #> 1008B: 83.62..84.13 True
# --8<-- [end:megatron]


# --8<-- [start:korthikanti]
# Korthikanti et al. 2022 (arXiv:2205.05198) Table 3 (configs; s = 2048, V = 51200, no data
# parallelism) and Table 5 ("Present Work" iteration time; MFU and HFU), on A100s.
A100 = load_hardware()["a100-sxm-80gb"].bf16_dense_tflops * 1e12  # the 312 TFLOP/s peak
KORTHIKANTI = {  # name: (layers, hidden, global batch, GPUs, seconds, MFU %, HFU %)
    "22B": (48, 6144, 4, 8, "1.10", "41.5", "43.7"),
    "175B": (96, 12288, 64, 64, "13.75", "51.4", "52.8"),
    "530B": (105, 20480, 280, 280, "37.83", "56.0", "57.0"),
    "1T": (128, 25600, 512, 512, "71.49", "56.3", "57.0"),
}


def table5(l, h, batch, gpus, recompute):
    flops = megatron_flops_per_iteration(batch, 2048, l, h, 51200, recompute)
    return lambda seconds: 100 * utilization(flops, seconds, gpus, A100)


for name, (l, h, batch, gpus, secs, mfu_pct, hfu_pct) in KORTHIKANTI.items():
    m = span(table5(l, h, batch, gpus, "none"), Printed(secs))  # model FLOPs: eq. 7
    hw = span(table5(l, h, batch, gpus, "selective"), Printed(secs))  # hardware FLOPs: eq. 8
    ok_m, ok_hw = reproduces(m, Printed(mfu_pct)), reproduces(hw, Printed(hfu_pct))
    print(name, f"MFU {m[0]:.2f}..{m[1]:.2f} {ok_m}  HFU {hw[0]:.2f}..{hw[1]:.2f} {ok_hw}")
    #> 22B MFU 41.46..41.84 True  HFU 43.61..44.01 True
    #> 175B MFU 51.37..51.41 True  HFU 52.75..52.79 True
    #> 530B MFU 56.04..56.05 True  HFU 56.96..56.97 True
    #> 1T MFU 56.26..56.27 True  HFU 57.00..57.01 True
# --8<-- [end:korthikanti]

# --8<-- [start:eq8_text]
# What the text describes: one extra forward of QK^T and of attention x V per layer
# (2Bs^2h + 2Bs^2h), i.e. 1 + s/4.5h on top of eq. 7 instead of the printed 1 + s/3h.
l, h, batch, gpus, secs, _, hfu_pct = KORTHIKANTI["530B"]
as_text = 72 * batch * 2048 * l * h**2 * (1 + 2048 / (4.5 * h) + 51200 / (12 * l * h))
hfu_as_text = utilization(as_text, float(secs), gpus, A100)
print(f"{hfu_as_text:.1%}", reproduces(point(100 * hfu_as_text), Printed(hfu_pct)))
#> 56.4% False
# --8<-- [end:eq8_text]


# --8<-- [start:distserve]
# DistServe (Zhong et al., OSDI 2024, arXiv:2401.09670) §1: a 13B model on A100s, 90 % SLO
# attainment. Colocated: about 1.6 rps per GPU. Prefill-only GPU 5.6 rps, decode-only 10 rps;
# "2 GPUs for prefill and 1 GPU for decoding ... 3.3 rps per GPU, which is 2.1x higher".
per_gpu = span(lambda p, d: disaggregated_goodput(p, 2, d, 1), Printed("5.6"), Printed("10"))
gain = span(lambda p, d, c: disaggregated_goodput(p, 2, d, 1) / c,
            Printed("5.6"), Printed("10"), Printed("1.6"))  # fmt: skip
print(f"{per_gpu[0]:.2f}..{per_gpu[1]:.2f}", reproduces(per_gpu, Printed("3.3")))
#> 3.17..3.50 True
print(f"{gain[0]:.2f}..{gain[1]:.2f}", reproduces(gain, Printed("2.1")))
#> 1.92..2.26 True
# --8<-- [end:distserve]


# --8<-- [start:qwen3]
# Qwen3-8B model card: "Number of Parameters: 8.2B", "(Non-Embedding): 6.95B".
p = qwen3_params(QWEN3_8B)
total, non_embedding = p["total"] / 1e9, p["non_embedding"] / 1e9
print(reproduces(point(total), Printed("8.2")), reproduces(point(non_embedding), Printed("6.95")))
#> True True
# --8<-- [end:qwen3]

# The figures the page quotes, checked on every run (results/metrics/reproductions.json).
computed_result(
    "metrics",
    "reproductions",
    {
        # two cells of ZeRO's Table 1 as computed: printed truncated (4011) and rounded (21.6)
        "zero_1t_os_1024_gb": zero_model_state_bytes(1e12, 1024, 1) / 1e9,
        "zero_7_5b_osg_16_gb": zero_model_state_bytes(7.5e9, 16, 2) / 1e9,
        "megatron_1t_days": [
            {"params_b": params / 1e9, "days_lo": lo, "days_hi": hi}
            for params, (lo, hi) in days_1t.items()
        ],
        "hfu_530b_as_text": hfu_as_text,
    },
)
