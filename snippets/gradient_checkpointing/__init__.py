"""选择性重算 + Pareto 曲线 (gradient-checkpointing) snippets, on the shared Qwen3 model."""
