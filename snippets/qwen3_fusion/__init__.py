"""看懂 Qwen3 结构 + 识别算子融合机会 (qwen3-fusion) snippets.

The Qwen3 model this post explains is shared by several posts: snippets/common/models/qwen3.py.
"""
