"""On the H200 (nox -s gpu_docs): load the shared target and draft (trained by the
trained-models post earlier in the same run), train the EAGLE-3 heads, measure acceptance,
round times and speedups with graph_ms, and write results/speculative-decoding/*.json.

Wall time, estimated from the H200 run at d00b949 (77.0 s for the post, 67.5 s in this file;
80 graph_ms calls took 30.8 s, settling included: 0.385 s a call): now 49 calls (the target's
2 steps and 4 passes, a round and a draft for 3 drafters x 4 (gamma, mode), 5 + 5 + 9 for
batches 16, 64 and 256; batch 1 reuses the batch-1 timings) ~18.9 s, 11.9 s less; 16 runs that
count acceptance instead of 24 and 30 timing engines instead of 57, ~2-4 s less: about 61-63 s
for the post, the rest unchanged (head training, the acceptance runs, loading, pytest).
"""

import torch

import snippets.speculative_decoding.bench as B
from snippets.common.bench import _traced, ceilings, graph_ms
from snippets.common.corpus import token_streams
from snippets.common.models.trained_configs import load_trained_models
from snippets.common.results import write_result
from snippets.common.train import trained
from snippets.speculative_decoding.bench import Sizes, measure

# where the seconds outside graph_ms go (gpu_docs prints the trace per call site)
B.train_heads, B.acceptance, B.agreement = (_traced(f) for f in (B.train_heads, B.acceptance,
                                                                  B.agreement))  # fmt: skip
token_streams, trained = _traced(token_streams), _traced(trained)

# --8<-- [start:run]
torch.manual_seed(0)  # the draws of sampled decoding
spec = load_trained_models()
train_stream, heldout = token_streams(spec)
target, draft = trained("target", spec=spec).model, trained("draft", spec=spec).model
settled = []


def timer(fn):
    """graph_ms: a CUDA graph of back-to-back calls, replayed 7 times. The first timing settles
    the clocks for a second; every later one follows other GPU work and settles for 50 ms.
    A repeat is about 5 ms of back-to-back calls (a round takes well under a millisecond).
    One eager warm-up call before the capture, as run() does for the acceptance runs: the
    default three add two eager calls per timing, bound by launches from Python (the 49
    timings took 20.9 s on a slow host, 3.5 s of it settling)."""
    settle = 50.0 if settled else 1000.0
    settled.append(fn)
    return graph_ms(fn, target_ms=5.0, settle_ms=settle, warmup=1)


copy = ceilings()["copy_bytes_per_s"].median  # measured once per gpu_docs run
records = measure(target, draft, train_stream, heldout, Sizes(), timer, copy)
for name, values in records.items():
    write_result("speculative-decoding", name, values)
# --8<-- [end:run]
