"""``python -m quantlab.run.worker RECIPE.json INDEX OUT.json [RUN_FOLDER [--retime]]``: measure one variant in a
fresh process (the run starts it through ``sweep.WORKER``, which makes Ctrl-C end it silently)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..files import atomic_write_text
from .recipe import validate_recipe
from .variant import measure_variant_safely


def worker_main(argv: list[str]) -> int:
    """Entry point of a variant's own process: ``python -m quantlab.run.worker RECIPE.json INDEX OUT.json
    [RUN_FOLDER [--retime]]``."""
    retime = "--retime" in argv
    argv = [a for a in argv if a != "--retime"]
    spec_path, index, out_path = Path(argv[0]), int(argv[1]), Path(argv[2])
    run_folder = Path(argv[3]) if len(argv) > 3 else None
    recipe = validate_recipe(json.loads(spec_path.read_text()), str(spec_path))
    body = measure_variant_safely(recipe, recipe.variants()[index], run_folder, retime)
    atomic_write_text(out_path, json.dumps(body))
    return 0


def main(argv: list[str]) -> int:
    from ..entrypoints import quiet_import_noise

    quiet_import_noise()
    return worker_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
