"""RL 训练加速：GRPO / DAPO / GSPO 与全异步 rollout (rl-training) snippets."""
