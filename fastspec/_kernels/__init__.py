"""Compiled kernels.  Private: they trust their input; the public wrappers (``fastspec.verify``,
``fastspec.tree``, ``fastspec.acceptance``, ...) validate, coerce and reshape before calling them."""
