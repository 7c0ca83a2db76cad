"""fastspec's version, in one place below every layer: the facade re-exports it (``fastspec.__version__``) and the
Dask workers report it (:mod:`fastspec.distributed`).  Keep it equal to pyproject.toml's ``version``."""
__version__ = "0.1.0"
