"""Entry point: ``fastspec`` (console script) -> :func:`main`.

Under an address-space limit (``ulimit -v``, RLIMIT_AS) native code that fastspec cannot catch fails when the
limit is reached: LLVM aborts while it compiles or loads the kernels (``std::bad_alloc``, "LLVM ERROR: out of
memory": rc 134), OpenBLAS spins forever or exits when its start-up buffers or threads do not fit, libgomp exits
when a worker thread cannot start.  So, when a limit is set, the BLAS thread pools are not started (fastspec never
calls BLAS), and :func:`main` refuses with one line, before any work, a limit that leaves less than a run needs
(:func:`address_space_shortfall`); a failure to load a library under a limit is one line too.
"""
from __future__ import annotations

import os
import sys

import typer
from typer.core import TyperGroup

from ._common import EXIT_BAD_INPUT, EXIT_RUNTIME

MIB = 1 << 20
#: address space a run needs beyond what start-up has mapped, besides a stack per worker thread: LLVM compiling
#: (or loading) the kernels, scipy's BLAS start-up buffer, a chunk of rows.  Measured with a cold kernel cache
#: (fastspec simulate/inspect data/smollm2_exit_top64.npz, 2 CPUs, OpenBLAS on one thread): runs aborted in LLVM
#: with up to 140 MiB left after start-up and all passed from 154 MiB; this keeps a margin above that.
RUN_RESERVE = 224 * MIB


def address_space_limit() -> int | None:
    """The soft address-space limit (``ulimit -v``, RLIMIT_AS) in bytes; None when there is none."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


if address_space_limit() is not None:
    # numpy's and scipy's OpenBLAS each start a thread per CPU, with a 32 MiB buffer each, when they load: room a
    # limit cannot spare, and OpenBLAS exits or spins when it does not get it.  Before numpy is imported (the
    # command modules below); an explicit setting wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _mapped_bytes() -> int | None:
    """The address space this process has mapped now (VmSize; Linux), else None."""
    try:
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return None


def run_reserve() -> int:
    """:data:`RUN_RESERVE` plus a stack for each worker thread a run may start (Numba's pool, the CRC-32 pool)."""
    import resource

    import numba

    from fastspec.io.crc import MAX_THREADS
    from fastspec.machine import available_cpus

    stack = resource.getrlimit(resource.RLIMIT_STACK)[0]
    stack = stack if stack != resource.RLIM_INFINITY and 0 < stack <= 64 * MIB else 8 * MIB
    return RUN_RESERVE + stack * (numba.config.NUMBA_NUM_THREADS + min(available_cpus(), MAX_THREADS) + 1)


def address_space_shortfall() -> str | None:
    """Why the address-space limit is too small for a run, or None (no limit, or room enough)."""
    limit, used = address_space_limit(), _mapped_bytes()
    if limit is None or used is None:
        return None
    need = used + run_reserve()
    if limit >= need:
        return None
    return (f"the address-space limit (ulimit -v) of {limit // MIB} MiB is too small: start-up has mapped "
            f"{used // MIB} MiB and a run needs about {(need - used) // MIB} MiB more (compiling or loading the "
            f"kernels, their threads, a chunk of rows); raise the limit to at least {-(-need // MIB)} MiB")


class _OneLineErrors(TyperGroup):
    """Turns every failure into one line on stderr and the documented exit code.

    Usage errors and the library's typed bad-input errors (:mod:`fastspec.errors`: InvalidInput, InvalidType,
    DumpFormatError, DumpNotFound) exit 2; anything else -- an I/O failure, a cluster that does not answer, a
    bug -- is a runtime failure and exits 1.  Never a traceback for a user mistake (set ``FASTSPEC_DEBUG=1`` to
    see one anyway).
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
    from fastspec.errors import InvalidInput, InvalidType

    if isinstance(exc, (InvalidInput, InvalidType)):
        typer.echo(f"fastspec: error: {' '.join(str(exc).split())}", err=True)
        return EXIT_BAD_INPUT
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


# Each command module registers its commands on `app` when imported.
try:
    from . import exact_cmd  # noqa: E402,F401
    from . import inspect_cmd  # noqa: E402,F401
    from . import simulate_cmd  # noqa: E402,F401
    from . import dump_cmd  # noqa: E402,F401
    from . import measure_cmd  # noqa: E402,F401
    from . import cost_cmd  # noqa: E402,F401
except (ImportError, OSError, MemoryError) as _exc:
    # a library that cannot be mapped under an address-space limit ("failed to map segment", llvmlite's
    # "Could not find/load shared object"): one line, not a traceback.  A missing package is not this.
    if isinstance(_exc, ModuleNotFoundError) or address_space_limit() is None:
        raise
    typer.echo(f"fastspec: error: cannot load fastspec's libraries under the address-space limit (ulimit -v) of "
               f"{address_space_limit() // MIB} MiB ({type(_exc).__name__}: {' '.join(str(_exc).split())}); "
               "raise the limit", err=True)
    raise SystemExit(EXIT_RUNTIME) from None


def main() -> None:
    if not {"--help", "-h"} & set(sys.argv[1:]) and len(sys.argv) > 1:
        shortfall = address_space_shortfall()
        if shortfall:
            typer.echo(f"fastspec: error: {shortfall}", err=True)
            sys.exit(EXIT_RUNTIME)
    app()

