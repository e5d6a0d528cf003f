#!/usr/bin/env bash
# The GPU-only checks in one pass, for a machine with a CUDA device:
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]
#
# 1. gpu_tests: the GPU-marked tests (tinygemm and int8_cast_mm against the dequantized reference, a recipe
#    run end to end on CUDA, allocator peaks, CUDA events, both decode engines, GPTQModel's CUDA kernels
#    where installed);
# 2. decode: benchmarks/decode.py for the Llama-3.1-8B shape (random weights), compiled then eager engine:
#    tokens/s and share of the memory-bandwidth roofline, the figures to compare with published ones;
# 3. linear_kernels: benchmarks/linear_kernels.py on CUDA, every matmul path against the dense matmuls;
# 4. linear_kernels_compiled: the same for 4096x14336 at batch 1 through torch.compile.
#
# Steps run in that order (most needed first), each under its own time limit (about 9 minutes in all);
# STEPS="gpu_tests decode" runs a subset.
#
# quantlab must be importable (pip install -e . or PYTHONPATH=.); on an image without pydantic, put its
# wheels in .whl/ (pydantic, pydantic_core, annotated_types, typing_inspection) and they are installed into
# /tmp/site first. Each step has its own time limit; logs go to OUT_DIR (default $OUT, else /tmp/quantlab-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/quantlab-gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
python3 - <<'EOF' || exit 1
import torch, transformers
assert torch.cuda.is_available(), "no CUDA device"
print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | grep -v -e "_pytree.py" -e "Failed to load" | tee "$out/$name.log"
}
steps=" ${STEPS:-gpu_tests decode linear_kernels linear_kernels_compiled} "
want() { [[ "$steps" == *" $1 "* ]]; }
want gpu_tests && step gpu_tests 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests
want decode && step decode_llama31_8b 290 python3 benchmarks/decode.py --shape llama-3.1-8b --device cuda \
  --formats bf16 int8 int4-g128 --engines compiled eager
want linear_kernels && step linear_kernels 40 python3 benchmarks/linear_kernels.py --device cuda \
  --shapes 4096x4096 4096x14336 --batches 1 16
want linear_kernels_compiled && step linear_kernels_compiled 50 python3 benchmarks/linear_kernels.py --device cuda \
  --shapes 4096x14336 --batches 1 --compile
true
