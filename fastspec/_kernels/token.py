"""Token-level verification kernels (rejection sampling), from logits or from probabilities.

For row b and drafted position i < num_draft with drafted token x: accept while ``u_i * q_i(x) <= p_i(x)``
(``u_i`` = ``position_uniform(seed, i, Stream.ACCEPT)``, in (0, 1]); at the first rejection emit a recovered
token from ``max(p_i - q_i, 0)`` (or from ``p_i`` without x for a one-hot draft); if every draft is accepted,
a bonus token from ``p_{num_draft}``.  Greedy rows (temperature 0) accept while the draft equals the target
argmax and emit the argmax at the first mismatch.  The rules and the public entry points are in
:mod:`fastspec.verify`.

Cost per visited position (logits): one max pass over the target row (the NaN/+inf/all -inf check too, fused
into the previous position's weight pass), one pass storing the target weights with their block sums, the
same for the draft row, two point look-ups, and on rejection the residual's block sums from the stored weights
(no exponential) and a scan of one block.  Rows after the decision are only validated.  Every row of the input
is validated exactly once; drafted tokens with draft probability 0 are reported wherever they are.
"""
from __future__ import annotations

import numpy as np

from .._numba.intrinsics import to_f64
from .._numba.fastexp import fexp
from .._numba.jit import kernel, parallel_kernel, prange
from .._numba.rng import Stream, derive_row_seed, position_uniform
from ..config import BLOCK, READ_AHEAD_BYTES
from .codes import (ACCEPTED, BAD_DRAFT, BAD_VALUES, DRAFT_ROWS, N_STATS, NO_EXCLUDED, PAD, TARGET_ROWS,
                    UNDERFLOWS)
from .process import row_cutoff, row_params
from .rows import ROW_OK, argmax_of, row_max, status
from .sample import block_count, block_sums, row_weights_ahead, sample, sample_weights


# --------------------------------------------------------------------------------------------- work buffers
def buffer_size(V: int, nb: int) -> int:
    """float64 elements of one thread's work buffer (see :func:`split_buffer`)."""
    return 2 * V + 3 * nb + BLOCK


@kernel
def split_buffer(buf, V, nb):
    """(wp, wq, zpb, zqb, bsum, tmp) views of one flat work buffer.

    wp, wq [V]: stored target / draft weights (wq doubles as the top-k/top-p selection scratch before the draft
    weights are written); zpb, zqb, bsum [nb]: their block sums and the sampler's; tmp [BLOCK]: sampler scratch."""
    wp = buf[0:V]
    wq = buf[V:2 * V]
    zpb = buf[2 * V:2 * V + nb]
    zqb = buf[2 * V + nb:2 * V + 2 * nb]
    bsum = buf[2 * V + 2 * nb:2 * V + 3 * nb]
    tmp = buf[2 * V + 3 * nb:2 * V + 3 * nb + BLOCK]
    return wp, wq, zpb, zqb, bsum, tmp


# --------------------------------------------------------------------------------------------- logits
@kernel
def _draft_prob_positive(y, tok, m, sp, scratch):
    """q(tok) > 0 for a valid draft row y with max m under the processing (temperature > 0)."""
    yv = to_f64(y[tok])
    if yv == m:  # the argmax is kept by every filter and has weight 1
        return True
    inv_t, thr = row_cutoff(y, m, sp, scratch)
    return yv >= thr and fexp((yv - m) * inv_t) > 0.0


@kernel
def validate_rest(xt, xd, has_draft, toks, nd, rows, md, sp, scratch, stats):
    """Validate target rows t0.. and draft rows d0.. (``rows = (t0, d0, d_known)``) of a row the decision did
    not read (draft rows below ``d_known`` were read ahead: their max is ``md[i]``), and check that every drafted
    token among them has draft probability > 0, so an invalid draft is reported whatever was accepted."""
    t0, d0, d_known = rows
    for i in range(t0, xt.shape[0]):
        if status(row_max(xt[i])) != ROW_OK:
            stats[BAD_VALUES] = TARGET_ROWS
            return
    for i in range(d0, xd.shape[0]):
        m = md[i] if i < d_known else row_max(xd[i])
        if status(m) != ROW_OK:
            stats[BAD_VALUES] = DRAFT_ROWS
            return
        if has_draft and i < nd and sp[0] > 0.0 and stats[BAD_DRAFT] == 0:
            if not _draft_prob_positive(xd[i], toks[i], m, sp, scratch):
                stats[BAD_DRAFT] = i + 1


@kernel
def _weights_ahead(x, m, sp, scratch, w, bsum, ahead, ahead2):
    """Processed weights of a valid row (as :func:`fastspec._kernels.process.processed_weights`, total
    returned) while reading ahead ``ahead = (rows, r0, r1, mx)`` and ``ahead2 = (rows2, s0, s1, mx2)``:
    rows[r0:r1] and rows2[s0:s1], their maxima into mx[r0:r1] and mx2[s0:s1]."""
    rows, r0, r1, mx = ahead
    rows2, s0, s1, mx2 = ahead2
    inv_t, thr = row_cutoff(x, m, sp, scratch)
    return row_weights_ahead(x, m, inv_t, thr, w, bsum, rows[r0:r1], mx[r0:r1], rows2[s0:s1], mx2[s0:s1])


