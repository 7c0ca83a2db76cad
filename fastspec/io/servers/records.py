"""The staged record of one prompt (one JSON file in the staging directory) and its check.

A record is ``{"i": prompt index, "continuation": [ids], "models": {role: {"ids": [[ids]], "logprobs":
[[logprobs]], "own": [logprob], "extra": [{"id": logprob}] or null}}}``, one row per continuation position.
:func:`check_record` applies, to the values as the dump will store them (ids int32, logprobs float32), every check
:func:`fastspec.io.save_dump` applies to the assembled dump -- so a record that passes can always be assembled --
and names the role whose answer broke a rule.  It runs on each prompt's answers before they are staged, and on
every staged record a rerun resumes from.
"""
from __future__ import annotations

import math
import re

import numpy as np

from ...config import LOGPROB_SUM_TOLERANCE
from ...errors import shown

__all__ = ["BadRecord", "check_record"]

_ID_END = 2 ** 31
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,9}")


class BadRecord(ValueError):
    """A record breaks a rule; ``role`` names the model whose answer broke it (``None``: the record itself)."""

    def __init__(self, message: str, role: str | None = None):
        super().__init__(message)
        self.role = role


def _f32(x) -> float:
    """``x`` as the dump stores it (float32), as a Python float; a non-number raises TypeError."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise TypeError
    with np.errstate(over="ignore"):
        return float(np.float32(x))


def _ids(row, where: str, role: str) -> list:
    if not isinstance(row, list) or not row:
        raise BadRecord(f"{where}: no top-k ids", role)
    for t in row:
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < _ID_END:
            raise BadRecord(f"{where}: id {shown(t)} is not a token id (an integer in [0, 2**31))", role)
    if len(set(row)) != len(row):
        raise BadRecord(f"{where}: an id is listed twice in the top-k list", role)
    return row


def _lps(row, n: int, where: str, role: str) -> list:
    if not isinstance(row, list) or len(row) != n:
        raise BadRecord(f"{where}: {n} top-k ids but {len(row) if isinstance(row, list) else 'no'} logprobs", role)
    out = []
    for v in row:
        try:
            f = _f32(v)
        except TypeError:
            raise BadRecord(f"{where}: the logprob {shown(v)} is not a number", role) from None
        if math.isnan(f) or f > 0:
            raise BadRecord(f"{where}: logprob {v!r} is not a log-probability (NaN or > 0)", role)
        out.append(f)
    if not any(math.isfinite(f) for f in out):
        raise BadRecord(f"{where}: no finite top-k logprob (as float32)", role)
    return out


def _mass(values, where: str, role: str, what: str) -> None:
    tot = math.fsum(math.exp(v) for v in values)
    if tot > 1.0 + LOGPROB_SUM_TOLERANCE:
        raise BadRecord(f"{where}: the {what} probabilities sum to {tot:.6g} > 1 (beyond the float tolerance "
                        f"{LOGPROB_SUM_TOLERANCE:g}): not log-probabilities of one distribution", role)


def check_record(rec, i: int, roles, *, max_new_tokens: int, ignore_eos: bool, tight: bool) -> None:
    """Raise :class:`BadRecord` unless ``rec`` is a valid record of prompt ``i`` for ``roles`` (the target first)."""
    if not isinstance(rec, dict):
        raise BadRecord(f"not a JSON object (a {type(rec).__name__})")
    if rec.get("i") != i or isinstance(rec.get("i"), bool):
        raise BadRecord(f"it records prompt {shown(rec.get('i'))}, not prompt {i}")
    cont = rec.get("continuation")
    if not isinstance(cont, list) or not cont:
        raise BadRecord("no continuation", "target")
    for j, t in enumerate(cont):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < _ID_END:
            raise BadRecord(f"continuation[{j}] = {shown(t)} is not a token id (an integer in [0, 2**31))", "target")
    L = len(cont)
    if L > max_new_tokens or (ignore_eos and L != max_new_tokens):
        raise BadRecord(f"{L} continuation tokens for {'exactly' if ignore_eos else 'at most'} {max_new_tokens}",
                        "target")
    models = rec.get("models")
    if not isinstance(models, dict) or sorted(models) != sorted(roles):
        raise BadRecord(f"models {sorted(models) if isinstance(models, dict) else shown(models)}, expected "
                        f"{sorted(roles)}")
    for role in roles:
        m = models[role]
        if not isinstance(m, dict):
            raise BadRecord("no rows", role)
        ids, lps, own, extra = m.get("ids"), m.get("logprobs"), m.get("own"), m.get("extra")
        for name, rows in (("ids", ids), ("logprobs", lps), ("own", own)):
            if not isinstance(rows, list) or len(rows) != L:
                got = len(rows) if isinstance(rows, list) else "no"
                raise BadRecord(f"{got} rows of {name} for {L} continuation tokens", role)
        if tight:
            if not isinstance(extra, list) or len(extra) != L:
                raise BadRecord(f"{len(extra) if isinstance(extra, list) else 'no'} rows of the other side's "
                                f"logprobs for {L} continuation tokens", role)
        elif extra is not None:
            raise BadRecord("logprobs of the other side's ids in a run without tight bounds", role)
        for t in range(L):
            where = f"position {t}"
            row = _ids(ids[t], where, role)
            vals = _lps(lps[t], len(row), where, role)
            _mass(vals, where, role, "top-k")
            try:
                o = _f32(own[t])
            except TypeError:
                raise BadRecord(f"{where}: the logprob {shown(own[t])} of the sampled token is not a number",
                                role) from None
            if math.isnan(o) or o > 0 or (role == "target" and o == -math.inf):
                need = "finite and <= 0: the target sampled that token" if role == "target" else "<= 0, not NaN"
                raise BadRecord(f"{where}: the sampled token's logprob {own[t]!r} (as float32: {o!r}) must be "
                                f"{need}", role)
            if tight:
                e = extra[t]
                if not isinstance(e, dict):
                    raise BadRecord(f"{where}: the other side's logprobs are {shown(e)}, not an object", role)
                known = dict(zip(row, vals, strict=True))
                for key, v in e.items():
                    if not _DECIMAL.fullmatch(key) or int(key) >= _ID_END:
                        raise BadRecord(f"{where}: key {shown(key)} is not a token id", role)
                    try:
                        f = _f32(v)
                    except TypeError:
                        raise BadRecord(f"{where}: the logprob {shown(v)} of id {key} is not a number", role) \
                            from None
                    if math.isnan(f) or f > 0:
                        raise BadRecord(f"{where}: logprob {v!r} of id {key} is not a log-probability", role)
                    known[int(key)] = max(f, known.get(int(key), -math.inf))
                _mass(known.values(), where, role, "top-k and other side's")
