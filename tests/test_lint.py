"""The linter configured in pyproject.toml (ruff: pyflakes, pycodestyle, bugbear, unused arguments) passes."""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_ruff_passes():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(pathlib.Path(sys.executable).parent))
    if ruff is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]' installs it")
    r = subprocess.run([ruff, "check", "fastspec", "cli", "tests", "benchmarks", "data"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_noqa_hides_an_unused_import():
    needle = "noqa: " + "F401"
    files = [p for top in ("fastspec", "cli", "tests", "benchmarks", "data") for p in (ROOT / top).rglob("*.py")]
    hits = [f"{p}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if needle in line]
    assert not hits, hits
