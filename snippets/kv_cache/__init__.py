"""KV Cache 的显存账：MHA / GQA / MQA / MLA 与 PagedAttention (kv-cache) snippets."""
