"""What a recipe's ``evaluations:`` names: perplexity under registered protocols (``eval.perplexity``, which
registers them) and lm-eval tasks (``eval.lm_eval``); the divergence statistics are ``quantlab.fidelity``'s.

Nothing is imported here, so the tensor-level modules (tokens) load without the others."""
