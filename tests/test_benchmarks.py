"""The benchmark scripts keep importing what they time (they are not run here: speed is measured there, not in
tests).  A renamed or removed library name breaks this test instead of the next benchmark run."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


@pytest.mark.subprocess
def test_every_benchmark_script_imports():
    assert len(SCRIPTS) >= 8
    code = ("import runpy, sys; sys.path.insert(0, sys.argv[1])\n"
            "for p in sys.argv[2:]:\n"
            "    runpy.run_path(p, run_name='benchmark_import_check')\n")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "benchmarks"), *map(str, SCRIPTS)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
