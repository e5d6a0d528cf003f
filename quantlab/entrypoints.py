"""Process set-up shared by quantlab's own entry points (the command, a variant's worker process, a Ray task);
the library itself changes no logging."""
from __future__ import annotations

IMPORT_NOISE_LOGGERS = ("torchao", "torch.utils._pytree")


def quiet_import_noise() -> None:
    """Silence ``IMPORT_NOISE_LOGGERS`` below errors. Called by quantlab's own entry points, never by the library."""
    import logging

    for name in IMPORT_NOISE_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
