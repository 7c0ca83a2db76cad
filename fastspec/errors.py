"""fastspec's typed errors.

Every mistake in what a caller passed raises :class:`InvalidInput` (a ``ValueError``) or :class:`InvalidType`
(a ``TypeError``), naming the argument, the index and the fix (the argument's name is also their ``argument``
attribute); a malformed dump file raises
:class:`DumpFormatError` (an ``InvalidInput`` that names the file and the array), a missing one
:class:`DumpNotFound` (also a ``FileNotFoundError``).  Because they subclass the built-in exceptions, code that
catches ``ValueError``/``TypeError`` keeps working.

The command line maps exactly these to "bad input" (exit code 2); anything else -- an I/O failure, a cluster
that does not answer (:class:`ClusterError`), a missing extra (:class:`MissingExtra`), a bug -- is a runtime failure
(exit code 1); fastspec's own errors print as their message, anything else with its type's name first.
"""
from __future__ import annotations

import dataclasses
import numbers
from contextlib import contextmanager

__all__ = ["FastspecError", "InvalidInput", "InvalidType", "DumpFormatError", "DumpNotFound", "ClusterError",
           "MissingExtra", "check_int", "int_in", "positive_int",
           "shown", "about", "config_or_settings"]


class FastspecError(Exception):
    """Base class of fastspec's own errors."""


class _ArgumentError(FastspecError):
    """An error about one argument the caller passed: ``argument`` is its name (e.g. ``"top_p"``, ``"source"``),
    or None when no single argument is at fault (or the raise site does not say).  ``str(error)`` is the message
    alone; the name is also in it, as the fix is."""

    def __init__(self, *args, argument: str | None = None):
        super().__init__(*args)
        self.argument = argument


class InvalidInput(_ArgumentError, ValueError):
    """A value the caller passed is invalid (out of range, wrong shape, inconsistent with another argument);
    ``argument``: the name of the argument at fault, or None."""


class InvalidType(_ArgumentError, TypeError):
    """An argument has the wrong type or dtype; ``argument``: its name, or None."""


class DumpFormatError(InvalidInput):
    """A logit dump (or one of its shards) is malformed: the message names the file, the array and the index."""


class DumpNotFound(InvalidInput, FileNotFoundError):
    """The dump path does not exist."""


class ClusterError(FastspecError, RuntimeError):
    """A Dask cluster failed or could not be reached (a runtime failure, not bad input)."""


class MissingExtra(FastspecError, ImportError):
    """An optional extra (``fastspec[hf]``: torch, transformers) is not installed; the message names the pip
    command (a runtime failure, not bad input; also an ``ImportError``)."""


def shown(value, limit: int = 40) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters ("..." after): a hostile value (a megabyte string,
    an integer too long for ``repr``, nesting too deep for it) is never echoed whole and never raises."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # Python's int-digit limit; a structure nested too deep
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[:limit] + "..."


def check_int(name: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an ``int`` when it is an integer (not a bool) in ``[low, high]`` (no upper bound when ``high`` is
    None); otherwise InvalidType (not an integer) or InvalidInput (out of range), naming ``name``."""
    want = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidType(f"{name} = {value!r} must be {want}", argument=name)
    if value < low or (high is not None and value > high):
        raise InvalidInput(f"{name} = {value!r} must be {want}", argument=name)
    return int(value)


def int_in(name: str, value, low: int, upper: int | None = None, note: str = "") -> int:
    """``value`` as an int in [``low``, ``upper``] (no upper bound when None), checked by the library's one checker
    (:func:`fastspec.errors.check_int`) and told in the entry points' words: ``"{name} = {value!r} is invalid: use
    {rule}{note}"``; InvalidType for a non-integer (bool included), InvalidInput when out of range."""
    rule = f"an integer >= {low}" if upper is None else f"an integer in [{low}, {upper}]"
    try:
        return check_int(name, value, low, upper)
    except InvalidType:
        raise InvalidType(f"{name} = {value!r} is invalid: use {rule}{note}") from None
    except InvalidInput:
        raise InvalidInput(f"{name} = {value!r} is invalid: use {rule}{note}") from None


def positive_int(name: str, value, upper: int | None = None) -> int:
    """``value`` as an int in [1, ``upper``] (no upper bound when None): :func:`int_in`."""
    return int_in(name, value, 1, upper)


@contextmanager
def about(*names):
    """Tag a typed error raised inside with the argument(s) at fault, ``exc.arguments`` (and, for one name,
    ``exc.argument``), unless an inner check tagged it already (the first tag wins), and let it go on: a front end
    speaks of its own names for them (the command line: its flags)."""
    try:
        yield
    except (InvalidInput, InvalidType) as exc:
        if getattr(exc, "arguments", None) is None:
            exc.arguments = names
        if len(names) == 1 and getattr(exc, "argument", None) is None:
            exc.argument = names[0]
        raise


def config_or_settings(cls, config, settings: dict):
    """The settings of an analysis as its frozen config dataclass ``cls``: ``config`` as it is, or ``cls(**settings)``
    (the caller's arguments one by one, validated on construction).  Both at once -- ``config`` and a setting away
    from its default -- is refused (InvalidInput, ``argument="config"``)."""
    if config is None:
        return cls(**settings)
    if not isinstance(config, cls):
        raise InvalidType(f"config must be a {cls.__name__} or None, got {type(config).__name__}", argument="config")
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    mixed = [n for n, v in settings.items() if v is not None and not _same(v, defaults.get(n))]
    if mixed:
        raise InvalidInput(f"give the settings either as config= or one by one ({', '.join(mixed)}), not both",
                           argument="config")
    return config


def _same(value, default) -> bool:
    """``value`` is the default of a setting (a plain scalar or tuple compared by value; anything else by identity)."""
    return value is default or (type(value) is type(default) and isinstance(value, (bool, int, float, str, tuple))
                                and value == default)
