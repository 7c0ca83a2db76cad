"""Block verification as a rule of the step enumerator (:func:`~fastspec.exact.walk.walk_step`).

Block verification (Sun, Mendlovic, Leviathan, Aharoni, Ro, Beirami, Suresh; arXiv 2403.10444) judges the
whole block of drafts jointly.  With p_i, q_i the target and draft distributions at drafted position i
(context: prefix and the drafts x_<i), w_0 = 1 and

    w_i = min(w_{i-1} p_i(x_i) / q_i(x_i), 1),
    Z_{i+1} = sum_x max(w_i p_{i+1}(x) - q_{i+1}(x), 0),   h_i = Z_{i+1} / (Z_{i+1} + 1 - w_i)   (i < k),
    h_k = w_k,

eta_i ~ Bernoulli(h_i) independently and tau = max{i : eta_i = 1} (0 if none): a later success rescues the
earlier drafts.  tau < k emits Y ~ max(w_tau p_{tau+1} - q_{tau+1}, 0) / Z_{tau+1}; tau = k a bonus token from
p_{k+1}.  It is not a per-position rule (tau depends on later positions): the rule walks every drafted path
and decides at its end.  The public entry is :func:`~fastspec.exact.block_distribution` with ``method="block"``.
"""
from __future__ import annotations

from fractions import Fraction

from .core import ONE, ZERO, Dist, check_count, normalized
from .walk import Accept, Emit, Model, models, walk_step

__all__ = ["block_acceptance_weights"]

#: the rule's state at the root: (w_0, (h_1..h_{i-1}), (the normalized residual at tau = j, for j < i))
START = (ONE, (), ())


def _h(z: Fraction, w: Fraction) -> Fraction:
    den = z + 1 - w
    return ONE if den == 0 else z / den


def rule(p: Dist, q: Dist | None, depth: int, state: tuple):
    """Block verification at a node ``depth`` drafts deep; ``state`` = (w_depth, hs, residuals)."""
    w, hs, residuals = state
    if q is None:  # all k = depth drafts are drawn: decide tau
        hs = hs + (w,) if depth > 0 else hs
        # P(tau = j) = h_j prod_{l > j} (1 - h_l), h indexed 1..k; tau = 0 when every eta is 0
        tail = ONE
        for j in range(depth, -1, -1):
            pj = tail * (hs[j - 1] if j > 0 else ONE)
            if j > 0:
                tail *= 1 - hs[j - 1]
            if pj == 0:
                continue
            dist = p if j == depth else residuals[j]
            if dist is None:
                raise AssertionError("block verification reached a zero residual: a bug in fastspec.exact")
            yield Emit(pj, dist, j)
        return
    res = tuple(max(w * a - b, ZERO) for a, b in zip(p, q, strict=True))
    if depth > 0:
        hs = hs + (_h(sum(res, ZERO), w),)
    residuals = residuals + (normalized(res),)
    for x, qx in enumerate(q):
        if qx:
            yield Accept(x, qx, (min(w * p[x] / qx, ONE), hs, residuals))


def block_acceptance_weights(target: Model, draft: Model, k: int, *, prefix: tuple = ()) -> Dist:
    """(E[w_1], ..., E[w_k]) of block verification: E[w_i] = P(at least i drafts accepted)."""
    k = check_count(k, "k")
    t, d = models(target, draft)
    mean_w = [ZERO] * (k + 1)

    def visit(depth: int, prob: Fraction, state: tuple):
        mean_w[depth] += prob * state[0]

    walk_step(t, d, k, rule, tuple(prefix), start=START, visit=visit)
    return tuple(mean_w[1:])
