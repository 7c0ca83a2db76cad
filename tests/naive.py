"""Slow, obvious NumPy references for fastspec's kernels (sorts, cumsums, loops)."""
from __future__ import annotations

import math

import numpy as np


def probabilities_row(x, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """Processed distribution of one logits row: temperature, top-k, top-p, min-p (full sort)."""
    x = np.asarray(x, dtype=np.float64)
    V = x.shape[0]
    if temperature == 0:
        out = np.zeros(V)
        out[int(np.argmax(x))] = 1.0
        return out
    m = x.max()
    w = np.exp((x - m) / temperature)
    thr = -np.inf
    if 0 < top_k < V:
        thr = np.sort(x)[::-1][top_k - 1]
    if top_p < 1:
        keep = x >= thr
        ws = np.where(keep, w, 0.0)
        order = np.argsort(-ws, kind="stable")
        cs = np.cumsum(ws[order])
        hit = np.flatnonzero(cs >= top_p * ws.sum())
        j = hit[0] if hit.size else V - 1
        c = ws[order][j]
        if not hit.size:
            c = ws[keep].min()
        thr = max(thr, x[keep & (w >= c)].min())
    if min_p > 0:
        thr = max(thr, m + temperature * math.log(min_p))
    ws = np.where(x >= thr, w, 0.0)
    return ws / ws.sum()


def probabilities(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    logits = np.asarray(logits, dtype=np.float64)
    V = logits.shape[-1]
    x2 = logits.reshape(-1, V)
    R = x2.shape[0]
    bc = lambda a: np.broadcast_to(np.asarray(a).reshape(-1) if np.ndim(a) else a, (R,))  # noqa: E731
    t, k, p, mp = bc(temperature), bc(top_k), bc(top_p), bc(min_p)
    out = np.stack([probabilities_row(x2[r], t[r], int(k[r]), p[r], mp[r]) for r in range(R)])
    return out.reshape(logits.shape)


def residual(p, q):
    """Residual distribution normalize(max(p - q, 0)); None when it is all zero."""
    r = np.maximum(np.asarray(p, float) - np.asarray(q, float), 0.0)
    s = r.sum()
    return None if s == 0 else r / s


def verify_with_uniforms(p, q, draft, u_accept, u_sample):
    """Token-level speculative verification of one row with given uniforms.

    p: [K+1, V] target probabilities, q: [K, V] draft probabilities (or None for
    one-hot drafts), draft: [K] ints, u_accept: [K] uniforms in (0, 1], u_sample: one
    uniform in (0, 1] for the recovered/bonus token. Returns the emitted token list.
    Sampling is inverse CDF: the first index whose cumulative weight >= u * total.
    """
    p = np.asarray(p, float)
    K = len(draft)
    out = []
    for i in range(K):
        x = int(draft[i])
        qx = 1.0 if q is None else q[i, x]
        if u_accept[i] * qx <= p[i, x]:
            out.append(x)
            continue
        if q is None:
            qi = np.zeros(p.shape[1])
            qi[x] = 1.0
        else:
            qi = q[i]
        r = np.maximum(p[i] - qi, 0.0)
        if r.sum() == 0:
            r = p[i]
        out.append(sample_inverse_cdf(r, u_sample))
        return out
    out.append(sample_inverse_cdf(p[K], u_sample))
    return out


def sample_inverse_cdf(w, u):
    w = np.asarray(w, float)
    c = np.cumsum(w)
    hit = np.flatnonzero(c >= u * c[-1])
    j = int(hit[0]) if hit.size else int(np.flatnonzero(w > 0)[-1])
    while w[j] == 0:
        j -= 1
    return j


# --------------------------------------------------------------------------- shared test helpers


def dist_from_weights(w):
    """Exact distribution (tuple of Fractions) proportional to integer weights ``w``."""
    from fractions import Fraction

    total = sum(w)
    return tuple(Fraction(x, total) for x in w)


def random_model(seed, vocab, zero_prob=0.3):
    """A context-dependent distribution prefix -> p over ``vocab`` tokens, with exact zeros sometimes."""
    import random

    cache = {}

    def model(prefix):
        if prefix not in cache:
            r = random.Random(f"{seed}:{prefix}")
            w = [0 if r.random() < zero_prob else r.randint(1, 9) for _ in range(vocab)]
            if sum(w) == 0:
                w[r.randrange(vocab)] = 1
            cache[prefix] = dist_from_weights(w)
        return cache[prefix]

    return model


def _outcomes(x):
    """A mapping outcome -> value: a dict as given, an array as {flat index: value}."""
    return x if isinstance(x, dict) else dict(enumerate(np.asarray(x, float).ravel()))


def chi2_statistic(counts, expected):
    """(statistic, degrees of freedom) of Pearson's chi-square of observed counts against exact probabilities.

    ``counts`` and ``expected`` map outcomes to observed counts and exact probabilities (dicts, or arrays indexed
    by outcome); outcomes of probability 0 are left out of the statistic, and one that was observed fails an
    assertion outright."""
    counts, expected = _outcomes(counts), _outcomes(expected)
    keys = sorted(set(counts) | set(expected))
    for key in keys:
        if expected.get(key, 0) == 0:
            assert counts.get(key, 0) == 0, f"emitted {key}, which has probability 0"
    keys = [key for key in keys if expected.get(key, 0) > 0]
    n = sum(counts.values())
    c = np.array([counts.get(key, 0) for key in keys], float)
    e = np.array([float(expected[key]) for key in keys]) * n
    return ((c - e) ** 2 / e).sum(), len(keys) - 1


def chi2_pooled(counts, expected_p, n: int) -> tuple[float, int]:
    """(statistic, degrees of freedom) of Pearson's chi-square over the cells of array ``counts`` whose expected
    count ``expected_p * n`` is >= 5, the other cells of nonzero probability pooled into one (for joint laws with
    many rare outcomes, e.g. two tokens of a real model); a zero-probability cell that was observed fails."""
    counts, exp = np.asarray(counts).ravel(), np.asarray(expected_p, float).ravel() * n
    assert counts[exp == 0].sum() == 0, "a zero-probability outcome was produced"
    big = exp >= 5
    small = (~big) & (exp > 0)
    obs = list(counts[big]) + ([counts[small].sum()] if small.any() else [])
    ex = list(exp[big]) + ([exp[small].sum()] if small.any() else [])
    obs, ex = np.asarray(obs, float), np.asarray(ex, float)
    return float(((obs - ex) ** 2 / ex).sum()), len(obs) - 1


def chi2_fits(counts, expected, n_tests, false_alarm=1e-6):
    """Calibrated goodness of fit (:func:`chi2_statistic`): False with probability < false_alarm / n_tests for
    a correct sampler (Bonferroni over the n_tests tests of a file)."""
    from scipy import stats

    s, df = chi2_statistic(counts, expected)
    return s <= stats.chi2.isf(false_alarm / n_tests, df)


# --------------------------------------------------------------------------- n-gram (prompt lookup) proposer


def ngram_proposal(context, k, min_n, max_n, occurrence="latest"):
    """Prompt lookup spelled out: for n = max_n down to min_n, list every start s of an earlier occurrence of the
    last n tokens (s + n <= len - 1: a token follows it, the suffix itself excluded, overlap allowed); the first
    n with any wins, then the latest (or earliest) s; its next k tokens (fewer at the end of the context)."""
    ctx = [int(t) for t in context]
    L = len(ctx)
    for n in range(max_n, min_n - 1, -1):
        starts = [s for s in range(L - n) if ctx[s:s + n] == ctx[L - n:]]
        if starts:
            s = max(starts) if occurrence == "latest" else min(starts)
            return ctx[s + n:s + n + k]
    return []
