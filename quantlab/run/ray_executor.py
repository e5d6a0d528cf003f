"""Sweeps on Ray: each variant a Ray task with the resources the recipe asks for, measured by the same
``measure_variant`` as a local run, in a worker process of its own (``max_calls=1``, as ``isolation: process``).

The driver (``quantlab run --executor ray``) claims each variant in the run folder before submitting it and
writes the record a task returns (the worker's machine fingerprint and copy bandwidth included), so local runs,
array-job shards and Ray drivers share one folder and one claim protocol. A worker lost mid-variant (killed, out
of memory, its node gone) leaves a failed record, retried by the next run; a driver killed and restarted finds
its claims stale (its pid is gone) and resubmits only what has no record. Without an address a local Ray
instance is started on this machine; with one (``auto``, ``ray://...``, ``host:port``) the driver joins it.
"""
from __future__ import annotations

from typing import Any

from ..errors import QuantlabError, first_line
from ..records.claims import Claim, Heartbeat
from ..records.fingerprint import fingerprint_id
from .sweep import Retime, Sweep
from .variant import failed_record, finish_record, measure_variant_safely


def require_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise QuantlabError("--executor ray needs Ray: pip install 'quantlab[ray]'") from None
    return ray


def measure_task(spec: dict[str, Any], index: int, sweep: int, run_folder: str | None = None,
                 retime: bool = False) -> dict[str, Any]:
    """One variant on a Ray worker: the local measurement, bracketed by the worker's own copy benchmark.
    ``run_folder`` is used for run-wide intermediates where the worker sees it (a shared file system)."""
    from pathlib import Path

    from ..engine.bandwidth import copy_bandwidth_bytes_per_s
    from ..engine.device import resolve_device
    from ..entrypoints import quiet_import_noise
    from .recipe import validate_recipe

    quiet_import_noise()  # a Ray worker is quantlab's own process

    recipe = validate_recipe(spec, "<ray task>")
    device = resolve_device(recipe.device)
    before = copy_bandwidth_bytes_per_s(device)
    folder = Path(run_folder) if run_folder and Path(run_folder).is_dir() else None
    body = measure_variant_safely(recipe, recipe.variants()[index], folder, retime and folder is not None)
    return finish_record(body, sweep, before, copy_bandwidth_bytes_per_s(device))


def worker_fingerprint() -> dict[str, Any]:
    from ..records.fingerprint import machine_fingerprint

    return machine_fingerprint()


class RaySweep(Sweep):
    """The local sweep's loop, with ``start`` submitting a Ray task and ``drain`` writing records as they finish."""

    @classmethod
    def check_available(cls, executor: Any) -> None:
        require_ray()
        if (executor.address or "").startswith("ray://"):
            try:
                import grpc  # noqa: F401  (what Ray's client extra brings)
            except ImportError:
                raise QuantlabError(f"--address {executor.address}: a ray:// address needs Ray's client: pip install "
                                    "'ray[client]'") from None

    def __init__(self, recipe: Any, folder: Any, sweep: int, log: Any, shard: Any, executor: Any,
                 retime: Retime | bool | None = None) -> None:
        super().__init__(recipe, folder, sweep, log, shard, executor, retime)
        self.ray = require_ray()
        self.running: dict[Any, tuple[Any, Claim, Heartbeat, str]] = {}  # object ref -> (variant, claim, beat, tag)
        self.done = self.failed = 0
        if not self.ray.is_initialized():
            try:
                self.ray.init(address=executor.address, include_dashboard=False, log_to_driver=False,
                              configure_logging=False)
            except ValueError as e:  # e.g. a ray:// address without Ray's client extra
                raise QuantlabError(f"--address {executor.address}: {first_line(e)}") from None
            except ConnectionError as e:
                raise QuantlabError(f"--address {executor.address}: no Ray cluster answers there "
                                    f"({first_line(e)})") from None
        resources = self.ray.cluster_resources()
        self.log(f"ray: {resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs in the cluster")
        gpus = executor.gpus_per_variant
        if gpus is None:
            gpus = 1 if recipe.device == "cuda" or (recipe.device == "auto" and resources.get("GPU", 0) > 0) else 0
        self.task = self.ray.remote(max_calls=1)(measure_task).options(
            num_cpus=executor.cpus_per_variant, num_gpus=gpus, max_retries=0)
        # Records are reused under the fingerprint a variant's task has (its node, and the threads its CPUs
        # allow), not the driver's: ask a task of the same shape.
        probe = self.ray.remote(max_calls=1)(worker_fingerprint).options(num_cpus=executor.cpus_per_variant, num_gpus=gpus)
        self.fid = fingerprint_id(self.ray.get(probe.remote()))

    def start(self, index: int, variant: Any, claim: Claim, tag: str) -> None:
        beat = Heartbeat(claim).start()
        ref = self.task.remote(self.recipe.to_spec(), index, self.sweep, str(self.folder.path),
                               variant.key in self.retiming)
        self.running[ref] = (variant, claim, beat, tag)

    def _progress(self) -> None:
        self.log(f"ray: {self.done} done, {len(self.running)} running, {self.failed} failed")

    def drain(self) -> None:
        try:
            while self.running:
                ready, _ = self.ray.wait(list(self.running), num_returns=1)
                ref = ready[0]
                variant, claim, beat, tag = self.running.pop(ref)
                try:
                    record = self.ray.get(ref)
                except (self.ray.exceptions.RayError, OSError) as e:  # the worker died: a failed, retryable record
                    why = first_line(e)
                    record = finish_record(failed_record(self.recipe, variant, f"ray worker lost: {type(e).__name__}: {why}"),
                                           self.sweep, None, None)
                try:
                    self.record(tag, record)
                finally:
                    beat.stop()
                    self.claims.release(claim)
                self.done += record["status"] == "ok"
                self.failed += record["status"] != "ok"
                self._progress()
        finally:  # interrupted: give back what is still running
            for ref, (_, claim, beat, _) in list(self.running.items()):
                self.ray.cancel(ref, force=True)
                beat.stop()
                self.claims.release(claim)
            self.running.clear()
