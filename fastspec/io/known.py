"""What a sparse dump may know beyond the top-k lists, and its text metadata: the checks.

Optional per-role arrays (kinds :data:`fastspec.io.format.KNOWN_KINDS`, named like the role arrays):

* ``<role>_sampled_logprob[__name]`` float [N, T] (or [T]): the logprob the role's model gives the recorded token
  ``tokens[n, t]`` (needs ``tokens``); <= 0, not NaN; the target's is finite (it sampled that token);
* ``<role>_extra_ids[__name]`` int + ``<role>_extra_logprobs[__name]`` float [N, T, m]: ids outside the role's
  top-k list whose logprobs are known exactly (e.g. the other model's top-k ids, scored by a server that returns
  the logprobs of given ids).  An unused slot holds id -1 with logprob -inf; the other ids are distinct, in
  ``[0, V)``, and not in the row's top-k; top-k plus extra probabilities sum to at most 1 (+ tolerance).

Text metadata (0-d ``numpy.str_`` arrays, loadable with ``allow_pickle=False``): ``logprobs_mode`` (``raw`` or
``processed``) and ``provenance`` (a JSON object, at most :data:`~fastspec.io.format.MAX_PROVENANCE_CHARS`
characters; information only).

The bounds these arrays allow are derived in :mod:`fastspec.acceptance` (the top-k list keeps bounding every
unknown id; the extra ids only become exact).  Structure is checked when a dump is opened
(:func:`check_known`); the extra arrays' values chunk by chunk as they are read (:func:`check_extra_rows`).
"""
from __future__ import annotations

import json

import numpy as np

from ..config import LOGPROB_SUM_TOLERANCE, MAX_WIDTH
from .format import FLOAT_DTYPES, LOGPROBS_MODES, MAX_PROVENANCE_CHARS, PAD_ID, format_error
from .values import ID_LIMIT

__all__ = ["check_known", "text_metadata", "check_extra_rows"]


def check_known(file, known, roles, kind, lead, rank3, lengths, tokens, verify):
    """``(sampled, extras)``: {role key: float64 [N, T] sampled-token logprobs} (read now: small) and {role key:
    {"extra_ids": Source, "extra_logprobs": Source}} (read chunk by chunk), after the structure checks."""
    sampled, extras = {}, {}
    if not known:
        return sampled, extras
    N, T = (lead[0], lead[1]) if rank3 else (1, lead[0])
    for key, parts in known.items():
        first = next(iter(parts.values())).name
        if kind != "sparse":
            raise format_error(file, f"array {first!r}: only a sparse top-k dump takes {', '.join(parts)} arrays "
                                     "(dense logits know every token already)")
        if key not in roles:
            raise format_error(file, f"array {first!r}: its role has no top-k arrays (topk_ids + topk_logprobs)")
        if "sampled_logprob" in parts:
            sampled[key] = _sampled(file, parts["sampled_logprob"], key, lead, N, T, lengths, tokens, verify)
        have = [k for k in ("extra_ids", "extra_logprobs") if k in parts]
        if len(have) == 1:
            miss = "extra_logprobs" if have[0] == "extra_ids" else "extra_ids"
            name = parts[have[0]].name
            raise format_error(file, f"array {name.replace(have[0], miss)!r} is missing (it goes with {name!r})")
        if have:
            extras[key] = _extras(file, parts["extra_ids"], parts["extra_logprobs"], lead)
    return sampled, extras


def _sampled(file, src, key, lead, N, T, lengths, tokens, verify):
    if src.dtype not in FLOAT_DTYPES:
        raise format_error(file, f"array {src.name!r}: dtype {src.dtype}; expected float16, float32 or float64")
    if tuple(src.shape) != tuple(lead):
        raise format_error(file, f"array {src.name!r}: shape {list(src.shape)}; expected {list(lead)} (one logprob "
                                 "per position, like 'tokens')")
    if tokens is None:
        raise format_error(file, f"array {src.name!r}: needs 'tokens' (it holds the logprob of the recorded token "
                                 "at each position)")
    a = src.read_all(verify).reshape(N, T).astype(np.float64)
    valid = np.arange(T)[None, :] < lengths[:, None]
    bad = valid & (np.isnan(a) | (a > 0) | ((a == -np.inf) if key == "target" else False))
    if bad.any():
        n, t = (int(x) for x in np.argwhere(bad)[0])
        need = "finite and <= 0 (the target sampled that token)" if key == "target" else "<= 0 and not NaN"
        idx = f"[{n}, {t}]" if len(lead) == 2 else f"[{t}]"
        raise format_error(file, f"array {src.name!r}: value {a[n, t]} at index {idx}; log-probabilities must be "
                                 f"{need}")
    a[~valid] = 0.0
    return a


