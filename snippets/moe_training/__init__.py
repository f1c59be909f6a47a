"""MoE 训练加速 (moe-training) snippets."""
