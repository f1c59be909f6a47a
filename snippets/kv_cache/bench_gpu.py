"""On the GPU (nox -s gpu_docs): the paged decode kernel at Qwen3-8B's attention heads, on a bf16
and an FP8 cache, against SDPA on a contiguous cache; writes results/kv-cache/paged-decode.json."""

import torch

from snippets.common.bench import ceilings, kernel_ms_each
from snippets.common.models.kv_configs import kv_config
from snippets.common.results import write_result
from snippets.kv_cache.paged_measure import Heads, measure

# --8<-- [start:run]
HEADS = Heads.of(kv_config("qwen3-8b"))  # from data/qwen3.yaml
SHAPES = [(batch, context) for batch in (1, 4, 16, 64) for context in (1024, 4096, 16384, 32768)]
copy = ceilings()["copy_bytes_per_s"]  # measured in this run
l2 = torch.cuda.get_device_properties("cuda").L2_cache_size
rows = measure(SHAPES, HEADS, "cuda", torch.bfloat16, kernel_ms_each, copy, rotate_bytes=4 * l2)
# --8<-- [end:run]

# --8<-- [start:record]
write_result("kv-cache", "paged-decode", {"copy_tb_s": copy / 1e12, "rows": rows})
# --8<-- [end:record]
