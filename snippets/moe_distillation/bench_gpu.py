"""On the H200 (nox -s gpu_docs): the experiment of experiment.py at GPU_BUDGET, the shared MoE
(trained("moe"), loaded from the run's model cache) as the teacher; writes
results/moe-distillation/distill.json."""

from snippets.common.results import write_result
from snippets.common.train import trained
from snippets.moe_distillation.experiment import GPU_BUDGET, run_experiment

# --8<-- [start:run]
teacher = trained("moe")  # the shared MoE: cached by the trained-models post of this run
values = run_experiment(teacher.model, teacher.train, GPU_BUDGET)
write_result("moe-distillation", "distill", values)
# --8<-- [end:run]
