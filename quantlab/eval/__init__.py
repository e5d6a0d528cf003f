"""What a recipe's ``evaluations:`` names: perplexity under registered protocols (``eval.perplexity``, which
registers them), lm-eval tasks (``eval.lm_eval``) and the divergence from the baseline (``eval.divergence``).

Nothing is imported here, so the tensor-level modules (divergence, tokens) load without the others."""
