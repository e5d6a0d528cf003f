"""Recipes: YAML files naming a model, the formats to compare, the workload and the evaluations.

Validation is strict: unknown keys, unknown format names, impossible values
and missing files raise ``RecipeError`` naming the file and the field path.
"""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FieldSerializationInfo,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from ..data import BUILTIN_TEXTS, TextSource
from ..engine import ENGINES
from ..errors import QuantlabError, RecipeError, first_line
from ..eval.base import EVALUATIONS
from ..eval.perplexity import PERPLEXITY_PROTOCOLS
from ..eval.perplexity.base import DEFAULT_KV_PROTOCOL, DEFAULT_PROTOCOL
from ..kv import KV_FORMATS, KVFormat
from ..measurements import MEASUREMENTS  # noqa: F401  (registers the evaluations the measurements run)
from ..models import ModelSpec, Strict
from ..quant import WEIGHT_FORMATS, WeightFormat
from ..registry import Registry
from ..validation import first_error, unknown_field_message

DEFAULT_KV_FORMAT = "native"  # the cache a recipe without kv_cache measures: transformers' own

EngineName = Annotated[str, Field(description="a registered engine (quantlab formats lists them)")]
PositiveInts = Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)]


class Workload(Strict):
    """Decode measurement points: every batch size x every prompt (context) length."""

    batch_size: int | PositiveInts = Field(1, description="one batch size or a list")
    prompt_tokens: int | PositiveInts = Field(64, description="one prompt length or a list (context lengths)")
    new_tokens: int = Field(32, ge=2, description="decode steps timed per run")
    warmup_runs: int = Field(1, ge=0, description="untimed generations before timing")
    prefill_repeats: int = Field(3, ge=1, description="timed prefills; the median is reported")
    engine: EngineName | Annotated[list[EngineName], Field(min_length=1)] = Field(
        "auto", description="a registered engine, or a list of them (every variant measured on each): auto (compiled "
                            "where the model and KV format capture, eager otherwise, the reason recorded), compiled "
                            "(static cache + torch.compile), eager (no compilation), llama.cpp (the variant's GGUF "
                            "export in llama.cpp's own process); quantlab formats lists them")

    @field_validator("engine")
    @classmethod
    def _registered(cls, v: Any) -> Any:
        for name in v if isinstance(v, list) else [v]:
            try:
                ENGINES[name]
            except QuantlabError as e:  # an unknown name: the registry's one line, with the known ones
                raise ValueError(str(e)) from None
        return v

    @field_validator("batch_size", "prompt_tokens", mode="before")
    @classmethod
    def _positive(cls, v: Any) -> Any:
        """One positive integer or a non-empty list of them; a bad element is named by its place."""
        values = v if isinstance(v, list) else [v]
        if isinstance(v, list) and not v:
            raise ValueError("an empty list; give one value or a list of them")
        for i, x in enumerate(values):
            where = f"element {i} ({x!r})" if isinstance(v, list) else repr(x)
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"{where} is not a whole number")
            if x < 1:
                raise ValueError(f"{where} is below 1")
        return v

    @property
    def engines(self) -> list[str]:
        """The engines every variant is measured on (one, or the list's)."""
        engines = self.engine if isinstance(self.engine, list) else [self.engine]
        return list(dict.fromkeys(engines))

    def points(self) -> list[tuple[int, int]]:
        """(batch size, prompt tokens) pairs, the first one the headline figures come from."""
        batches = self.batch_size if isinstance(self.batch_size, list) else [self.batch_size]
        prompts = self.prompt_tokens if isinstance(self.prompt_tokens, list) else [self.prompt_tokens]
        return [(b, p) for b in batches for p in prompts]


class CalibrationSpec(Strict):
    """Where calibration data for formats that need it (GPTQ) comes from: random windows of a text."""

    text: TextSource = Field("stdlib-train", description=f"one of {', '.join(BUILTIN_TEXTS)}, a .txt/.jsonl file or a dataset")
    samples: int = Field(128, ge=1)
    seq_len: int = Field(256, ge=2)
    seed: int = 0


