"""效率指标 (metrics) snippets: serving, training, hardware and memory formulas."""
