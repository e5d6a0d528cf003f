"""A run folder's records: one file per measured variant (``folder``), the claims of the processes filling it
(``claims``), the machine each record was measured on (``fingerprint``), and the flat rows every view is built from
(``views``). Written by ``run``, read by ``report``; it knows neither."""
from .folder import RECORD_VERSION, RunFolder, now_iso, reusable, wait_s

__all__ = ["RECORD_VERSION", "RunFolder", "now_iso", "reusable", "wait_s"]
