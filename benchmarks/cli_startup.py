"""How long ``quantlab --help`` and a refused recipe take to answer: the command must not import torch for help,
and an error in a recipe must come before transformers, pandas and matplotlib load.

    python benchmarks/cli_startup.py [--repeats 5]

Prints the median wall time of each and its ratio to a bare ``python -c pass`` (the interpreter's own start)."""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def median_s(argv: list[str], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, text=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.yaml"
        bad.write_text("name: bad\nmodel: {bundled: tiny-stdlib-llama}\nweights: [{format: int9}]\n")
        python = median_s([sys.executable, "-c", "pass"], args.repeats)
        for what, argv in (("quantlab --help", [sys.executable, "-m", "quantlab.cli", "--help"]),
                           ("a refused recipe", [sys.executable, "-m", "quantlab.cli", "run", str(bad)])):
            took = median_s(argv, args.repeats)
            print(f"{what}: {took * 1000:.0f} ms median of {args.repeats} ({took / python:.1f}x python's own start, "
                  f"{python * 1000:.0f} ms)")


if __name__ == "__main__":
    main()