@kernel
def verify_row_logits(xt, xd, has_draft, check_all, toks, nd, sp, seed, out, stats, buf):
    """Verify one row from logits: xt [K+1, V], xd [K, V] (or [0, V] for a one-hot draft), toks [K] (valid ids),
    nd <= K drafts, sp = (temperature, top_k, top_p, min_p) of the row; writes out [K+1] (PAD beyond the emitted
    tokens) and stats [N_STATS].

    Every row is read for validation exactly once.  Only the first target row is read on its own: each target
    weight pass reads the position's draft row ahead, and the first target and draft weight passes read every
    other row ahead when the row's logits fit in READ_AHEAD_BYTES (else each pass reads the next position's row
    ahead), so the reading overlaps the exponentials (maxima kept in mt/md; target rows [0, t_known) and draft
    rows [0, d_known) are read).  Rows read but not used are judged by their maxima at the end, the rest by
    :func:`validate_rest`.  ``check_all`` False (``validate="visited"``): only the rows the decision uses are
    read (a position's draft row still during its target pass); the others are neither read nor judged."""
    V = xt.shape[1]
    wp, wq, zpb, zqb, bsum, tmp = split_buffer(buf, V, block_count(V))
    greedy = sp[0] == 0.0
    K1 = xt.shape[0]
    Kd = xd.shape[0]
    mt = np.empty(K1)
    md = np.empty(max(Kd, 1))
    t_known = 0
    d_known = 0
    every = (K1 * xt.itemsize + Kd * xd.itemsize) * V <= READ_AHEAD_BYTES  # read every row ahead
    t_ok = 0  # target rows [0, t_ok) used (validated)
    d_ok = 0  # draft rows [0, d_ok) used (validated)
    for i in range(nd + 1):
        x = xt[i]
        if i >= t_known:
            mt[i] = row_max(x)
            t_known = i + 1
        m = mt[i]
        if status(m) != ROW_OK:
            stats[BAD_VALUES] = TARGET_ROWS
            return
        t_ok = i + 1
        if greedy:
            amax = argmax_of(x, m)
            out[i] = amax
            if i < nd and toks[i] == amax:
                continue
            stats[ACCEPTED] = i
            break
        two = has_draft and i < nd
        d_next = i + 1 if two and d_known <= i else d_known  # this position's draft row (used next), if unread
        t_end = (K1 if every else min(i + 2, K1)) if check_all else t_known
        zp = _weights_ahead(x, m, sp, wq, wp, zpb, (xt, t_known, max(t_end, t_known), mt), (xd, d_known, d_next, md))
        t_known = max(t_end, t_known)
        d_known = d_next
        if i == nd:  # every draft accepted: bonus token from p_nd
            stats[ACCEPTED] = nd
            out[nd] = sample(wp, wp, 1.0, 0.0, NO_EXCLUDED, zpb, position_uniform(seed, nd, Stream.BONUS))
            break
        tok = toks[i]
        px = wp[tok] / zp
        zq = 1.0
        if two:
            if status(md[i]) != ROW_OK:
                stats[BAD_VALUES] = DRAFT_ROWS
                return
            d_ok = i + 1
            d_end = (Kd if every else min(i + 2, Kd)) if check_all else d_known
            zq = _weights_ahead(xd[i], md[i], sp, wq, wq, zqb, (xd, d_known, max(d_end, d_known), md), (xd, 0, 0, md))
            d_known = max(d_end, d_known)
        qx = wq[tok] / zq if two else 1.0  # one-hot draft: q(x) = 1
        if not qx > 0.0:
            stats[BAD_DRAFT] = i + 1
            return
        if position_uniform(seed, i, Stream.ACCEPT) * qx <= px:
            out[i] = tok
            continue
        stats[ACCEPTED] = i
        ur = position_uniform(seed, i, Stream.RESIDUAL)
        if two:
            a, b = 1.0 / zp, 1.0 / zq
            v = sample_weights(wp, wq, a, b, NO_EXCLUDED, bsum, tmp, ur)
        else:  # one-hot draft: p without the drafted token; only its block's sum changes
            bsum[:] = zpb
            jx = tok // BLOCK
            block_sums(wp, wp, 1.0, 0.0, tok, bsum, tmp, jx, jx + 1)
            v = sample(wp, wp, 1.0, 0.0, tok, bsum, ur)
        if v < 0:  # the residual underflowed to 0 (p ~= q): sample p
            stats[UNDERFLOWS] += 1
            v = sample(wp, wp, 1.0, 0.0, NO_EXCLUDED, zpb, ur)
        out[i] = v
        break
    if not check_all:
        return
    for r in range(t_ok, t_known):  # read ahead, not used: their maxima decide them
        if status(mt[r]) != ROW_OK:
            stats[BAD_VALUES] = TARGET_ROWS
            return
    validate_rest(xt, xd, has_draft, toks, nd, (t_known, d_ok, d_known), md, sp, wq, stats)


