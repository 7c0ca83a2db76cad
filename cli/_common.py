"""Shared CLI plumbing: one-line errors, exit codes, number-list parsing, JSON output."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, NoReturn

import typer

EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 1


class UserError(Exception):
    """A mistake in what the user gave us: one line on stderr, exit 2."""


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``fastspec: error: message`` (one line) on stderr and exit with ``code``."""
    one_line = " ".join(str(message).split())
    typer.echo(f"fastspec: error: {one_line}", err=True)
    raise typer.Exit(code)


def parse_float_list(text: str, name: str) -> list[str]:
    """Split a comma-separated list of numbers, keeping each as text (exact decimals)."""
    if text is None or not text.strip():
        fail(f"{name} is empty; give comma-separated probabilities, e.g. {name} 0.5,0.3,0.2")
    items = [t.strip() for t in text.split(",")]
    for i, t in enumerate(items):
        if not t:
            fail(f"{name} has an empty entry at index {i}; give comma-separated numbers, e.g. 0.5,0.3,0.2")
        try:
            v = float(t)
        except ValueError:
            fail(f"{name} entry {i} is {t!r}, not a number")
        if not math.isfinite(v):
            fail(f"{name} entry {i} is {t!r}; entries must be finite")
    return items


def stdout_console():
    """A rich Console for tables on stdout: the terminal's width, or 120 columns when piped."""
    from rich.console import Console

    c = Console()
    return c if c.is_terminal else Console(width=120)


def _jsonable(obj: Any) -> Any:
    from fractions import Fraction

    import numpy as np

    if isinstance(obj, Fraction):
        return f"{obj.numerator}/{obj.denominator}"
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        obj = float(obj)
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # never NaN/inf in JSON output
    return obj


def print_json(obj: Any) -> None:
    typer.echo(json.dumps(_jsonable(obj), indent=2, allow_nan=False))
