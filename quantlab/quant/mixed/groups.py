"""Groups of a model's linears, as sensitivity tables and mixed precision see them: a decoder layer, a module
type across layers, or one module (a linear outside the decoder layers, such as the output head, is always a
group of its own at layer granularity)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from torch import nn

from ..calibrate.layers import decoder_layers_name

Granularity = Literal["layer", "module-type", "module"]
GRANULARITIES = ("layer", "module-type", "module")


@dataclass(frozen=True)
class ModuleGroup:
    name: str  # what a table calls it: "layer 3", "down_proj" or a module's name
    patterns: tuple[str, ...]  # globs that select it (a format's include)
    modules: tuple[str, ...]  # the linears in it
    layer: int | None  # decoder layer, where the group lies in one
    kind: str | None  # module type (the last part of the name), where the group has one
    first_layer: int | None  # the earliest decoder layer of its linears (None: one lies outside the layers)


def group_linears(model: nn.Module, names: list[str], granularity: Granularity) -> list[ModuleGroup]:
    """``names`` (linears of ``model``) grouped by ``granularity``, in model order."""
    prefix = decoder_layers_name(model) + "."

    def layer_of(name: str) -> int | None:
        return int(name[len(prefix):].split(".", 1)[0]) if name.startswith(prefix) else None

    def kind_of(name: str) -> str:
        return name.rsplit(".", 1)[-1]

    def first(members: tuple[str, ...]) -> int | None:
        at = [layer_of(n) for n in members]
        return None if None in at else min(at)  # type: ignore[type-var]

    if granularity == "module":
        return [ModuleGroup(n, (n,), (n,), layer_of(n), kind_of(n), layer_of(n)) for n in names]
    if granularity == "module-type":
        kinds = dict.fromkeys(kind_of(n) for n in names)
        return [ModuleGroup(k, (k, f"*.{k}"), members, None, k, first(members))
                for k in kinds if (members := tuple(n for n in names if kind_of(n) == k))]
    indices = sorted({i for n in names if (i := layer_of(n)) is not None})
    layers = [ModuleGroup(f"layer {i}", (f"{prefix}{i}.*",), tuple(n for n in names if layer_of(n) == i), i, None, i)
              for i in indices]
    outside = [ModuleGroup(n, (n,), (n,), None, kind_of(n), None) for n in names if layer_of(n) is None]
    return layers + outside  # a linear outside the decoder layers (the output head) is a group of its own