class Evaluations:
    """A recipe's ``evaluations:``: each registered evaluation it names (``eval.base.EVALUATIONS``, filled by the
    measurements that run them) and its config. An evaluation it does not name reads as that evaluation's
    ``absent()`` (None, or an empty task list), so ``recipe.evaluations.perplexity`` is None when none is run."""

    def __init__(self, entries: dict[str, Any] | None = None) -> None:
        self._entries: dict[str, Any] = dict(entries or {})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.get(name)

    def get(self, name: str) -> Any:
        if name in self._entries:
            return self._entries[name]
        if name in EVALUATIONS:
            return EVALUATIONS[name].cls.absent()
        raise AttributeError(f"no evaluation {name!r} is registered")

    def items(self) -> list[tuple[str, Any]]:
        """(name, config) of every evaluation the recipe names, in its order."""
        return list(self._entries.items())

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Evaluations) and self._entries == other._entries

    def __repr__(self) -> str:
        return f"Evaluations({self._entries!r})"

    def model_dump(self, mode: str = "python", exclude_defaults: bool = False) -> dict[str, Any]:
        """The recipe form; with ``exclude_defaults`` an entry that is all defaults stays (it is asked for) and an
        empty one goes, as the variant keys recorded before evaluations were a registry computed them."""
        out = {}
        for name, config in self._entries.items():
            dumped = config.model_dump(mode=mode, exclude_defaults=exclude_defaults)
            if exclude_defaults and dumped == [] :
                continue
            out[name] = dumped
        return out


def parse_evaluations(value: Any, recipe: dict[str, Any], where: str = "evaluations") -> Evaluations:
    """The ``evaluations:`` mapping, each entry built by its registered evaluation (ValueError or pydantic's
    ValidationError naming what is wrong; ``recipe``: the whole mapping, for defaults that depend on it)."""
    if value is None:
        return Evaluations()
    if isinstance(value, Evaluations):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected a mapping of evaluations (known: {', '.join(EVALUATIONS.names())})")
    entries = {}
    for name, entry in value.items():
        if name not in EVALUATIONS:
            raise ValueError(unknown_field_message(str(name), EVALUATIONS.names()))
        cls = EVALUATIONS[name].cls
        built = None if entry is None else entry if isinstance(entry, cls) else cls.parse(entry, recipe)
        if built:  # an empty task list asks for nothing
            entries[name] = built
    for name, config in entries.items():
        missing = [r for r in type(config).requires if r not in entries]
        if missing:
            raise ValueError(f"{name} reads the {missing[0]} evaluation's text: add {where}.{missing[0]}")
    return Evaluations(entries)


class ExecutorSpec(Strict):
    """Where a run's variants are measured: here, one after another (``local``), or as tasks on a Ray cluster."""

    kind: str = Field("local", description="a registered executor: local | ray (checked by the runner, before "
                      "anything is written)")
    address: str | None = Field(None, description="ray: the cluster to join ('auto': the one running here); "
                                "none starts a local Ray instance")
    cpus_per_variant: float = Field(1, gt=0, description="ray: CPUs each variant's task reserves")
    gpus_per_variant: float | None = Field(None, ge=0, description="ray: GPUs each variant's task reserves "
                                           "(default: 1 when the recipe's device is cuda, else 0)")


class ExportSpec(Strict):
    """Deployable folders a run writes beside its report: each variant named (its label, or its weight format's
    label for every KV format it is paired with) exported to each target, from the model that was measured."""

    variants: list[str] = Field(min_length=1, description="variant or weight-format labels")
    to: list[str] = Field(min_length=1, description="export targets (quantlab formats lists them)")

    @field_validator("to")
    @classmethod
    def _known_targets(cls, to: list[str]) -> list[str]:
        from ..quant.io import EXPORTERS

        for name in to:
            if name not in EXPORTERS:
                raise ValueError(f"unknown export target {name!r} (known: {', '.join(EXPORTERS.names())})")
        return to


def byte_size(v: Any) -> Any:
    """A size field's value: ``8GiB``, ``500MB`` or a byte count as a string becomes bytes; anything else is left to
    the field's type."""
    if isinstance(v, str):
        from ..estimate.fit import parse_bytes

        try:
            return parse_bytes(v, "size")
        except QuantlabError as e:
            raise ValueError(str(e).removeprefix("size: ")) from None
    return v


