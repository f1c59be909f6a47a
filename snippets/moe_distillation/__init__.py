"""MoE 教师 → Dense 学生蒸馏 (moe-distillation) snippets."""
