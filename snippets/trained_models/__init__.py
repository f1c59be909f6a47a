"""共享训练模型 (trained-models) snippets."""
