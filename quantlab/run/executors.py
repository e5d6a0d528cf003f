"""Executors: where a sweep's variants are measured, registered by the name a recipe's ``executor.kind`` gives.

An executor is a ``Sweep`` subclass: ``start`` measures (or submits) one claimed variant and ``drain`` waits for
what it started; ``check_available`` refuses, in one line, an executor whose engine is not installed. Array jobs
are not an executor of their own: ``--shard I/N`` narrows any executor to one shard of the variants."""
from __future__ import annotations

from ..registry import Registry
from .ray_executor import RaySweep
from .sweep import Sweep

EXECUTORS: Registry[Sweep] = Registry("executor")
EXECUTORS.add("local", Sweep, "here, one variant at a time (in a process of its own by default)")
EXECUTORS.add("ray", RaySweep, "each variant a Ray task with the resources the recipe asks for (extra ray)")
