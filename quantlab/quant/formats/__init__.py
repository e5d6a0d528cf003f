"""Weight formats, one module per family. Importing this package registers every built-in one."""
from . import awq, cast, checkpoint, codebook, fp8, gguf, gptq, gptqmodel, hqq, rtn  # noqa: F401  (registration)
