"""The library's imports point down one table of layers (issue #29, item 3; docs/architecture.md).

Every module of ``fastspec`` and of the command line (``cli/``, imported as ``fastspec_cli``) is parsed with
``ast``, and every import of a fastspec module is checked -- module-level and function-local ones alike; only the
imports under ``if TYPE_CHECKING:`` are exempt (they never run).  An import may point to its own layer or to one
below, never above, and the module graph has no circle (no strongly connected component of more than one module).

Each import statement is one arrow to the module it names: ``from .io import open_dump`` points to
``fastspec.io`` (the package's ``__init__``), ``from . import distributed`` and ``from fastspec.io import shards``
to the submodule.  That importing ``fastspec.x.y`` first runs the ``__init__`` of ``fastspec`` and ``fastspec.x``
is ignored: it is Python's doing, not the importer's.

Adding a module: one line in :data:`LAYERS` (a package entry covers everything under it).  Also: no module
reaches a sibling through its parent package (``from .. import methods``; issue #20, item 9).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY, CLI = "fastspec", "fastspec_cli"  # cli/ is the package fastspec_cli (pyproject.toml's package-dir)
SOURCES = {LIBRARY: ROOT / "fastspec", CLI: ROOT / "cli"}


def _layer(level: float, name: str, *modules: str) -> list[tuple[str, float, str]]:
    """``modules`` (dotted names under ``fastspec``, or ``fastspec_cli``) on layer ``level``, called ``name``."""
    return [(m, level, name) for m in modules]


#: Bottom to top.  An entry names a module, or a package and everything under it; the most specific entry wins.
LAYERS = [
    # constants, typed errors, SamplingParams, and the leaf helpers that import only these: the registry of
    # verification methods and candidate schemes, the host's cores, the interval statistics
    *_layer(0, "base", "fastspec._version", "fastspec.config", "fastspec.errors", "fastspec.params",
            "fastspec.methods", "fastspec.machine", "fastspec.stats"),
    *_layer(1, "_numba", "fastspec._numba"),
    *_layer(2, "_kernels", "fastspec._kernels"),
    # array APIs: validate arrays, call a kernel.  exact/ is the Fraction reference of the verifiers (it imports
    # nothing above the array APIs; the verifiers are checked against it).  ngram: proposers and the spec grammar.
    *_layer(3, "array APIs", "fastspec.verify", "fastspec.candidates", "fastspec.processing", "fastspec.block",
            "fastspec.ngram", "fastspec.exact"),
    # formats only: npz/npy dumps, shard sets, llama.cpp files, token files, server wire formats, open_dump()
    *_layer(4, "io", "fastspec.io",
            "fastspec.costs.table"),  # the cost-table schema and its strict reader: a format (a dump records one)
    # analyses over an open dump.  distributed: the Dask runner of the shard-set alpha pass (given the pass by
    # acceptance; it imports no analysis); server_dump: the dump-server pipeline (it writes an alpha report).
    # acceptance also holds the array half of alpha (acceptance_rates / _bounds): it imports nothing above io.
    *_layer(5, "analyses", "fastspec.acceptance", "fastspec.analysis", "fastspec.simulation", "fastspec.policies",
            "fastspec.audit", "fastspec.gof", "fastspec.costs", "fastspec.distributed",
            "fastspec.server_dump",
            "fastspec.runs"),  # the settings of the real-model runs (cost measurement, dump): no torch
    *_layer(6, "hf", "fastspec.hf"),
    *_layer(7, "engines", "fastspec.engines"),
    # the facade: fastspec/__init__.py re-exports the library (exactly this module, not the packages under it)
    *_layer(7.5, "facade", "fastspec"),
    *_layer(8, "cli", "fastspec_cli"),
]


def _placed(module: str) -> tuple[float, str] | None:
    """(level, layer name) of ``module``: its most specific entry in :data:`LAYERS` (the facade ``fastspec`` only
    for the module itself)."""
    best = None
    for entry, level, name in LAYERS:
        covers = module == entry or (entry != LIBRARY and module.startswith(entry + "."))
        if covers and (best is None or len(entry) > len(best[0])):
            best = (entry, level, name)
    return None if best is None else best[1:]


def _modules() -> dict[str, Path]:
    """{dotted module name: file} of the library and the command line."""
    out = {}
    for top, base in SOURCES.items():
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([top, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _edges(modules: dict[str, Path]) -> list[tuple[str, str, str]]:
    """(importer, imported, "file:line") for every import of a fastspec module (module names as in ``modules``)."""
    out = []
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        where = path.relative_to(ROOT).as_posix()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    origin = ".".join(base + ([node.module] if node.module else []))
                else:
                    origin = node.module
                # a name that is a submodule is an arrow to it; any other name is the origin module's
                targets = sorted({f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin
                                  for a in node.names})
            for t in targets:
                if t.split(".")[0] not in SOURCES:
                    continue
                while t not in modules and "." in t:  # ``import fastspec.x.y as z`` of a name that is not a file
                    t = t.rpartition(".")[0]
                if t != mod:
                    out.append((mod, t, f"{where}:{node.lineno}"))
    return out


def _components(nodes, edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = {n: sorted({b for a, b, _ in edges if a == n}) for n in nodes}
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for n in sorted(graph):
        if n not in index:
            visit(n)
    return out


def _graph():
    modules = _modules()
    return modules, _edges(modules)


def test_every_module_has_a_layer():
    missing = [f"{path.relative_to(ROOT).as_posix()} ({mod})" for mod, path in _modules().items()
               if _placed(mod) is None]
    assert not missing, ("modules in no layer: add each to LAYERS in tests/test_import_layers.py (one line, in the "
                         "layer of what it does):\n" + "\n".join(missing))


def test_no_import_points_up_the_layers():
    _, edges = _graph()
    bad = []
    for a, b, where in edges:
        (la, na), (lb, nb) = _placed(a), _placed(b)
        if lb > la:
            bad.append(f"{where}: {a} (layer {la:g}, {na}) imports {b} (layer {lb:g}, {nb}); an import may only "
                       f"point down. Fix: move what {a} needs from {b} down to layer {la:g} or below, or have the "
                       f"caller above pass it in (a parameter, a function), or move {a} up to the layer it belongs to")
    assert not bad, "imports that point up the layers:\n" + "\n".join(bad)


def test_no_import_circle():
    modules, edges = _graph()
    live = edges
    circles = []
    for comp in _components(list(modules), live):
        inside = set(comp)
        lines = [f"  {where}: {a} -> {b}" for a, b, where in live if a in inside and b in inside]
        circles.append(f"circle {' <-> '.join(comp)}:\n" + "\n".join(sorted(lines)))
    assert not circles, ("import circles (fix: move the shared part into a module below both, or pass it in; a "
                         "function-local import does not break a circle):\n" + "\n".join(circles))


def test_io_imports_no_analysis():
    """The formats never import what reads them (the circle io -> acceptance -> shards -> distributed -> io)."""
    _, edges = _graph()
    bad = [f"{where}: {a} imports {b}" for a, b, where in edges
           if a.startswith("fastspec.io") and _placed(b)[0] > _placed("fastspec.io")[0]]
    assert not bad, "\n".join(bad)




def _parent_package_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT).as_posix()}:{node.lineno}: from {'.' * node.level} import "
            + ", ".join(a.name for a in node.names)
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module is None]




def test_no_module_imports_through_a_parent_package():
    hits = [h for p in sorted((ROOT / "fastspec").rglob("*.py")) for h in _parent_package_imports(p)]
    assert hits == [], "import the module (from ..methods import name), not the parent package:\n" + "\n".join(hits)


def test_the_checker_sees_what_it_must():
    """The checker itself: a function-local import is an arrow, a TYPE_CHECKING one is not, and a circle through
    two modules is found."""
    tree = ast.parse("import typing\nif typing.TYPE_CHECKING:\n    from .a import x\n"
                     "def f():\n    from .b import y\n")
    assert [n.module for n in _imports(tree) if isinstance(n, ast.ImportFrom)] == ["b"]
    assert _components(["a", "b", "c"], [("a", "b", ""), ("b", "a", ""), ("b", "c", "")]) == [["a", "b"]]
    assert _placed("fastspec") == (7.5, "facade") and _placed("fastspec.io.shards") == (4, "io")
    assert _placed("fastspec.nonexistent") is None


def test_exact_candidates_uses_the_registry():
    from fastspec import methods
    from fastspec.exact import candidates

    assert candidates.CANDIDATE_SAMPLING == tuple(methods.CANDIDATE_SAMPLING)
    assert not hasattr(candidates, "methods")
    for name in candidates.CANDIDATE_SAMPLING:
        assert candidates.check_candidate_sampling(name) == name
