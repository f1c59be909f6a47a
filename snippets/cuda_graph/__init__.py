"""CUDA Graphs for Qwen3 decode and training, and the traps."""
