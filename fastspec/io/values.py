"""Value checks of a dump, run on every chunk of rows as it is read (valid positions only: padding is never read).
(The CRC-32 of stored zip members is checked as they are read: :class:`fastspec.io.sources.MapSource`.)

``where(row)`` turns a flat row number of the dump into the index that messages print (``[n, t]``).  Every
failure is a :class:`fastspec.errors.DumpFormatError` naming the file, the array and the index.
"""
from __future__ import annotations

import numpy as np

from ..config import LOGPROB_SUM_TOLERANCE
from .format import format_error

__all__ = ["check_dense", "check_sparse", "ID_LIMIT"]

#: ids and tokens must fit int64 (the kernels' type) when the vocabulary size is unknown
ID_LIMIT = 2 ** 63


def _first_row(mask):
    """Index of the first True row of a [rows] mask, or None."""
    return int(np.flatnonzero(mask)[0]) if mask.any() else None


def _first_entry(bad, valid):
    """(row, column) of the first True entry of [rows, width] ``bad`` in a valid row, or None."""
    bad &= valid[:, None]
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return int(i), int(j)


def _entry(where, row, col):
    return f"{where(row)[:-1]}, {col}]"


def check_dense(file: str, where, name: str, a: np.ndarray, valid: np.ndarray, r0: int) -> None:
    """Raw logits ``a`` [rows, V] (rows start at flat row ``r0``): no NaN, no +inf, one finite logit per row."""
    hit = _first_entry(np.isnan(a), valid)
    if hit:
        raise format_error(file, f"array {name!r}: NaN at index {_entry(where, r0 + hit[0], hit[1])}; logits must "
                                 "not be NaN")
    hit = _first_entry(np.isposinf(a), valid)
    if hit:
        raise format_error(file, f"array {name!r}: +inf at index {_entry(where, r0 + hit[0], hit[1])}; logits must "
                                 "be finite or -inf (masked)")
    i = _first_row(~np.isfinite(a).any(axis=1) & valid)
    if i is not None:
        raise format_error(file, f"array {name!r}: row {where(r0 + i)} has no finite logit (all tokens masked)")


def check_sparse(file: str, where, V: int | None, names: tuple, ids: np.ndarray, lp: np.ndarray, valid: np.ndarray,
                 r0: int) -> None:
    """Top-k ``ids`` and ``lp`` [rows, k] (arrays ``names``): ids distinct and in [0, V), log-probabilities <= 0,
    not NaN, at least one finite, probabilities summing to at most 1 (+ LOGPROB_SUM_TOLERANCE)."""
    iname, lname = names
    hit = _first_entry((ids < 0) | (ids >= (ID_LIMIT if V is None else V)), valid)
    if hit:
        i, j = hit
        raise format_error(file, f"array {iname!r}: id {ids[i, j]} at index {_entry(where, r0 + i, j)} is outside "
                                 f"[0, {V if V is not None else '2**63'})")
    if ids.shape[1] > 1:
        s = np.sort(ids, axis=1)
        i = _first_row((s[:, 1:] == s[:, :-1]).any(axis=1) & valid)
        if i is not None:
            raise format_error(file, f"array {iname!r}: row {where(r0 + i)} lists an id twice; top-k ids must be "
                                     "distinct")
    hit = _first_entry(np.isnan(lp) | (lp > 0), valid)
    if hit:
        i, j = hit
        raise format_error(file, f"array {lname!r}: value {lp[i, j]} at index {_entry(where, r0 + i, j)}; "
                                 "log-probabilities must be <= 0 and not NaN")
    i = _first_row(~np.isfinite(lp).any(axis=1) & valid)
    if i is not None:
        raise format_error(file, f"array {lname!r}: row {where(r0 + i)} has no finite log-probability")
    tot = np.exp(lp.astype(np.float64)).sum(axis=1)
    i = _first_row((tot > 1.0 + LOGPROB_SUM_TOLERANCE) & valid)
    if i is not None:
        raise format_error(file, f"array {lname!r}: row {where(r0 + i)} has probabilities summing to {tot[i]:.6g} "
                                 "> 1; expected log-probabilities under the full-vocabulary distribution")
