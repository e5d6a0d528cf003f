"""The estimate of a recipe's model from its config alone, made once per process (the runner's checks and every
variant's analytic figures share it)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from ..errors import QuantlabError
from ..models import load_config, model_dtype_name, model_location


def config_estimate(model_spec: Any) -> Any | None:
    """``quantlab estimate`` of the recipe's model (from its config file where there is one, else from the
    config transformers builds), once per process; None if it cannot be made."""
    return _config_estimate(json.dumps(model_spec.model_dump(mode="json"), sort_keys=True))


@lru_cache(maxsize=4)
def _config_estimate(spec_json: str) -> Any | None:
    from ..models import ModelSpec
    from . import estimate_from_raw, read_raw_config

    model_spec = ModelSpec.model_validate(json.loads(spec_json))
    config = load_config(model_spec)
    try:
        raw, where = read_raw_config(model_location(model_spec))
    except QuantlabError:
        raw, where = config.to_dict(), "the loaded config"  # e.g. a GGUF file: the config transformers built from it
    try:
        return estimate_from_raw(raw, where, [], [], seq_len=1, dtype=model_dtype_name(model_spec, config),
                                 dtype_source="the recipe's model.dtype, as loaded")
    except Exception:  # noqa: BLE001 - the record then has no estimates; the measurements are unaffected
        return None


