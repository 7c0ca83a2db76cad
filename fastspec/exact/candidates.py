"""Multi-candidate verification of one position: ``w`` candidates judged by recursive rejection sampling.

Starting from r = p, candidate x_s (drawn from the proposal g_s) is accepted with probability
min(1, r(x_s) / g_s(x_s)); on rejection r <- normalize(max(r - g_s, 0)); if every candidate is rejected, a
token is sampled from r.  Proposals (``candidate_sampling``, the names of :data:`fastspec.methods.CANDIDATE_SAMPLING`):

* "iid": g_s = q for every s (SpecInfer's multi-step speculative sampling);
* "without_replacement": g_s = q with x_1..x_{s-1} removed and renormalized (recursive speculative decoding);
  fewer than w candidates are drawn when q's support runs out;
* "deterministic": given candidate ids (default: the top-w of q, lowest id on ties), each a point mass.

Each step outputs r exactly whatever g_s is, as long as x_s really is drawn from g_s; so the output is p.
Trees of candidates (``widths[i]`` per node at depth i + 1) are enumerated by
:func:`~fastspec.exact.block_distribution` with ``method="candidates"``.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterator, Sequence

from ..errors import InvalidInput, InvalidType
from ..methods import CANDIDATE_SAMPLING as _REGISTRY
from ..methods import check_candidate_sampling
from .core import ONE, ZERO, ComparedWithTarget, Dist, check_count, normalized, pair, residual, total_variation
from .walk import Accept, Emit, position_law

__all__ = ["CANDIDATE_SAMPLING", "top_candidates", "CandidateStep", "candidate_step"]

#: The candidate-sampling names (from the registry :data:`fastspec.methods.CANDIDATE_SAMPLING`).
CANDIDATE_SAMPLING = tuple(_REGISTRY)


def check_widths(widths) -> tuple:
    """``widths`` as a tuple of ints >= 1 (candidates per node, one per depth)."""
    if isinstance(widths, (numbers.Integral, str)):
        raise InvalidType(f"widths must be a sequence (w_1, ..., w_k) of candidates per depth, got {widths!r}; "
                          "e.g. widths=(2, 1)")
    ws = tuple(widths)
    for i, v in enumerate(ws):
        check_count(v, f"widths[{i}]", 1, f" (candidates at depth {i + 1})")
    return tuple(int(v) for v in ws)


def top_candidates(q: Sequence[Fraction], w: int) -> tuple:
    """The ``w`` most likely ids of ``q`` (lowest id on ties); fewer if q has fewer than w positive entries."""
    order = sorted((i for i in range(len(q)) if q[i] > 0), key=lambda i: (-q[i], i))
    return tuple(order[:w])


def candidate_outcomes(p: Dist, q: Dist, w: int, candidate_sampling: str, candidates: tuple | None = None) -> Iterator:
    """Recursive rejection over the ``w`` candidates of one position.

    Yields :class:`~fastspec.exact.walk.Accept` ``(x, probability, s)`` for candidate x accepted at step s
    (1-based) and :class:`~fastspec.exact.walk.Emit` ``(probability, r)`` when every candidate was rejected.
    ``candidates`` (deterministic proposals): the point masses, default the top-w of ``q``.
    """
    V = len(p)
    if candidate_sampling == "deterministic" and candidates is None:
        candidates = top_candidates(q, w)

    def proposal(s: int, used: tuple):
        if candidate_sampling == "iid":
            return q
        if candidate_sampling == "deterministic":
            if s >= len(candidates):
                return None
            return tuple(ONE if v == candidates[s] else ZERO for v in range(V))
        mass = ONE - sum((q[v] for v in used), ZERO)
        if mass == 0:
            return None
        return tuple(ZERO if v in used else q[v] / mass for v in range(V))

    def rec(s: int, r: Dist, used: tuple, prob: Fraction):
        g = proposal(s, used) if s < w else None
        if g is None:
            yield Emit(prob, r)
            return
        r_next = normalized(residual(r, g))
        for x, gx in enumerate(g):
            if not gx:
                continue
            a = min(ONE, r[x] / gx)
            if a:
                yield Accept(x, prob * gx * a, s + 1)
            if a != 1:
                yield from rec(s + 1, r_next, used + (x,), prob * gx * (1 - a))

    return rec(0, p, (), ONE)


@dataclass(frozen=True)
class CandidateStep(ComparedWithTarget):
    """Exact anatomy of verifying ``w`` candidates at one position (all Fractions).

    ``accepted_at[s]``: probability that candidate s+1 is the accepted one; ``acceptance``: probability that
    some candidate is accepted; ``output``: the emitted token's distribution (equals ``p`` for every proposal
    scheme).
    """

    p: Dist
    q: Dist
    w: int
    candidate_sampling: str
    candidates: tuple | None
    accepted_at: Dist
    acceptance: Fraction
    output: Dist
    total_variation: Fraction


def candidate_step(p, q, w: int, *, candidate_sampling: str = "iid", candidates=None,
                   normalize: bool = False) -> CandidateStep:
    """Exact recursive rejection sampling of ``w`` candidates at one position (see the module docstring).

    ``candidates`` (only with ``candidate_sampling="deterministic"``): the candidate ids, distinct, at most ``w``;
    default the top-w of ``q``.
    """
    p, q = pair(p, q, normalize)
    w = check_count(w, "w", 1, " (candidates per position)")
    check_candidate_sampling(candidate_sampling)
    if candidates is not None:
        if candidate_sampling != "deterministic":
            raise InvalidInput("candidates are given only with candidate_sampling='deterministic' (point-mass "
                               "proposals); drop candidates or set candidate_sampling='deterministic' "
                               f"(candidate_sampling is {candidate_sampling!r})")
        candidates = tuple(check_count(c, f"candidates[{i}]") for i, c in enumerate(candidates))
        for i, c in enumerate(candidates):
            if c >= len(p) or c in candidates[:i]:
                raise InvalidInput(f"candidates[{i}] = {c}: candidates {candidates} must be distinct ids "
                                   f"in [0, {len(p)})")
        w = min(w, len(candidates))
    elif candidate_sampling == "deterministic":
        candidates = top_candidates(q, w)
    out, accepted = position_law(candidate_outcomes(p, q, w, candidate_sampling, candidates), len(p))
    at = tuple(accepted.get(s, ZERO) for s in range(1, w + 1))
    return CandidateStep(p, q, w, candidate_sampling, candidates, at, sum(at, ZERO), out, total_variation(out, p))
