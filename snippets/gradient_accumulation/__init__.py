"""梯度累积 (gradient-accumulation) snippets."""
