"""``python -m quantlab.worker RECIPE.json INDEX OUT.json``: measure one variant in a fresh process."""
import sys

from .runner import worker_main

if __name__ == "__main__":
    from .cli import quiet_import_noise

    quiet_import_noise()
    sys.exit(worker_main(sys.argv[1:]))
