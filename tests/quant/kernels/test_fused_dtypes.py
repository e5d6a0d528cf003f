"""A kernel that lists bfloat16 in ``fused_dtypes`` gets a bf16 model's activations in bfloat16, also inside a
compiled graph: given float32, inductor folds the widening into the op that produced the activations (a norm) and
passes its unrounded output, and the product misses its bfloat16 path."""
import pytest
import torch

from quantlab.quant.forms.affine.bitplane import BitplaneCPUKernel
from quantlab.quant.forms.affine.tensor import quantize_tensor
from quantlab.quant.forms.microscaling.kernel import E2M1CPUKernel
from quantlab.quant.forms.microscaling.quantize import quantize_mx
from quantlab.quant.kernels.base import KERNELS

N_IN = 576


def _weight() -> torch.Tensor:
    return torch.randn(64, N_IN, generator=torch.Generator().manual_seed(0)) * 0.05


BUILDERS = {  # every kernel taking bfloat16 as it is, by path
    "bitplane_cpu": lambda: BitplaneCPUKernel(quantize_tensor(_weight(), 3, 128), torch.bfloat16),
    "e2m1_lut_cpu": lambda: E2M1CPUKernel(quantize_mx(_weight(), "e2m1"), torch.bfloat16),
}


def test_every_kernel_that_takes_bfloat16_is_checked_here() -> None:
    assert {path for path, cls in KERNELS.items() if torch.bfloat16 in getattr(cls, "fused_dtypes", ())} == set(BUILDERS)


@pytest.mark.parametrize("path", BUILDERS)
def test_a_compiled_graph_hands_the_product_a_bf16_models_activations_in_bfloat16(path: str) -> None:
    kernel = BUILDERS[path]()
    seen: list[torch.dtype] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        seen.extend(node.args[0].meta["example_value"].dtype for node in gm.graph.nodes
                    if isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "quantlab")
        return gm.forward

    def norm_then_product(x: torch.Tensor) -> torch.Tensor:
        return kernel(torch.nn.functional.rms_norm(x, (N_IN,)))

    x = torch.randn(1, N_IN, generator=torch.Generator().manual_seed(1)).bfloat16()
    y = torch.compile(norm_then_product, backend=backend, fullgraph=True)(x)
    assert seen == [torch.bfloat16]
    assert torch.equal(y, norm_then_product(x))
