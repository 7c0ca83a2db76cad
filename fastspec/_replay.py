"""Monte-Carlo replay kernels for the simulator (Bernoulli mode).

Trajectory replay: a verify step starting at position t of a recorded sequence
of length L drafts ``kk = min(k, L - 1 - t)`` tokens (so the recovered or
bonus token always lands on a recorded position), accepts draft i (position
t + i) with probability alpha[t + i] while every earlier draft was accepted,
emits accepted + 1 tokens, and the next step starts at t + accepted + 1.  A
step at t = L - 1 drafts nothing: it is a plain target step and is not counted
as a verify step.  This is exactly the convention of
:mod:`fastspec.acceptance`'s dynamic programme (see its module docstring), so
the Monte-Carlo estimate converges to it; "tokens" below are accepted drafts
plus one recovered/bonus token per verify step.

Uniforms come from :func:`fastspec._rng.uniform` keyed by (seed, global row
id, trial, position): a position is consumed at most once per trial, results
do not depend on the thread count, and a row's result does not depend on which
other rows are in the batch (so sharded runs match single-machine runs).
"""
from __future__ import annotations

import numpy as np

from ._jit import kernel, parallel_kernel, prange
from ._rng import PURPOSE_DRAFT, PURPOSE_SIM, hash4, uniform


@parallel_kernel
def bernoulli_replay(alpha, lengths, row_ids, k, trials, n_batches, seed,
                     tokens, steps, drafted, accepted, hist, pos_drafted, pos_accepted):
    """Replay every row ``trials`` times; accumulate per (row, batch) totals.

    alpha [N, T] float64, lengths [N] int64 (1..T), row_ids [N] int64.
    Trial r belongs to batch ``r % n_batches``.  Outputs (zeroed by the caller):
    tokens, steps, drafted, accepted [N, n_batches] int64; hist [N, n_batches, k+1]
    (accepted drafts per step); pos_drafted, pos_accepted [N, n_batches, k] (draft
    slot i drafted / accepted, i.e. vLLM's per-position counters).
    """
    n_rows = alpha.shape[0]
    for n in prange(n_rows):
        length = lengths[n]
        rid = row_ids[n]
        for r in range(trials):
            b = r % n_batches
            t = 0
            n_steps = 0
            n_drafted = 0
            n_accepted = 0
            while t < length:
                kk = min(k, length - 1 - t)
                if kk == 0:  # plain target step at the last position: not a verify step
                    t += 1
                    continue
                j = 0
                while j < kk:
                    pos_drafted[n, b, j] += 1
                    if uniform(seed, rid, r, t + j) <= alpha[n, t + j]:
                        pos_accepted[n, b, j] += 1
                        j += 1
                    else:
                        break
                # slots after the first rejection were drafted but never judged
                for jj in range(j + 1, kk):
                    pos_drafted[n, b, jj] += 1
                hist[n, b, j] += 1
                n_steps += 1
                n_drafted += kk
                n_accepted += j
                t += j + 1
            tokens[n, b] += n_accepted + n_steps
            steps[n, b] += n_steps
            drafted[n, b] += n_drafted
            accepted[n, b] += n_accepted
    return 0


@kernel
def step_seeds(seed, row_ids, trials, starts):
    """Per-replay seed of the verify step starting at ``starts[i]`` in trial ``trials[i]`` of global row ``row_ids[i]``."""
    out = np.empty(trials.shape[0], np.int64)
    for i in range(trials.shape[0]):
        out[i] = np.int64(hash4(seed, row_ids[i], trials[i] * 16 + PURPOSE_SIM, starts[i]) >> np.uint64(1))
    return out


@kernel
def draft_uniforms(seed, row_ids, trials, starts, kmax):
    """Uniforms in (0, 1] for sampling draft tokens at positions starts[i] + j, j < kmax (token mode)."""
    out = np.empty((trials.shape[0], kmax), np.float64)
    for i in range(trials.shape[0]):
        for j in range(kmax):
            out[i, j] = uniform(seed, row_ids[i], trials[i] * 16 + PURPOSE_DRAFT, starts[i] + j)
    return out
