"""The linter configured in pyproject.toml (ruff: pyflakes, pycodestyle, bugbear, unused arguments) passes."""
from __future__ import annotations

import pathlib
import re
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
    """No ``# noqa`` that silences the unused-import check (F401), alone or listed with other codes."""
    pattern = re.compile(r"noqa:[\sA-Z0-9,]*\bF401\b")
    files = [p for top in ("fastspec", "cli", "tests", "benchmarks", "data") for p in (ROOT / top).rglob("*.py")]
    hits = [f"{p}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_the_command_line_has_no_import_cycle():
    """Command modules register on ``cli/_app.py``'s app; only ``cli/main.py`` imports them (issue #20, item 9)."""
    cycle = re.compile(r"^\s*(from \.main import|from fastspec_cli\.main import|import fastspec_cli\.main)", re.M)
    hits = [p.name for p in (ROOT / "cli").glob("*.py") if p.name not in ("__init__.py", "main.py")
            and cycle.search(p.read_text())]
    assert not hits, hits
