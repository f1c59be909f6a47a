"""效果指标：CE、PPL、KL、WER / CER (quality-metrics) snippets."""
