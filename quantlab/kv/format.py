"""The KV-cache format interface: a validated config that builds a transformers ``Cache``."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from transformers import Cache, PretrainedConfig

from ..registry import Registry


class KVFormat(BaseModel):
    """Base of every KV-cache format. Subclasses are registered in ``KV_FORMATS``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @property
    def label(self) -> str:
        raise NotImplementedError

    def make_cache(self, config: PretrainedConfig) -> Cache:
        """A fresh, empty cache for one generation with a model of this config."""
        raise NotImplementedError


KV_FORMATS: Registry[KVFormat] = Registry("KV-cache format")
