"""``python -m quantlab.quant.formats.gptqmodel_worker SPEC.json``: GPTQModel quantizes a saved model in a process of its
own, so that what it does to its surroundings (a logs/ folder in the working directory, settings read from the
environment, logging handlers) stays there. SPEC names the source and output folders, the QuantizeConfig fields
and the calibration samples."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    from gptqmodel import GPTQModel, QuantizeConfig

    quantized = GPTQModel.load(spec["src"], QuantizeConfig(**spec["config"]))
    quantized.quantize(spec["samples"])
    quantized.save(spec["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
