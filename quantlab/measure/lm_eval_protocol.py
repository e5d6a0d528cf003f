"""The ``lm-eval`` perplexity protocol: lm-evaluation-harness's ``loglikelihood_rolling`` on a local task.

lm-eval (optional extra ``quantlab[eval]``) scores each document in disjoint windows of
``max_length`` tokens, each after one token of context (an end-of-text token before the
first), and reports word_perplexity, byte_perplexity and bits_per_byte; quantlab also
derives the token perplexity from the same log-likelihoods.
"""
from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..data import Text
from ..errors import QuantlabError
from .protocols import PERPLEXITY_PROTOCOLS, PerplexityProtocol

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


def _harness_model(model: nn.Module, tokenizer: Any, window_tokens: int, batch_size: int, device: torch.device) -> Any:
    try:
        from lm_eval.models.huggingface import HFLM
    except ImportError:
        raise QuantlabError("protocol lm-eval needs lm-evaluation-harness: pip install 'quantlab[eval]'") from None
    return HFLM(pretrained=model, tokenizer=tokenizer, max_length=window_tokens, batch_size=batch_size,
                device=str(device))


def rolling_token_loglikelihood(model: nn.Module, tokenizer: Any, documents: list[str], *, window_tokens: int,
                                batch_size: int, device: torch.device) -> tuple[float, int]:
    """Summed log-likelihood and token count of ``documents`` under lm-eval's rolling windows."""
    from lm_eval.api.instance import Instance

    lm = _harness_model(model, tokenizer, window_tokens, batch_size, device)
    requests = [Instance("loglikelihood_rolling", {}, (doc,), i) for i, doc in enumerate(documents)]
    logliks = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    tokens = sum(len(lm.tok_encode(doc)) for doc in documents)
    return float(sum(logliks)), tokens


def lm_eval_perplexity(model: nn.Module, tokenizer: Any, text: Text, *, window_tokens: int, batch_size: int,
                       device: torch.device) -> dict[str, Any]:
    """lm-eval's word/byte perplexity and bits per byte on ``text`` (one document), plus token perplexity."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = _harness_model(model, tokenizer, window_tokens, batch_size, device)
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
    def check(self, spec: Any) -> str | None:
        if spec.stride_tokens not in (None, spec.window_tokens):
            return "protocol lm-eval has stride = window; use protocol sliding for another stride"
        return None

    def run(self, model, tokenizer, ids, text, spec, kv, device):  # type: ignore[no-untyped-def]
        return lm_eval_perplexity(model, tokenizer, text, window_tokens=spec.window_tokens, batch_size=spec.batch_size,
                                  device=device)


def _task_with_absolute_data_files(manager: Any, task: str) -> str | dict[str, Any]:
    """The task's config with relative ``dataset_kwargs.data_files`` made absolute against its YAML's folder (as a
    config dict lm-eval accepts in place of a name); the name itself when there is nothing to resolve."""
    entry = manager.task_index.get(task)
    yaml_path = getattr(entry, "yaml_path", None)
    if yaml_path is None:
        return task
    from lm_eval.tasks._yaml_loader import load_yaml  # the loader TaskManager itself uses (lm-eval is pinned)

    config = load_yaml(Path(yaml_path).resolve(), resolve_func=True)
    files = (config.get("dataset_kwargs") or {}).get("data_files")
    if not files:
        return task
    base = Path(yaml_path).resolve().parent

    def absolute(f: Any) -> Any:
        if isinstance(f, str) and "://" not in f and not Path(f).is_absolute():
            return str(base / f)
        return [absolute(x) for x in f] if isinstance(f, list) else f

    resolved = {k: absolute(v) for k, v in files.items()} if isinstance(files, dict) else absolute(files)
    return {**config, "dataset_kwargs": {**config["dataset_kwargs"], "data_files": resolved}}


def lm_eval_tasks(model: nn.Module, tokenizer: Any, tasks: list[Any], *, device: torch.device) -> dict[str, Any]:
    """Run lm-eval tasks (``task``, ``include_path``, ``num_fewshot``, ``limit``) on the in-memory model.

    A task YAML's relative ``data_files`` resolve beside the YAML (no change of working directory).
    Metrics land as ``lm_eval_<task>_<metric>``.
    """
    import lm_eval
    from lm_eval.tasks import TaskManager

    out: dict[str, Any] = {}
    for spec in tasks:
        lm = _harness_model(model, tokenizer, getattr(model.config, "max_position_embeddings", 2048), spec.batch_size, device)
        manager = TaskManager(include_path=spec.include_path)
        results = lm_eval.simple_evaluate(
            model=lm, tasks=[_task_with_absolute_data_files(manager, spec.task)], task_manager=manager,
            num_fewshot=spec.num_fewshot, limit=spec.limit, log_samples=False, bootstrap_iters=0, verbosity="ERROR")
        if spec.task not in results["results"]:
            raise QuantlabError(f"lm-eval ran no task named {spec.task!r}")
        for key, value in results["results"][spec.task].items():
            metric, _, _filter = key.partition(",")
            if isinstance(value, (int, float)) and not metric.endswith("_stderr") and metric != "alias":
                out[f"lm_eval_{spec.task}_{metric}"] = value
        out.setdefault("lm_eval_tasks", []).append(
            {"task": spec.task, "num_fewshot": spec.num_fewshot, "limit": spec.limit,
             "samples": results.get("n-samples", {}).get(spec.task, {}).get("effective"),
             "lm_eval_version": getattr(lm_eval, "__version__", "unknown")})
    return out
