"""Counter-based random numbers: a pure function of (seed, counters).

No state, no per-thread generator: the uniform used for a decision is
``uniform(seed, a, b, c)`` where the counters name *what* the number is for
(e.g. draft position and purpose).  Results are therefore identical whatever
the thread count, the batch composition or the row order -- "same text under a
fixed seed", which is a different claim from "same distribution".

The mixer is SplitMix64's finaliser applied to each counter in turn (a
well-tested 64-bit bijective hash); the output takes the top 53 bits and maps
them to ``(0, 1]`` so a uniform is never exactly 0 -- ``u * q(x) <= p(x)`` can
then never accept a token with ``p(x) == 0``.
"""
from __future__ import annotations

import numpy as np

from ._jit import kernel

# Purposes: distinct streams for distinct decisions at the same position.
PURPOSE_ACCEPT = 1
PURPOSE_RESIDUAL = 2
PURPOSE_BONUS = 3
PURPOSE_DRAFT = 4
PURPOSE_BLOCK = 5
PURPOSE_CANDIDATE = 6
PURPOSE_SIM = 7

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


@kernel
def _mix(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@kernel
def hash4(seed, a, b, c):
    """64-bit hash of four integer counters (all cast to uint64)."""
    h = _mix(np.uint64(seed) + _GOLDEN)
    h = _mix(h ^ (np.uint64(a) + _GOLDEN))
    h = _mix(h ^ (np.uint64(b) + _GOLDEN))
    h = _mix(h ^ (np.uint64(c) + _GOLDEN))
    return h


@kernel
def uniform(seed, a, b, c):
    """A uniform in (0, 1] keyed by (seed, a, b, c); never 0."""
    h = hash4(seed, a, b, c)
    return (np.float64(h >> _S11) + 1.0) * _INV53


@kernel
def derive_seed(seed, row):
    """Seed of row ``row`` when the caller gave one scalar seed for the batch."""
    return np.int64(hash4(seed, row, 0x5EED, 0) >> np.uint64(1))


def row_seeds(seed, batch: int) -> np.ndarray:
    """Per-row seeds for a batch of ``batch`` rows.

    A scalar ``seed`` expands to ``derive_seed(seed, b)`` for row ``b`` (so rows
    get independent streams); a sequence of ``batch`` integers is used as given.
    Verifying row ``b`` alone with ``seed=row_seeds(seed, B)[b:b+1]`` reproduces
    the batched result exactly.
    """
    arr = np.asarray(seed)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"seed must be an integer or an integer array of shape [{batch}], got dtype {arr.dtype}")
    if arr.ndim == 0:
        s = int(arr)
        return np.array([derive_seed(s, b) for b in range(batch)], dtype=np.int64)
    if arr.shape != (batch,):
        raise ValueError(f"seed must be a scalar or have shape [{batch}] (one per row), got shape {list(arr.shape)}")
    return arr.astype(np.int64)
