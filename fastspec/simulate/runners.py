"""The simulator's replays: Bernoulli (recorded alpha_t), token mode (real tokens through verify_logits), block
verification, and the per-position acceptance beta_t(w) of w candidates.

Every replay keys its random numbers by (seed, global row, trial, position) through the named streams of
:mod:`fastspec._numba.rng`, so results do not depend on the thread count, the chunking or the shard a row
lives in.
"""
from __future__ import annotations

import math

import numpy as np

from .._kernels import replay as R
from .._kernels.process import sample_rows
from ..config import AGREEMENT_Z, REPLAY_SCRATCH_BYTES, TOKEN_REPLAY_CHUNK_BYTES, TOKEN_REPLAY_ROWS
from ..processing import kernel_view

__all__ = ["bernoulli", "token_replay", "candidate_beta", "iter_sequences"]


def bernoulli(alpha, lengths, row_ids, k, trials, batches, seed, *, max_bytes=REPLAY_SCRATCH_BYTES):
    """Bernoulli replay in blocks of rows, so scratch counters stay under ``max_bytes`` whatever N and k.
    Blocks do not change results: every uniform is keyed by the row's global id."""
    N = alpha.shape[0]
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    rows = int(max(1, min(N, max_bytes // (8 * batches * (2 * k + 1 + R.N_REPLAY) + 1))))
    totals = np.zeros((batches, R.N_REPLAY), np.int64)
    hist_tot = np.zeros(k + 1, np.int64)
    pos_tot = np.zeros(k, np.int64)
    for s in range(0, N, rows):
        e = min(N, s + rows)
        part = np.zeros((e - s, batches, R.N_REPLAY), np.int64)
        hist = np.zeros((e - s, batches, k + 1), np.int64)
        pos_a = np.zeros((e - s, batches, k), np.int64)
        R.bernoulli_replay(alpha[s:e], lengths[s:e], row_ids[s:e], k, trials, batches, int(seed), part, hist, pos_a)
        totals += part.sum(0)
        hist_tot += hist.sum((0, 1))
        pos_tot += pos_a.sum((0, 1))
    return dict(tokens=totals[:, R.R_TOKENS], steps=totals[:, R.R_STEPS], drafted=totals[:, R.R_DRAFTED],
                accepted=totals[:, R.R_ACCEPTED], hist=hist_tot, pos_accepted=pos_tot)


def iter_sequences(dump, draft, max_bytes=TOKEN_REPLAY_CHUNK_BYTES):
    """Yield (n0, n1, target [m, T, V], draft [m, T, V]) for whole sequences, ``max_bytes`` per array."""
    infos = [dump.arrays[dump.array_name("target", "logits")], dump.arrays[dump.array_name(draft, "logits")]]
    row_bytes = max(np.dtype(i.dtype).itemsize for i in infos) * dump.V
    per_seq = dump.T * row_bytes
    m = max(1, max_bytes // per_seq)
    n0 = 0
    for ch in dump.iter_chunks(drafts=(draft,), max_bytes=m * per_seq):
        n1 = n0 + (ch.stop - ch.start) // dump.T
        yield n0, n1, ch.target.reshape(n1 - n0, dump.T, -1), ch.drafts[draft].reshape(n1 - n0, dump.T, -1)
        n0 = n1


def _draft_tokens(rows, u, sp):
    """x ~ q for each logits row of rows [R, V] with uniforms u [R] (the library's one sampler)."""
    out = np.empty(rows.shape[0], np.int64)
    sample_rows(kernel_view(rows), sp.rows(rows.shape[0]), np.ascontiguousarray(u), out)
    return out


def token_replay(dump, draft, alpha, k, trials, batches, seed, sp, progress=None, method="token"):
    """Replay with real tokens through :func:`fastspec.verify_logits`, in lockstep batches of (sequence, trial).

    Drafts are sampled from q_t; token verification keys them by position (a position is judged at most once),
    block verification by step (it depends on every drafted token of the block)."""
    from ..verify import verify_logits

    row_offset = int(getattr(dump, "row_offset", 0))
    lengths = dump.lengths
    tokens = np.zeros(batches, np.int64)
    steps = np.zeros(batches, np.int64)
    drafted = np.zeros(batches, np.int64)
    accepted_tot = np.zeros(batches, np.int64)
    hist = np.zeros(k + 1, np.int64)
    pos_a = np.zeros(k, np.int64)
    judged = judged_accepted = 0
    judged_alpha = judged_var = 0.0
    for n0, n1, tgt, drf in iter_sequences(dump, draft):
        m = n1 - n0
        # every (sequence, trial) replay of this chunk advances in lockstep, one verify call per group
        seq = np.repeat(np.arange(m), trials)
        trial = np.tile(np.arange(trials), m).astype(np.int64)
        L = lengths[n0 + seq].astype(np.int64)
        gid = (row_offset + n0 + seq).astype(np.int64)
        pos = np.zeros(m * trials, np.int64)
        while True:
            live = np.flatnonzero(pos < L)
            if not live.size:
                break
            kk_all = np.minimum(k, L[live] - 1 - pos[live])
            pos[live[kk_all <= 0]] += 1  # plain target step at the last position
            act, kk = live[kk_all > 0], kk_all[kk_all > 0]
            for s in range(0, act.size, TOKEN_REPLAY_ROWS):
                rows, kr = act[s:s + TOKEN_REPLAY_ROWS], kk[s:s + TOKEN_REPLAY_ROWS]
                kmax = int(kr.max())
                starts = pos[rows]
                offs = np.arange(kmax + 1)
                tpos = np.minimum(starts[:, None] + offs[None, :], L[rows, None] - 1)
                target_rows = tgt[seq[rows, None], tpos]  # [R, kmax+1, V]
                draft_rows = drf[seq[rows, None], tpos[:, :kmax]]  # [R, kmax, V]
                seeds = R.step_seeds(int(seed), gid[rows], trial[rows], starts)
                if method == "block":
                    u = R.step_draft_uniforms(seeds, kmax)
                else:
                    u = R.position_draft_uniforms(int(seed), gid[rows], trial[rows], starts, kmax)
                x = _draft_tokens(draft_rows.reshape(-1, draft_rows.shape[-1]), u.reshape(-1), sp)
                x = np.where(offs[None, :kmax] < kr[:, None], x.reshape(len(rows), kmax), -1)
                res = verify_logits(target_rows, draft_rows, x, num_draft=kr, temperature=sp.temperature,
                                    top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, seed=seeds, method=method)
                acc = res.num_accepted
                b = trial[rows] % batches
                np.add.at(steps, b, 1)
                np.add.at(drafted, b, kr)
                np.add.at(accepted_tot, b, acc)
                np.add.at(tokens, b, acc + 1)
                np.add.at(hist, acc, 1)
                for j in range(kmax):
                    pos_a[j] += int((acc > j).sum())
                # judged positions: drafts 0..acc (the rejected one included) unless all were accepted
                nj = np.minimum(acc + 1, kr)
                a_seg = alpha[n0 + seq[rows, None], np.minimum(tpos[:, :kmax], alpha.shape[1] - 1)]
                a_seg = np.where(offs[None, :kmax] < nj[:, None], a_seg, 0.0)
                judged += int(nj.sum())
                judged_alpha += float(a_seg.sum())
                judged_var += float((a_seg * (1 - a_seg)).sum())
                judged_accepted += int(np.minimum(acc, nj).sum())
                pos[rows] += acc + 1
        if progress is not None:
            progress(m)
    check = None
    if judged and method == "token":  # block verification's acceptance is not alpha_t per position
        sd = math.sqrt(judged_var) if judged_var > 0 else 0.0
        z = (judged_accepted - judged_alpha) / sd if sd > 0 else (0.0 if judged_accepted == judged_alpha else math.inf)
        check = {"judged_positions": judged, "accepted": judged_accepted, "expected_accepted": judged_alpha,
                 "acceptance_frequency": judged_accepted / judged, "expected_frequency": judged_alpha / judged,
                 "z": z, "passed": bool(abs(z) <= AGREEMENT_Z)}
    return dict(tokens=tokens, steps=steps, drafted=drafted, accepted=accepted_tot, hist=hist,
                pos_accepted=pos_a, token_check=check)


def candidate_beta(d, name, sp, w, sampling, valid) -> np.ndarray:
    """beta_t(w) [N, T]: probability that one of w candidates is accepted at position t (exact, per position)."""
    from ..candidates import candidate_acceptance
    from ..processing import probabilities

    beta = np.zeros((d.N, d.T))
    flat = beta.reshape(-1)
    for n0, n1, tgt, drf in iter_sequences(d, name):
        m = n1 - n0
        x = tgt.reshape(m * d.T, -1)
        y = drf.reshape(m * d.T, -1)
        rows = np.flatnonzero(valid[n0:n1].reshape(-1))
        for s in range(0, rows.size, 256):
            r = rows[s:s + 256]
            kw = sp.as_dict()
            p = probabilities(x[r], **kw)
            q = probabilities(y[r], **kw)
            flat[n0 * d.T + r] = candidate_acceptance(
                p, q, w, sampling=sampling,
                draft_logits=np.asarray(y[r], dtype=np.float64) if sampling == "deterministic" else None)
    return beta
