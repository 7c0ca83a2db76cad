"""Trajectory-replay kernels of the simulator: the exact dynamic programme and the Bernoulli Monte-Carlo replay.

Convention (shared with :mod:`fastspec.analysis`): a verify step starting at position t of a recorded
sequence of length L drafts ``d = min(k, L - 1 - t)`` tokens, accepts draft i (position t + i) with probability
alpha[t + i] while every earlier draft was accepted, emits accepted + 1 tokens, and the next step starts at
t + accepted + 1.  A step at t = L - 1 drafts nothing: it is a plain target step and is not counted.
"""
from __future__ import annotations

import numpy as np

from .._numba.jit import kernel, parallel_kernel, prange
from .._numba.rng import Stream, position_uniform, replay_draft_uniform, replay_step_seed, replay_uniform

# columns of the per-sequence DP totals [N, N_DP]
DP_STEPS, DP_DRAFTED, DP_ACCEPTED = range(3)
N_DP = 3
# columns of the Bernoulli replay totals [rows, batches, N_REPLAY]
R_TOKENS, R_STEPS, R_DRAFTED, R_ACCEPTED = range(4)
N_REPLAY = 4


@kernel
def dp_start(L, per_pos_row, k):
    """The initial state of a DP over step starts of a sequence of L positions: every step-start probability 0
    but position 0's (1), and the k per-slot acceptance counts of the row zeroed."""
    start = np.zeros(L + 1)
    start[0] = 1.0
    for j in range(k):
        per_pos_row[j] = 0.0
    return start


@parallel_kernel
def expected_counts(alpha, lengths, k, totals, per_pos):
    """Exact expected verify steps, drafted and accepted tokens per sequence (totals [N, N_DP]) and per draft
    slot j the expected number of steps whose draft j was accepted (per_pos [N, k]), by DP over start
    positions.  Each position is drafted at most once, so one Bernoulli(alpha_t) coin per position drawn in
    advance gives the same process."""
    N = alpha.shape[0]
    for n in prange(N):
        L = lengths[n]
        start = dp_start(L, per_pos[n], k)
        st = 0.0
        dr = 0.0
        ac = 0.0
        for t in range(L):
            P = start[t]
            if P == 0.0:
                continue
            d = min(k, L - 1 - t)
            if d == 0:
                start[t + 1] += P  # plain target step for the last token: not a verify step
                continue
            st += P
            dr += P * d
            c = 1.0
            for j in range(d):
                a = alpha[n, t + j]
                start[t + j + 1] += P * c * (1.0 - a)
                c *= a
                ac += P * c
                per_pos[n, j] += P * c
            start[t + d + 1] += P * c
        totals[n, DP_STEPS] = st
        totals[n, DP_DRAFTED] = dr
        totals[n, DP_ACCEPTED] = ac


@parallel_kernel
def bernoulli_replay(alpha, lengths, row_ids, k, trials, n_batches, seed, totals, hist, pos_accepted):
    """Replay every row ``trials`` times with :func:`~fastspec._numba.rng.replay_uniform` coins.

    alpha [N, T] float64, lengths [N] (1..T), row_ids [N] (global row ids: results do not depend on which
    rows share a call).  Trial r belongs to batch ``r % n_batches``.  Outputs, zeroed by the caller: totals
    [N, n_batches, N_REPLAY] (tokens, verify steps, drafted, accepted), hist [N, n_batches, k+1] (accepted
    drafts per step), pos_accepted [N, n_batches, k] (steps whose draft slot j was accepted)."""
    for n in prange(alpha.shape[0]):
        length = lengths[n]
        rid = row_ids[n]
        for r in range(trials):
            b = r % n_batches
            t = 0
            steps = 0
            drafted = 0
            accepted = 0
            while t < length:
                kk = min(k, length - 1 - t)
                if kk == 0:  # plain target step at the last position: not a verify step
                    t += 1
                    continue
                j = 0
                while j < kk and replay_uniform(seed, rid, r, t + j) <= alpha[n, t + j]:
                    pos_accepted[n, b, j] += 1
                    j += 1
                hist[n, b, j] += 1
                steps += 1
                drafted += kk
                accepted += j
                t += j + 1
            totals[n, b, R_TOKENS] += accepted + steps
            totals[n, b, R_STEPS] += steps
            totals[n, b, R_DRAFTED] += drafted
            totals[n, b, R_ACCEPTED] += accepted


