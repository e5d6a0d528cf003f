"""The weight-format interface. A format is a frozen, validated config that knows how to apply itself."""
from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatch
from typing import Any, ClassVar, Iterator

import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from torch import nn

from ..dtypes import DTYPES, SHORT_DTYPE, DtypeName  # noqa: F401  (re-exported for the formats)
from ..registry import Registry
from .tensors.base import Spec


@dataclass
class Calibration:
    """Calibration token ids (each ``[1, seq]``) and, where there is one, the tokenizer that made them."""

    samples: list[torch.Tensor]
    tokenizer: Any | None = None

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.samples)

    def __len__(self) -> int:
        return len(self.samples)


class WeightFormat(BaseModel):
    """Base of every weight format. Subclasses are registered in ``WEIGHT_FORMATS``.

    Every format also says which linears it takes: ``include`` / ``exclude`` globs on module names (the output
    head stays unquantized), and ``overrides`` that give matching modules another format (an override naming
    the output head, e.g. ``lm_head``, quantizes it too).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    requires_calibration: ClassVar[bool] = False
    example_fields: ClassVar[dict[str, Any] | None] = {}  # a small instance's fields (the contract test builds it,
    # less the fields a registered preset fixes); None: it needs files of its own (its own tests cover it)
    estimate_is_exact: ClassVar[bool] = True  # False: the model decides some bytes the config cannot tell (a lower bound)
    slow_to_apply: ClassVar[bool] = False  # runs a library of its own in a subprocess (the contract test marks it slow)
    format_fields: ClassVar[tuple[str, ...]] = ()  # fields holding formats themselves: a recipe resolves each entry
    include: tuple[str, ...] | None = Field(None, description="globs of the linears to quantize (default: all but "
                                            "the output head)")
    exclude: tuple[str, ...] = Field((), description="globs of linears kept unquantized")
    overrides: tuple["ModuleOverride", ...] = Field((), description="[{modules: GLOB(S), format: NAME, ...}]: "
                                                    "these modules in another format (the first match wins; one "
                                                    "naming the output head, e.g. lm_head, quantizes it)")
    transforms: tuple[Any, ...] = Field((), description="[NAME or {name: NAME, field: value}]: applied to each linear "
                                        "before the format rounds it, in order (quantlab formats lists them)")
    takes_transforms: ClassVar[bool] = True  # False: the format's weights come from elsewhere (a checkpoint, a mix)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass's ``scheme_label`` ends with its transforms' labels (``int3-g128-asym-had``), once: a label
        built on ``super().scheme_label`` gets them only where the most derived class's label is asked for."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("scheme_label")
        if not isinstance(own, property):
            return
        raw = own.fget

        def scheme_label(self: "WeightFormat") -> str:
            top = next(c.__dict__["scheme_label"] for c in type(self).__mro__ if "scheme_label" in c.__dict__)
            return raw(self) + (self.transforms_label if top.fget is scheme_label else "")

        cls.scheme_label = property(scheme_label, doc=own.__doc__)  # type: ignore[assignment]

    @model_validator(mode="before")
    @classmethod
    def _transform_entries(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("transforms"):
            from .transforms import TRANSFORMS, Transform

            if not cls.takes_transforms:
                raise ValueError("transforms: this format's weights are not rounded here; it takes none")
            from ..registry import UnknownNameError

            built = []
            for i, t in enumerate(data["transforms"]):
                try:
                    built.append(t if isinstance(t, Transform) else TRANSFORMS.build_entry(t, "name"))
                except (UnknownNameError, ValueError) as e:
                    raise ValueError(f"transforms[{i}]: {e}") from None
            data = {**data, "transforms": tuple(built)}
        return data

    @model_serializer(mode="wrap")
    def _dump_transforms(self, handler: Any) -> dict[str, Any]:
        """The fields as they are, ``transforms`` in their recipe form and left out when there are none."""
        out = handler(self)
        if isinstance(out, dict) and "transforms" in out:
            if not self.transforms:
                del out["transforms"]
            else:
                from .transforms import TRANSFORMS

                out["transforms"] = [{"name": TRANSFORMS.canonical_name(t),
                                      **t.model_dump(mode="json", exclude_defaults=True)} for t in self.transforms]
        return out

    @property
    def transforms_label(self) -> str:
        return "".join(f"-{t.label}" for t in self.transforms)

    @property
    def label(self) -> str:
        """A short name derived from the config (never parsed back): the scheme, then the module selection."""
        return self.scheme_label + self.selection_label

    @property
    def scheme_label(self) -> str:
        """The label of the scheme alone."""
        raise NotImplementedError

    @property
    def selection_label(self) -> str:
        """``-only:mlp``, ``-no:down_proj``, ``+int8-pc-asym@down_proj``: empty for the default selection."""
        parts = [f"-only:{_tags(self.include)}"] if self.include is not None else []
        parts += [f"-no:{_tags(self.exclude)}"] if self.exclude else []
        parts += [f"+{o.format.label}@{_tags(o.modules)}" for o in self.overrides]
        return "".join(parts)

    @property
    def is_plain(self) -> bool:
        """Whether the format takes the default selection whole: no include, exclude or overrides."""
        return self.include is None and not self.exclude and not self.overrides

    @property
    def needs_calibration(self) -> bool:
        """Whether this format, or one of its overrides, needs calibration data (its algorithm, or activations
        rounded under a static scale calibrated on data)."""
        return self._calibrates or any(o.format._calibrates for o in self.overrides)

    @property
    def _calibrates(self) -> bool:
        activations = getattr(self, "activations", None)
        return (self.requires_calibration or bool(activations is not None and activations.static)
                or any(t.requires_calibration for t in self.transforms))

    def format_for(self, name: str) -> "WeightFormat | None":
        """The format module ``name`` (a linear the default selection takes) is stored in; None: kept as is."""
        if self.include is not None and not any(fnmatch(name, p) for p in self.include):
            return None
        if any(fnmatch(name, p) for p in self.exclude):
            return None
        return next((o.format for o in self.overrides if any(fnmatch(name, p) for p in o.modules)), self)

    def head_format(self, head: str) -> "WeightFormat | None":
        """The format the output head ``head`` (a module name) takes, or None: it is kept.

        The default selection leaves the head out; an override whose globs match it takes it in (as GPTQModel's
        ``lm_head`` option and llama.cpp's quantized output matrix do).
        """
        if not any(fnmatch(head, p) for o in self.overrides for p in o.modules):
            return None
        return self.format_for(head)  # the format's include / exclude still apply

    @property
    def calibrates_head(self) -> bool:
        """Whether taking the output head in would calibrate it (refused: the head takes uncalibrated formats)."""
        return self.requires_calibration

    @model_validator(mode="after")
    def _overrides_are_plain(self) -> "WeightFormat":
        for o in self.overrides:
            f = o.format
            if not f.is_plain:
                raise ValueError("an override's format takes no include, exclude or overrides of its own")
            if f.unquantized_dtype(torch.float32) != self.unquantized_dtype(torch.float32):
                raise ValueError(f"override {f.label} would run the model in another dtype than {self.scheme_label}; "
                                 "give both the same compute_dtype (to keep modules unquantized, use exclude)")
        return self

    def stored_specs(self) -> tuple[Spec, ...]:
        """The stored forms this config writes into the linears it quantizes (its overrides aside), described from
        the config alone for the codecs; empty: none that any export target is asked about."""
        return ()

    @property
    def exports(self) -> tuple[str, ...]:
        """The export targets a model quantized with this config can be written to: those whose codecs claim every
        form it stores (``quant.codecs``), and for a mix those that give each module its own setting and take
        every override's format too. A format that rounds its activations goes only where the target's loaders
        round the input the same way (``Exporter.activations_refusal``)."""
        from .codecs import EXPORTERS, per_module_targets, targets_holding

        own = targets_holding(self.stored_specs(), EXPORTERS.names())
        if self.online_transforms:  # the weights need their input transform at run time: targets that carry it
            own = tuple(t for t in own if self.carries_online_transforms(t))
        activations = getattr(self, "activations", None)
        if activations is not None:
            own = tuple(t for t in own
                        if EXPORTERS[t].cls.activations_refusal(activations) is None)
        if not self.overrides:
            return own
        return tuple(t for t in per_module_targets(own) if all(t in o.format.exports for o in self.overrides))

    @property
    def online_transforms(self) -> list[Any]:
        """The transforms (its own and its overrides') that leave work to run time: not folded entirely."""
        return [t for f in (self, *(o.format for o in self.overrides)) for t in f.transforms if not t.folds_entirely]

    def carries_online_transforms(self, to: str) -> bool:
        """Whether export target ``to`` carries what this format's transforms leave to run time: at most one such
        transform per format, an input rotation, written by a target that writes those."""
        from .codecs import EXPORTERS

        if to not in EXPORTERS.names() or not EXPORTERS[to].cls.writes_input_rotations:
            return False
        one_each = all(sum(not t.folds_entirely for t in f.transforms) <= 1
                       for f in (self, *(o.format for o in self.overrides)))
        return one_each and all(t.rotates_inputs for t in self.online_transforms)

    exports_decided_at_export: ClassVar[bool] = False  # True: whether it exports depends on the quantized model

    def export_refusal(self, to: str) -> str | None:
        """Why a model in this format cannot be written as ``to``, decided from the config alone (before any model
        is loaded), or None: it can, or only the quantized model can tell."""
        if to in self.exports or self.exports_decided_at_export:
            return None
        from .codecs import EXPORTERS, targets_holding

        online = self.online_transforms
        if online and not self.carries_online_transforms(to):
            from .codecs.targets import run_time_note

            return (f"weight format {self.label} cannot be written as {to}: its transform {online[0].label} acts on "
                    f"each input at run time, which {to} does not carry ({run_time_note()})")
        activations = getattr(self, "activations", None)
        if activations is not None and to in targets_holding(self.stored_specs(), EXPORTERS.names()):
            why = EXPORTERS[to].cls.activations_refusal(activations)
            return f"weight format {self.label} cannot be written as {to}: {why}"
        others = ", ".join(self.exports) or "no target"
        return (f"weight format {self.label} cannot be written as {to} (its numbers export to: {others}); formats "
                f"that export to {to}: {', '.join(formats_exporting_to(to)) or 'none'}")

    @property
    def embedding_format(self) -> "WeightFormat | None":
        """The format an untied token embedding table is stored in (llama.cpp's named mixes store ``token_embd`` in
        their default type), or None: the table is kept. It applies where it stores ggml blocks, which a lookup
        reads row by row (``BlockEmbedding``)."""
        return None

    @property
    def head_holds_lookup_table(self) -> bool:
        """Whether a tied embedding, once the head is in this format, looks its rows up in the head's stored
        blocks (one table, as a GGUF without ``output.weight``) instead of keeping a copy beside them."""
        return False

    def missing_dependency(self) -> str | None:
        """What to install when a package this format needs (an optional extra) is missing, or None; asked before a
        run starts."""
        found = [o.format.missing_dependency() for o in self.overrides]
        return next((m for m in found if m), None)

    def check_model(self, linears: dict[str, tuple[int, int]], head: str | None,
                    base: torch.dtype) -> tuple[str, str] | None:
        """``(field, problem)`` when this config cannot apply as written to a model whose linears (the default
        selection) have these ``(out, in)`` shapes and whose output head is ``head``; checked before a run starts,
        so a glob that matches nothing is refused instead of labelling a mix that is not there."""
        names = [*linears, *([head] if head else [])]
        globs = [(f".{key}[{k}]", p) for key in ("include", "exclude") for k, p in enumerate(getattr(self, key) or ())]
        globs += [(f".overrides[{k}].modules", p) for k, o in enumerate(self.overrides) for p in o.modules]
        for where, pattern in globs:
            if not any(fnmatch(n, pattern) for n in names):
                return where, (f"'{pattern}' matches no linear module of the model (its names look like "
                               f"{', '.join(names[:2])}, ..., {names[-1]})" if names else f"'{pattern}' matches nothing")
        return None

    def prepare_model_(self, model: nn.Module) -> None:
        """Whole-model changes made before any module is replaced (e.g. a dtype cast)."""

    def unquantized_dtype(self, base: torch.dtype) -> torch.dtype:
        """The dtype of tensors the format leaves unquantized (embeddings, norms, biases, the head)."""
        return base

    def linear_weight_bytes(self, out_features: int, in_features: int, base: torch.dtype) -> int:
        """Bytes a selected linear weight ``[out, in]`` takes in this format's layout, from its shape alone
        (used by ``quantlab estimate``; a format without a formula is reported as not estimated)."""
        raise NotImplementedError

    def linear_weights_bytes(self, linears: dict[str, tuple[int, int]], base: torch.dtype) -> int:
        """Bytes these linears' weights (module name → ``(out, in)``) take in this format: each one's formula; a
        format whose layout follows a module's role and layer (llama.cpp's named mixes) reads the names."""
        return sum(self.linear_weight_bytes(o, i, base) for o, i in linears.values())

    def quantize_module(self, name: str, module: nn.Module) -> nn.Module | None:
        """A replacement for a selected linear module, or None to leave it as it is."""
        return None

    def replacement(self, model: nn.Module, name: str) -> nn.Module | None:
        """``quantize_module`` of the model's module ``name``, placed where that module runs (None: kept)."""
        from .offload import onloaded, placed

        old = model.get_submodule(name)
        with onloaded(old):  # an offloaded module's weights are brought in for its quantization only
            new = self.quantize_module(name, old)
        return None if new is None else placed(new, old)

    def observe_(self, model: nn.Module, names: list[str], calibration: Calibration | None,
                 shared: dict[Any, Any]) -> None:
        """Take from ``model``, before anything in it is quantized, what ``apply_`` will read of ``names`` (an
        importance matrix). A mix calls it for each candidate before it applies any; candidates that would collect
        the same thing find it in ``shared``, keyed by what determines it. Default: nothing to take."""

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        """Replace the ``selected`` linear modules in place; returns per-module details (may be empty).

        The default quantizes each module on its own; calibrated formats override this.
        """
        details: dict[str, Any] = {}
        for name in selected:
            new = self.replacement(model, name)
            if new is not None:
                model.set_submodule(name, new)
                details[name] = {}
        return details


class QuantizedWeightFormat(WeightFormat):
    """A format that replaces linear weights by a stored form and may run the rest of the model in another dtype."""

    compute_dtype: DtypeName | None = Field(default=None, description="activation dtype; null keeps the model's")

    def prepare_model_(self, model: nn.Module) -> None:
        from .offload import cast_

        if self.compute_dtype:
            cast_(model, DTYPES[self.compute_dtype])

    def unquantized_dtype(self, base: torch.dtype) -> torch.dtype:
        return DTYPES[self.compute_dtype] if self.compute_dtype else base

    def compute_dtype_label(self) -> list[str]:
        """The label part naming the compute dtype (none when the model's is kept)."""
        return [SHORT_DTYPE[self.compute_dtype]] if self.compute_dtype else []


def _tags(patterns: tuple[str, ...]) -> str:
    return ",".join(p.strip("*.") or p for p in patterns)


class ModuleOverride(BaseModel):
    """Modules (globs on their names) stored in another format than the entry's."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    modules: tuple[str, ...] = Field(min_length=1)
    format: WeightFormat

    @model_validator(mode="before")
    @classmethod
    def _flat(cls, data: Any) -> Any:
        """Accept ``{modules: ..., format: NAME, field: value...}`` (the recipe form) and a single glob."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if isinstance(data.get("modules"), str):
            data["modules"] = (data["modules"],)
        return WEIGHT_FORMATS.nested_entry(data, "modules", WeightFormat)

    @model_serializer
    def _spec(self) -> dict[str, Any]:
        return {"modules": list(self.modules), **format_entry(self.format)}


def build_format(entry: Any) -> WeightFormat:
    """A format from its recipe form: ``NAME`` or ``{format: NAME, field: value...}`` (a format is returned as is)."""
    return entry if isinstance(entry, WeightFormat) else WEIGHT_FORMATS.build_entry(entry)


def format_entry(fmt: WeightFormat) -> dict[str, Any]:
    """The recipe form of ``fmt`` (registered name and the fields set away from their defaults)."""
    return WEIGHT_FORMATS.recipe_entry(fmt)


for _cls in (WeightFormat, QuantizedWeightFormat):
    _cls.model_rebuild()

WEIGHT_FORMATS: Registry[WeightFormat] = Registry("weight format")


def formats_exporting_to(to: str) -> list[str]:
    """The registered weight-format names whose example writes to export target ``to``."""
    names = []
    for entry in WEIGHT_FORMATS.entries():
        try:
            example = entry.example()
        except Exception:  # noqa: BLE001 - an example that needs files or a package: not listed
            continue
        if example is not None and to in example.exports:
            names.append(entry.name)
    return names