class ReportSpec(Strict):
    """What the report's answer is judged by: the quality tolerance against the baseline and the byte budget."""

    kl_tolerance_nats: float = Field(0.01, gt=0, description="a variant is within tolerance when its mean KL "
                                     "divergence from the baseline is at most this (about llama.cpp's Q5_K_M on "
                                     "Llama-3-8B); used where divergence was measured")
    perplexity_tolerance_percent: float = Field(1.0, gt=0, description="without a KL figure: perplexity at most this "
                                                "many percent above the baseline's")
    budget_share: float = Field(0.5, gt=0, description="the byte budget as a share of the baseline's weights + KV "
                                "cache (best quality within it)")
    budget_bytes: int | None = Field(None, gt=0, description="the byte budget in bytes, or a size such as 8GiB "
                                     "(instead of budget_share)")

    @field_validator("budget_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return byte_size(v)


class PlanSpec(Strict):
    """``quantlab plan``'s workload, budget and scans (its command-line flags, where given, take precedence)."""

    memory_bytes: int = Field(gt=0, description="the budget the weights, the cache, the activations and the runtime "
                              "share: bytes, or a size such as 24GiB")
    context_tokens: int = Field(ge=1, description="positions each sequence holds at the workload")
    batch_size: int = Field(1, ge=1, description="sequences held at once")
    prefill_chunk_tokens: int = Field(512, ge=1, description="tokens a forward takes at once when the prompt is "
                                      "read (llama.cpp's default micro-batch): sizes the activations term")
    runtime_bytes: int | None = Field(None, ge=0, description="the runtime's own memory where the plan is deployed "
                                      "(a size such as 1GiB); default: measured on this machine")
    kv_group_layers: int = Field(1, ge=1, description="consecutive layers of one attention kind that share a KV format")
    scan_tokens: int = Field(2048, ge=16, description="calibration tokens the weight scan scores each choice on")
    kv_window_tokens: int = Field(512, ge=16, description="length of each window the KV scan feeds through the cache")
    kv_windows: int = Field(2, ge=1, description="windows the KV scan feeds through the cache")
    kv_split: bool = Field(False, description="also offer keys and values in different formats: every pair of the "
                           "recipe's stored KV formats that keep the same recent positions (more KV scan rows)")
    measure: bool = Field(True, description="apply the plan whole, and every uniform configuration that fits, and "
                          "measure each one's KL through the cache beside its prediction")

    @field_validator("memory_bytes", "runtime_bytes", mode="before")
    @classmethod
    def _size(cls, v: Any) -> Any:
        return byte_size(v)


class Recipe(Strict):
    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="used as the report folder name")
    description: str = ""
    model: ModelSpec
    weights: list[WeightFormat] = Field(min_length=1)
    kv_cache: list[KVFormat] = Field(default_factory=list)
    workload: Workload = Workload()
    evaluations: Evaluations = Field(default_factory=Evaluations, description="each registered evaluation to run "
                                     "(quantlab formats lists them), with its fields")
    calibration: CalibrationSpec = CalibrationSpec()
    baseline: str | None = Field(None, description="variant label of the baseline, or a weight-format label (its variant "
                                 "with the first KV format listed); default: the first variant")
    device: Literal["auto", "cpu", "cuda"] = "auto"
    threads: int | None = Field(None, ge=1, description="CPU threads torch uses in every process that measures "
                                "(torch.set_num_threads; default: torch's own, one per core)")
    isolation: Literal["process", "none"] = Field("process", description="run each variant in its own process")
    variant_timeout_s: float | None = Field(None, gt=0, description="stop a variant's process after this long; "
                                            "it is recorded as failed and the run goes on (isolation: process)")
    executor: ExecutorSpec = ExecutorSpec()
    export: list[ExportSpec] = Field(default_factory=list, description="[{variants: [LABEL, ...], to: [gguf, ...]}]: "
                                     "deployable folders written under exports/ from each measured variant")
    report: ReportSpec = Field(default_factory=ReportSpec, description="the tolerance and budget the report's "
                               "answer is judged by")
    plan: PlanSpec | None = Field(None, description="quantlab plan's budget and workload: {memory_bytes, "
                                  "context_tokens, batch_size, ...}")
    seed: int = 0
    _source: str = PrivateAttr("<recipe>")  # the file it was read from, for error messages

    @field_validator("evaluations", mode="before")
    @classmethod
    def _evaluations(cls, v: Any, info: ValidationInfo) -> Evaluations:
        return parse_evaluations(v, dict(info.data))

    @field_serializer("evaluations")
    def _dump_evaluations(self, v: Evaluations, info: FieldSerializationInfo) -> dict[str, Any]:
        return v.model_dump(mode=info.mode, exclude_defaults=info.exclude_defaults)

    @property
    def source(self) -> str:
        return self._source

    def with_threads(self, threads: int) -> "Recipe":
        """This recipe measured with ``threads`` CPU threads (``quantlab run --threads``)."""
        if threads < 1:
            raise RecipeError("--threads", "", f"a positive number of threads, not {threads}")
        changed = self.model_copy(update={"threads": threads})
        changed._source = self._source
        return changed

    @contextmanager
    def threads_applied(self) -> Iterator[None]:
        """Within: torch's CPU threads in this process are the recipe's (when it gives them), restored after."""
        import torch

        before = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    @model_validator(mode="after")
    def _check(self) -> "Recipe":
        if not self.kv_cache:
            object.__setattr__(self, "kv_cache", [KV_FORMATS[DEFAULT_KV_FORMAT].build()])
        labels = [v.label for v in self.variants()]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise ValueError(f"two variants share the label '{dupes[0]}'; remove one")
        if self.baseline is not None and self.baseline not in labels:
            named = self.variant_named(self.baseline)
            if named is None:
                raise ValueError(f"baseline '{self.baseline}' is no variant or weight-format label (labels: "
                                 f"{', '.join(labels)})")
            object.__setattr__(self, "baseline", named.label)  # a weight label: its variant with the first KV format
        if self.variant_timeout_s is not None and self.isolation != "process":
            raise ValueError("variant_timeout_s needs isolation: process (a variant in this process cannot be stopped)")
        for i, spec in enumerate(self.export):
            for name in spec.variants:
                if self.variant_named(name) is None:
                    raise ValueError(f"export[{i}].variants: '{name}' is no variant or weight-format label (labels: "
                                     f"{', '.join(labels)})")
        for name in self.workload.engines:
            engine = ENGINES[name].build()
            refusal = engine.refuse(self)
            if refusal is not None:
                field, why = refusal
                raise ValueError(f"{field}: {why} (workload.engine: {name})")
            for evaluation, config in self.evaluations.items():
                why = config.engine_refusal(engine)
                if why is not None:
                    raise ValueError(f"evaluations.{evaluation}: {why} (workload.engine: {name})")
        if self.model.synthetic and self.evaluations:
            raise ValueError("evaluations need trained weights; a synthetic model has random ones")
        return self

    def variants(self) -> list["Variant"]:
        multi_kv = len(self.kv_cache) > 1
        engines = self.workload.engines
        return [Variant(self, w, kv, multi_kv, engine, len(engines) > 1)
                for w in self.weights for kv in self.kv_cache for engine in engines]

    @property
    def baseline_label(self) -> str:
        return self.baseline or self.variants()[0].label

    @property
    def baseline_variant(self) -> "Variant":
        return next(v for v in self.variants() if v.label == self.baseline_label)

    def variant_named(self, name: str) -> "Variant | None":
        """The variant labelled ``name``, else the first variant of the weight format labelled ``name`` (its KV
        twins hold the same weights), else None."""
        variants = self.variants()
        return next((v for v in variants if v.label == name), None) or \
            next((v for v in variants if v.weight.label == name), None)

    def exports_for(self, variant: "Variant") -> list[str]:
        """The targets ``variant`` is exported to: those of the export entries that name it (``variant_named``)."""
        targets: list[str] = []
        for spec in self.export:
            if any((named := self.variant_named(n)) is not None and named.label == variant.label for n in spec.variants):
                targets += [t for t in spec.to if t not in targets]
        return targets

    def to_spec(self) -> dict[str, Any]:
        """A plain dict that ``validate_recipe`` turns back into an equal recipe."""
        spec = self.model_dump(mode="json", exclude={"weights", "kv_cache"})
        spec["weights"] = [format_spec(WEIGHT_FORMATS, w) for w in self.weights]
        spec["kv_cache"] = [format_spec(KV_FORMATS, k) for k in self.kv_cache]
        return spec


