"""Protocol ``lm-eval``: lm-evaluation-harness's ``loglikelihood_rolling`` on the text as one local document.

lm-eval (optional extra ``quantlab[eval]``) scores each document in disjoint windows of ``max_length`` tokens,
each after one token of context (an end-of-text token before the first), and reports word_perplexity,
byte_perplexity and bits_per_byte; quantlab also derives the token perplexity from the same log-likelihoods.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from torch import nn

from ...data import Text
from ..lm_eval import harness_model, rolling_token_loglikelihood
from .base import PERPLEXITY_PROTOCOLS, PerplexityProtocol

TASK = "quantlab_rolling"
TASK_YAML = """task: quantlab_rolling
dataset_path: json
dataset_kwargs:
  data_files:
    test: DOCS
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
should_decontaminate: false
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


class LMEvalPerplexity(BaseModel):
    """What protocol lm-eval reports besides ``perplexity`` (its word perplexity)."""

    lm_eval_word_perplexity: float | None = None
    lm_eval_byte_perplexity: float | None = None
    lm_eval_bits_per_byte: float | None = None
    lm_eval_token_perplexity: float | None = None


def lm_eval_perplexity(model: nn.Module, tokenizer: Any, text: Text, *, window_tokens: int, batch_size: int,
                       device: torch.device) -> dict[str, Any]:
    """lm-eval's word/byte perplexity and bits per byte on ``text`` (one document), plus token perplexity."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = harness_model(model, tokenizer, window_tokens, batch_size, device)
    with tempfile.TemporaryDirectory(prefix="quantlab-lm-eval-") as tmp:
        docs = Path(tmp) / "docs.jsonl"
        docs.write_text(json.dumps({"text": text.text}) + "\n", encoding="utf-8")
        (Path(tmp) / f"{TASK}.yaml").write_text(TASK_YAML.replace("DOCS", str(docs)), encoding="utf-8")
        results = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=tmp),
                                          log_samples=False, bootstrap_iters=0, verbosity="ERROR")
    metrics = {k.split(",")[0]: v for k, v in results["results"][TASK].items() if isinstance(v, (int, float))}
    loglik, tokens = rolling_token_loglikelihood(model, tokenizer, [text.text], window_tokens=window_tokens,
                                                 batch_size=batch_size, device=device)
    return {
        "perplexity": round(metrics["word_perplexity"], 4),
        "lm_eval_word_perplexity": metrics["word_perplexity"],
        "lm_eval_byte_perplexity": metrics["byte_perplexity"],
        "lm_eval_bits_per_byte": metrics["bits_per_byte"],
        "lm_eval_token_perplexity": round(math.exp(-loglik / tokens), 4),
        "perplexity_protocol": {
            "name": "lm-eval", "metric": "word_perplexity", "window_tokens": window_tokens,
            "stride_tokens": window_tokens, "scored_tokens": tokens, "text": text.source, "text_sha256": text.sha256,
            "lm_eval_version": getattr(lm_eval, "__version__", "unknown"),
        },
    }


@PERPLEXITY_PROTOCOLS.register("lm-eval", "lm-evaluation-harness's loglikelihood_rolling: word perplexity (extra eval)")
class LMEvalRolling(PerplexityProtocol):
    extra_result = LMEvalPerplexity
    whole_windows = False  # lm-eval runs the model in this process

    def run(self, model, tokenizer, ids, text, kv, device):  # type: ignore[no-untyped-def]
        return lm_eval_perplexity(model, tokenizer, text, window_tokens=self.window_tokens, batch_size=self.batch_size,
                                  device=device)
