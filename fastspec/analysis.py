"""Expected speculative-decoding figures from per-position acceptance rates: the exact trajectory DP and the
closed forms.

Trajectory DP and the end-of-sequence convention
------------------------------------------------
A sequence has L valid positions 0..L-1 with acceptance rates alpha_0..alpha_{L-1} (alpha_t: the draft's
proposal for token t is accepted).  A verify step starting at position t drafts ``d = min(k, L - 1 - t)``
tokens, i.e. **it never speculates past the recorded end**: drafts cover positions t..t+d-1 and the bonus
token, if all are accepted, is token t+d <= L-1.  Draft i is accepted with probability alpha_{t+i} given drafts
< i were, so exactly j < d are accepted with probability (prod_{i<j} alpha_{t+i})(1 - alpha_{t+j}) and all d
with prod_{i<d} alpha_{t+i}; the step emits accepted + 1 tokens and the next step starts at t + accepted + 1.
A step that would start at t = L-1 (d = 0) is a plain target step: it emits the last token and is **not**
counted as a verify step (nothing was drafted), matching engines, which count only steps with drafts.
Consequently alpha_{L-1} is never used.  Each position is drafted at most once, so the process is the same as
drawing one independent Bernoulli(alpha_t) coin per position in advance.

Reported figures, summed over sequences and then divided (ratios of totals, as vLLM's metrics):

* mean acceptance length = (accepted + verify steps) / verify steps = 1 + accepted / steps
  (tokens per verify step, the bonus / recovered token included);
* draft acceptance rate = accepted / drafted;
* per-position acceptance[j] = (steps whose draft j was accepted) / steps (vLLM's unconditional definition).

Closed forms (Leviathan et al. 2023) assume one alpha for every position and no end of sequence:
``(1 - alpha^{k+1}) / (1 - alpha)`` tokens per step (bonus included) and speed-up ``that / (k c + 1)`` for a
draft/target cost ratio c.  Replaying recorded alpha_t differs from plugging their mean into the formula:
E[prod alpha] != prod E[alpha] (Jensen), and blocks start right after a rejection, i.e. disproportionately
after hard positions.
The page that explains it: ``docs/guide/simulate.md``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ._kernels.replay import DP_ACCEPTED, DP_DRAFTED, DP_STEPS, N_DP, expected_counts
from .config import MAX_K
from .errors import InvalidInput, InvalidType
from .params import format_value

__all__ = ["SpecStats", "expected_tokens_per_step", "expected_tokens_closed_form", "expected_speedup", "optimal_k",
           "alpha_summary", "check_k", "parse_k_list"]


def check_k(k, name: str = "k", *, minimum: int = 1) -> int:
    """A draft length as int: an integer in [minimum, MAX_K] (InvalidInput otherwise)."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)) or not minimum <= k <= MAX_K:
        raise InvalidInput(f"{name} must be an integer in [{minimum}, {MAX_K}] (the draft length), got {k!r}")
    return int(k)


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


