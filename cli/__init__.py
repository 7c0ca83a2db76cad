"""The ``fastspec`` command line (Typer, the ``cli`` extra).  Thin: every figure it prints comes from the library."""


def main() -> None:
    """Console-script entry point: the Typer app, or one clear line when the ``cli`` extra is missing."""
    try:
        from .main import main as run
    except ModuleNotFoundError as exc:
        if exc.name not in ("typer", "rich", "click"):
            raise
        import sys

        sys.stderr.write(f"fastspec: error: the command line needs {exc.name!r}: pip install 'fastspec[cli]'\n")
        raise SystemExit(1) from None
    run()
