"""The simulator's replays: Bernoulli (recorded alpha_t), token mode (real tokens through verify_logits), block
verification, and the per-position acceptance beta_t(w) of w candidates.

Every replay keys its random numbers by (seed, global row, trial, position) through the named streams of
:mod:`fastspec._numba.rng`, so results do not depend on the thread count, the chunking or the shard a row
lives in.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from .._kernels import replay as R
from .._kernels.codes import PAD
from .._kernels.process import sample_rows
from ..config import (AGREEMENT_FALSE_ALARM, REPLAY_BLOCK_WORK, REPLAY_SCRATCH_BYTES, TOKEN_REPLAY_CHUNK_BYTES,
                      TOKEN_REPLAY_LANES, TOKEN_REPLAY_ROWS)
from ..processing import kernel_view
from ..stats import t_isf

__all__ = ["bernoulli", "token_replay", "candidate_beta", "iter_sequences", "agreement_threshold"]


def agreement_threshold(df: float) -> float:
    """|z| above which a Monte-Carlo figure disagrees with its exact expectation: the two-sided Student-t
    quantile with ``df`` degrees of freedom (``math.inf`` for a normal statistic) at AGREEMENT_FALSE_ALARM."""
    return t_isf(AGREEMENT_FALSE_ALARM / 2, df)


def bernoulli(alpha, lengths, row_ids, k, trials, batches, seed, *, max_bytes=REPLAY_SCRATCH_BYTES,
              max_work=REPLAY_BLOCK_WORK, progress=None):
    """Bernoulli replay in blocks of rows, so scratch counters stay under ``max_bytes`` whatever N and k, and
    a block holds about ``max_work`` position-trials (``progress(rows)`` after each).  Blocks do not change
    results: every uniform is keyed by the row's global id."""
    N, T = alpha.shape
    alpha = np.ascontiguousarray(alpha, dtype=np.float64)
    by_work = max(numba.get_num_threads(), max_work // max(1, T * trials))
    rows = int(max(1, min(N, by_work, max_bytes // (8 * batches * (2 * k + 1 + R.N_REPLAY) + 1))))
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
        if progress is not None:
            progress(e - s)
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


def token_replay(dump, draft, alpha, k, trials, batches, seed, sp, progress=None, method="token", *,
                 lanes=TOKEN_REPLAY_LANES, argmax=False):
    """Replay with real tokens through :func:`fastspec.verify_logits`, in lockstep groups of at most ``lanes``
    (sequence, trial) replays (scratch is O(lanes + chunk) whatever ``trials``; ``progress(n)`` as n replays
    finish).  Groups do not change results: every random number is keyed by (seed, row, trial, position) and
    every total is a sum of integers (the expected acceptance is summed from per-position counts).

    Drafts are sampled from q_t; token verification keys them by position (a position is judged at most once),
    block verification by step (it depends on every drafted token of the block).  ``argmax``: the drafts are the
    draft's argmax tokens (lowest id among ties), verified with a one-hot q (``draft_logits=None``); ``alpha``
    is then p_t(argmax q_t) (:mod:`fastspec.simulation.argmax`)."""
    if argmax and method != "token":
        raise ValueError("argmax drafts are replayed with token verification only")
    rep = _TokenReplay(dump, k, batches, seed, sp, method, progress, argmax)
    judged_alpha = judged_var = 0.0
    for n0, n1, tgt, drf in iter_sequences(dump, draft):
        m = n1 - n0
        judged_at = np.zeros((m, dump.T), np.int64) if method == "token" else None
        for g0 in range(0, m * trials, lanes):
            flat = np.arange(g0, min(m * trials, g0 + lanes), dtype=np.int64)
            rep.run(n0, tgt, drf, flat // trials, flat % trials, judged_at)
        if judged_at is not None:
            a = alpha[n0:n1]
            judged_alpha += float((judged_at * a).sum())
            judged_var += float((judged_at * (a * (1 - a))).sum())
    out = dict(tokens=rep.tokens, steps=rep.steps, drafted=rep.drafted, accepted=rep.accepted, hist=rep.hist,
               pos_accepted=rep.pos_a, token_check=None)
    if rep.judged and method == "token":  # block verification's acceptance is not alpha_t per position
        sd = math.sqrt(judged_var) if judged_var > 0 else 0.0
        diff = rep.judged_accepted - judged_alpha
        z = diff / sd if sd > 0 else (0.0 if diff == 0 else math.inf)
        bound = agreement_threshold(math.inf)
        n, hits = rep.judged, rep.judged_accepted
        out["token_check"] = {"judged_positions": n, "accepted": hits, "expected_accepted": judged_alpha,
                              "acceptance_frequency": hits / n, "expected_frequency": judged_alpha / n, "z": z,
                              "threshold": bound, "passed": bool(abs(z) <= bound)}
    return out


class _TokenReplay:
    """The counters of one token-mode replay, and the lockstep advance of a group of (sequence, trial) replays."""

    def __init__(self, dump, k, batches, seed, sp, method, progress, argmax=False):
        from ..verify import verify_logits

        self.argmax = argmax
        self.verify_logits, self.lengths = verify_logits, dump.lengths
        self.k, self.batches, self.seed, self.sp, self.method = k, batches, int(seed), sp, method
        self.progress = progress
        self.tokens, self.steps, self.drafted, self.accepted = (np.zeros(batches, np.int64) for _ in range(4))
        self.hist = np.zeros(k + 1, np.int64)
        self.pos_a = np.zeros(k, np.int64)
        self.judged = self.judged_accepted = 0

    def run(self, n0, tgt, drf, seq, trial, judged_at):
        """Advance the replays (sequence n0 + seq[i], trial[i]) together, one verify call per TOKEN_REPLAY_ROWS."""
        L = self.lengths[n0 + seq].astype(np.int64)
        gid = (n0 + seq).astype(np.int64)
        pos = np.zeros(seq.size, np.int64)
        reported = 0
        while True:
            live = np.flatnonzero(pos < L)
            if self.progress is not None and seq.size - live.size > reported:
                self.progress(seq.size - live.size - reported)
                reported = seq.size - live.size
            if not live.size:
                return
            kk_all = np.minimum(self.k, L[live] - 1 - pos[live])
            pos[live[kk_all <= 0]] += 1  # plain target step at the last position
            act, kk = live[kk_all > 0], kk_all[kk_all > 0]
            for s in range(0, act.size, TOKEN_REPLAY_ROWS):
                rows, kr = act[s:s + TOKEN_REPLAY_ROWS], kk[s:s + TOKEN_REPLAY_ROWS]
                acc = self._step(tgt, drf, seq[rows], trial[rows], gid[rows], pos[rows], L[rows], kr, judged_at)
                pos[rows] += acc + 1

    def _step(self, tgt, drf, seq, trial, gid, starts, L, kr, judged_at):
        """One verify call for rows starting at ``starts`` with kr drafts each; returns accepted drafts per row."""
        kmax = int(kr.max())
        offs = np.arange(kmax + 1)
        tpos = np.minimum(starts[:, None] + offs[None, :], L[:, None] - 1)
        target_rows = tgt[seq[:, None], tpos]  # [R, kmax+1, V]
        draft_rows = drf[seq[:, None], tpos[:, :kmax]]  # [R, kmax, V]
        seeds = R.step_seeds(self.seed, gid, trial, starts)
        if self.argmax:  # the draft's top-1 (np.argmax: the lowest id among ties), judged with a one-hot q
            x = np.argmax(draft_rows, axis=-1).astype(np.int64)
        else:
            if self.method == "block":
                u = R.step_draft_uniforms(seeds, kmax)
            else:
                u = R.position_draft_uniforms(self.seed, gid, trial, starts, kmax)
            x = _draft_tokens(draft_rows.reshape(-1, draft_rows.shape[-1]), u.reshape(-1), self.sp)
        x = np.where(offs[None, :kmax] < kr[:, None], x.reshape(len(seq), kmax), PAD)
        sp = self.sp
        res = self.verify_logits(target_rows, None if self.argmax else draft_rows, x, num_draft=kr,
                                 temperature=sp.temperature,
                                 top_k=sp.top_k, top_p=sp.top_p, min_p=sp.min_p, seed=seeds, method=self.method)
        acc = res.num_accepted
        b = trial % self.batches
        np.add.at(self.steps, b, 1)
        np.add.at(self.drafted, b, kr)
        np.add.at(self.accepted, b, acc)
        np.add.at(self.tokens, b, acc + 1)
        np.add.at(self.hist, acc, 1)
        for j in range(kmax):
            self.pos_a[j] += int((acc > j).sum())
        if judged_at is not None:
            # judged positions: drafts 0..acc (the rejected one included) unless all were accepted
            nj = np.minimum(acc + 1, kr)
            judged = offs[None, :kmax] < nj[:, None]
            np.add.at(judged_at, (np.broadcast_to(seq[:, None], judged.shape)[judged], tpos[:, :kmax][judged]), 1)
            self.judged += int(nj.sum())
            self.judged_accepted += int(np.minimum(acc, nj).sum())
        return acc


def candidate_beta(d, name, sp, w, candidate_sampling, valid) -> np.ndarray:
    """beta_t(w) [N, T]: probability that one of w candidates (proposed by ``candidate_sampling``: "iid" or
    "deterministic") is accepted at position t under the sampling ``sp`` (exact, per position)."""
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
                p, q, w, candidate_sampling=candidate_sampling,
                draft_logits=np.asarray(y[r], dtype=np.float64) if candidate_sampling == "deterministic" else None)
    return beta
