"""Kernel signatures and sentinels, read from the sources with ``ast`` (nothing is compiled): no compiled function
takes more than 12 parameters, the sampling parameters travel as one tuple, and the ``-1`` sentinels have names
(:mod:`fastspec._kernels.codes`)."""
from __future__ import annotations

import ast
import os

import fastspec
from fastspec._numba import jit

MAX_PARAMS = 12
_PACKAGE = os.path.dirname(os.path.abspath(fastspec.__file__))
_DECORATORS = {"kernel", "parallel_kernel", "njit", "jit", "generated_jit", "vectorize", "guvectorize", "cfunc"}
_SAMPLING = {"temperature", "temp", "top_k", "top_p", "min_p"}


def _sources():
    for root, dirs, files in os.walk(_PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                with open(path, encoding="utf-8") as fh:
                    yield os.path.relpath(path, _PACKAGE).replace(os.sep, "/"), ast.parse(fh.read())


def _decorator_name(d):
    d = d.func if isinstance(d, ast.Call) else d
    return d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", None)


def _compiled():
    """(module, function node) of every compiled function of the package: kernels, parallel kernels, njit."""
    for rel, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                    _decorator_name(d) in _DECORATORS for d in node.decorator_list):
                yield rel, node


def _params(fn):
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs] + [p.arg for p in (a.vararg, a.kwarg) if p]


def test_the_scan_finds_the_kernels():
    found = {(rel, fn.name) for rel, fn in _compiled()}
    assert {("_kernels/token.py", "verify_row_logits"), ("_kernels/block.py", "verify_row_block"),
            ("_kernels/ngram.py", "match"), ("_numba/rng.py", "uniform")} <= found
    assert len(found) > 60


def test_no_kernel_takes_more_than_12_parameters():
    wide = [f"{rel}:{fn.lineno} {fn.name} takes {len(_params(fn))}" for rel, fn in _compiled()
            if len(_params(fn)) > MAX_PARAMS]
    assert wide == [], "bundle related arrays into tuples:\n" + "\n".join(wide)


def test_row_kernels_take_one_sampling_tuple():
    """(temperature, top_k, top_p, min_p) is one argument, ``sp`` of a row or ``params`` of per-row arrays."""
    loose = [f"{rel}:{fn.lineno} {fn.name}({', '.join(sorted(_SAMPLING & set(_params(fn))))})"
             for rel, fn in _compiled() if _SAMPLING & set(_params(fn))]
    assert loose == [], "pass the sampling parameters as one tuple (sp / params):\n" + "\n".join(loose)


def test_no_bare_minus_one_in_the_kernels():
    """-1 as a value (padding, no token, no index) is PAD / NONE / NO_EXCLUDED of _kernels/codes.py; a range step
    or bound is arithmetic, not a sentinel."""
    bare = []
    for rel, tree in _sources():
        if not rel.startswith(("_kernels/", "_numba/")) or rel == "_kernels/codes.py":
            continue
        in_range = {id(m) for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "range"
                    for a in n.args for m in ast.walk(a)}
        bare += [f"{rel}:{n.lineno}" for n in ast.walk(tree)
                 if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and isinstance(n.operand, ast.Constant)
                 and n.operand.value == 1 and id(n) not in in_range]
    assert bare == [], "name the sentinel (fastspec._kernels.codes):\n" + "\n".join(bare)


def test_kernels_import_only_kernel_sources():
    """The cache stamp covers jit.KERNEL_SOURCES only, so a module the kernels import at module level (compile-time
    constants, inlined helpers) must lie there; function-local imports of plain Python helpers are not compiled."""
    outside = []
    for rel, tree in _sources():
        if not jit._is_kernel_source(os.path.join(_PACKAGE, rel)):
            continue
        pkg = rel.rsplit("/", 1)[0].split("/") if "/" in rel else []
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg[:len(pkg) - node.level + 1]
                target = "/".join(base + (node.module.split(".") if node.module else []))
                for cand in (target + ".py", target + "/__init__.py", target):
                    path = os.path.join(_PACKAGE, cand)
                    if os.path.exists(path):
                        break
                if not jit._is_kernel_source(path):
                    outside.append(f"{rel}:{node.lineno} imports {target}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                outside += [f"{rel}:{node.lineno} imports {n}" for n in names if n and n.startswith("fastspec")]
    assert outside == [], "add the module to jit.KERNEL_SOURCES or move the import:\n" + "\n".join(outside)
