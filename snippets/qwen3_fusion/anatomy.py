"""Read the architecture from code: parameter counts, shapes, and the per-operator accounting."""

import torch

from snippets.common.hardware import load_hardware, ridge_point
from snippets.common.models.qwen3 import QWEN3_8B, TINY, Qwen3ForCausalLM, count_parameters
from snippets.qwen3_fusion.accounting import layer_ops, model_forward_flops, rule_of_thumb_flops

# --8<-- [start:params]
counts = count_parameters(QWEN3_8B)
print(f"{counts['total']:,} parameters, {counts['non_embedding']:,} without embedding and LM head")
#> 8,190,735,360 parameters, 6,946,075,648 without embedding and LM head
cfg = QWEN3_8B
per_layer = (counts["non_embedding"] - cfg.hidden_size) // cfg.num_hidden_layers
attn = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
mlp = 3 * cfg.hidden_size * cfg.intermediate_size
print(f"per layer {per_layer:,}: attention {attn / per_layer:.1%}, MLP {mlp / per_layer:.1%}")
#> per layer 192,946,432: attention 21.7%, MLP 78.3%
# --8<-- [end:params]

# --8<-- [start:shapes]
torch.manual_seed(0)
tiny = Qwen3ForCausalLM(TINY)
ids = torch.randint(0, TINY.vocab_size, (2, 16))
print(tiny(ids).shape, tiny(ids, labels=ids).shape)  # logits; scalar loss
#> torch.Size([2, 16, 1000]) torch.Size([])
# --8<-- [end:shapes]

# --8<-- [start:accounting]
h200 = load_hardware()["h200-sxm"]
ridge = ridge_point(h200)  # FLOP per byte where HBM time equals bf16 matmul time
print(f"H200 ridge point: {ridge:.0f} FLOP/B")
#> H200 ridge point: 206 FLOP/B
print(f"{'operator':<26}{'fwd GFLOP':>10}{'fwd MB':>8}{'FLOP/B':>8}  bound")
#> operator                   fwd GFLOP  fwd MB  FLOP/B  bound
for fwd, _ in layer_ops(QWEN3_8B, batch=2, seq=4096):
    bound = "compute" if fwd.intensity > ridge else "memory"
    numbers = f"{fwd.flops / 1e9:>10.1f}{fwd.bytes / 1e6:>8.0f}{fwd.intensity:>8.1f}"
    print(f"{fwd.name:<26}{numbers}  {bound}")
    #> input_layernorm                  0.1     134     1.0  memory
    #> q_proj                         274.9     168  1638.4  compute
    #> k_proj                          68.7      92   744.7  compute
    #> v_proj                          68.7      92   744.7  compute
    #> q_norm + k_norm                  0.2     168     1.0  memory
    #> rope (q, k)                      0.1     168     0.8  memory
    #> attention                      274.9     168  1638.4  compute
    #> o_proj                         274.9     168  1638.4  compute
    #> residual add                     0.0     201     0.2  memory
    #> post_attention_layernorm         0.1     134     1.0  memory
    #> gate_proj                      824.6     369  2234.2  compute
    #> up_proj                        824.6     369  2234.2  compute
    #> silu(gate) * up                  0.5     604     0.8  memory
    #> down_proj                      824.6     369  2234.2  compute
    #> residual add                     0.0     201     0.2  memory
# --8<-- [end:accounting]

# --8<-- [start:check]
accounted = model_forward_flops(QWEN3_8B, batch=2, seq=4096)
thumb = rule_of_thumb_flops(QWEN3_8B, counts["total"], batch=2, seq=4096)
print(f"{accounted / 1e12:.1f} vs {thumb / 1e12:.1f} TFLOP, gap {accounted / thumb - 1:.3%}")
#> 133.9 vs 133.9 TFLOP, gap 0.027%
assert abs(accounted / thumb - 1) < 1e-3  # elementwise work is O(h + I) per token, matmuls O(h^2)
# --8<-- [end:check]
