"""GPTQModel's own quantized linear kernels (``pip install quantlab[gptq]``) as a matmul path.

GPTQModel chooses, for the device, bits, group size and activation dtype, among
its kernels (Marlin, ExLlama, Triton on CUDA; torch and aten ones on CPU). The
tensor is handed over in the GPTQ checkpoint layout that kernel expects (v1 or
v2 zero points). Each candidate is checked once on a probe batch against the
dequantized reference and skipped if it disagrees, so the path recorded is one
that was verified for this tensor; its class name is recorded with it.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import logging
from typing import Iterator

import torch

from ....errors import UnsupportedError
from ...kernels.base import KERNELS, Kernel
from .tensor import QuantizedTensor

GPTQ_BITS = (2, 4, 8)
HALF_DTYPES = (torch.float16, torch.bfloat16)
PROBE_ROWS = 4
PROBE_TOLERANCE = 2e-2  # relative Frobenius error; the kernels compute in 16-bit, wrong layouts give ~0.3+


@functools.cache
def gptqmodel_available() -> bool:
    return importlib.util.find_spec("gptqmodel") is not None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """GPTQModel logs a banner and per-kernel notes on first use; keep them out of quantlab's output."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@functools.cache
def _candidates(bits: int, group_size: int, symmetric: bool, act_order: bool, device_type: str,
                dtype: torch.dtype) -> tuple[type, ...]:
    """GPTQModel's kernel classes for these settings, in its order of preference (empty if none)."""
    if not gptqmodel_available():
        return ()
    with _quiet():
        from gptqmodel.quantization import FORMAT
        from gptqmodel.utils.importer import select_quant_linear

        try:
            found = select_quant_linear(bits=bits, group_size=group_size, desc_act=act_order, sym=symmetric,
                                        device=device_type, format=FORMAT.GPTQ, dtype=dtype, multi_select=True,
                                        pack_dtype=torch.int32)
        except Exception:  # GPTQModel raises plain exceptions for "no kernel supports this"
            return ()
    return tuple(found if isinstance(found, list) else [found])


@contextlib.contextmanager
def _inductor_config_kept() -> Iterator[None]:
    """Some GPTQModel CPU kernels set global inductor options on first call; undo that."""
    try:
        import torch._inductor.config as config
    except ImportError:  # pragma: no cover
        yield
        return
    saved = {k: getattr(config, k) for k in ("freezing", "max_autotune")}
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(config, k, v)


def _build(cls: type, q: QuantizedTensor, device: torch.device) -> torch.nn.Module:
    from .gptq_layout import to_gptq_tensors

    layout = "gptq_v2" if getattr(cls, "REQUIRES_FORMAT_V2", False) else "gptq"
    tensors = to_gptq_tensors(q.to("cpu"), layout)
    out, n_in = q.shape
    module = cls(bits=q.bits, group_size=q.group_size or -1, sym=q.symmetric, desc_act=q.g_idx is not None,
                 in_features=n_in, out_features=out, bias=False, pack_dtype=torch.int32, register_buffers=True)
    for name, value in tensors.items():
        buffer = getattr(module, name)
        if buffer.shape != value.shape:
            raise ValueError(f"{cls.__name__} expects {name} of shape {tuple(buffer.shape)}, not {tuple(value.shape)}")
        buffer.data.copy_(value)
    module = module.to(device).eval()
    module.post_init()
    return module