@dataclass(frozen=True)
class Variant:
    """One weight format x one KV format of a recipe."""

    recipe: Recipe
    weight: WeightFormat
    kv: KVFormat
    show_kv: bool = True
    engine: str = "auto"  # the workload's engine this variant is measured on
    show_engine: bool = False

    @property
    def label(self) -> str:
        label = f"{self.weight.label}/kv-{self.kv.label}" if self.show_kv else self.weight.label
        return f"{label}@{self.engine}" if self.show_engine else label

    @property
    def key(self) -> str:
        """A hash of everything that determines this variant's results (resume key). Fields left at their
        defaults are not part of it, so a new optional field does not invalidate earlier results."""
        r = self.recipe

        def dump(model: BaseModel) -> Any:
            return model.model_dump(mode="json", exclude_defaults=True)

        workload = {k: v for k, v in dump(r.workload).items() if k != "engine"}
        if self.engine != "auto":  # this variant's engine (the default leaves earlier keys as they were)
            workload["engine"] = self.engine
        payload = {
            "model": dump(r.model), "weight": {"format": WEIGHT_FORMATS.canonical_name(self.weight), **dump(self.weight)},
            "kv": {"format": KV_FORMATS.canonical_name(self.kv), **dump(self.kv)}, "workload": workload,
            "evaluations": dump(r.evaluations), "device": r.device, "seed": r.seed,
        }
        if self.weight.needs_calibration:
            payload["calibration"] = dump(r.calibration)
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def format_spec(registry: Registry[Any], fmt: BaseModel) -> dict[str, Any]:
    return {"format": registry.canonical_name(fmt), **fmt.model_dump(mode="json")}


