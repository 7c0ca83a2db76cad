"""Entry point: ``fastspec`` (console script) -> :func:`main`.

The one place that assembles the command line: the address-space guard first (:mod:`._limits`, before numpy is
imported), then the app (:mod:`._app`), then every command module, each registering its commands on ``app`` when
imported.  Command modules import ``app`` from :mod:`._app`, never from here, so the import graph has no cycle.
A failure to load a library under an address-space limit is one line too.
"""
from __future__ import annotations

import importlib
import sys

import typer

from ._limits import MIB, address_space_limit, address_space_shortfall
from ._app import app
from ._common import EXIT_RUNTIME

#: the command modules, in the order of ``fastspec --help``; each registers its commands on ``app`` when imported
COMMAND_MODULES = ("exact_cmd", "inspect_cmd", "simulate_cmd", "policy_cmd", "dump_cmd", "measure_cmd", "cost_cmd",
                   "audit_output_cmd", "dump_server_cmd")

try:
    for _module in COMMAND_MODULES:
        importlib.import_module(f"{__package__}.{_module}")
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

