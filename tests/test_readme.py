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


def _commands() -> list[str]:
    """Every command the CLI registers (``@app.command("NAME")`` in cli/*.py)."""
    names = [m for p in sorted((ROOT / "cli").glob("*.py"))
             for m in re.findall(r'@app\.command\(\s*"([a-z-]+)"', p.read_text())]
    assert names, "no command found in cli/"
    return names


def test_readme_is_a_front_page():
    """At most 250 lines: what fastspec is, the three claims, the commands, links to docs/ for the rest."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for claim in ("same distribution", "same text under a fixed seed", "close task score"):
        assert f"**{claim}**" in text, claim
    assert "(docs/architecture.md)" in text
    assert text.count("```python") == 1, "one library snippet"


def test_readme_has_one_line_per_command_with_a_link():
    lines = (ROOT / "README.md").read_text().splitlines()
    for name in _commands():
        rows = [ln for ln in lines if ln.startswith(f"| `fastspec {name}` |")]
        assert len(rows) == 1, f"README.md needs one table row for fastspec {name}"
        assert re.search(r"\]\((docs/[^)]+\.md)(#[^)]*)?\)", rows[0]), f"fastspec {name}: the row links no page"


def test_every_command_has_its_flags_in_the_cli_reference():
    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for name in _commands():
        assert f"## `fastspec {name}`" in text, name


def test_the_dump_format_lives_in_docs_and_data_readme_points_to_it():
    """The format moved from data/README.md (which now describes the shipped files) to docs/reference/."""
    fmt = (ROOT / "docs" / "reference" / "dump-format.md").read_text()
    for section in ("## Array names", "### Sparse top-k", "## Sharded dumps", "--kl-divergence-base"):
        assert section in fmt, section
    data = (ROOT / "data" / "README.md").read_text()
    assert "../docs/reference/dump-format.md" in data
    for shipped in ("synthetic_pair.npz", "smollm2_exit_top64.npz", "smollm2_costs_v2.json", "prompts_lookup.jsonl",
                    "measured/"):
        assert shipped in data, shipped
