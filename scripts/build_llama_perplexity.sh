#!/usr/bin/env bash
# Build llama.cpp's own llama-perplexity from the source of the llama-cpp-python the bench extra installs
# (the same llama.cpp as quantlab's llama.cpp engine), with cmake, into ~/.cache/quantlab/llama.cpp/bin
# (or $QUANTLAB_LLAMA_CPP_BUILD/bin). About 6 minutes on 2 cores.
#
#     scripts/build_llama_perplexity.sh [VERSION]
set -euo pipefail
VERSION="${1:-0.3.36}"
BUILD="${QUANTLAB_LLAMA_CPP_BUILD:-$HOME/.cache/quantlab/llama.cpp}"
SRC="$BUILD/source"  # not src: that is a folder of the cmake build
mkdir -p "$SRC"
if [ ! -d "$SRC/llama_cpp_python-$VERSION" ]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$SRC"
  tar -xzf "$SRC/llama_cpp_python-$VERSION.tar.gz" -C "$SRC"
fi
cmake -S "$SRC/llama_cpp_python-$VERSION/vendor/llama.cpp" -B "$BUILD" -G "$(command -v ninja >/dev/null && echo Ninja || echo 'Unix Makefiles')" \
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF >/dev/null
cmake --build "$BUILD" --target llama-perplexity -j "$(nproc)"
echo "$BUILD/bin/llama-perplexity"