def resolve_format(registry: Registry[Any], entry: Any, file: str, where: str, name_key: str = "format") -> Any:
    """The config ``entry`` names (``NAME`` or ``{<name_key>: NAME, field: value...}``), built by ``registry``;
    a wrong name or field is a ``RecipeError`` naming the file, the field path and what is allowed."""
    if isinstance(entry, str):
        entry = {name_key: entry}
    if not isinstance(entry, dict):
        raise RecipeError(file, where, f"expected a {registry.kind} name or a mapping with '{name_key}', "
                          f"got {type(entry).__name__}")
    params = dict(entry)
    name = params.pop(name_key, None)
    if not isinstance(name, str):
        raise RecipeError(file, f"{where}.{name_key}", f"required: one of {', '.join(registry.names())}")
    try:
        preset = registry[name]
    except QuantlabError as e:
        raise RecipeError(file, f"{where}.{name_key}", str(e)) from None
    allowed = [f for f in preset.cls.model_fields if f not in preset.fixed]
    if "overrides" in params and "overrides" in allowed:
        params["overrides"] = _resolve_overrides(registry, params["overrides"], file, f"{where}.overrides")
    for key in getattr(preset.cls, "format_fields", ()):  # weight formats holding formats (a mix's candidates)
        value = params.get(key)
        if isinstance(value, list):
            params[key] = [resolve_format(registry, e, file, f"{where}.{key}[{j}]") for j, e in enumerate(value)]
        elif value is not None:
            params[key] = resolve_format(registry, value, file, f"{where}.{key}")
    for key in params:
        if key in preset.fixed:
            raise RecipeError(file, f"{where}.{key}", f"'{key}' is fixed by format '{name}' (settable: {', '.join(allowed)})")
        if key not in preset.cls.model_fields:
            raise RecipeError(file, f"{where}.{key}", unknown_field_message(key, [name_key, *allowed]))
    try:
        return preset.build(**params)
    except ValidationError as e:
        path, msg = first_error(e, preset.cls, where)
        raise RecipeError(file, path, msg) from None


def _resolve_overrides(registry: Registry[Any], entries: Any, file: str, where: str) -> list[dict[str, Any]]:
    """``[{modules: GLOB(S), format: NAME, field: value...}]`` with each format built (errors name the entry)."""
    if not isinstance(entries, list):
        raise RecipeError(file, where, "expected a list of {modules: GLOB or [GLOBS], format: NAME, ...}")
    resolved = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not isinstance(entry.get("modules"), (str, list)) or not entry["modules"]:
            raise RecipeError(file, f"{where}[{i}].modules", "required: a glob of module names (e.g. '*.down_proj') "
                              "or a list of them")
        params = {k: v for k, v in entry.items() if k != "modules"}
        resolved.append({"modules": entry["modules"], "format": resolve_format(registry, params, file, f"{where}[{i}]")})
    return resolved


def _resolve_formats(data: dict[str, Any], key: str, registry: Registry[Any], file: str) -> None:
    entries = data.get(key)
    if entries is None:
        return
    if not isinstance(entries, list):
        raise RecipeError(file, key, f"expected a list of formats (known: {', '.join(registry.names())})")
    data[key] = [resolve_format(registry, e, file, f"{key}[{i}]") for i, e in enumerate(entries)]


