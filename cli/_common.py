"""Shared CLI plumbing: one-line errors, exit codes, consoles without markup, progress, JSON output."""
from __future__ import annotations

import json
import math
import sys
from typing import Any, NoReturn

import typer

EXIT_BAD_INPUT = 2
EXIT_RUNTIME = 1


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print ``fastspec: error: message`` (one line) on stderr and exit with ``code``."""
    one_line = " ".join(str(message).split())
    typer.echo(f"fastspec: error: {one_line}", err=True)
    raise typer.Exit(code)


def stdout_console():
    """A rich Console for tables on stdout: the terminal's width, or 120 columns when piped.  Markup is off:
    paths, draft names and messages the user controls print as they are (emphasis uses ``style=``)."""
    from rich.console import Console

    c = Console(markup=False, highlight=False)
    return c if c.is_terminal else Console(width=120, markup=False, highlight=False)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, markup=False, highlight=False)


def progress_bar(console, label: str, total: int | None, *, every: int | None = None):
    """(start, advance(n), set_total(n), stop) for long work: a rich bar on a terminal; elsewhere, with ``every``,
    one plain line on stderr per ``every`` units of work (so logs of long non-interactive runs show progress),
    without it nothing."""
    if console.is_terminal:
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        bar = Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                       TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True)
        task = bar.add_task(label, total=total)
        return bar.start, (lambda n=1: bar.advance(task, n)), (lambda n: bar.update(task, total=n)), bar.stop
    if every is None:
        return (lambda: None), (lambda _n=1: None), (lambda _n: None), (lambda: None)
    state = {"done": 0, "total": total, "shown": 0}

    def advance(n=1):
        state["done"] += n
        if state["done"] - state["shown"] >= every or state["done"] == state["total"]:
            state["shown"] = state["done"]
            of = f"/{state['total']}" if state["total"] else ""
            sys.stderr.write(f"fastspec: {label}: {state['done']}{of}\n")
            sys.stderr.flush()

    def set_total(n):
        state["total"] = n

    return (lambda: None), advance, set_total, (lambda: None)


def stage_progress(console):
    """``progress(stage, total, every)`` for a library pipeline (e.g. :func:`fastspec.hf.measure_and_predict`): a
    context manager per stage that shows a :func:`progress_bar` labelled ``stage`` while it runs and yields its
    ``advance``."""
    from contextlib import contextmanager

    @contextmanager
    def stage(label: str, total: int, every: int):
        start, advance, _, stop = progress_bar(console, label, total, every=every)
        start()
        try:
            yield advance
        finally:
            stop()

    return stage


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
