"""Argmax drafts: the draft proposes its top-1 token and the verifier judges it with a one-hot q (vLLM V1).

A draft model that proposes ``x_t = argmax q_t`` (the lowest id among ties) is a deterministic proposal: q is
one-hot on x_t, so the token is accepted with probability ``p_t(x_t)`` (the processed target probability), not
``sum_v min(p_t, q_t)``; a rejection resamples from the residual, which is p_t with x_t removed, renormalized, so
the output still follows p exactly.  It is :func:`fastspec.candidate_acceptance`'s ``"deterministic"`` sampling
at one candidate (w candidates: the top-w draft tokens as point masses, acceptance the target mass of that set),
and this module computes it with that function.  The argmax is taken on the draft's logits (temperature and the
top-k / top-p / min-p filters keep it); at temperature 0 both models are one-hot and argmax drafts are exactly
greedy drafts.

Sparse top-k dumps record the draft's top entries, so its argmax is known (the list's highest log-probability,
the lowest id among ties; when every listed entry ties and the list does not cover the vocabulary, an unlisted
token could tie with a lower id: then [0, 1]).  ``p_t(x_t)`` is known when x_t is in the target's list; otherwise
it lies in [0, min(smallest listed target probability, unlisted mass)]: true bounds, which the trajectory DP keeps
(it is monotone in every per-position acceptance).  A dump without ``vocab_size`` (every ``dump-server`` output)
gives the same bounds with the lists taken as not covering the vocabulary: still true bounds (a list that does
cover it has no unlisted mass, so the cap is ~0 anyway).
"""
from __future__ import annotations

import numpy as np

from ..acceptance import DraftAcceptance

__all__ = ["argmax_acceptance", "argmax_bounds"]


def argmax_acceptance(d, name: str, sp, acc: DraftAcceptance) -> DraftAcceptance:
    """Per-position acceptance of ``name``'s argmax drafts over dump ``d`` under the SamplingParams ``sp``:
    exact ``alpha`` (dense; sparse analysed at temperature 0, where ``acc``, the sampled draft's acceptance, is
    already exact and equal) or sparse bounds.  ``acc``: the sampled draft's :class:`DraftAcceptance` (its
    ``valid`` mask, and the greedy case)."""
    valid = acc.valid
    if d.kind != "dense":
        if sp.greedy:  # both one-hot: the sampled draft's greedy acceptance [top_p == top_q] is the same thing
            return DraftAcceptance(name, valid, lower=acc.lower, upper=acc.upper)
        lo, hi = np.zeros((d.N, d.T)), np.zeros((d.N, d.T))
        for ch in d.iter_chunks(drafts=(name,)):
            rows = slice(ch.start, ch.stop)
            v = np.asarray(ch.valid, dtype=bool)
            a, b = argmax_bounds(ch.target[0], ch.target[1], ch.drafts[name][0], ch.drafts[name][1], d.V)
            lo.reshape(-1)[rows] = np.where(v, a, 0.0)
            hi.reshape(-1)[rows] = np.where(v, b, 0.0)
        return DraftAcceptance(name, valid, lower=lo, upper=hi)
    from ..candidates import candidate_acceptance
    from ..processing import probabilities

    alpha = np.zeros((d.N, d.T))
    flat = alpha.reshape(-1)
    kw = sp.as_dict()
    for ch in d.iter_chunks(drafts=(name,)):
        rows = ch.start + np.flatnonzero(np.asarray(ch.valid, dtype=bool))
        for s in range(0, rows.size, 256):
            r = rows[s:s + 256]
            x, y = ch.target[r - ch.start], ch.drafts[name][r - ch.start]
            p = probabilities(x, **kw)
            flat[r] = candidate_acceptance(p, probabilities(y, **kw), 1, candidate_sampling="deterministic",
                                           draft_logits=np.asarray(y, dtype=np.float64))
    return DraftAcceptance(name, valid, alpha=alpha)


def argmax_bounds(target_ids, target_logprobs, draft_ids, draft_logprobs, vocab_size: int | None):
    """(lower, upper) [R] of ``p(argmax q)`` from sparse top-k rows (the module docstring's rules);
    ``vocab_size`` None (not recorded): a list is never taken to cover the vocabulary."""
    ti = np.asarray(target_ids, dtype=np.int64)
    tp = np.exp(np.asarray(target_logprobs, dtype=np.float64))
    di = np.asarray(draft_ids, dtype=np.int64)
    dl = np.asarray(draft_logprobs, dtype=np.float64)
    top = dl.max(axis=1, keepdims=True)
    big = np.iinfo(np.int64).max
    x = np.where(dl == top, di, big).min(axis=1)  # the draft's argmax: lowest id among its ties
    def partial(width: int) -> bool:  # the list may leave tokens out
        return vocab_size is None or width < vocab_size

    ambiguous = (dl.min(axis=1) == top[:, 0]) & partial(di.shape[1])
    hit = ti == x[:, None]
    listed = hit.any(axis=1)
    p_listed = np.where(hit, tp, 0.0).sum(axis=1)
    unlisted = np.clip(1.0 - tp.sum(axis=1), 0.0, 1.0)
    cap = np.minimum(tp.min(axis=1), unlisted) if partial(ti.shape[1]) else np.zeros(ti.shape[0])
    lower = np.where(listed, p_listed, 0.0)
    upper = np.where(listed, p_listed, cap)
    lower = np.where(ambiguous, 0.0, lower)
    upper = np.where(ambiguous, 1.0, upper)
    return np.minimum(lower, 1.0), np.minimum(upper, 1.0)
