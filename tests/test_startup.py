"""First run vs later runs of the main command: the compile notice, and the same output."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_first_run_says_it_compiles_and_later_runs_are_quiet(tmp_path):
    from fastspec_cli._compile_notice import MESSAGE

    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "fastspec_cli", "simulate", str(ROOT / "data" / "synthetic_pair.npz"), "--k", "2",
           "--draft", "near", "--json"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    second = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    assert MESSAGE in first.stderr and first.stderr.count("\n") == 1
    assert second.stderr == ""
    assert first.stdout == second.stdout  # compiled or loaded from the cache: the same JSON, to the last digit


@pytest.mark.subprocess
def test_importing_the_hf_loop_starts_no_numba_thread_pool():
    """Importing fastspec.hf (its loop included) does no work at import: Numba's thread pool starts at the first
    loop, dump or cost measurement (fastspec.hf.loop.start_numba_pool), not when the module is imported."""
    pytest.importorskip("torch")
    code = ("import fastspec.hf, fastspec.hf.loop\n"
            "from numba.np.ufunc import parallel\n"
            "assert not parallel._is_initialized, 'the pool started at import'\n"
            "fastspec.hf.loop.start_numba_pool()\n"
            "assert parallel._is_initialized\n")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=300)