def beside(base: Path, value: str) -> Path:
    """``value`` (a path a recipe names) made absolute against the recipe's folder as the recipe was named: ``..``
    is taken lexically, so a recipe reached through a linked folder (``recipes/`` of a checkout) resolves its
    ``../reports`` beside that folder, as a reader of the tree expects."""
    return Path(os.path.abspath(base / os.path.expanduser(value)))


def _resolve_format_files(entry: Any, base: Path) -> None:
    """Every ``*_path`` field (a file a format reads or writes: an importance matrix, a sensitivity table) of a
    weight entry and of the formats inside it (a mix's candidates and budget, overrides), made absolute."""
    if isinstance(entry, list):
        for item in entry:
            _resolve_format_files(item, base)
    elif isinstance(entry, dict):
        for key, value in entry.items():
            if key.endswith("_path") and isinstance(value, str):
                entry[key] = str(beside(base, value))
            elif isinstance(value, (dict, list)):
                _resolve_format_files(value, base)


def _resolve_paths(data: dict[str, Any], base: Path, file: str) -> None:
    model = data.get("model")
    if isinstance(model, dict):
        for key in ("path", "config"):
            if isinstance(model.get(key), str):
                p = beside(base, model[key])
                if not p.exists():
                    raise RecipeError(file, f"model.{key}", f"no such {'folder' if key == 'path' else 'file'}: {p}")
                if key == "path" and not p.is_dir():
                    hint = (f"give its folder as path and gguf_file: {p.name}" if p.suffix.lower() == ".gguf" else
                            "config: FILE with synthetic: true measures random weights at its shapes"
                            if p.suffix.lower() == ".json" else "give the folder holding config.json and the weights")
                    raise RecipeError(file, "model.path", f"{p} is a file, not a model folder; {hint}")
                if key == "config" and p.is_dir():
                    raise RecipeError(file, "model.config", f"{p} is a folder; name its config.json (or use path: for "
                                      "a model folder with weights)")
                model[key] = str(p)
    for i, entry in enumerate(data.get("weights") if isinstance(data.get("weights"), list) else []):
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):  # a checkpoint folder or GGUF file
            p = beside(base, entry["path"])
            kind = "file" if p.suffix.lower() == ".gguf" else "folder"
            if not (p.is_file() if kind == "file" else p.is_dir()):
                raise RecipeError(file, f"weights[{i}].path", f"no such {kind}: {p}")
            entry["path"] = str(p)
        _resolve_format_files(entry, base)
    evaluations = data.get("evaluations") if isinstance(data.get("evaluations"), dict) else {}
    for i, task in enumerate(evaluations.get("lm_eval_tasks") or []):
        if isinstance(task, dict) and isinstance(task.get("include_path"), str):
            p = beside(base, task["include_path"])
            if not p.is_dir():
                raise RecipeError(file, f"evaluations.lm_eval_tasks[{i}].include_path", f"no such folder: {p}")
            task["include_path"] = str(p)
    ppl = evaluations.get("perplexity")
    for where, section in (("evaluations.perplexity", ppl), ("calibration", data.get("calibration"))):
        text = section.get("text") if isinstance(section, dict) else None
        if isinstance(text, dict) and isinstance(text.get("dataset"), str) and text["dataset"].startswith((".", "/", "~")):
            p = beside(base, text["dataset"])
            if not p.exists():
                raise RecipeError(file, f"{where}.text.dataset", f"no such dataset folder: {p}")
            text["dataset"] = str(p)
        if isinstance(section, dict) and isinstance(section.get("text"), str) and section["text"] not in BUILTIN_TEXTS:
            p = beside(base, section["text"])
            if not p.is_file():
                raise RecipeError(file, f"{where}.text", f"no such file: {p} (or one of: {', '.join(BUILTIN_TEXTS)})")
            problem = text_file_problem(p)
            if problem:
                raise RecipeError(file, f"{where}.text", problem)
            section["text"] = str(p)


def text_file_problem(path: Path) -> str | None:
    """Why a text file cannot be scored or calibrated on (empty, only blanks, no text in a .jsonl), or None."""
    from ..data import read_text_file

    try:
        raw = read_text_file(path)
    except QuantlabError as e:
        return str(e)
    except (OSError, UnicodeDecodeError) as e:
        return f"{path}: cannot be read as UTF-8 text ({first_line(e)})"
    if not raw.strip():
        return f"{path} holds no text; name a file with the text to score (or one of: {', '.join(BUILTIN_TEXTS)})"
    return None