@KERNELS.register
class GPTQModelKernel(Kernel):
    """A GPTQModel ``QuantLinear`` chosen by GPTQModel and verified on a probe batch."""

    path = "gptqmodel"
    preference = 60
    tensor_type = QuantizedTensor

    def __init__(self, q: QuantizedTensor, dtype: torch.dtype) -> None:
        super().__init__()
        self.shape, self.bits, self.group_size = q.shape, q.bits, q.group_size
        self.symmetric, self.act_order = q.symmetric, q.g_idx is not None
        self.dtype = dtype
        device = q.packed.device
        generator = torch.Generator(device="cpu").manual_seed(0)
        probe = torch.randn(PROBE_ROWS, q.shape[1], generator=generator).to(device, dtype)
        reference = probe.float() @ q.dequantize(torch.float32).t()
        rejected: list[str] = []
        for cls in _candidates(q.bits, q.group_size or -1, q.symmetric, q.g_idx is not None, device.type, dtype):
            try:
                with _quiet(), _inductor_config_kept(), torch.no_grad():
                    module = _build(cls, q, device)
                    got = module(probe).float()
            except Exception as e:  # noqa: BLE001 - a candidate that cannot run is skipped, with its reason
                rejected.append(f"{cls.__name__} ({type(e).__name__})")
                continue
            error = ((got - reference).norm() / reference.norm().clamp_min(1e-12)).item()
            if error <= PROBE_TOLERANCE:
                self.module, self.implementation = module, cls.__name__
                self.path = f"gptqmodel:{cls.__name__}"  # the class actually used, recorded in results
                return
            rejected.append(f"{cls.__name__} (probe error {error:.2f})")
        raise UnsupportedError(f"no GPTQModel kernel agrees with the reference for {q.bits}-bit weights {q.shape}: "
                               f"{', '.join(rejected) or 'none offered'}")

    @classmethod
    def in_auto(cls, device: torch.device) -> bool:
        # On CPU GPTQModel offers TorchLinear and its fused variants: slower than dequantize+matmul for every
        # width measured (benchmarks/linear_kernels.py) and recompiled by torch.compile on every new shape
        # until the recompile limit. They stay selectable by name (kernel: gptqmodel).
        return device.type != "cpu"

    @classmethod
    def supports(cls, q: QuantizedTensor, device: torch.device, dtype: torch.dtype) -> bool:
        # 16-bit activations only: some kernels take float32 but compute in bfloat16, a silent precision change.
        if q.bits not in GPTQ_BITS or q.per_tensor or dtype not in HALF_DTYPES or not gptqmodel_available():
            return False
        return bool(_candidates(q.bits, q.group_size or -1, q.symmetric, q.g_idx is not None, device.type, dtype))

    def analytic_nbytes(self) -> int:
        """The GPTQ layout: packed codes, float16 scales and packed zero points per group, int32 g_idx."""
        out, n_in = self.shape
        groups = 1 if self.group_size is None else -(-n_in // self.group_size)
        codes_and_zeros = (out * n_in + groups * out) * self.bits // 8
        return codes_and_zeros + groups * out * 2 + 4 * n_in

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        eye = torch.eye(self.shape[1], dtype=self.dtype, device=self.module.qweight.device)
        with torch.no_grad():
            return self.module(eye).t().to(dtype)

    def stored(self) -> QuantizedTensor:
        """The GPTQ tensors the QuantLinear holds (qweight / qzeros / scales / g_idx), read as GPTQModel keeps them
        in memory (zero points as they are, its v2 form) and checked against the module's own product; a kernel
        that repacked them for its own layout is refused."""
        from .gptq_layout import from_gptq_tensors

        m = self.module
        if not all(isinstance(getattr(m, k, None), torch.Tensor) for k in ("qweight", "qzeros", "scales", "g_idx")):
            raise UnsupportedError(f"{self.path} holds no GPTQ tensors to read back")
        tensors = {k: getattr(m, k).detach().cpu() for k in ("qweight", "qzeros", "scales", "g_idx")}
        expected = self.dequantize(torch.float32).cpu()
        for layout in ("gptq_v2", "gptq"):
            try:
                q = from_gptq_tensors(tensors, self.bits, self.group_size or -1, self.symmetric, layout)
            except Exception:  # noqa: BLE001 - a layout these tensors are not in
                continue
            if q.shape == self.shape and torch.allclose(q.dequantize(torch.float32), expected, rtol=2e-2, atol=1e-3):
                return q.to(self.module.qweight.device)
        raise UnsupportedError(f"{self.path} repacked its weights into a layout of its own, which is not read back")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)