def _extras(file, ids, lps, lead):
    for src in (ids, lps):
        if len(src.shape) != len(lead) + 1 or tuple(src.shape[:-1]) != tuple(lead):
            raise format_error(file, f"array {src.name!r}: shape {list(src.shape)}; expected {list(lead) + ['m']} "
                                     "(the top-k arrays' leading dims)")
        if src.shape[-1] > MAX_WIDTH:
            raise format_error(file, f"array {src.name!r}: {src.shape[-1]} entries per position; more than "
                                     f"{MAX_WIDTH}")
    if ids.dtype.kind not in "iu":
        raise format_error(file, f"array {ids.name!r}: dtype {ids.dtype}; expected an integer dtype")
    if lps.dtype not in FLOAT_DTYPES:
        raise format_error(file, f"array {lps.name!r}: dtype {lps.dtype}; expected float16, float32 or float64")
    if ids.shape != lps.shape:
        raise format_error(file, f"arrays {ids.name!r} {list(ids.shape)} and {lps.name!r} {list(lps.shape)} differ "
                                 "in shape")
    return {"extra_ids": ids, "extra_logprobs": lps}


def text_metadata(file, sources, verify):
    """``(logprobs_mode or None, provenance dict or None)`` from the 0-d text arrays present in ``sources``."""
    mode = prov = None
    if "logprobs_mode" in sources:
        mode = _text(file, sources["logprobs_mode"], 64, verify)
        if mode not in LOGPROBS_MODES:
            raise format_error(file, f"array 'logprobs_mode': {mode!r}; use 'raw' or 'processed'")
    if "provenance" in sources:
        text = _text(file, sources["provenance"], MAX_PROVENANCE_CHARS, verify)

        def _refuse(c):
            raise ValueError(f"{c} is not JSON")

        try:
            prov = json.loads(text, parse_constant=_refuse)
        except ValueError as exc:
            raise format_error(file, f"array 'provenance': not valid JSON ({exc})") from None
        if not isinstance(prov, dict):
            raise format_error(file, f"array 'provenance': must hold a JSON object, got {type(prov).__name__}")
    return mode, prov


def _text(file, src, max_chars, verify):
    if src.shape not in ((), (1,)) or src.dtype.kind != "U":
        raise format_error(file, f"array {src.name!r}: must be a 0-d string array (numpy.str_), got dtype "
                                 f"{src.dtype} shape {list(src.shape)}")
    if src.nbytes > 4 * max_chars:
        raise format_error(file, f"array {src.name!r}: {src.nbytes // 4} characters; at most {max_chars}")
    return str(src.read_all(verify).reshape(()))


def check_extra_rows(file, where, V, names, ids, lps, top_ids, top_lps, valid, r0):
    """Extra ``ids`` / ``lps`` [rows, m] (arrays ``names``) against the same rows' top-k lists: unused slots are
    (-1, -inf); other ids distinct, in [0, V), not in the top-k; logprobs <= 0, not NaN; top-k + extra mass <= 1."""
    iname, lname = names
    pad = ids == PAD_ID

    def first(bad):
        bad = bad & valid[:, None]
        return None if not bad.any() else tuple(int(x) for x in np.argwhere(bad)[0])

    def at(i, j):
        return f"{where(r0 + i)[:-1]}, {j}]"

    hit = first(~pad & ((ids < 0) | (ids >= (ID_LIMIT if V is None else V))))
    if hit:
        raise format_error(file, f"array {iname!r}: id {ids[hit]} at index {at(*hit)} is outside "
                                 f"[0, {V if V is not None else '2**63'}) (-1 marks an unused slot)")
    hit = first(np.isnan(lps) | (lps > 0) | (pad & (lps != -np.inf)))
    if hit:
        raise format_error(file, f"array {lname!r}: value {lps[hit]} at index {at(*hit)}; log-probabilities must be "
                                 "<= 0 and not NaN, and -inf in an unused slot (id -1)")
    both = np.concatenate([np.asarray(top_ids, dtype=np.int64), np.where(pad, PAD_ID, ids).astype(np.int64)], axis=1)
    s = np.sort(both, axis=1)
    dup = (s[:, 1:] == s[:, :-1]) & (s[:, 1:] != PAD_ID)
    rows = np.flatnonzero(dup.any(axis=1) & valid)
    if rows.size:
        raise format_error(file, f"array {iname!r}: row {where(r0 + int(rows[0]))} lists an id twice or an id of "
                                 "the top-k list; extra ids must be distinct and outside the top-k")
    tot = (np.exp(np.asarray(top_lps, dtype=np.float64)).sum(axis=1)
           + np.exp(np.asarray(lps, dtype=np.float64)).sum(axis=1))
    rows = np.flatnonzero((tot > 1.0 + LOGPROB_SUM_TOLERANCE) & valid)
    if rows.size:
        r = int(rows[0])
        raise format_error(file, f"array {lname!r}: row {where(r0 + r)}: top-k and extra probabilities sum to "
                                 f"{tot[r]:.6g} > 1")
