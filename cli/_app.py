"""The Typer app every command registers on, and its one error boundary (one line on stderr, exit 2 for bad
input, 1 for a runtime failure).  Commands import ``app`` from here; :mod:`fastspec_cli.main` imports the commands:
no module imports the one that imports it."""
from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from ._common import EXIT_BAD_INPUT, EXIT_RUNTIME
from ._limits import MIB, address_space_limit


class _OneLineErrors(TyperGroup):
    """Turns every failure into one line on stderr and the documented exit code.

    Usage errors and the library's typed bad-input errors (:mod:`fastspec.errors`: InvalidInput, InvalidType,
    DumpFormatError, DumpNotFound) exit 2; anything else -- an I/O failure, a cluster that does not answer
    (ClusterError), a missing extra (MissingExtra), a bug -- is a runtime failure and exits 1.  fastspec's own
    errors print as their message; other exceptions (but OSError) with their type's name first.  Never a
    traceback for a user mistake (set ``FASTSPEC_DEBUG=1`` to see one anyway).
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        import os

        from ._compile_notice import compile_notice

        try:
            with compile_notice():
                rv = super().main(args=args, prog_name=prog_name or "fastspec", complete_var=complete_var,
                                  standalone_mode=False, **extra)
        except (KeyboardInterrupt, EOFError):
            typer.echo("fastspec: error: interrupted", err=True)
            rv = EXIT_RUNTIME
        except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
            if os.environ.get("FASTSPEC_DEBUG"):
                raise
            rv = _report(exc)
        code = rv if isinstance(rv, int) else 0
        if standalone_mode:
            sys.exit(code)
        return code


def _report(exc: Exception) -> int:
    # Click usage errors carry exit_code and format_message (typer re-raises them unchanged
    # when standalone_mode is False); we read them duck-typed, without importing click.
    if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
        if type(exc).__name__ == "NoArgsIsHelpError":
            msg = exc.format_message()  # typer has already printed the help
            if msg.strip():
                typer.echo(msg, err=True)
            return EXIT_BAD_INPUT
        msg = exc.format_message()
        ctx = getattr(exc, "ctx", None)
        where = f" ({ctx.command_path})" if ctx is not None else ""
        typer.echo(f"fastspec: error{where}: {' '.join(str(msg).split())}", err=True)
        return int(exc.exit_code) if exc.exit_code else EXIT_BAD_INPUT
    from fastspec.errors import FastspecError, InvalidInput, InvalidType

    if isinstance(exc, (InvalidInput, InvalidType)):
        typer.echo(f"fastspec: error: {' '.join(str(exc).split())}", err=True)
        return EXIT_BAD_INPUT
    if isinstance(exc, FastspecError):  # ClusterError, MissingExtra: a message written for people, exit 1
        typer.echo(f"fastspec: error: {' '.join(str(exc).split())}", err=True)
        return EXIT_RUNTIME
    if isinstance(exc, MemoryError):
        limit = address_space_limit()
        detail = " ".join(str(exc).split())
        under = "" if limit is None else f" under the address-space limit (ulimit -v) of {limit // MIB} MiB"
        typer.echo(f"fastspec: error: out of memory{under} (MemoryError{': ' + detail if detail else ''})", err=True)
        return EXIT_RUNTIME
    what = "" if isinstance(exc, OSError) else f"{type(exc).__name__}: "
    typer.echo(f"fastspec: error: {what}{' '.join(str(exc).split())}", err=True)
    return EXIT_RUNTIME


app = typer.Typer(
    cls=_OneLineErrors,
    name="fastspec",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain text: "fastspec[plot]" keeps its brackets
    help="Exact, fast, checkable speculative-decoding verification, and offline what-if analysis of draft models.",
)


@app.callback()
def _root() -> None:
    """fastspec: speculative decoding verification you can check."""