@kernel
def step_seeds(seed, row_ids, trials, starts):
    """Seed of the verify step starting at ``starts[i]`` in trial ``trials[i]`` of global row ``row_ids[i]``."""
    out = np.empty(trials.shape[0], np.int64)
    for i in range(trials.shape[0]):
        out[i] = replay_step_seed(seed, row_ids[i], trials[i], starts[i])
    return out


@kernel
def position_draft_uniforms(seed, row_ids, trials, starts, kmax):
    """Uniforms for drafting at positions starts[i] + j (token verification: keyed by position, since a
    position is judged at most once before the replay moves past it)."""
    out = np.empty((trials.shape[0], kmax), np.float64)
    for i in range(trials.shape[0]):
        for j in range(kmax):
            out[i, j] = replay_draft_uniform(seed, row_ids[i], trials[i], starts[i] + j)
    return out


@kernel
def step_draft_uniforms(step_seeds_, kmax):
    """Uniforms for drafting kmax tokens in each verify step, keyed by the step's own seed.  Block verification
    depends on every drafted token of the block, so a replay must draft fresh tokens in every step (a position
    re-drafted after a rejection must not reuse the token that helped reject it)."""
    out = np.empty((step_seeds_.shape[0], kmax), np.float64)
    for i in range(step_seeds_.shape[0]):
        for j in range(kmax):
            out[i, j] = position_uniform(step_seeds_[i], j, Stream.DRAFT)
    return out


# columns of the per-sequence totals of the step-dependent DP [N, N_STEPWISE]
SW_STEPS, SW_DRAFTED, SW_ACCEPTED, SW_PLAIN, SW_ALL_ACCEPTED, SW_TIME, SW_OFF_RECORD = range(7)
N_STEPWISE = 7


@parallel_kernel
def expected_counts_stepwise(beta, num_draft, matches, lengths, k, step_cost, totals, per_pos):
    """The trajectory DP when the acceptance of draft j depends on where its verify step starts (a proposer
    whose drafts depend on the context, e.g. n-gram lookup): a step starting at t drafts
    d = min(num_draft[n, t], k, L - 1 - t) tokens (d = 0: a plain target step), draft j is accepted with
    probability beta[n, t, j] while the earlier ones were.  matches[n, t, j] = 1 when draft j equals the recorded
    token (an accepted draft that does not leaves the recorded context: SW_OFF_RECORD counts them).
    step_cost[d] is the cost of a step with d drafts (d = 0: plain); totals [N, N_STEPWISE] and per_pos [N, k]
    (steps whose draft j was accepted) are written."""
    for n in prange(beta.shape[0]):
        L = lengths[n]
        start = dp_start(L, per_pos[n], k)
        for c in range(N_STEPWISE):
            totals[n, c] = 0.0
        for t in range(L):
            P = start[t]
            if P == 0.0:
                continue
            d = min(num_draft[n, t], k, L - 1 - t)
            totals[n, SW_TIME] += P * step_cost[d]
            if d <= 0:
                totals[n, SW_PLAIN] += P
                start[t + 1] += P
                continue
            totals[n, SW_STEPS] += P
            totals[n, SW_DRAFTED] += P * d
            c = 1.0
            for j in range(d):
                b = beta[n, t, j]
                start[t + j + 1] += P * c * (1.0 - b)
                c *= b
                totals[n, SW_ACCEPTED] += P * c
                per_pos[n, j] += P * c
                if matches[n, t, j] == 0:
                    totals[n, SW_OFF_RECORD] += P * c
            totals[n, SW_ALL_ACCEPTED] += P * c
            start[t + d + 1] += P * c
