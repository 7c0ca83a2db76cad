"""Test-only views into the verification kernels: the distributions they sample from at one position.

They call the very primitives the kernels call (row max, cutoff, stored weights, residual weights with their
block sums), so a test can compare the kernel's acceptance probability and recovered distribution with the
exact Fraction path without sampling.
"""
from __future__ import annotations

import numpy as np

from fastspec._kernels.process import row_cutoff
from fastspec._kernels.rows import row_max
from fastspec._kernels.codes import NO_EXCLUDED
from fastspec._kernels.sample import block_count, block_sums, residual_weight, row_weights
from fastspec.config import BLOCK
from fastspec.processing import kernel_view, validate_logits


def _residual(P, Q, a, b, excl):
    """(w [V], total) of the sampler's weights w(v) = max(fma(P, a, -Q b), 0) without excl, as the kernel sums them."""
    V = P.shape[0]
    bsum = np.empty(block_count(V))
    block_sums(P, Q, a, b, excl, bsum, np.empty(BLOCK), 0, bsum.shape[0])
    w = np.array([residual_weight(P, Q, a, b, excl, v) for v in range(V)])
    return w, float(sum(bsum))


def verification_distributions(p, q, token):
    """For one position with target probs p [V] and draft probs q [V] (or None for a one-hot draft on
    ``token``): (acceptance probability of ``token``, the distribution the recovered token is sampled from on
    rejection or None if never rejected, whether the residual underflowed)."""
    p = np.ascontiguousarray(p, dtype=np.float64)
    qx = 1.0 if q is None else float(q[token])
    acc = min(1.0, float(p[token]) / qx)
    if q is None:
        w, total = _residual(p, p, 1.0, 0.0, token)
    else:
        w, total = _residual(p, np.ascontiguousarray(q, dtype=np.float64), 1.0, 1.0, NO_EXCLUDED)
    if acc >= 1.0:
        return acc, None, False
    if total == 0.0:
        return acc, p / p.sum(), True
    return acc, w / total, False


def _weights(x, temperature, top_k, top_p, min_p):
    xk = kernel_view(np.ascontiguousarray(x))
    m = row_max(xk)
    inv_t, thr = row_cutoff(xk, m, (float(temperature), int(top_k), float(top_p), float(min_p)), np.empty(len(x)))
    w = np.empty(len(x))
    z = row_weights(xk, m, inv_t, thr, w, np.empty(block_count(len(x))))
    return w, z


def verification_distributions_logits(target_row, draft_row, token, *, temperature=1.0, top_k=0, top_p=1.0,
                                      min_p=0.0):
    """The processed p(x), q(x) and the recovered distribution the logits kernel samples from on rejection at
    one position (q one-hot when draft_row is None); temperature > 0."""
    x = validate_logits("target_row", target_row, ndim=1)
    kw = (temperature, top_k, top_p, min_p)
    wp, zp = _weights(x, *kw)
    px = wp[token] / zp
    if draft_row is None:
        w, total = _residual(wp, wp, 1.0, 0.0, token)
        qx = 1.0
    else:
        y = validate_logits("draft_row", draft_row, ndim=1)
        wq, zq = _weights(y, *kw)
        qx = wq[token] / zq
        w, total = _residual(wp, wq, 1.0 / zp, 1.0 / zq, NO_EXCLUDED)
    return px, qx, (None if total == 0.0 else w / total)
