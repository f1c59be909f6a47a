"""On the H200 (nox -s gpu_docs): section 6's run at GPU_BUDGET on the shared draft model
(trained("draft"), loaded from the run's model cache); writes results/rl-training/rl-run.json."""

from snippets.common.results import write_result
from snippets.common.train import trained
from snippets.rl_training.experiment import GPU_BUDGET, run_experiment

# --8<-- [start:run]
draft = trained("draft")  # the shared draft model: cached by the trained-models post of this run
values = run_experiment(draft.model, draft.tokenizer, GPU_BUDGET)
write_result("rl-training", "rl-run", values)
# --8<-- [end:run]
