"""lm-evaluation-harness tasks run on the in-memory quantized model: one column per task metric."""
from __future__ import annotations

from typing import Any, Iterator

from pydantic import BaseModel, ConfigDict, Field, model_serializer

from ..eval.base import Evaluation
from ..eval.lm_eval import lm_eval_tasks
from .base import Column, Measurement, Result, register


class LMEvalTask(BaseModel):
    """An lm-evaluation-harness task, e.g. a local YAML in ``evals/`` (needs ``quantlab[eval]``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    task: str
    include_path: str | None = Field(None, description="folder of task YAMLs (relative to the recipe)")
    num_fewshot: int = Field(0, ge=0)
    limit: int | None = Field(None, ge=1, description="at most this many documents")
    batch_size: int = Field(8, ge=1)




class LMEvalTaskList(Evaluation):
    """``evaluations.lm_eval_tasks``: a list of lm-evaluation-harness tasks, run on the in-memory model."""

    tasks: list[LMEvalTask] = Field(default_factory=list)

    @classmethod
    def parse(cls, value: Any, recipe: dict[str, Any]) -> "LMEvalTaskList":
        if not isinstance(value, list):
            raise ValueError("expected a list of tasks: [{task: NAME, include_path: FOLDER, ...}]")
        return cls(tasks=value)

    @classmethod
    def absent(cls) -> "LMEvalTaskList":
        return cls()

    @model_serializer(mode="wrap")
    def _as_list(self, handler: Any) -> Any:
        return handler(self).get("tasks", [])  # the recipe form: the list itself (empty when left at its default)

    def __iter__(self) -> Iterator[LMEvalTask]:  # type: ignore[override]
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)

    def __bool__(self) -> bool:
        return bool(self.tasks)

    def problem(self) -> tuple[str, str] | None:
        from ..eval.lm_eval import task_problem

        for i, task in enumerate(self.tasks):
            problem = task_problem(task.task, task.include_path)
            if problem:
                return f"[{i}].task", problem
        return None

    def engine_refusal(self, engine: Any) -> str | None:
        return None if engine.in_process else "lm-eval runs the model in this process; measure this engine in a " \
            "recipe without lm_eval_tasks"


class TaskResult(Result):
    task: str
    num_fewshot: int
    limit: int | None = None
    samples: int | None = None
    lm_eval_version: str
    metrics: dict[str, float]


class LMEvalTasksResult(Result):
    lm_eval_tasks: list[TaskResult]


@register("lm_eval_tasks", "metrics of lm-evaluation-harness tasks (accuracy, ...) on the quantized model")
class LMEvalTasks(Measurement):
    order = 100
    result = LMEvalTasksResult
    evaluation = LMEvalTaskList
    title = "lm-eval tasks"
    section = "lm-eval tasks"

    def measure(self, ctx, point=None):  # type: ignore[no-untyped-def]
        flat = lm_eval_tasks(ctx.model, ctx.tokenizer, ctx.recipe.evaluations.lm_eval_tasks, device=ctx.device)
        tasks = []
        for t in flat["lm_eval_tasks"]:
            prefix = f"lm_eval_{t['task']}_"
            tasks.append(TaskResult(**t, metrics={k.removeprefix(prefix): v for k, v in flat.items() if k.startswith(prefix)}))
        return LMEvalTasksResult(lm_eval_tasks=tasks)

    def flat(self, result: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"lm_eval_tasks": [{k: v for k, v in t.items() if k != "metrics"} for t in result["lm_eval_tasks"]]}
        for t in result["lm_eval_tasks"]:
            for metric, value in t["metrics"].items():
                out[f"lm_eval_{t['task']}_{metric}"] = value
        return out

    def unflat(self, row: dict[str, Any]) -> dict[str, Any] | None:
        tasks = row.get("lm_eval_tasks")
        if not tasks:
            return None
        return {"lm_eval_tasks": [{**t, "metrics": {k.removeprefix(f"lm_eval_{t['task']}_"): v for k, v in row.items()
                                                    if k.startswith(f"lm_eval_{t['task']}_")}} for t in tasks]}

    def columns_for(self, rows: list[dict[str, Any]]) -> list[Column]:
        names = []
        for r in rows:
            for t in r.get("lm_eval_tasks") or []:
                for key in r:
                    if key.startswith(f"lm_eval_{t['task']}_") and isinstance(r[key], (int, float)) and key not in names:
                        names.append(key)
        return [Column(n, n.removeprefix("lm_eval_"), ".4f", compare="delta") for n in names]

    def reads_kv_cache(self, row: dict[str, Any]) -> bool | None:
        return False  # whole windows through the model, no cache

    def provenance(self, row, rows, manifest):  # type: ignore[no-untyped-def]
        tasks = row.get("lm_eval_tasks") or []
        if not tasks:
            return None
        return "; ".join(f"{t.get('task')}: {t.get('num_fewshot') or 0}-shot, limit {t.get('limit')}, "
                         f"{t.get('samples')} samples, lm-eval {t.get('lm_eval_version')}" for t in tasks) + "."
