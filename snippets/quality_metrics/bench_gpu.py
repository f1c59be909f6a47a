"""On the H200 (nox -s gpu_docs): every path of accelerated.py against the fp32 shared target
model, on GPU_PLAN's slices of its held-out stream; writes results/quality-metrics/accelerated.json.

Wall time, estimated from operation counts (the post's budget is 60 s from a cold start):
- the model: trained("target") loads the run's checkpoint (2.9 GB of fp32 weights, ~3 s) when
  the trained-models post ran first in this gpu_docs run, else trains it (~25 s);
- forwards: 2 N FLOP per token, N = 721 M weights multiplied per token (the tied head
  included), over 8 x 8 x 512 = 32,768 tokens: 47 TFLOP per path. The fp32 reference at the
  datasheet's 67 TFLOP/s (IEEE fp32, no TF32) >= 0.7 s; six bf16 paths at a few hundred
  TFLOP/s ~0.1 s each; the quantized ones also turn 688 M weights into bf16 per forward
  (~3 GB of traffic, ~1 ms);
- metrics: per slice and path, fp64 log-softmax and KL over 8 x 511 x 8192 logits (268 MB
  per tensor, a few passes): 56 x ~1.5 GB at ~4 TB/s ~0.02 s;
- Triton: importing the three kernel modules runs their bf16 checks (about ten forward and
  backward kernels) and the path compiles a few more specializations: ~10-15 s cold;
- the page's other sections and the unit tests: ~5 s, Python and CUDA start-up ~5 s.
About 30 s with the cached model, about 50 s when the model is trained here.
"""

from snippets.common.corpus import token_streams
from snippets.common.results import write_result
from snippets.common.train import trained
from snippets.quality_metrics.accelerated import GPU_PLAN, heldout_slices, measure, summarize

# --8<-- [start:run]
target = trained("target")  # fp32 weights, eval mode, on the GPU
_, heldout = token_streams()
slices = heldout_slices(heldout, target.train.seq_len, GPU_PLAN)
measured = measure(target.model, slices)  # the Triton path in bf16 here
write_result("quality-metrics", "accelerated", summarize(measured))
# --8<-- [end:run]