@kernel
def row_seed(seeds, derive, b):
    """Row b's seed: derived from the one seed of the batch (``derive``, :func:`fastspec.row_seeds`'s rule) or
    given per row."""
    return derive_row_seed(seeds[0], b) if derive else seeds[b]


@parallel_kernel
def verify_logits_rows(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats, buffers):
    """Rows in parallel: thread chunk c takes rows c, c + n, ... (n = len(buffers)) with work buffer
    buffers[c]; results do not depend on which thread runs a row.  Seeds: see :func:`row_seed`."""
    B = xt.shape[0]
    n = buffers.shape[0]
    for c in prange(n):
        for b in range(c, B, n):
            verify_row_logits(xt[b], xd[b], has_draft, check_all, toks[b], nd[b], row_params(params, b),
                              row_seed(seeds, derive, b), out[b], stats[b], buffers[c])


@kernel
def verify_logits_serial(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats, buffers):
    """The same, rows one after the other with buffers[0] (no parallel region: lowest latency for few rows)."""
    for b in range(xt.shape[0]):
        verify_row_logits(xt[b], xd[b], has_draft, check_all, toks[b], nd[b], row_params(params, b),
                          row_seed(seeds, derive, b), out[b], stats[b], buffers[0])


@kernel
def verify_one_row(xt, xd, has_draft, check_all, toks, sp, seed, buf):
    """The latency path of :func:`fastspec.verify_logits`: one row (B = 1), every draft used, scalar sampling
    parameters ``sp = (temperature, top_k, top_p, min_p)``, one integer seed (as int64 bits), whatever else
    unchecked but the token ids.  Allocates its outputs here, so one dispatch does the whole call.

    Returns (tokens int64 [1, K+1], summary int64 [4, 1] = accepted, emitted, underflows, num_draft, ok); ok is
    False for an id outside [0, V), a row with NaN/+inf/no finite logit or a draft with q = 0: the caller then
    takes the general path, which words the error.  Same tokens as :func:`verify_logits_serial` with the seed
    derived for row 0."""
    K = xt.shape[1] - 1
    V = xt.shape[2]
    out = np.full((1, K + 1), PAD, np.int64)
    summary = np.zeros((4, 1), np.int64)
    for i in range(K):
        if toks[0, i] < 0 or toks[0, i] >= V:
            return out, summary, False
    stats = np.zeros(N_STATS, np.int64)
    s = derive_row_seed(seed, 0)
    if has_draft:
        verify_row_logits(xt[0], xd[0], True, check_all, toks[0], K, sp, s, out[0], stats, buf)
    else:  # one-hot draft: an empty draft array, as the general path passes
        verify_row_logits(xt[0], xt[0, 0:0], False, check_all, toks[0], K, sp, s, out[0], stats, buf)
    summary[0, 0] = stats[ACCEPTED]
    summary[1, 0] = stats[ACCEPTED] + 1
    summary[2, 0] = stats[UNDERFLOWS]
    summary[3, 0] = K
    return out, summary, stats[BAD_DRAFT] == 0 and stats[BAD_VALUES] == 0


# --------------------------------------------------------------------------------------------- probabilities
@kernel
def verify_row_probs(pt, pd, has_draft, toks, nd, seed, out, stats, bsum, tmp):
    """Verify one row from validated probabilities pt [K+1, V], pd [K, V] (or [0, V] for one-hot drafts)."""
    for i in range(nd):
        p = pt[i]
        tok = toks[i]
        q = pd[i] if has_draft else p
        qx = q[tok] if has_draft else 1.0
        if position_uniform(seed, i, Stream.ACCEPT) * qx <= p[tok]:
            out[i] = tok
            continue
        stats[ACCEPTED] = i
        ur = position_uniform(seed, i, Stream.RESIDUAL)
        if has_draft:
            v = sample_weights(p, q, 1.0, 1.0, NO_EXCLUDED, bsum, tmp, ur)
        else:
            v = sample_weights(p, p, 1.0, 0.0, tok, bsum, tmp, ur)
        if v < 0:
            stats[UNDERFLOWS] += 1
            v = sample_weights(p, p, 1.0, 0.0, NO_EXCLUDED, bsum, tmp, ur)
        out[i] = v
        return
    stats[ACCEPTED] = nd
    p = pt[nd]
    out[nd] = sample_weights(p, p, 1.0, 0.0, NO_EXCLUDED, bsum, tmp, position_uniform(seed, nd, Stream.BONUS))


@parallel_kernel
def verify_probs_rows(pt, pd, has_draft, toks, nd, seeds, derive, out, stats):
    nb = block_count(pt.shape[2])
    for b in prange(pt.shape[0]):
        bsum = np.empty(nb)
        tmp = np.empty(BLOCK)
        verify_row_probs(pt[b], pd[b], has_draft, toks[b], nd[b], row_seed(seeds, derive, b), out[b], stats[b],
                         bsum, tmp)
