#!/usr/bin/env bash
# The GPU-only checks in one pass, for a machine with a CUDA device:
#
#     bash benchmarks/gpu_check.sh [OUT_DIR]
#
# 1. gpu_tests: the GPU-marked tests (tinygemm and int8_cast_mm against the dequantized reference, a recipe
#    run end to end on CUDA, the microscaling forms quantized on CUDA equal to CPU bit for bit and a recipe of
#    them measuring on CUDA what CPU measures, allocator peaks, CUDA events, both decode engines, GPTQModel's
#    CUDA kernels where installed);
# 2. decode: benchmarks/decode.py for the Llama-3.1-8B shape (random weights), compiled engine: tokens/s and
#    share of the memory-bandwidth roofline for bf16, int8 and int4-g128, the figures to compare with published ones;
# 3. decode_microscaling: the same shape's first 8 layers (compile time) for bf16, MXFP4, NVFP4, MXFP8 and block FP8;
# 4. linear_kernels: benchmarks/linear_kernels.py on CUDA, every matmul path against the dense matmuls;
# 5. profile_microscaling: where a compiled MXFP4 and a block-FP8 decode step of that shape (2 layers) spend their
#    GPU time, with dynamo's graph and graph-break counts.
#
# Steps run in that order (most needed first), each under its own time limit (about 13 minutes in all: the
# compiled 8B step takes about 100 s to compile per format on an H200, so within one 10-minute command run
# STEPS="gpu_tests decode" and then the rest); STEPS="gpu_tests decode" runs a subset; every figure is printed as it is measured, so a step stopped at its
# limit keeps what it measured.
#
# quantlab must be importable (pip install -e . or PYTHONPATH=.); on an image without pydantic or gguf, put their
# wheels in .whl/ (pydantic, pydantic_core, annotated_types, typing_inspection, typing_extensions, gguf) and they
# are installed into /tmp/site first. Logs go to OUT_DIR (default $OUT, else /tmp/quantlab-gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-/tmp/quantlab-gpu}}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import pydantic, gguf" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site:$PYTHONPATH"
fi
python3 - <<'EOF' || exit 1
import torch, transformers
assert torch.cuda.is_available(), "no CUDA device"
print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
step() {  # step NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v -e "_pytree.py" -e "Failed to load" | tee "$out/$name.log"
}
steps=" ${STEPS:-gpu_tests decode decode_microscaling linear_kernels profile_microscaling} "
want() { [[ "$steps" == *" $1 "* ]]; }
want gpu_tests && step gpu_tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider --durations=10 tests
want decode && step decode_llama31_8b 330 python3 benchmarks/decode.py --shape llama-3.1-8b --device cuda \
  --formats bf16 int4-g128 int8 --engines compiled
want decode_microscaling && step decode_llama31_8b_8layers 130 python3 benchmarks/decode.py --shape llama-3.1-8b \
  --layers 8 --device cuda --formats bf16 mxfp4 nvfp4 mxfp8 fp8-b128 --engines compiled
want profile_microscaling && for fmt in mxfp4 fp8-b128; do step profile_$fmt 75 python3 benchmarks/profile_decode.py \
  --device cuda --shape llama-3.1-8b --layers 2 --format $fmt --steps 10 --rows 12; done
want linear_kernels && step linear_kernels 40 python3 benchmarks/linear_kernels.py --device cuda \
  --shapes 4096x4096 4096x14336 --batches 1 16
true
