"""The README carries the project's two set-up commands; CI runs exactly the test one."""
from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _command_after(marker: str) -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(re.escape(marker) + r"\s*```bash\n(.+?)\n```", text, re.S)
    assert m, f"README.md has no fenced command after {marker}"
    lines = [ln for ln in m.group(1).splitlines() if ln.strip()]
    assert len(lines) == 1, "each set-up command is one line"
    return lines[0]


def test_readme_has_two_setup_commands():
    main = _command_after("<!-- main-command -->")
    test = _command_after("<!-- test-command -->")
    assert "pip install" in main and "fastspec " in main
    assert "pip install" in test and "pytest" in test and "[test" in test


@pytest.mark.subprocess
def test_ci_runs_exactly_the_readme_test_command():
    script = (ROOT / ".ci" / "run").read_text()
    cmd = re.search(r'^cmd="(.+)"$', script, re.M)
    assert cmd, ".ci/run must spell out the test command"
    assert cmd.group(1) == _command_after("<!-- test-command -->")
    # and .ci/run's own README extraction agrees (it refuses to run on a mismatch)
    awk = re.search(r"readme=\$\((awk .+?README\.md)\)", script)
    assert awk, ".ci/run must check its command against README.md"
    extracted = subprocess.run(["bash", "-c", awk.group(1)], cwd=ROOT, capture_output=True, text=True, check=True)
    assert extracted.stdout.strip() == cmd.group(1)
