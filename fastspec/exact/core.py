"""Exact inputs and one drafted position: probabilities as :class:`~fractions.Fraction`, total variation, and
the anatomy of verifying one drafted token (:func:`verify_step`).

Every function here names the argument and the index of a bad value and says how to fix it; the caller's own
names (``name=``) are used in the messages, so a caller with other words for its inputs passes them in.
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Mapping, Sequence

from ..errors import InvalidInput, InvalidType, shown

__all__ = ["FLOAT_SUM_TOLERANCE", "to_fraction", "as_distribution", "total_variation", "VerifyStep", "verify_step"]

Dist = tuple  # tuple[Fraction, ...]

#: Float inputs rarely sum to exactly 1; within this tolerance they are divided by their exact sum.
FLOAT_SUM_TOLERANCE = 1e-6

ZERO = Fraction(0)
ONE = Fraction(1)

_KINDS = "a Fraction, int, decimal string or float"


# --------------------------------------------------------------------------- inputs


def to_fraction(value, name: str = "value", index: int | None = None) -> Fraction:
    """Convert one probability to an exact :class:`Fraction`.

    ``Fraction`` and ``int`` are taken as they are; a decimal string means the
    decimal exactly (``"0.1"`` is 1/10; ``"1/3"`` also works); a float is
    converted exactly (``Fraction(0.1)`` is 3602879701896397/36028797018963968)
    so a float kernel's inputs can be checked exactly.  Raises
    :class:`~fastspec.errors.InvalidType` for a bool or a non-number and
    :class:`~fastspec.errors.InvalidInput` for text that is no number or a
    value that is not finite; the message calls the value ``name[index]``.
    """
    where = f"{name}[{index}]" if index is not None else name
    if isinstance(value, bool):
        raise InvalidType(f"{where} is a bool; give a number ({_KINDS})")
    if isinstance(value, Fraction):
        return value
    if isinstance(value, numbers.Integral):
        return Fraction(int(value))
    if isinstance(value, str):
        text = value.strip()
        _check_size(text, where)
        try:
            exact = Fraction(text)
        except (ValueError, ZeroDivisionError):
            exact = None
        if exact is not None:
            return _bounded(exact, where)
        if text.lower().lstrip("+-") in ("inf", "infinity", "nan"):
            raise InvalidInput(f"{where} is {value!r}; probabilities must be finite")
        raise InvalidInput(f"{where} is {value!r}, not a number; write e.g. '0.25' or '1/4'")
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise InvalidInput(f"{where} is {value}; probabilities must be finite")
        _check_size(f"{len(value.as_tuple().digits)}e{value.as_tuple().exponent}", where)
        return _bounded(Fraction(value), where)
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise InvalidInput(f"{where} is {f}; probabilities must be finite")
        return Fraction(f)
    raise InvalidType(f"{where} has type {type(value).__name__}; give {_KINDS}")


#: an exact entry's numerator and denominator have at most this many decimal digits (Python prints integers of up
#: to 4300 digits, and an exponent such as 1e-999999999 would build a 400 MB integer before anything could check it)
MAX_DIGITS = 1000
_EXPONENT = re.compile(r"[eE]\s*([+-]?\d+)")


def _check_size(text: str, where: str) -> None:
    """Refuse, before any conversion, text whose exact value would need more than MAX_DIGITS digits."""
    m = _EXPONENT.search(text)
    if len(text) > 2 * MAX_DIGITS + 10 or (m and (len(m.group(1).lstrip("+-")) > 6 or
                                                  abs(int(m.group(1))) > MAX_DIGITS)):
        raise InvalidInput(f"{where} is {shown(text)}: exact entries are limited to {MAX_DIGITS} digits (exponents "
                           f"within +-{MAX_DIGITS}); write the probability with fewer digits")


def _bounded(x: Fraction, where: str) -> Fraction:
    bits = int(MAX_DIGITS * 3.3219280948873626)
    if x.numerator.bit_length() > bits or x.denominator.bit_length() > bits:
        raise InvalidInput(f"{where}: exact entries are limited to {MAX_DIGITS} digits in numerator and "
                           "denominator; write the probability with fewer digits")
    return x


def _is_float(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (numbers.Rational, Decimal))


def as_distribution(values, name: str = "p", *, normalize: bool = False) -> Dist:
    """Validate and convert a probability vector to a tuple of Fractions.

    Raises :class:`~fastspec.errors.InvalidInput` naming the problem and the
    index: empty vector, negative entry, or a sum different from 1
    (:class:`~fastspec.errors.InvalidType` for a string or a non-sequence).
    Sums are checked exactly for rational inputs (ints, Fractions, decimal
    strings); a vector containing floats may be off by at most
    :data:`FLOAT_SUM_TOLERANCE` and is then divided by its exact sum.
    ``normalize=True`` divides any vector with a positive sum by that sum.
    """
    if isinstance(values, (str, bytes)):
        raise InvalidType(f"{name} must be a sequence of probabilities, not a string; split it first")
    if not hasattr(values, "__len__"):
        try:
            values = list(values)
        except TypeError:
            raise InvalidType(f"{name} must be a sequence of probabilities, got {type(values).__name__}") from None
    if len(values) == 0:
        raise InvalidInput(f"{name} is empty; give at least one probability")
    fracs = []
    for i, v in enumerate(values):
        f = to_fraction(v, name, i)
        if f < 0:
            raise InvalidInput(f"{name}[{i}] = {f} is negative; probabilities must be >= 0")
        fracs.append(f)
    total = sum(fracs, ZERO)
    if total == 0:
        raise InvalidInput(f"{name} sums to 0; at least one probability must be positive")
    if total != 1:
        near_one = any(map(_is_float, values)) and abs(float(total) - 1.0) <= FLOAT_SUM_TOLERANCE
        if not (normalize or near_one):
            raise InvalidInput(f"{name} sums to {total} (= {float(total):.12g}), not 1; fix the entries or "
                               "pass normalize=True to divide them by their sum")
        fracs = [f / total for f in fracs]
    return tuple(fracs)


def total_variation(p: Sequence[Fraction], q: Sequence[Fraction]) -> Fraction:
    """TV(p, q) = (1/2) sum |p - q| over equal-length vectors."""
    if len(p) != len(q):
        raise InvalidInput(f"length mismatch: {len(p)} vs {len(q)} entries; give two vectors over one vocabulary")
    return sum((abs(a - b) for a, b in zip(p, q, strict=True)), ZERO) / 2


def tv_mappings(a: Mapping, b: Mapping) -> Fraction:
    """Total variation between two distributions given as mappings outcome -> probability."""
    keys = set(a) | set(b)
    return sum((abs(a.get(k, ZERO) - b.get(k, ZERO)) for k in keys), ZERO) / 2


def pair(p, q, normalize: bool) -> tuple[Dist, Dist]:
    """``p`` and ``q`` validated as distributions over one vocabulary."""
    p = as_distribution(p, "p", normalize=normalize)
    q = as_distribution(q, "q", normalize=normalize)
    if len(p) != len(q):
        raise InvalidInput(f"length mismatch: p has {len(p)} entries, q has {len(q)}; "
                           "both must cover the same vocabulary")
    return p, q


def check_count(value, name: str, minimum: int = 0, what: str = "") -> int:
    """``value`` as an int if it is an integer >= ``minimum`` (not a bool), else InvalidInput."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise InvalidInput(f"{name} must be an integer >= {minimum}{what}, got {value!r}")
    return int(value)


