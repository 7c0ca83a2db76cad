"""Sampling parameters: the one place that knows their ranges, defaults and recorded values.

The distribution an engine samples from is obtained from a logits row ``x`` in this order (vLLM's and Hugging
Face's): **temperature** ``T`` (``exp((x - max) / T)``; ``T == 0`` is greedy: one-hot on the argmax, lowest
index on ties), then **top-k** (keep logits ``>=`` the k-th largest, ties kept; 0 disables), then **top-p** on
the renormalized result (the smallest highest-probability set with mass ``>= top_p``, ties kept; 1 disables),
then **min-p** (keep ``p >= min_p * p_max``; 0 disables).  fastspec applies them identically to target and
draft (:func:`fastspec.probabilities` is the reference implementation).

* :class:`SamplingParams` -- one validated configuration (scalars): what a dump records, what the CLI and the
  Hugging Face loop take, what an analysis resolves from a dump's metadata and explicit overrides.
* :func:`per_row` -- scalars or one value per row, validated and broadcast to the arrays the kernels read
  (:class:`RowParams`).

Range rules: ``temperature`` finite and ``>= 0`` (a positive value below :data:`MIN_TEMPERATURE` is refused:
``1/T`` would overflow), ``top_k`` an integer ``>= 0``, ``top_p`` in ``(0, 1]``, ``min_p`` in ``[0, 1)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping, NamedTuple

import numpy as np

from .errors import InvalidInput, InvalidType, about

__all__ = ["SamplingParams", "RowParams", "per_row", "MIN_TEMPERATURE", "NAMES", "format_value", "sampling_overrides",
           "SamplingSettings", "GivenSampling", "given_sampling"]

MIN_TEMPERATURE = 1e-300
NAMES = ("temperature", "top_k", "top_p", "min_p")
_DEFAULTS = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}
_RULE = {
    "temperature": "use a finite value >= 0 (0 means greedy)",
    "top_k": "use 0 (disabled) or a positive count",
    "top_p": "use a value in (0, 1] (1 disables top-p)",
    "min_p": "use a value in [0, 1) (0 disables min-p)",
}


def _fmt(v) -> str:
    """A value as a user typed it: 0.7, 1, inf, nan -- never np.float64(...)."""
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return repr(v) if math.isfinite(v) and v != int(v) else (str(int(v)) if math.isfinite(v) else str(v))
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return str(int(v))
    return repr(v)


format_value = _fmt  # for messages elsewhere: a value as the user typed it


def _ok(name: str, v) -> bool:
    if name == "temperature":
        return math.isfinite(v) and v >= 0
    if name == "top_k":
        return 0 <= v < 2 ** 63
    if name == "top_p":
        return 0 < v <= 1
    return 0 <= v < 1


def _scalar(name: str, value, where: str = ""):
    """Validate one scalar parameter; returns float (int for top_k)."""
    label = name + where
    if name == "top_k":
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            if isinstance(value, (float, np.floating)) and float(value).is_integer():
                value = int(value)
            else:
                raise InvalidType(f"{label} must be an integer, got {type(value).__name__} {_fmt(value)}")
        v = int(value)
    else:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise InvalidType(f"{label} must be a real number, got {type(value).__name__} {value!r}")
        v = float(value)
    if not _ok(name, v):
        raise InvalidInput(f"{label} = {_fmt(v)} is invalid: {_RULE[name]}")
    if name == "temperature" and 0 < v < MIN_TEMPERATURE:
        raise InvalidInput(f"{label} = {_fmt(v)} is too small: 1/temperature overflows float64; use 0 for greedy "
                           f"or a value >= {MIN_TEMPERATURE:g}")
    return v


@dataclass(frozen=True)
class SamplingParams:
    """One sampling configuration, validated on construction (see the module docstring)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        for name in NAMES:
            object.__setattr__(self, name, _scalar(name, getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def filtered(self) -> bool:
        """True when top-k, top-p or min-p removes tokens (beyond temperature)."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    def as_dict(self) -> dict:
        return {n: getattr(self, n) for n in NAMES}

    def describe(self) -> str:
        return ", ".join(f"{n}={_fmt(getattr(self, n))}" for n in NAMES)

    @classmethod
    def from_metadata(cls, metadata: Mapping, **overrides) -> "SamplingParams":
        """Resolve a configuration: an explicit override (not None) wins, then the value recorded in ``metadata``
        (a dump's), then the default (temperature 1, no filters)."""
        unknown = set(overrides) - set(NAMES)
        if unknown:
            raise InvalidInput(f"unknown sampling parameter(s): {', '.join(sorted(unknown))}")
        vals = {}
        for n in NAMES:
            v = overrides.get(n)
            vals[n] = v if v is not None else metadata.get(n, _DEFAULTS[n])
        return cls(**vals)

    @classmethod
    def recorded(cls, metadata: Mapping) -> "SamplingParams | None":
        """The configuration a dump's trajectories were sampled with, or None when it does not say
        (no ``temperature`` in its metadata)."""
        if "temperature" not in metadata:
            return None
        return cls.from_metadata(metadata)

    def differences(self, other: "SamplingParams", *, label: str = "recorded") -> list[str]:
        """``["temperature 0.7 (recorded 1)", ...]`` for every parameter that differs from ``other``."""
        return [f"{n} {_fmt(getattr(self, n))} ({label} {_fmt(getattr(other, n))})" for n in NAMES
                if getattr(self, n) != getattr(other, n)]

    def rows(self, n: int) -> "RowParams":
        """The kernels' per-row arrays, every row with this configuration."""
        return RowParams(np.full(n, self.temperature), np.full(n, self.top_k, dtype=np.int64),
                         np.full(n, self.top_p), np.full(n, self.min_p))


def sampling_overrides(sampling, loose: dict) -> dict:
    """{name: value} of the explicitly requested sampling settings (validated); the others come from the dump.

    ``sampling``: None or a :class:`fastspec.params.SamplingParams` (every setting given); ``loose``: the settings
    given one by one (``temperature=``, ``top_k=``, ``top_p=``, ``min_p=``; None: the dump's), not both.  One
    convention for the analyses' configs (:class:`fastspec.simulation.SimulateConfig`, the policy replays,
    :class:`fastspec.acceptance.InspectConfig`)."""
    given = {}
    for name in NAMES:
        if loose[name] is not None:
            with about(name):
                given[name] = _scalar(name, loose[name])
    if sampling is None:
        return given
    with about("sampling"):
        if not isinstance(sampling, SamplingParams):
            raise InvalidType(f"sampling must be a SamplingParams or None (the dump's recorded settings; give single "
                              f"settings as temperature=, top_k=, top_p=, min_p=), got {type(sampling).__name__}")
        if given:
            raise InvalidInput("give the sampling settings either as sampling= or one by one (temperature=, top_k=, "
                               "top_p=, min_p=), not both")
    return sampling.as_dict()


@dataclass(frozen=True, kw_only=True)
class SamplingSettings:
    """The sampling settings of an analysis's config (a base of its frozen dataclass, whose :attr:`checked` validates
    every field on construction): ``sampling`` (None: the dump's recorded settings; or a :class:`SamplingParams`) or
    ``temperature``, ``top_k``, ``top_p``, ``min_p`` one by one (None: the dump's), not both."""

    sampling: SamplingParams | None = None
    temperature: Any = None
    top_k: Any = None
    top_p: Any = None
    min_p: Any = None

    def __post_init__(self):
        self.checked  # noqa: B018 - validated on construction

    @cached_property
    def checked(self):
        """The validated settings (a subclass adds its own fields' checks)."""
        return self.overrides()

    def overrides(self) -> dict:
        """The explicitly requested settings, validated (:func:`sampling_overrides`)."""
        return sampling_overrides(self.sampling, {n: getattr(self, n) for n in NAMES})


def _at_default(name: str, value) -> bool:
    """``value`` of setting ``name`` is None or its default (no processing)."""
    return value is None or (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                             and value == _DEFAULTS[name])


def given_sampling(sampling=None, temperature=None, top_k=None, top_p=None, min_p=None) -> SamplingParams:
    """The sampling of an entry point with no dump to take it from (a real-model run, an output audit, a save):
    ``sampling`` (a :class:`SamplingParams`) or the four settings one by one (None or the default: not given, no
    processing), not both (:func:`sampling_overrides`: InvalidInput tagged ``sampling``); validated, the setting at
    fault tagged (``exc.arguments``)."""
    loose = dict(zip(NAMES, (temperature, top_k, top_p, min_p), strict=True))
    if sampling is not None:
        loose = {n: (None if _at_default(n, v) else v) for n, v in loose.items()}
    return SamplingParams(**sampling_overrides(sampling, loose))


@dataclass(frozen=True, kw_only=True)
class GivenSampling:
    """The sampling settings of a config with no dump to take them from (a real-model run, an output audit), a base
    of its frozen dataclass: ``sampling`` (a :class:`SamplingParams`) or ``temperature``, ``top_k``, ``top_p``,
    ``min_p`` one by one (None: the default), not both (:func:`given_sampling`), checked by :meth:`checked_sampling`
    with the setting at fault tagged (``exc.arguments``); :attr:`params` is the one configuration."""

    sampling: Any = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def checked_sampling(self) -> dict:
        """Validate the settings; returns what the four fields hold after construction: the validated values,
        defaults filled in -- or, with ``sampling``, nothing (the fields stay as given, so ``dataclasses.replace``
        of another field keeps working; :attr:`params` is ``sampling``'s)."""
        params = self.params
        return {} if self.sampling is not None else params.as_dict()

    @property
    def params(self) -> SamplingParams:
        """The settings as one :class:`SamplingParams`."""
        return given_sampling(self.sampling, *(getattr(self, n) for n in NAMES))


class RowParams(NamedTuple):
    """Per-row sampling parameters as the kernels read them: four contiguous arrays of one length."""

    temperature: np.ndarray  # float64 [rows]
    top_k: np.ndarray  # int64 [rows]
    top_p: np.ndarray  # float64 [rows]
    min_p: np.ndarray  # float64 [rows]


def _array(name, value, rows, lead):
    arr = np.asarray(value)
    kind_ok = (np.issubdtype(arr.dtype, np.integer) or
               (name != "top_k" and np.issubdtype(arr.dtype, np.floating))) and arr.dtype != bool
    if not kind_ok:
        if name == "top_k" and np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
            arr = arr.astype(np.int64)
        else:
            need = "an integer" if name == "top_k" else "a real number"
            raise InvalidType(f"{name} must be {need} or an array of them with one entry per row ({rows}), "
                              f"got dtype {arr.dtype}")
    if arr.ndim == 0:
        return None, arr.item()
    if lead is not None and arr.shape == tuple(lead):
        arr = arr.reshape(rows)
    if arr.shape != (rows,):
        raise InvalidInput(f"{name} must be a scalar or have shape [{rows}] (one per row), got shape "
                           f"{list(arr.shape)}")
    return arr, None


def per_row(rows: int, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, *, lead=None) -> RowParams:
    """Validate sampling parameters given as scalars or one per row and broadcast them to ``rows`` rows.

    ``lead``: an optional leading shape whose arrays are accepted too (flattened to ``rows``).  Raises
    :class:`InvalidType`/:class:`InvalidInput` naming the parameter, the offending row and the fix.
    """
    values = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p}
    if all(type(v) in (int, float) for v in values.values()) and type(top_k) is int:  # common case: scalars
        return SamplingParams(**values).rows(rows)
    out = []
    for name in NAMES:
        arr, scalar = _array(name, values[name], rows, lead)
        dtype = np.int64 if name == "top_k" else np.float64
        if arr is None:
            out.append(np.full(rows, _scalar(name, scalar), dtype=dtype))
            continue
        if name == "top_k":
            a = arr.astype(np.float64) if arr.dtype == np.uint64 else arr
            bad = ~((a >= 0) & (a < 2 ** 63))
        else:
            a = arr.astype(np.float64)
            with np.errstate(invalid="ignore"):
                ok = {"temperature": np.isfinite(a) & (a >= 0) & ~((a > 0) & (a < MIN_TEMPERATURE)),
                      "top_p": (a > 0) & (a <= 1), "min_p": (a >= 0) & (a < 1)}[name]
            bad = ~ok
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            _scalar(name, arr[i].item(), f"[{i}]")  # raises with the row named
        out.append(np.ascontiguousarray(arr, dtype=dtype))
    return RowParams(*out)
