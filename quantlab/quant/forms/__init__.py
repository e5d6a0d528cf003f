"""Stored weight forms, one folder each: the layout (``tensor``), its matmul kernels, and its codecs (how it is
written to each export target). The algorithms that fill a form (RTN, GPTQ, AWQ, HQQ, the GGUF rules) live in
``quant/formats``. Importing this package registers every built-in form's kernels and codecs."""
from . import affine, codebook, float8, ggml, microscaling  # noqa: F401  (registration)
