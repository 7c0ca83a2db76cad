"""Packaging: every package of the tree is installed, the library's dependencies stay light, the public API."""
from __future__ import annotations

import pathlib
import tomllib


import fastspec

ROOT = pathlib.Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_directory_is_listed():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fastspec").rglob("__init__.py")}
    assert found | {"fastspec_cli"} == listed


def test_library_dependencies_are_light():
    deps = " ".join(PYPROJECT["project"]["dependencies"])
    for heavy in ("typer", "rich", "torch", "matplotlib", "click"):
        assert heavy not in deps
    assert "typer" in " ".join(PYPROJECT["project"]["optional-dependencies"]["cli"])


def test_public_api_is_explicit_and_importable():
    assert len(fastspec.__all__) == len(set(fastspec.__all__))
    for name in fastspec.__all__:
        assert hasattr(fastspec, name), name
    # fastspec.simulate is the simulator's function itself (no module of that name)
    assert fastspec.simulate is fastspec.simulation.simulate
    data = ROOT / "data" / "synthetic_pair.npz"
    a = fastspec.simulate(data, k=2, drafts=["near"], trials=4, batches=2).as_dict()
    assert a == fastspec.simulation.simulate(data, k=2, drafts=["near"], trials=4, batches=2).as_dict()
