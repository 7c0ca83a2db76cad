"""The library's imports point down the layers (issue #20, item 9): no module reaches a sibling through its parent
package (``from .. import methods``, ``from .. import X`` of the package ``__init__``); it imports the module it
needs (``from ..methods import check_candidate_sampling``)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED: set[str] = set()


def _parent_package_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: from {'.' * node.level} import "
            + ", ".join(a.name for a in node.names)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module is None]


def test_no_module_imports_through_a_parent_package():
    hits = [h for p in sorted((ROOT / "fastspec").rglob("*.py"))
            if p.relative_to(ROOT).as_posix() not in ALLOWED for h in _parent_package_imports(p)]
    assert hits == [], "import the module (from ..methods import name), not the parent package:\n" + "\n".join(hits)


def test_exact_candidates_uses_the_registry():
    from fastspec import methods
    from fastspec.exact import candidates

    assert candidates.CANDIDATE_SAMPLING == tuple(methods.CANDIDATE_SAMPLING)
    assert not hasattr(candidates, "methods")
    for name in candidates.CANDIDATE_SAMPLING:
        assert candidates.check_sampling(name) == name