def _evaluations_of(value: Any, data: dict[str, Any], file: str) -> Evaluations:
    """``evaluations:`` built entry by entry, a wrong name or field a ``RecipeError`` naming its path."""
    if isinstance(value, dict):
        for name, entry in value.items():
            if name not in EVALUATIONS:
                raise RecipeError(file, f"evaluations.{name}", unknown_field_message(str(name), EVALUATIONS.names()))
            cls = EVALUATIONS[name].cls
            try:
                value = {**value, name: entry if entry is None or isinstance(entry, cls) else cls.parse(entry, data)}
            except ValidationError as e:
                path, msg = first_error(e, cls, f"evaluations.{name}")
                raise RecipeError(file, path, msg) from None
            except ValueError as e:
                raise RecipeError(file, f"evaluations.{name}", str(e)) from None
    try:
        return parse_evaluations(value, data)
    except ValueError as e:
        raise RecipeError(file, "evaluations", str(e)) from None


def validate_recipe(data: Any, file: str = "<recipe>", base_dir: Path | None = None) -> Recipe:
    """Validate a parsed recipe mapping; relative paths resolve against ``base_dir``."""
    if not isinstance(data, dict):
        raise RecipeError(file, "", "a recipe must be a YAML mapping (name:, model:, weights:, ...)")
    data = json.loads(json.dumps(data, default=str))  # a deep copy we may edit
    for key in data:
        if key not in Recipe.model_fields:
            raise RecipeError(file, str(key), unknown_field_message(str(key), list(Recipe.model_fields)))
    _resolve_paths(data, base_dir or Path.cwd(), file)
    if data.get("kv_cache") == []:
        raise RecipeError(file, "kv_cache", "an empty list; leave kv_cache out for the model's own cache (native), or "
                          f"list formats (known: {', '.join(KV_FORMATS.names())})")
    _resolve_formats(data, "weights", WEIGHT_FORMATS, file)
    _resolve_formats(data, "kv_cache", KV_FORMATS, file)
    evaluations = data.get("evaluations")
    if isinstance(evaluations, dict) and isinstance(evaluations.get("perplexity"), dict):
        kv = [KV_FORMATS.canonical_name(k) for k in data.get("kv_cache") or []]
        compares_kv = any(name != DEFAULT_KV_FORMAT for name in kv)  # quality must then read the cache, unless told not to
        entry = {"protocol": DEFAULT_KV_PROTOCOL if compares_kv else DEFAULT_PROTOCOL, **evaluations["perplexity"]}
        evaluations["perplexity"] = resolve_format(PERPLEXITY_PROTOCOLS, entry, file, "evaluations.perplexity", "protocol")
    if evaluations is not None:
        data["evaluations"] = _evaluations_of(evaluations, data, file)
    try:
        recipe = Recipe.model_validate(data)
    except ValidationError as e:
        path, msg = first_error(e, Recipe)
        raise RecipeError(file, path, msg) from None
    recipe._source = file
    return recipe


class DuplicateKey(yaml.YAMLError):
    def __init__(self, where: str, message: str) -> None:
        super().__init__(message)
        self.where = where


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the plain loader keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise DuplicateKey(f"line {line}", f"'{key}' is given twice in one mapping (lines {seen[key]} and "
                                   f"{line}); keep one")
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str | os.PathLike[str]) -> Recipe:
    """Read and validate a recipe YAML file."""
    p = Path(path)
    if p.is_dir():
        raise RecipeError(str(p), "", "a folder, not a recipe file; name a recipe .yaml (quantlab init writes one)")
    if not p.is_file():
        raise RecipeError(str(p), "", "no such recipe file (quantlab init writes one)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RecipeError(str(p), "", f"not UTF-8 text (byte {e.start}: {e.reason}); save the recipe as UTF-8") from None
    try:
        data = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506  (a SafeLoader subclass)
    except DuplicateKey as e:
        raise RecipeError(str(p), e.where, str(e)) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else ""
        raise RecipeError(str(p), where, f"not valid YAML: {getattr(e, 'problem', e)}") from None
    return validate_recipe(data, str(p), p.parent)
