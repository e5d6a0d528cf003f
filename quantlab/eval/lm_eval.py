"""lm-evaluation-harness on the in-memory model (``pip install 'quantlab[eval]'``): the harness's model wrapper,
its rolling log-likelihood, and tasks run by name (``evaluations.lm_eval_tasks``)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import QuantlabError


def harness_model(model: nn.Module, tokenizer: Any, window_tokens: int, batch_size: int, device: torch.device) -> Any:
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

    lm = harness_model(model, tokenizer, window_tokens, batch_size, device)
    requests = [Instance("loglikelihood_rolling", {}, (doc,), i) for i, doc in enumerate(documents)]
    logliks = lm.loglikelihood_rolling(requests, disable_tqdm=True)
    tokens = sum(len(lm.tok_encode(doc)) for doc in documents)
    return float(sum(logliks)), tokens


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
        lm = harness_model(model, tokenizer, getattr(model.config, "max_position_embeddings", 2048), spec.batch_size, device)
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


def task_problem(task: str, include_path: str | None) -> str | None:
    """Why lm-eval cannot run a task of this name (not installed, or no such task, with the nearest names), or
    None; read from lm-eval's task index before any model is loaded."""
    import difflib

    try:
        from lm_eval.tasks import TaskManager
    except ImportError:
        return "lm-eval tasks need lm-evaluation-harness: pip install 'quantlab[eval]'"
    known = TaskManager(include_path=include_path).all_tasks
    if task in known:
        return None
    near = difflib.get_close_matches(task, known, n=3, cutoff=0.6)
    where = f" in lm-eval's tasks or {include_path}" if include_path else " in lm-eval's tasks"
    return f"no task '{task}'{where}" + (f"; did you mean {', '.join(repr(n) for n in near)}?" if near else "")
