"""``hadamard``: a Walsh-Hadamard rotation of each linear's input with its inverse folded into the weight
(llm-compressor's QuIP-style online transform, compressed-tensors' ``hadamard`` / ``random-hadamard``): the layer
computes ``(x Ĥ)(W Ĥ)ᵀ = x Wᵀ`` for the orthogonal ``Ĥ = D H / √n``, and the format rounds ``W Ĥ``, whose outliers
the rotation spreads over the row.

``H`` is compressed-tensors' construction for any size ``n = K·2^m`` with a known Hadamard matrix of order ``K``
(its table, N. J. A. Sloane's library): ``m`` butterfly steps, then the order-``K`` matrix. ``D`` is a diagonal
of random signs (``randomize``: compressed-tensors' ``random_hadamard_matrix`` with a generator seeded ``seed``),
or the identity (for a power of two, Sylvester's matrix: ``deterministic_hadamard_matrix``). The input is rotated
by that butterfly in ``O(n log n)``, never as an ``n × n`` matrix.

``block_size: b`` rotates each run of ``b`` inputs by the same ``Ĥ_b`` instead (a block-diagonal rotation,
compressed-tensors' ``head_dim``, llm-compressor's ``transform_block_size``): matched to a format's group (16 for
NVFP4, 32 for MXFP4), a rotation stays inside each group's scale, as MR-GPTQ pairs them."""
from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from pydantic import Field
from torch import nn

from ...errors import UnsupportedError
from .base import TRANSFORMS, InputRotation, Transform


def known_factor(n: int) -> torch.Tensor:
    """The ±1 Hadamard matrix of order ``K`` (float32) that compressed-tensors' construction uses for size ``n``:
    the largest order in its table with ``n / K`` a power of two."""
    from compressed_tensors.transform.utils import hadamard as ct

    found = ct._fetch_hadamard_divisor(n, torch.float32)
    if found is None:
        raise ValueError(f"no Hadamard matrix of size {n}: it must be K·2^m for a known order K (powers of two, "
                         "multiples of 4 up to 256)")
    return found


def butterfly(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``x [..., n]`` times compressed-tensors' unnormalized Hadamard construction (as ``_matmul_hadU`` maps each
    row), in float32."""
    shape, n, k = x.shape, x.shape[-1], factor.shape[0]
    v = x.reshape(-1, n, 1).float()
    while v.shape[1] > k:
        v = v.view(v.shape[0], v.shape[1] // 2, 2, v.shape[2])
        v = torch.stack((v[:, :, 0] + v[:, :, 1], v[:, :, 0] - v[:, :, 1]), dim=2)
        v = v.view(v.shape[0], v.shape[1], -1)
    return (factor.to(v.device) @ v).reshape(shape)


class HadamardRotation(InputRotation):
    """``x ↦ x Ĥ`` in the input's dtype (computed in float32); with ``Ĥ`` smaller than the input, each run of
    its size rotated alike (block-diagonal)."""

    def __init__(self, signs: torch.Tensor, factor: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("signs", signs)
        self.register_buffer("factor", factor)
        self.scale = 1.0 / math.sqrt(signs.numel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        blocks = x.float().unflatten(-1, (-1, self.signs.numel()))
        return (butterfly(blocks * self.signs, self.factor) * self.scale).flatten(-2).to(x.dtype)

    def matrix(self) -> torch.Tensor:
        return butterfly(torch.diag(self.signs.float()), self.factor).round()  # ±1: D H

    @property
    def sylvester(self) -> bool:
        n = self.signs.numel()
        return n & (n - 1) == 0 and bool((self.signs == 1).all())  # the construction is Sylvester's there

    def extra_repr(self) -> str:
        return f"n={self.signs.numel()}, K={self.factor.shape[0]}"


@TRANSFORMS.register("hadamard", "rotate each linear's input by a Walsh-Hadamard matrix and fold its inverse into the "
                     "weight (QuIP-style online rotation); fields: randomize (random signs), seed, block_size")
class Hadamard(Transform):
    example_fields: ClassVar[dict[str, Any]] = {"randomize": True}
    rotates_inputs: ClassVar[bool] = True
    randomize: bool = Field(False, description="random ±1 signs before the rotation (compressed-tensors' "
                            "random-hadamard), drawn from a generator seeded with seed")
    seed: int = Field(0, description="the signs' generator seed (randomize)")
    block_size: int | None = Field(None, ge=2, description="rotate each run of this many inputs alike (a "
                                   "block-diagonal rotation: compressed-tensors' head_dim), e.g. the format's group "
                                   "(16 for NVFP4, 32 for MXFP4); default: the whole input")

    @property
    def label(self) -> str:
        return f"had{'r' + str(self.seed) if self.randomize else ''}{'b' + str(self.block_size) if self.block_size else ''}"

    def signs(self, n: int) -> torch.Tensor:
        """compressed-tensors' ``random_hadamard_matrix`` draws: ``randint(0, 2, (n,))`` from the seeded
        generator, as ±1."""
        if not self.randomize:
            return torch.ones(n)
        return torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(self.seed)).float() * 2 - 1

    def input_module(self, in_features: int, device: torch.device) -> nn.Module:
        n = self.block_size or in_features
        if in_features % n:
            raise UnsupportedError(f"hadamard block_size {n} does not divide a linear's {in_features} inputs")
        return HadamardRotation(self.signs(n).to(device), known_factor(n).to(device))

    def weight(self, weight: torch.Tensor, input_module: nn.Module) -> torch.Tensor:
        return input_module(weight)  # each row rotated as an input is: (x Ĥ)(W Ĥ)ᵀ = x Wᵀ