def residual(p: Sequence[Fraction], q: Sequence[Fraction]) -> Dist:
    """max(p - q, 0) entrywise (not normalized)."""
    return tuple(max(a - b, ZERO) for a, b in zip(p, q, strict=True))


def normalized(weights: Sequence[Fraction]) -> Dist | None:
    """``weights`` divided by their sum, or ``None`` when the sum is 0."""
    total = sum(weights, ZERO)
    if total == 0:
        return None
    return tuple(w / total for w in weights)


class ComparedWithTarget:
    """Base of the results compared with the target: ``exact`` is ``total_variation == 0``."""

    __slots__ = ()

    @property
    def exact(self) -> bool:
        """Whether the output law equals the target's (total-variation distance 0)."""
        return self.total_variation == 0


# --------------------------------------------------------------------------- one position


@dataclass(frozen=True)
class VerifyStep:
    """Exact anatomy of verifying one drafted token (all fields are Fractions).

    ``recovered`` is ``None`` when ``rejection == 0`` (p == q): the rejection
    branch is unreachable and no division happens.
    """

    p: Dist
    q: Dist
    accepted: Dist
    acceptance: Fraction
    rejection: Fraction
    residual: Dist
    recovered: Dist | None
    output: Dist

    @property
    def total_variation(self) -> Fraction:
        """TV(p, q), which equals the rejection probability 1 - alpha."""
        return total_variation(self.p, self.q)


def verify_step(p, q, *, normalize: bool = False) -> VerifyStep:
    """Exact speculative verification of one drafted token x ~ q against target p.

    Accept x with probability min(1, p(x)/q(x)); on rejection sample from the
    residual max(p - q, 0) divided by its sum.  The returned ``output`` equals
    ``p`` exactly -- this is checked, and an ``AssertionError`` would mean a
    bug in this function, never in the caller's input.
    """
    p, q = pair(p, q, normalize)
    accepted = tuple(min(a, b) for a, b in zip(p, q, strict=True))
    acceptance = sum(accepted, ZERO)
    rejection = ONE - acceptance
    res = residual(p, q)
    if rejection == 0:
        recovered = None
        output = accepted
    else:
        # sum(residual) == rejection exactly, since sum(p) == 1
        recovered = tuple(r / rejection for r in res)
        output = tuple(a + rejection * r for a, r in zip(accepted, recovered, strict=True))
    if output != p:
        raise AssertionError("exact verification output differs from p: this is a bug in fastspec.exact")
    return VerifyStep(p, q, accepted, acceptance, rejection, res, recovered, output)
