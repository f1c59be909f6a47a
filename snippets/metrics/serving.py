"""Serving metrics from per-request token timestamps: TTFT, TPOT, ITL, E2E, throughput, goodput.

Definitions follow vLLM's `vllm bench serve` (vllm/benchmarks/serve.py, calculate_metrics) and,
for goodput, DistServe (Zhong et al., OSDI 2024, arXiv:2401.09670, §1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from snippets.common.results import computed_result


# --8<-- [start:record]
@dataclass(frozen=True)
class Request:
    """One streamed request as the client saw it. All times on one clock (here: ms).

    sent:          when the client sent the request
    chunks:        when each streamed chunk of output arrived (the first one carries token 1)
    output_tokens: tokens generated; None means one token per chunk. A chunk can carry
                   several tokens (speculative decoding, server-side batching of the stream).
    """

    sent: float
    chunks: tuple[float, ...]
    output_tokens: int | None = None

    @property
    def n_out(self) -> int:
        return len(self.chunks) if self.output_tokens is None else self.output_tokens


# --8<-- [end:record]


# --8<-- [start:latency]
def ttft(r: Request) -> float:
    """Time to first token: first chunk minus send time (queueing + prefill + network)."""
    return r.chunks[0] - r.sent


def e2e(r: Request) -> float:
    """End-to-end latency: last chunk minus send time."""
    return r.chunks[-1] - r.sent


def tpot(r: Request) -> float | None:
    """Time per output token, EXCLUDING the first: (E2E - TTFT) / (n - 1); None when n == 1."""
    if r.n_out < 2:
        return None
    return (e2e(r) - ttft(r)) / (r.n_out - 1)


def itls(r: Request) -> list[float]:
    """Inter-token latencies: one sample per gap between consecutive chunks."""
    return [b - a for a, b in zip(r.chunks, r.chunks[1:], strict=False)]


def pooled_itls(requests: list[Request]) -> list[float]:
    """ITL over a run: every gap of every request in one pool (long answers weigh more)."""
    return [gap for r in requests for gap in itls(r)]


# --8<-- [end:latency]


# --8<-- [start:percentile]
def percentile(values: list[float], p: float, method: str = "linear") -> float:
    """The p-th percentile (0 <= p <= 100) of values.

    "linear": numpy's default (Hyndman & Fan type 7): rank h = (n - 1) p / 100, interpolate
              between the two neighbouring order statistics. vllm bench serve uses this.
    "nearest-rank": the smallest value with at least p% of the values <= it:
              the ceil(n p / 100)-th order statistic (numpy method="inverted_cdf").
    """
    xs = sorted(values)
    if not xs or not 0 <= p <= 100:
        raise ValueError("need at least one value and 0 <= p <= 100")
    if method == "linear":
        h = (len(xs) - 1) * p / 100
        lo = math.floor(h)
        hi = min(lo + 1, len(xs) - 1)
        return xs[lo] + (h - lo) * (xs[hi] - xs[lo])
    if method == "nearest-rank":
        return xs[max(math.ceil(len(xs) * p / 100), 1) - 1]
    raise ValueError(f"unknown percentile method {method!r}")


# --8<-- [end:percentile]


# --8<-- [start:throughput]
def duration(requests: list[Request]) -> float:
    """Wall time of a run: first send to last chunk."""
    return max(r.chunks[-1] for r in requests) - min(r.sent for r in requests)


def request_throughput(requests: list[Request], seconds: float) -> float:
    """Completed requests per second."""
    return len(requests) / seconds


def output_token_throughput(requests: list[Request], seconds: float) -> float:
    """Generated tokens per second, over all requests (what 'tokens/s' usually means)."""
    return sum(r.n_out for r in requests) / seconds


# --8<-- [end:throughput]


# --8<-- [start:slo]
@dataclass(frozen=True)
class SLO:
    """Latency objectives for one request; None means 'no objective on this metric'."""

    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None


def meets(r: Request, slo: SLO) -> bool:
    """True only if the request meets EVERY objective (<=, as vllm bench serve).

    A one-token answer has no TPOT and cannot miss a TPOT objective (vLLM counts it as 0).
    """
    checks = [
        (slo.ttft, ttft(r)),
        (slo.tpot, tpot(r) or 0.0),
        (slo.e2e, e2e(r)),
    ]
    return all(limit is None or value <= limit for limit, value in checks)


def slo_attainment(requests: list[Request], slo: SLO) -> float:
    """Fraction of requests that meet all objectives at once (DistServe's 'SLO attainment')."""
    return sum(meets(r, slo) for r in requests) / len(requests)


def goodput(requests: list[Request], slo: SLO, seconds: float) -> float:
    """Requests per second that met every objective (vllm bench serve's request goodput)."""
    return sum(meets(r, slo) for r in requests) / seconds


def per_gpu_goodput(attainment_at_rate: dict[float, float], n_gpus: int, goal=0.9) -> float:
    """DistServe §1: the highest tested request rate whose SLO attainment >= goal, per GPU.

    attainment_at_rate maps an offered rate (req/s) to the attainment measured at that rate;
    no interpolation between tested rates.
    """
    ok = [rate for rate, attained in attainment_at_rate.items() if attained >= goal]
    return max(ok, default=0.0) / n_gpus


def disaggregated_goodput(prefill_rate, n_prefill, decode_rate, n_decode) -> float:
    """Per-GPU goodput of n_prefill prefill GPUs feeding n_decode decode GPUs (DistServe §1).

    prefill_rate / decode_rate: per-GPU goodput of a GPU that runs only that phase. The
    pipeline serves the slower side's rate; divide by all the GPUs it uses.
    """
    return min(prefill_rate * n_prefill, decode_rate * n_decode) / (n_prefill + n_decode)


# --8<-- [end:slo]


# --8<-- [start:trace]
# A hand-checked trace (times in ms). C streams 2 tokens per chunk (e.g. speculative decoding).
A = Request(sent=0, chunks=(200, 220, 240, 260, 280))  # 5 tokens
B = Request(sent=0, chunks=(900, 930, 960))  # 3 tokens, slow to start
C = Request(sent=100, chunks=(400, 520, 640), output_tokens=5)  # 5 tokens in 3 chunks
trace = [A, B, C]

print([ttft(r) for r in trace])
#> [200, 900, 300]
print([tpot(r) for r in trace])
#> [20.0, 30.0, 60.0]
print([e2e(r) / r.n_out for r in trace])  # WRONG "TPOT": the first token's wait leaks in
#> [56.0, 320.0, 108.0]
print([itls(r) for r in trace])
#> [[20, 20, 20, 20], [30, 30], [120, 120]]
# mean TPOT weighs requests equally; mean ITL weighs every gap equally:
print(sum(tpot(r) for r in trace) / 3, sum(pooled_itls(trace)) / len(pooled_itls(trace)))
#> 36.666666666666664 47.5
# --8<-- [end:trace]

# --8<-- [start:trace_percentiles]
gaps = pooled_itls(trace)
print(percentile(gaps, 50), percentile(gaps, 50, "nearest-rank"))
#> 25.0 20
firsts = [ttft(r) for r in trace]
print(percentile(firsts, 90), percentile(firsts, 90, "nearest-rank"))
#> 780.0 900
# --8<-- [end:trace_percentiles]

# --8<-- [start:trace_goodput]
slo = SLO(ttft=500, tpot=50)  # ms
print([meets(r, slo) for r in trace])  # B misses TTFT, C misses TPOT
#> [True, False, False]
per_metric = [sum(ttft(r) <= 500 for r in trace) / 3, sum(tpot(r) <= 50 for r in trace) / 3]
print(per_metric, slo_attainment(trace, slo))  # 2/3 meet each objective, 1/3 meet both
#> [0.6666666666666666, 0.6666666666666666] 0.3333333333333333
seconds = duration(trace) / 1000  # the run took 0.96 s
print(round(request_throughput(trace, seconds), 3), round(goodput(trace, slo, seconds), 3))
#> 3.125 1.042
print(round(output_token_throughput(trace, seconds), 2))
#> 13.54
# --8<-- [end:trace_goodput]

# The figures the page quotes, checked on every run (results/metrics/serving-trace.json).
computed_result(
    "metrics",
    "serving-trace",
    {
        "requests": [
            {
                "req": name,
                "ttft": ttft(r),
                "tpot": tpot(r),
                "e2e_per_token": e2e(r) / r.n_out,  # the wrong "TPOT"
                "itl": itls(r),
            }
            for name, r in zip("ABC", trace, strict=True)
        ],
        "p90_ttft": {
            "linear": percentile(firsts, 90),
            "nearest_rank": percentile(firsts, 90, "nearest-rank"),
        },
        "ttft_met": sum(ttft(r) <= slo.ttft for r in trace),
        "tpot_met": sum(tpot(r) <= slo.tpot for r in trace),
        "attainment": slo_attainment(trace, slo),
        "request_throughput": request_throughput(trace, seconds),
        "goodput": goodput(trace, slo, seconds),
    },
)
