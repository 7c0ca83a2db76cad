"""Public names kept only for compatibility (issue #20, item 8): still there, and still unused inside the library."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_agreement_z_is_a_kept_public_name_that_nothing_reads():
    import fastspec.config
    import fastspec.simulation

    assert "AGREEMENT_Z" in fastspec.simulation.__all__  # public since issue #12: removing it would break imports
    assert fastspec.simulation.AGREEMENT_Z == fastspec.config.AGREEMENT_Z == 4.0
    lines = (ROOT / "fastspec/config.py").read_text(encoding="utf-8").splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("AGREEMENT_Z = "))
    doc = []
    while lines[i - 1 - len(doc)].startswith("#:"):
        doc.insert(0, lines[i - 1 - len(doc)])
    assert "DEPRECATED" in " ".join(doc)  # its doc comment says so
    users = [p.relative_to(ROOT).as_posix() for p in sorted((ROOT / "fastspec").rglob("*.py"))
             if re.search(r"\bAGREEMENT_Z\b", p.read_text(encoding="utf-8"))]
    # defined in config, re-exported by simulation; the checks use the calibrated thresholds (AGREEMENT_FALSE_ALARM)
    assert users == ["fastspec/config.py", "fastspec/simulation/__init__.py"]
