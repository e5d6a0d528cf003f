"""``rotate-residual``: an orthogonal rotation of the residual stream folded into the model (SpinQuant's R1 without
training, QuaRot's offline rotation; llm-compressor's ``SpinQuantModifier`` with R1 and norm fusion).

Every RMSNorm's weight is first folded into the linears that read its output (q/k/v, gate/up, the output head),
leaving norms that only normalize, which commute with any rotation ``Q`` (``rms(x Q) = rms(x)``). Then the token
embedding becomes ``E Q``, every linear that reads the residual stream ``W Q``, and every linear that writes to it
(o_proj, down_proj) ``Qᵀ W`` with its bias ``b Q``: the residual stream is ``h Q`` throughout and the logits are
unchanged, while each weight the format rounds has had its outlier input channels mixed by ``Q``. ``Q`` is
compressed-tensors' Hadamard matrix of the hidden size over its square root (random signs by default, as QuaRot
and SpinQuant start from). Nothing remains to do at run time, so the model exports as any other; a tied embedding
is untied first (the head takes the final norm's weight, the table does not), which the memory table shows.

Only for models whose norms multiply by their weight and sit before the blocks alone (Llama, Mistral, Qwen 2,
SmolLM2); Gemma's norms multiply by ``1 + weight`` and wrap each block's output as well, which no rotation
commutes with.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from ...errors import UnsupportedError
from .base import TRANSFORMS, Transform
from .hadamard import Hadamard
from .smoothquant import norm_offset

READS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
WRITES = ("self_attn.o_proj", "mlp.down_proj")
NORMS = {"input_layernorm": READS[:3], "post_attention_layernorm": READS[3:]}


def _layers(model: nn.Module) -> tuple[nn.Module, list[nn.Module]]:
    """The decoder (holding ``embed_tokens``, ``layers`` and ``norm``) and its layers, or ``UnsupportedError``
    naming what the model lacks."""
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if decoder is None or layers is None or not hasattr(decoder, "embed_tokens") or not hasattr(decoder, "norm"):
        raise UnsupportedError(f"rotate-residual folds into Llama-style decoders (model.embed_tokens, model.layers, "
                               f"model.norm); {type(model).__name__} has another layout")
    for layer in layers:
        names = {n for n, _ in layer.named_modules()}
        missing = [n for n in (*READS, *WRITES, *NORMS) if n not in names]
        extra = [n for n in names if n.endswith("feedforward_layernorm") or n.startswith("post_feedforward")]
        if missing or extra:
            raise UnsupportedError(f"rotate-residual folds into Llama-style layers (a norm before attention and "
                                   f"before the MLP, nothing after them); {type(model).__name__}'s layers "
                                   + (f"lack {', '.join(missing)}" if missing else f"have {', '.join(extra)}"))
    for norm in [decoder.norm, *(getattr(layer, n) for layer in layers for n in NORMS)]:
        if norm_offset(norm) != 0.0:
            raise UnsupportedError(f"rotate-residual folds norms that multiply by their weight; {type(model).__name__}"
                                   f"'s {type(norm).__name__} does not (Gemma's multiply by 1 + weight)")
    return decoder, list(layers)


def _fold_norm_(norm: nn.Module, linears: list[nn.Module]) -> None:
    """``norm``'s weight into the columns of the ``linears`` reading it; the norm's weight becomes 1."""
    g = norm.weight.data.float()
    for lin in linears:
        lin.weight.data = (lin.weight.data.float() * g).to(lin.weight.dtype)
    norm.weight.data = torch.ones_like(norm.weight.data)


@TRANSFORMS.register("rotate-residual", "rotate the residual stream by a Hadamard matrix folded into the embedding, "
                     "the norms and every linear (SpinQuant's R1 without training, for Llama-style models); fields: "
                     "randomize, seed")
class RotateResidual(Transform):
    example_fields: ClassVar[dict[str, Any]] = {"seed": 0}
    randomize: bool = Field(True, description="random ±1 signs before the Hadamard matrix (QuaRot's and SpinQuant's "
                            "starting rotation); false: the deterministic matrix")
    seed: int = Field(0, description="the signs' generator seed")

    @property
    def label(self) -> str:
        return f"rr{self.seed}" if self.randomize else "rr"

    @property
    def folds_entirely(self) -> bool:
        return True

    def rotation(self, n: int, device: torch.device) -> torch.Tensor:
        """``Q`` ``[n, n]`` float32: compressed-tensors' (random-signed) Hadamard matrix over ``√n``."""
        module = Hadamard(randomize=self.randomize, seed=self.seed).input_module(n, device)
        return module(torch.eye(n, device=device))

    @torch.no_grad()
    def apply_(self, model: nn.Module, names: list[str], steps: dict[str, list[nn.Module]],
               samples: list[torch.Tensor] | None) -> None:
        if getattr(model, "_residual_rotated", False):
            raise UnsupportedError("rotate-residual rotates the whole model once; it is already rotated (give it to "
                                   "one format of a mix, not to each)")
        decoder, layers = _layers(model)
        head = model.get_output_embeddings()
        table = decoder.embed_tokens
        if head is not None and head.weight is table.weight:  # tied: the head takes the final norm, the table not
            head.weight = nn.Parameter(table.weight.data.clone(), requires_grad=False)
            if getattr(model.config, "tie_word_embeddings", False):
                model.config.tie_word_embeddings = False
        for layer in layers:
            for norm, reads in NORMS.items():
                _fold_norm_(getattr(layer, norm), [layer.get_submodule(n) for n in reads])
        _fold_norm_(decoder.norm, [head] if head is not None else [])
        q = self.rotation(table.weight.shape[1], table.weight.device)
        table.weight.data = (table.weight.data.float() @ q).to(table.weight.dtype)
        for lin in [*(layer.get_submodule(n) for layer in layers for n in READS), *([head] if head else [])]:
            lin.weight.data = (lin.weight.data.float() @ q).to(lin.weight.dtype)
        for lin in (layer.get_submodule(n) for layer in layers for n in WRITES):
            lin.weight.data = (q.T @ lin.weight.data.float()).to(lin.weight.dtype)
            if lin.bias is not None:
                lin.bias.data = (lin.bias.data.float() @ q).to(lin.bias.dtype)
        model._residual_rotated = True