@dataclass
class SpecStats:
    """Expected counts of the speculative process replayed along recorded trajectories (module docstring)."""

    k: int
    steps: float  # expected verify steps (summed over sequences)
    drafted: float
    accepted: float
    tokens: int  # valid positions (tokens produced), summed over sequences
    mean_acceptance_length: float  # 1 + accepted / steps (tokens per verify step, bonus included)
    draft_acceptance_rate: float  # accepted / drafted
    per_position_acceptance: np.ndarray  # [k]: accepted at draft index j / steps
    per_sequence_acceptance_length: np.ndarray = field(repr=False)  # [N]
    per_sequence_steps: np.ndarray = field(default=None, repr=False)  # [N] expected verify steps
    per_sequence_accepted: np.ndarray = field(default=None, repr=False)  # [N] expected accepted drafts

    def as_dict(self) -> dict:
        return {"k": self.k, "steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
                "tokens": self.tokens, "mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance.tolist()}


def _lengths(lengths, N, T):
    if lengths is None:
        return np.full(N, T, dtype=np.int64)
    ln = np.asarray(lengths)
    if ln.dtype.kind not in "iu" or ln.shape != (N,):
        raise InvalidInput(f"lengths must be integers of shape [{N}], got {ln.dtype} {list(ln.shape)}")
    ln = ln.astype(np.int64)
    bad = np.flatnonzero((ln < 1) | (ln > T))
    if bad.size:
        raise InvalidInput(f"lengths[{bad[0]}] = {ln[bad[0]]} must be in [1, {T}]")
    return ln


def expected_tokens_per_step(alpha, k, *, lengths=None) -> SpecStats:
    """Exact expected speculative-decoding figures for draft length ``k`` by DP along each trajectory.

    ``alpha``: [N, T] (or [T]) per-position acceptance rates in [0, 1]; ``lengths``: valid positions per
    sequence (default T; positions beyond are ignored).  ``k`` in [1, MAX_K].  O(N T k) time, O(N k) memory.
    """
    a = np.asarray(alpha, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[1] < 1:
        raise InvalidInput(f"alpha must have shape [N, T] or [T], got {list(np.shape(alpha))}")
    k = check_k(k)
    N, T = a.shape
    ln = _lengths(lengths, N, T)
    valid = np.arange(T)[None, :] < ln[:, None]
    bad = np.argwhere(valid & ~((a >= 0.0) & (a <= 1.0)))
    if bad.size:
        n, t = bad[0]
        raise InvalidInput(f"alpha[{n}, {t}] = {a[n, t]!r} must be a probability in [0, 1]")
    totals = np.empty((N, N_DP))
    per_pos = np.empty((N, k))
    if N:
        expected_counts(np.ascontiguousarray(a), ln, k, totals, per_pos)
    steps, drafted, accepted = totals[:, DP_STEPS], totals[:, DP_DRAFTED], totals[:, DP_ACCEPTED]
    S, D, A = float(steps.sum()), float(drafted.sum()), float(accepted.sum())
    per_seq = np.where(steps > 0, 1.0 + accepted / np.where(steps > 0, steps, 1.0), 1.0)
    return SpecStats(
        k=k, steps=S, drafted=D, accepted=A, tokens=int(ln.sum()),
        mean_acceptance_length=1.0 + A / S if S > 0 else 1.0,
        draft_acceptance_rate=A / D if D > 0 else 0.0,
        per_position_acceptance=per_pos.sum(axis=0) / S if S > 0 else np.zeros(k),
        per_sequence_acceptance_length=per_seq, per_sequence_steps=steps.copy(),
        per_sequence_accepted=accepted.copy(),
    )


def _check_alpha_k(alpha, k):
    a = float(alpha)
    if not (0.0 <= a <= 1.0):
        raise InvalidInput(f"alpha = {alpha!r} must be in [0, 1]")
    return a, check_k(k, minimum=0)


def expected_tokens_closed_form(alpha, k) -> float:
    """(1 - alpha^{k+1}) / (1 - alpha): expected tokens per verify step with i.i.d. alpha (k + 1 when alpha = 1)."""
    a, k = _check_alpha_k(alpha, k)
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_speedup(alpha, k, c) -> float:
    """(1 - alpha^{k+1}) / ((1 - alpha)(k c + 1)): walltime speed-up for draft/target cost ratio ``c`` >= 0."""
    a, k = _check_alpha_k(alpha, k)
    c = float(c)
    if not (c >= 0.0 and math.isfinite(c)):
        raise InvalidInput(f"c = {c!r} (draft/target cost ratio) must be finite and >= 0")
    return expected_tokens_closed_form(a, k) / (k * c + 1.0)


def optimal_k(alpha, c, k_max=64) -> int:
    """The k in [0, k_max] maximizing :func:`expected_speedup` (0 means: do not speculate; smallest on ties)."""
    k_max = check_k(k_max, "k_max", minimum=0)
    best, best_s = 0, 1.0
    for k in range(1, k_max + 1):
        s = expected_speedup(alpha, k, c)
        if s > best_s * (1.0 + 1e-12):
            best, best_s = k, s
    return best


def alpha_summary(alpha, valid) -> dict:
    """mean (over valid positions), std over positions, std/min/max of per-sequence means, min and max."""
    a = np.asarray(alpha, dtype=np.float64)
    v = np.asarray(valid, dtype=bool)
    vals = a[v]
    cnt = v.sum(axis=1)
    seq = np.where(cnt > 0, np.where(v, a, 0.0).sum(axis=1) / np.maximum(cnt, 1), 0.0)[cnt > 0]
    return {"mean": float(vals.mean()), "std_positions": float(vals.std()),
            "std_sequences": float(seq.std()), "min_sequence": float(seq.min()), "max_sequence": float(seq.max()),
            "min": float(vals.min()), "max": float(vals.max())}
