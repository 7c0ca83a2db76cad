"""What the draft-length policies need of a dense dump, in one pass: per position the acceptance alpha_t, the
draft's max probability, the exact per-threshold sums of the confidence stop, and (Monte-Carlo) pre-drawn joint
draws of (q of the drafted token, accepted).

Per position t with processed target p_t and draft q_t (:func:`fastspec.processing.probabilities`, the settings
of :func:`fastspec.acceptance.resolve_sampling`):

* ``alpha_t = sum_v min(p_t(v), q_t(v))`` (:func:`fastspec.acceptance.acceptance_rates`, the simulator's own);
* ``qmax_t = max_v q_t(v)``;
* for a threshold theta on the drafted token's probability: ``g_t = P(q_t(x) >= theta) = sum_{v: q_t(v) >= theta}
  q_t(v)`` and ``c_t = P(accepted and q_t(x) >= theta) = sum_{v: q_t(v) >= theta} min(p_t(v), q_t(v))``, exact
  sums over the vocabulary (x ~ q_t is accepted with probability min(1, p/q));
* Monte-Carlo: per (sequence, position) a generator keyed by (seed, sequence, position) draws, for each trial,
  x ~ q_t by inverse CDF and accepts it with probability min(1, p_t(x) / q_t(x)); it stores q_t(x) and the outcome.
  Each position is drafted at most once on the recorded trajectory, so one draw per (trial, position) replays
  the process; the keyed generator makes the draws independent of how the dump is chunked or sharded.

Greedy decoding (temperature 0): the draft proposes its argmax and verification compares argmaxes (alpha_t is 0
or 1); the confidence it reports is its softmax at temperature 1 (Hugging Face's greedy ``ConfidenceCriteria``
reads the unwarped scores), so ``q_t(x) = qmax_t`` of that softmax and the stop is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..acceptance import acceptance_rates
from ..errors import InvalidInput
from ..processing import probabilities

__all__ = ["PolicyFeatures", "policy_features", "MAX_DRAW_BYTES"]

#: the largest Monte-Carlo draw table (trials x positions x 9 bytes) the replay keeps in memory
MAX_DRAW_BYTES = 1 << 30
#: rows of logits per chunk of the pass
_CHUNK_BYTES = 8 << 20


@dataclass
class PolicyFeatures:
    """Per-position inputs of the policy replay for one draft (module docstring); arrays [N, T], 0 at padding."""

    draft: str
    lengths: np.ndarray
    alpha: np.ndarray
    qmax: np.ndarray
    g: dict = field(default_factory=dict)   # theta -> [N, T]
    c: dict = field(default_factory=dict)   # theta -> [N, T]
    qx: np.ndarray | None = None            # [N, trials, T] q of the drafted token
    acc: np.ndarray | None = None           # [N, trials, T] accepted
    trials: int = 0
    seed: int = 0
    greedy: bool = False


def _seed_words(seed: int) -> list[int]:
    s = int(seed) & ((1 << 64) - 1)
    return [s & 0xFFFFFFFF, s >> 32]


def draw(p_row, q_row, trials, seed, n, t, joint=True):
    """(q(x), accepted) for ``trials`` draws x ~ q at one position (generator keyed by seed, n, t).  ``joint=False``
    is a deliberately broken variant (the acceptance coin is drawn for an independent second token) used by the
    tests to show the Monte-Carlo check can fail."""
    rng = np.random.default_rng(_seed_words(seed) + [int(n), int(t), 0x706F6C])
    cdf = np.cumsum(q_row)
    total = cdf[-1]
    u = rng.random(trials)
    x = np.minimum(np.searchsorted(cdf, u * total, side="right"), len(q_row) - 1)
    qx = q_row[x]
    if not joint:
        x = np.minimum(np.searchsorted(cdf, rng.random(trials) * total, side="right"), len(q_row) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(q_row[x] > 0, np.minimum(1.0, p_row[x] / q_row[x]), 0.0)
    return qx, rng.random(trials) < ratio


def policy_features(d, draft: str, sp, *, thetas=(), trials: int = 0, seed: int = 0, progress=None,
                    joint: bool = True) -> PolicyFeatures:
    """One pass over the dense dump ``d`` for ``draft`` under sampling ``sp`` (module docstring).  ``thetas``: the
    thresholds of on=token stops to sum exactly; ``trials`` > 0: keep that many Monte-Carlo draws per position."""
    N, T = d.N, d.T
    lengths = d.lengths.astype(np.int64)
    if trials:
        need = N * T * trials * 9
        if need > MAX_DRAW_BYTES:
            raise InvalidInput(f"trials = {trials}: the Monte-Carlo draws of {N} sequences x {T} positions would "
                               f"take {need / 2**30:.1f} GiB (at most {MAX_DRAW_BYTES / 2**30:.0f} GiB); use fewer "
                               "trials or fewer sequences")
    thetas = sorted(set(float(x) for x in thetas))
    f = PolicyFeatures(draft, lengths, np.zeros((N, T)), np.zeros((N, T)),
                       {th: np.zeros((N, T)) for th in thetas}, {th: np.zeros((N, T)) for th in thetas},
                       trials=trials, seed=seed, greedy=sp.greedy)
    if trials:
        f.qx = np.zeros((N, trials, T))
        f.acc = np.zeros((N, trials, T), np.bool_)
    settings = sp.as_dict()
    for ch in d.iter_chunks(drafts=(draft,), max_bytes=_CHUNK_BYTES):
        rows = np.flatnonzero(np.asarray(ch.valid)) + ch.start
        if rows.size:
            sel = rows - ch.start
            tl = np.asarray(ch.target)[sel]
            dl = np.asarray(ch.drafts[draft])[sel]
            alpha = acceptance_rates(tl, dl, **settings)
            if sp.greedy:
                p = probabilities(tl, **settings)
                q = probabilities(dl, **settings)
                qc = probabilities(dl, temperature=1.0)
            else:
                p = probabilities(tl, **settings)
                q = qc = probabilities(dl, **settings)
            qmax = qc.max(axis=1)
            ns, ts = rows // T, rows % T
            f.alpha[ns, ts] = alpha
            f.qmax[ns, ts] = qmax
            if thetas:
                mn = np.minimum(p, q)
                for th in thetas:
                    if sp.greedy:
                        gt = (qmax >= th).astype(np.float64)
                        f.g[th][ns, ts] = gt
                        f.c[th][ns, ts] = alpha * gt
                    else:
                        m = q >= th
                        f.g[th][ns, ts] = np.where(m, q, 0.0).sum(axis=1)
                        f.c[th][ns, ts] = np.where(m, mn, 0.0).sum(axis=1)
            if trials:
                for i, (n, t) in enumerate(zip(ns, ts, strict=True)):
                    if sp.greedy:
                        f.qx[n, :, t] = qmax[i]
                        f.acc[n, :, t] = alpha[i] > 0.5
                    else:
                        f.qx[n, :, t], f.acc[n, :, t] = draw(p[i], q[i], trials, seed, n, t, joint)
        if progress is not None:
            progress(ch.stop - ch.start)
    return f
