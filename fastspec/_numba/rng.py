"""Counter-based random numbers: a pure function of (seed, counters), never a per-thread generator.

A uniform is the SplitMix64 finaliser applied to the seed and three counters in turn (a well-tested 64-bit
bijective mix), its top 53 bits mapped to ``(0, 1]`` -- never 0, so ``u * q(x) <= p(x)`` can never accept a
token with ``p(x) = 0``.  The counters say *what* a number is for, through the named streams below, so results
are identical whatever the thread count, the batch composition or the row order ("same text under a fixed
seed", a property of this implementation; "same distribution" is the separate, seed-independent claim).

Streams (the counters of each are fixed forever: changing them changes every sampled token):

==========================  ======================================  =========================================
stream                      key                                     used for
==========================  ======================================  =========================================
:func:`position_uniform`    (row seed, position, ACCEPT, 0)         token verification: accept draft i?
:func:`position_uniform`    (row seed, position, RESIDUAL, 0)       recovered token at the first rejection
:func:`position_uniform`    (row seed, position, BONUS, 0)          bonus token after all drafts accepted
:func:`position_uniform`    (row seed, position, BLOCK, 0)          block verification's eta_i coins
:func:`candidate_uniform`   (row seed, depth, CANDIDATE, sibling)   tree verification: accept candidate s?
:func:`position_uniform`    (step seed, position, DRAFT, 0)         drafting inside one replayed block step
:func:`replay_uniform`      (seed, row, trial, position)            Bernoulli replay: accept at position t?
:func:`replay_draft_uniform`  (seed, row, trial*16 + DRAFT, pos)    token-mode replay: draft token at pos
:func:`replay_step_seed`    (seed, row, trial*16 + SIM, start)      token-mode replay: seed of a verify step
:func:`derive_row_seed`     (seed, row, 0x5EED, 0)                  per-row seeds from one scalar seed
==========================  ======================================  =========================================

Seeds are integers in ``[-2**63, 2**64)``, used modulo ``2**64`` (``-1`` and ``2**64 - 1`` are the same seed);
:func:`seed_bits` checks and converts them once, in Python, so a kernel always sees an int64.
The page that explains it: ``docs/design/determinism.md``.
"""
from __future__ import annotations

from enum import IntEnum

import numpy as np

from .jit import kernel

class Stream(IntEnum):
    """What a random number is for: distinct streams for distinct decisions at the same position."""

    ACCEPT = 1  # token verification: accept draft i?
    RESIDUAL = 2  # the recovered token at the first rejection
    BONUS = 3  # the bonus token after every draft was accepted
    DRAFT = 4  # drafting a token in a replay
    BLOCK = 5  # block verification's eta_i coins
    CANDIDATE = 6  # tree verification: accept candidate s?
    SIM = 7  # the seed of a replayed verify step


_TRIAL_STRIDE = 16  # replay streams pack (trial, purpose) into one counter: trial * 16 + purpose (< 16)
_ROW_SEED_TAG = 0x5EED

SEED_MIN = -(2 ** 63)
SEED_END = 2 ** 64  # exclusive

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S11 = np.uint64(11)
_S1 = np.uint64(1)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


@kernel
def _mix(z):
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@kernel
def hash4(seed, a, b, c):
    """64-bit hash of a seed and three integer counters (all taken as uint64)."""
    h = _mix(np.uint64(seed) + _GOLDEN)
    h = _mix(h ^ (np.uint64(a) + _GOLDEN))
    h = _mix(h ^ (np.uint64(b) + _GOLDEN))
    h = _mix(h ^ (np.uint64(c) + _GOLDEN))
    return h


@kernel
def uniform(seed, a, b, c):
    """A uniform in (0, 1] keyed by (seed, a, b, c); never 0."""
    return (np.float64(hash4(seed, a, b, c) >> _S11) + 1.0) * _INV53


@kernel
def position_uniform(seed, position, purpose):
    """The uniform for decision ``purpose`` (a :class:`Stream`: ACCEPT, RESIDUAL, BONUS, BLOCK, DRAFT) at
    ``position`` of a row or verify step with seed ``seed``."""
    return uniform(seed, position, purpose, 0)


@kernel
def candidate_uniform(seed, depth, sibling):
    return uniform(seed, depth, Stream.CANDIDATE, sibling)


@kernel
def replay_uniform(seed, row, trial, position):
    return uniform(seed, row, trial, position)


@kernel
def replay_draft_uniform(seed, row, trial, position):
    return uniform(seed, row, trial * _TRIAL_STRIDE + Stream.DRAFT, position)


@kernel
def replay_step_seed(seed, row, trial, start):
    return np.int64(hash4(seed, row, trial * _TRIAL_STRIDE + Stream.SIM, start) >> _S1)


@kernel
def derive_row_seed(seed, row):
    """Seed of row ``row`` when the caller gave one scalar seed for the batch."""
    return np.int64(hash4(seed, row, _ROW_SEED_TAG, 0) >> _S1)


@kernel
def _derive_row_seeds(seed, out):
    for b in range(out.shape[0]):
        out[b] = derive_row_seed(seed, b)


def seed_bits(seed, name: str = "seed") -> int:
    """A seed as the int64 with the same 64 bits; ``seed`` must be an integer in ``[-2**63, 2**64)``."""
    from ..errors import InvalidInput, InvalidType

    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise InvalidType(f"{name} must be an integer in [-2**63, 2**64), got {type(seed).__name__} {seed!r}")
    s = int(seed)
    if not SEED_MIN <= s < SEED_END:
        raise InvalidInput(f"{name} = {s} does not fit in 64 bits: use an integer in [-2**63, 2**64)")
    return s - SEED_END if s >= 2 ** 63 else s


def row_seeds(seed, batch: int) -> np.ndarray:
    """Per-row seeds (int64 [batch]) for a batch.

    A scalar ``seed`` expands to :func:`derive_row_seed` ``(seed, b)`` for row ``b`` (independent streams; row b's
    seed does not depend on the batch size); a sequence of ``batch`` integers is used as given (each in
    ``[-2**63, 2**64)``).  Verifying row ``b`` alone with ``seed=row_seeds(seed, B)[b:b+1]`` reproduces the
    batched result exactly.
    """
    from ..errors import InvalidInput, InvalidType, shown

    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        out = np.empty(batch, np.int64)
        _derive_row_seeds(seed_bits(seed), out)
        return out
    arr = np.asarray(seed)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == object):
        raise InvalidType(f"seed must be an integer or an integer array of shape [{batch}], got dtype {arr.dtype}")
    if arr.ndim == 0:
        item = arr.item()
        if isinstance(item, int) and not isinstance(item, bool):
            return row_seeds(item, batch)
        raise InvalidType(f"seed must be an integer in [-2**63, 2**64) or an integer array of shape [{batch}] (one per "
                          f"row), got {type(seed).__name__} {shown(seed)}: every draw is keyed by the seed, so "
                          "pass one (e.g. seed=0)")
    if arr.shape != (batch,):
        raise InvalidInput(f"seed must be a scalar or have shape [{batch}] (one per row), got shape {list(arr.shape)}")
    if arr.dtype == np.int64:
        return np.ascontiguousarray(arr)
    if arr.dtype == np.uint64:
        return arr.view(np.int64).copy()
    return np.array([seed_bits(s, f"seed[{i}]") for i, s in enumerate(arr.tolist())], dtype=np.int64)
