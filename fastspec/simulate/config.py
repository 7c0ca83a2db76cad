"""What to simulate: draft lengths, verification variants, modes and trial counts (validated up front)."""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np

from ..config import DEFAULT_BLOCK_TRIALS, DEFAULT_TRIALS, MAX_CANDIDATES, MAX_K, MAX_TRIALS, MIN_TRIALS
from ..errors import InvalidInput, InvalidType
from ..methods import check_candidate_sampling, check_method
from ..params import format_value

__all__ = ["parse_k_list", "MODES", "variants", "block_trials", "check_mode", "check_trials"]

MODES = ("bernoulli", "token")
SIMULATED_SAMPLING = ("iid", "deterministic")


def parse_k_list(spec) -> list[int]:
    """``4`` / ``"4"`` / ``"1,2,4,8"`` / ``"1-8"`` (and mixtures ``"1-3,8"``) -> sorted unique ks in
    [1, MAX_K].  Ranges are checked against the cap before they are expanded."""
    items: list[int] = []
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        items = [int(spec)]
    elif isinstance(spec, str):
        for part in spec.split(","):
            part = part.strip()
            m = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", part)
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                if hi < lo:
                    raise InvalidInput(f"k range {part!r} is empty; write low-high, e.g. 1-8")
                if lo < 1 or hi > MAX_K:
                    raise InvalidInput(f"k range {part!r} is outside [1, {MAX_K}] (drafted tokens per step)")
                items.extend(range(lo, hi + 1))
            else:
                try:
                    items.append(int(part))
                except ValueError:
                    raise InvalidInput(f"k {part!r} is not an integer; write e.g. 4, 1,2,4,8 or 1-8") from None
    elif isinstance(spec, Sequence):
        for v in spec:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidType(f"k values must be integers, got {type(v).__name__} {format_value(v)}")
            items.append(int(v))
    else:
        raise InvalidType(f"k must be an integer, a list of integers or a string like '1-8', got "
                          f"{type(spec).__name__}")
    if not items:
        raise InvalidInput("k is empty; give at least one draft length, e.g. 4")
    bad = [v for v in items if v < 1]
    if bad:
        raise InvalidInput(f"k = {bad[0]} is invalid: the draft length must be >= 1")
    if max(items) > MAX_K:
        raise InvalidInput(f"k = {max(items)} is too large (at most {MAX_K} drafted tokens per step)")
    return sorted(set(items))


def _as_list(value, name):
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return [value]  # one value (an integral float such as 2.0 counts, 2.5 is refused by the caller)
    try:
        return list(value)
    except TypeError:
        raise InvalidType(f"{name} must be a value or a list of values, got {type(value).__name__}") from None


def _shown(v) -> str:
    """A value in a message as it was written: text as it is (a list item of "1,2.5"), numbers as typed."""
    return v if isinstance(v, str) else format_value(v)


def variants(verify, candidates, candidate_sampling) -> list[tuple[str, int]]:
    """[(verify method, candidates)] rows to compute per (draft, k): token verification with each w, block
    verification with w = 1."""
    methods = [check_method(m, name="verify") for m in _as_list(verify, "verify")]
    ws = []
    for w in _as_list(candidates, "candidates"):
        try:
            wi = int(w)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInput(f"candidates {_shown(w)} is not an integer; write e.g. 1, 2 or 1,2,4") from None
        if isinstance(w, (bool, np.bool_)) or wi != w and not isinstance(w, str) or wi < 1 or wi > MAX_CANDIDATES:
            raise InvalidInput(f"candidates = {_shown(w)} is invalid: use an integer in [1, {MAX_CANDIDATES}] "
                               "(candidates per position)")
        ws.append(wi)
    if not methods or not ws:
        raise InvalidInput("verify and candidates must each name at least one value")
    why = (" (without replacement the per-position acceptance depends on which candidates were drawn; it is "
           "supported by fastspec.verify_tree_probs and fastspec.exact, not by the simulator)"
           if candidate_sampling == "without_replacement" else "")
    check_candidate_sampling(candidate_sampling, SIMULATED_SAMPLING, why=why)
    out = [(m, w) for m in methods for w in sorted(set(ws)) if not (m == "block" and w > 1)]
    if not out:
        raise InvalidInput("block verification judges one candidate per position: use candidates 1 with block "
                           "verification")
    return list(dict.fromkeys(out))


def check_mode(mode) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidInput(f"mode {format_value(mode)} is unknown; choose one of: {', '.join(MODES)}")
    return mode


def _count(name, v, lo, hi, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise InvalidInput(f"{name} = {format_value(v)} is invalid: give an integer from {lo} to {hi} ({what})")
    return int(v)


def check_trials(trials, mode) -> int:
    """Monte-Carlo replays per sequence (default by mode), an integer in [MIN_TRIALS, MAX_TRIALS]."""
    return _count("trials", DEFAULT_TRIALS[check_mode(mode)] if trials is None else trials, MIN_TRIALS, MAX_TRIALS,
                  "replays per sequence")


def block_trials(n, batches) -> int:
    """Replays per sequence for block verification, rounded up to a multiple of the batches."""
    n = _count("block_trials", DEFAULT_BLOCK_TRIALS if n is None else n, MIN_TRIALS, MAX_TRIALS,
               "block-verification replays per sequence")
    b = min(batches, n)
    return int(-(-n // b) * b)
