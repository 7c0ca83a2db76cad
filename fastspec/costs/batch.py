"""Where speculation stops paying as the batch grows: :func:`break_even`, the one rule for predicted and measured
speed-ups alike (``fastspec simulate --batch`` and the vLLM batch benchmark).

The rule and its assumptions: docs/design/cost-model.md.
"""
from __future__ import annotations

import math
from typing import Sequence

__all__ = ["break_even"]


def break_even(points: Sequence[tuple]) -> dict:
    """Where speculation stops paying, from [(B, speed-up)] sorted by B: ``pays_up_to`` (the largest B before
    the first B whose speed-up is not above 1), ``stops_at`` (that B) and ``estimate`` (speed-up 1 interpolated
    linearly in log B and log speed-up between them); ``status`` "pays at every batch", "never pays", "stops
    paying" or "not monotone" (the speed-up crosses 1 more than once, or does not pay at the smallest B)."""
    pays = [s > 1.0 for _, s in points]
    out = {"pays_up_to": None, "stops_at": None, "estimate": None}
    if all(pays):
        return {**out, "status": "pays at every batch", "pays_up_to": points[-1][0]}
    if not any(pays):
        return {**out, "status": "never pays"}
    if not pays[0] or sum(a != b for a, b in zip(pays[:-1], pays[1:], strict=True)) > 1:
        return {**out, "status": "not monotone"}
    i = pays.index(False)
    (b1, s1), (b2, s2) = points[i - 1], points[i]
    t = math.log(s1) / (math.log(s1) - math.log(s2))  # log-linear crossing of speed-up 1
    est = math.exp(math.log(b1) + t * (math.log(b2) - math.log(b1)))
    return {**out, "status": "stops paying", "pays_up_to": b1, "stops_at": b2, "estimate": est}
