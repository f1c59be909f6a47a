"""看懂 Qwen3 结构 + 识别算子融合机会 (qwen3-fusion) snippets; model.py is the shared Qwen3."""
