"""Dtype names as recipes and configs spell them, and their torch dtypes."""
from __future__ import annotations

from typing import Literal

import torch

DtypeName = Literal["float32", "bfloat16", "float16"]
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHORT_DTYPE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
