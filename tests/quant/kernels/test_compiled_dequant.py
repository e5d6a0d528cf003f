"""The fallback kernel (dequantize, then the dense matmul) is what every stored form runs on CUDA without a fused
kernel of its own, inside the compiled engine's graph: it must trace whole. A slice as a parameter default breaks
dynamo's graph in torch 2.11 (it cannot wrap one from an object built inside the trace, the stored form
``DequantKernel`` rebuilds), which left each linear of a compiled decode step on an H200 to run eagerly between
graphs (21 graph breaks for two Llama-3.1-8B layers, MXFP4 ~25x slower than bf16)."""
from __future__ import annotations

import inspect

import pytest
import torch

from quantlab import quantize_tensor
from quantlab.quant.forms.affine.float_zero import quantize_float_zero
from quantlab.quant.forms.codebook.tensor import quantize_codebook
from quantlab.quant.forms.float8.tensor import quantize_fp8
from quantlab.quant.forms.microscaling import quantize_mx, quantize_nvfp4
from quantlab.quant.kernels.base import DequantKernel
from quantlab.quant.tensors.base import WeightTensor

FORMS = {
    "int4-g64": lambda w: quantize_tensor(w, 4, 64), "int3-g64": lambda w: quantize_tensor(w, 3, 64),
    "nf4": lambda w: quantize_codebook(w, "nf4", 64), "float-zero": lambda w: quantize_float_zero(w, 4, 64),
    "fp8-b128": lambda w: quantize_fp8(w, block_size=128), "mxfp4": lambda w: quantize_mx(w, "e2m1"),
    "mxfp8": lambda w: quantize_mx(w, "e4m3"), "nvfp4": quantize_nvfp4,
}


def _subclasses(cls: type) -> list[type]:
    return [cls] + [s for sub in cls.__subclasses__() for s in _subclasses(sub)]


def test_no_stored_form_method_has_a_slice_default() -> None:
    assert len(_subclasses(WeightTensor)) > 5
    for cls in _subclasses(WeightTensor):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            for param in inspect.signature(fn).parameters.values():
                assert not isinstance(param.default, slice), f"{cls.__name__}.{name}({param.name}=slice)"


@pytest.mark.parametrize("form", FORMS)
def test_the_fallback_kernel_traces_whole_and_equals_eager(form: str) -> None:
    w = torch.randn(128, 256, generator=torch.Generator().manual_seed(0)) * 0.05
    kernel = DequantKernel(FORMS[form](w))
    x = torch.randn(1, 256)
    torch._dynamo.reset()
    compiled = torch.compile(kernel, fullgraph=True)  # a graph break raises
    assert torch.allclose(compiled(x), kernel(x), rtol=1e-5, atol=1e-6)
