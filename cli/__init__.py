"""The ``fastspec`` command line (Typer).  Thin: every figure it prints comes from the library."""
