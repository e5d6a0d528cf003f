"""Where quantlab's own files and installed model packages live (no imports of the rest of quantlab)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_DIR = Path(__file__).parent / "bundled"


def bundled_models() -> dict[str, Path]:
    """Models shipped inside the package, by name."""
    return {p.name: p for p in sorted(BUNDLED_DIR.iterdir()) if (p / "config.json").is_file()}


def package_folder(name: str) -> Path | None:
    """The folder of an installed package (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None
