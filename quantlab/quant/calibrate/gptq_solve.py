"""The GPTQ solve (Frantar et al., 2022) as a pure function of a weight and its Hessian.

``H = 2 X Xᵀ / n`` over calibration inputs X. Columns are quantized one at a time
and the error of each is spread over the not-yet-quantized columns through the
upper Cholesky factor of ``H⁻¹``, with lazy batch updates of ``block_size``
columns. Group scales are chosen when a group starts, from the weights as the
last block update left them (the reference implementation's choice, which
GPTQModel and AutoGPTQ keep); with ``act_order`` columns are visited by
decreasing ``diag(H)`` and ``g_idx`` records the group of each original column.
Scales are float32 during the solve, as in the reference, and rounded to
``scale_dtype`` (nearest) when stored: the codes equal GPTQModel's for the same
weight and Hessian.
"""
from __future__ import annotations

import torch

from ...errors import UnsupportedError
from ..forms.affine.tensor import QuantizedTensor
from ..tensors.primitives import ClipSearch, check_finite, choose_qparams, max_code, pack


def _inverse_cholesky(hessian: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of the dampened Hessian's inverse."""
    h = hessian.clone()
    h.diagonal().add_(damp * h.diagonal().mean())
    for _ in range(6):  # raise the dampening until the factorization succeeds
        chol, info = torch.linalg.cholesky_ex(h)
        if info == 0:
            break
        h.diagonal().add_(damp * h.diagonal().mean())
    else:
        raise UnsupportedError("the Hessian is not positive definite even after dampening")
    return torch.linalg.cholesky(torch.cholesky_inverse(chol), upper=True)


def gptq_quantize(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    bits: int,
    group_size: int | None = None,
    symmetric: bool = False,
    act_order: bool = False,
    damp: float = 0.01,
    block_size: int = 128,
    scale_dtype: torch.dtype = torch.float16,
    clip: ClipSearch | None = None,
) -> QuantizedTensor:
    """Quantize ``weight [out, in]`` minimizing the output error on inputs whose Hessian is ``hessian [in, in]``."""
    out, n_in = weight.shape
    if hessian.shape != (n_in, n_in):
        raise UnsupportedError(f"Hessian shape {tuple(hessian.shape)} does not match the input dimension {n_in}")
    check_finite(weight)
    w = weight.detach().float().clone()
    h = hessian.detach().float().clone()
    dead = h.diagonal() == 0  # inputs that were always zero: their weights cannot matter
    h[dead, dead] = 1
    w[:, dead] = 0
    perm = torch.argsort(h.diagonal(), descending=True) if act_order else torch.arange(n_in, device=w.device)
    w, h = w[:, perm], h[perm][:, perm]
    hinv = _inverse_cholesky(h, damp)

    gs = group_size or n_in
    codes = torch.zeros(out, n_in, dtype=torch.uint8, device=w.device)
    scales, zeros = [], []
    if group_size is None:
        scale, zero = choose_qparams(w.unsqueeze(1), bits, symmetric, torch.float32, clip)
        scales.append(scale), zeros.append(zero)
    for i1 in range(0, n_in, block_size):
        i2 = min(i1 + block_size, n_in)
        w1, err1, hinv1 = w[:, i1:i2].clone(), torch.zeros(out, i2 - i1, device=w.device), hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if group_size is not None and col % gs == 0:
                scale, zero = choose_qparams(w[:, col:col + gs].unsqueeze(1), bits, symmetric, torch.float32, clip)
                scales.append(scale), zeros.append(zero)
            s, z = scales[-1][:, 0].float(), zeros[-1][:, 0].float()
            q = torch.clamp(torch.round(w1[:, i] / s) + z, 0, max_code(bits))
            codes[:, col] = q.to(torch.uint8)
            err = (w1[:, i] - (q - z) * s) / hinv1[i, i]
            w1[:, i:] -= err.unsqueeze(1) * hinv1[i, i:].unsqueeze(0)
            err1[:, i] = err
        w[:, i2:] -= err1 @ hinv[i1:i2, i2:]

    inv = torch.argsort(perm)
    scale_t, zero_t = torch.cat(scales, dim=1).to(scale_dtype), torch.cat(zeros, dim=1)
    g_idx = None
    if act_order and group_size is not None:
        g_idx = (torch.arange(n_in, device=w.device) // gs)[inv].to(torch.int32)
    return QuantizedTensor(
        packed=pack(codes[:, inv], bits), scales=scale_t, zeros=None if symmetric else pack(zero_t, bits),
        shape=(out, n_in), bits=bits, group_size=group_size, g_idx=g_idx,
    )
