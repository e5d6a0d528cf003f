"""Mixed precision under a byte budget: each linear (or group) in the candidate that costs the least divergence.

``{format: mixed, candidates: [int8, {format: int4, group_size: 128}, {format: int3, group_size: 128}],
bits_per_weight: 4.25}`` (or ``budget_bytes``, or ``budget_format``: the bytes another format would take).

1. Sensitivity: for every group of linears (``granularity``) and every candidate, the mean KL divergence from
   the unquantized model when only that group is in that candidate, on windows of the calibration text (not the
   evaluation text, so the choice is not fitted to what it is judged on). It is measured in process
   (``measure.module_sensitivity.scan``), or read from ``sensitivity_path`` when that file exists (a
   ``quantlab sensitivity`` table with a ``format`` column, or this format's own); a scan writes its table
   there, so other budgets over the same candidates reuse it.
2. Assignment: the candidates' byte formulas give each group's bytes per candidate; the exact multiple-choice
   knapsack (``knapsack.choose``) minimizes the summed divergence with the total within the budget. The sum
   treats the groups' divergences as additive, the usual first-order assumption of such searches; the variant's
   own divergence measurement then shows the combined effect.
3. Each candidate is applied to its linears through its own ``apply_`` (calibrated ones last, so they see the
   others quantized); every replaced linear's details name its candidate (the report's per-module table).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, ClassVar

import torch
from pydantic import Field, field_serializer, field_validator, model_validator
from torch import nn

from ...errors import QuantlabError
from ..apply import default_exclude
from ..format import WEIGHT_FORMATS, Calibration, WeightFormat, build_format, format_entry
from ..linear import linear_weight
from .groups import Granularity, ModuleGroup, group_linears
from .knapsack import InfeasibleBudget, choose

TABLE_KEYS = ("group", "format", "kl_divergence_mean")


@WEIGHT_FORMATS.register("mixed", "per-module choice among candidate formats under a byte budget, by measured "
                         "divergence; fields: candidates, budget_bytes | bits_per_weight | budget_format, granularity, "
                         "sensitivity_path, scan_tokens")
class MixedFormat(WeightFormat):
    takes_transforms: ClassVar[bool] = False  # each candidate takes its own
    requires_calibration: ClassVar[bool] = True  # the sensitivity scan reads the calibration text
    example_fields: ClassVar[dict[str, Any] | None] = {
        "candidates": ["int8", {"format": "int4", "group_size": 64}], "budget_format": {"format": "int4", "group_size": 32},
        "scan_tokens": 256}
    format_fields: ClassVar[tuple[str, ...]] = ("candidates", "budget_format")  # recipes resolve these as formats
    candidates: tuple[WeightFormat, ...] = Field(min_length=2, description="the formats a linear may be stored in")
    budget_bytes: int | None = Field(None, gt=0, description="most bytes the selected linears' weights may take")
    bits_per_weight: float | None = Field(None, gt=0, description="most bits per weight over the selected linears "
                                          "(scales and zero points included)")
    budget_format: WeightFormat | None = Field(None, description="as many bytes as this format would take")
    granularity: Granularity = Field("module", description="what takes one format: module, layer or module-type")
    sensitivity_path: str | None = Field(None, description="CSV of divergences per group and candidate: read when "
                                         "it exists, else measured and written there")
    scan_tokens: int = Field(2048, ge=2, description="calibration tokens the sensitivity scan scores")
    export_to: str | None = Field(None, description="an export target (gguf, compressed-tensors, ...): every candidate "
                                  "must write to it exactly, so the chosen mix can be deployed there")
    head: bool = Field(False, description="the output head joins the choice as a group of its own: in a candidate "
                       "that needs no calibration, or kept as it is (kept, a tied head costs nothing beyond the "
                       "embedding table the lookup needs anyway; quantized, it takes a copy of its own)")

    @field_validator("candidates", mode="before")
    @classmethod
    def _candidates(cls, value: Any) -> Any:
        return tuple(build_format(e) for e in value) if isinstance(value, (list, tuple)) else value

    @field_validator("budget_format", mode="before")
    @classmethod
    def _budget_format(cls, value: Any) -> Any:
        return None if value is None else build_format(value)

    @field_serializer("candidates")
    def _dump_candidates(self, value: tuple[WeightFormat, ...]) -> list[dict[str, Any]]:
        return [format_entry(f) for f in value]

    @field_serializer("budget_format")
    def _dump_budget_format(self, value: WeightFormat | None) -> dict[str, Any] | None:
        return None if value is None else format_entry(value)

    @model_validator(mode="after")
    def _consistent(self) -> "MixedFormat":
        budgets = [k for k in ("budget_bytes", "bits_per_weight", "budget_format") if getattr(self, k) is not None]
        if len(budgets) != 1:
            raise ValueError("give exactly one of budget_bytes, bits_per_weight, budget_format")
        if self.overrides:
            raise ValueError("mixed chooses each module's format itself: use include/exclude, not overrides")
        if self.head and all(c.requires_calibration for c in self.candidates):
            raise ValueError("head: the output head takes only formats without calibration data, and every "
                             "candidate needs it")
        if self.export_to is not None:
            from ..io import EXPORTERS

            if self.export_to not in EXPORTERS:
                raise ValueError(f"export_to: unknown export target {self.export_to!r} (known: "
                                 f"{', '.join(EXPORTERS.names())})")
            for c in self.candidates:
                if self.export_to not in c.exports:
                    raise ValueError(f"export_to {self.export_to}: candidate {c.label} does not export to it "
                                     f"(it exports to: {', '.join(c.exports) or 'nothing'})")
        labels = [c.scheme_label for c in self.candidates]
        if len(set(labels)) != len(labels):
            raise ValueError(f"candidates repeat a format: {', '.join(labels)}")
        dtype = self.candidates[0].unquantized_dtype(torch.float32)
        for c in (*self.candidates, *([self.budget_format] if self.budget_format else [])):
            if isinstance(c, MixedFormat) or not c.is_plain:
                raise ValueError(f"candidate {c.label}: a plain format (no mixed, include, exclude or overrides)")
            try:
                c.linear_weights_bytes({"model.layers.0.mlp.down_proj": (64, 64)}, torch.float32)
            except NotImplementedError:
                raise ValueError(f"{c.label} has no byte formula, so it cannot be budgeted") from None
        for c in self.candidates:
            if c.unquantized_dtype(torch.float32) != dtype:
                raise ValueError(f"candidates {self.candidates[0].scheme_label} and {c.scheme_label} run the model in "
                                 "different dtypes; give them the same compute_dtype")
        return self

    @property
    def exports(self) -> tuple[str, ...]:
        """The per-module targets every candidate writes to."""
        from ..io.export import per_module_targets

        return per_module_targets(tuple(t for t in self.candidates[0].exports
                                        if all(t in c.exports for c in self.candidates)))

    @property
    def budget_label(self) -> str:
        if self.bits_per_weight is not None:
            return f"{self.bits_per_weight:g}bpw"
        if self.budget_bytes is not None:
            return f"{self.budget_bytes / 1e6:.4g}MB"
        return f"as-{self.budget_format.scheme_label}"  # type: ignore[union-attr]

    @property
    def scheme_label(self) -> str:
        by = "" if self.granularity == "module" else f"-by-{self.granularity}"
        head = "+head" if self.head else ""
        return f"mixed:{self.budget_label}{by}{head}[{','.join(c.scheme_label for c in self.candidates)}]"

    def head_format(self, head: str) -> WeightFormat | None:
        return self if self.head and self.format_for(head) is not None else None

    @property
    def embedding_format(self) -> WeightFormat | None:
        """An untied table is stored as the budget format stores it (a named GGUF mix: in its default type), so
        the mix and the file it is sized against hold the same table."""
        return None if self.budget_format is None else self.budget_format.embedding_format

    @property
    def calibrates_head(self) -> bool:
        return False  # the head's options are the candidates without calibration, and keeping it

    def options_for(self, group: ModuleGroup, heads: set[str]) -> list[int]:
        """Indices of the candidates ``group`` may take (the head: those without calibration)."""
        if heads & set(group.modules):
            return [j for j, c in enumerate(self.candidates) if not c.requires_calibration]
        return list(range(len(self.candidates)))

    def prepare_model_(self, model: nn.Module) -> None:
        for c in self.candidates:
            c.prepare_model_(model)

    def unquantized_dtype(self, base: torch.dtype) -> torch.dtype:
        return self.candidates[0].unquantized_dtype(base)

    def missing_dependency(self) -> str | None:
        found = [c.missing_dependency() for c in (*self.candidates, *([self.budget_format] if self.budget_format else []))]
        return next((m for m in found if m), None) or super().missing_dependency()

    def check_model(self, linears: dict[str, tuple[int, int]], head: str | None,
                    base: torch.dtype) -> tuple[str, str] | None:
        """Besides the globs: a budget below the smallest possible total is refused before the scan."""
        problem = super().check_model(linears, head, base)
        if problem is not None:
            return problem
        chosen = {name: shape for name, shape in linears.items() if self.format_for(name) is not None}
        budget = self.budget_for(chosen, base)
        smallest = sum(min(c.linear_weight_bytes(o, i, base) for c in self.candidates) for o, i in chosen.values())
        if smallest > budget:
            which = next(k for k in ("budget_bytes", "bits_per_weight", "budget_format") if getattr(self, k) is not None)
            return f".{which}", (f"the budget of {budget:,} bytes is below the smallest possible total, {smallest:,} "
                                 f"bytes (every selected linear in its smallest candidate)")
        return None

    def budget_for(self, linears: dict[str, tuple[int, int]], base: torch.dtype) -> int:
        """The budget in bytes over these linears (module name → ``(out, in)``)."""
        if self.budget_bytes is not None:
            return self.budget_bytes
        if self.bits_per_weight is not None:
            return math.floor(self.bits_per_weight * sum(o * i for o, i in linears.values()) / 8)
        return self.budget_format.linear_weights_bytes(linears, base)  # type: ignore[union-attr]

    def sensitivity(self, model: nn.Module, groups: list[ModuleGroup], calibration: Calibration | None,
                    heads: set[str] = frozenset()) -> dict[tuple[str, str], float]:
        """Mean KL per (group name, candidate label): read from ``sensitivity_path``, or scanned (and written there).
        A group holding the output head (``heads``) is measured in the candidates it may take only."""
        import pandas as pd

        path = Path(self.sensitivity_path) if self.sensitivity_path else None
        if path is not None and path.exists():
            table = pd.read_csv(path)
            missing_columns = [k for k in TABLE_KEYS if k not in table.columns]
            if missing_columns:
                raise QuantlabError(f"{path}: a sensitivity table needs the columns {', '.join(TABLE_KEYS)} "
                                    f"(missing: {', '.join(missing_columns)})")
        else:
            from ...files import atomic_write_text
            from .sensitivity import scan, scan_samples

            if calibration is None or not len(calibration):
                raise QuantlabError(f"weight format {self.label} scans sensitivity on calibration text: give calibration")
            samples = scan_samples(calibration, self.scan_tokens)
            barred = {(g.name, c.scheme_label) for g in groups for j, c in enumerate(self.candidates)
                      if j not in self.options_for(g, heads)}
            table = pd.DataFrame(scan(model, groups, list(self.candidates), samples, calibration, done=barred))
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(path, table.to_csv(index=False))
        found = {(str(r.group), str(r.format)): float(r.kl_divergence_mean) for r in table.itertuples()
                 if not pd.isna(r.kl_divergence_mean)}
        for g in groups:
            for c in (self.candidates[j] for j in self.options_for(g, heads)):
                if (g.name, c.scheme_label) not in found:
                    raise QuantlabError(f"{path}: no divergence for {g.name} in {c.scheme_label} (the table has "
                                        f"{', '.join(sorted(set(table['format'].astype(str))))}; granularity "
                                        f"{self.granularity}); delete it to measure again")
        return found

    def apply_(self, model: nn.Module, selected: list[str], calibration: Calibration | None) -> dict[str, Any]:
        if not selected:
            return {}
        heads = set(default_exclude(model)) & set(selected)
        groups = group_linears(model, selected, self.granularity)
        shapes = {n: tuple(linear_weight(model.get_submodule(n)).shape) for n in selected}
        base = linear_weight(model.get_submodule(selected[0])).dtype
        table = self.sensitivity(model, groups, calibration, heads)
        options = [self.options_for(g, heads) for g in groups]
        sizes = [[sum(self.candidates[j].linear_weight_bytes(*shapes[n], base) for n in g.modules) for j in opts]
                 for g, opts in zip(groups, options)]
        costs = [[table[(g.name, self.candidates[j].scheme_label)] for j in opts] for g, opts in zip(groups, options)]
        table = _tied_table_bytes(model, heads)
        for k, g in enumerate(groups):
            if heads & set(g.modules):
                # A tied table stays in float beside a quantized head that does not hold it
                sizes[k] = [b + (0 if self.candidates[j].head_holds_lookup_table else table)
                            for j, b in zip(options[k], sizes[k])]
                options[k].append(-1)  # keeping the head is one more option, at no divergence: its float bytes
                sizes[k].append(sum(linear_weight(model.get_submodule(n)).numel() for n in g.modules)
                                * torch.empty((), dtype=base).element_size())
                costs[k].append(0.0)
        budget = self.budget_for({n: shapes[n] for g in groups for n in g.modules}, base)
        if table and not (self.budget_format is not None and self.budget_format.head_holds_lookup_table):
            budget += table  # the budget's own head leaves the float table beside it (or it counts linears only)
        try:
            choice = choose(costs, sizes, budget)
        except InfeasibleBudget as e:
            raise QuantlabError(f"weight format {self.label}: {e} bytes (all in the smallest candidates)") from None
        assigned: dict[int, list[str]] = {}
        for g, opts, pick in zip(groups, options, choice.options):
            if opts[pick] >= 0:
                assigned.setdefault(opts[pick], []).extend(g.modules)
        shared: dict[Any, Any] = {}
        for option in assigned:  # statistics of the unquantized model, taken before any candidate changes it
            self.candidates[option].observe_(model, selected, calibration, shared)
        details: dict[str, Any] = {}
        for option in sorted(assigned, key=lambda o: self.candidates[o].needs_calibration):  # calibrated ones last
            fmt = self.candidates[option]
            found = fmt.apply_(model, assigned[option], calibration)
            details.update({n: {**d, "format": fmt.scheme_label} for n, d in found.items()})
        return details


def _tied_table_bytes(model: nn.Module, heads: set[str]) -> int:
    """Bytes of the token embedding table when the output head among ``heads`` is tied to it (0 otherwise)."""
    from ..apply import tied_embedding

    if not heads or not tied_embedding(model):
        return 0
    weight = model.get_input_embeddings().weight
    return weight.numel() * weight.element_size()
