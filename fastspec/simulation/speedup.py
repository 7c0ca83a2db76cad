"""Speed-up from the simulator's tokens per verify step: the pricing of a step, its interval, the best choice.

Two ways to price a step, one interface (:class:`Pricing`):

* **measured seconds** (:class:`TablePricing`): a :class:`fastspec.costs.CostTable` recorded in the dump by
  ``fastspec dump``, written by ``fastspec cost`` or by hand (``--costs FILE``).  The cost model is the real
  loop's (:class:`fastspec.costs.StepCost` at batch 1): speed-up = tokens per step x plain step time / step(k).
* **relative units** (:class:`FlagPricing`): ``--draft-cost c`` / ``--verify-cost`` (one target forward = 1,
  :class:`fastspec.costs.CostModel`), speed-up = tokens per step / (k c + verify(k)).  Flags override a recorded
  table.

Interval.  The speed-up S = m x plain / step(k) has two independent sources of uncertainty: the mean acceptance
length m over the recorded sequences (a ratio of totals with the sequences as clusters,
:func:`fastspec.stats.ratio_ci`) and the measured times (the table's standard errors, delta method).  They are
combined on the log scale, where a ratio's relative errors add: ``h = sqrt((h_m / m)^2 + (1.96 r_c)^2)`` with r_c
the relative standard error of step(k) / plain, and the interval is ``[S exp(-h), S exp(h)]`` -- always positive,
never below zero however large the standard errors (to first order the same as ``S (1 +- h)``).  Monte-Carlo
error is not included: the exact expectation replaces the estimate.  Explained in docs/design/cost-model.md.
"""
from __future__ import annotations

import math

import numpy as np

from ..costs.step import StepCost
from ..costs.table import CostTable
from ..errors import InvalidInput
from ..stats import Z95, ratio_ci

__all__ = ["Pricing", "FlagPricing", "TablePricing", "over_sequences", "speedup_interval", "best_row",
           "best_per_draft", "best_overall", "verdict", "Z95"]


class Pricing:
    """How one simulation prices a verify step (module docstring)."""

    source = "none"  # "flags", "dump" or "file"

    def covers(self, draft: str) -> bool:  # noqa: ARG002 (one interface for both pricings)
        return True

    def speedup(self, draft: str, m: float, k: int, p_all_accepted: float = 0.0) -> float | None:
        raise NotImplementedError

    def tree_speedup(self, draft: str, m: float, k: int, w: int) -> float | None:
        """w candidates per depth: k draft forwards, one target forward over k w + 1 positions."""
        raise NotImplementedError

    def ngram_costs(self, draft: str, k: int) -> tuple[np.ndarray, float] | None:
        """(cost of a step proposing j = 0..k tokens -- j = 0: the lookup found nothing, a plain step after the
        proposer's call --, cost of a plain decoding step) for a proposer without a model; None if not priced."""
        raise NotImplementedError

    def relative_se(self, draft: str, k: int, p_all_accepted: float = 0.0) -> float:  # noqa: ARG002 (one interface for both pricings)
        return 0.0

    def describe(self) -> dict:
        raise NotImplementedError


class FlagPricing(Pricing):
    """Relative costs from ``draft_cost`` / ``verify_cost`` (a :class:`fastspec.simulation.CostModel`)."""

    source = "flags"

    def __init__(self, model):
        self.model = model

    def speedup(self, draft, m, k, p_all_accepted=0.0):  # noqa: ARG002 (one interface for both pricings)
        return self.model.speedup(m, k)

    def tree_speedup(self, draft, m, k, w):  # noqa: ARG002 (one interface for both pricings)
        try:
            return m / self.model.tree_step_cost(k, w)
        except InvalidInput:  # a verify-cost table without k*w
            return None

    def ngram_costs(self, draft, k):  # noqa: ARG002 (one interface for both pricings)
        try:  # one proposer call per step
            return np.array(self.model.ngram_step_costs(k)), 1.0
        except InvalidInput:
            return None

    def describe(self):
        return {"source": "flags", "draft_cost": self.model.draft_cost, "verify_cost": self.model.verify.describe()}


class TablePricing(Pricing):
    """Measured seconds from a :class:`fastspec.costs.CostTable` (``source``: "dump" or "file")."""

    def __init__(self, table: CostTable, source: str):
        self.table = table
        self.source = source

    def key(self, draft: str) -> str | None:
        """The table's entry for ``draft``: its own name; for an n-gram draft ("ngram1-3") also the entry "ngram"
        or any one-call entry whose name starts with "ngram"; None when the table has none."""
        t = self.table
        if draft in t.draft_forward_s:
            return draft
        if draft.startswith("ngram"):
            if "ngram" in t.draft_forward_s:
                return "ngram"
            for name in t.draft_forward_s:
                if name.startswith("ngram") and name in t.one_call:
                    return name
        return None

    def covers(self, draft):
        return self.key(draft) is not None

    def _loop(self, draft):
        key = self.key(draft)
        return StepCost(self.table, key) if key is not None else None

    def speedup(self, draft, m, k, p_all_accepted=0.0):
        loop = self._loop(draft)
        if loop is None:
            return None
        try:
            return loop.speedup(m, k, p_all_accepted)
        except InvalidInput:  # the table does not reach k + 1 target positions
            return None

    def tree_speedup(self, draft, m, k, w):
        loop = self._loop(draft)
        if loop is None:
            return None
        try:
            return m * self.table.plain_step_s() / loop.tree_step_s(k, w)
        except InvalidInput:  # the table lacks target(k w + 1) or overhead(k)
            return None

    def missing(self, draft: str, k: int, w: int = 1, ngram: bool = False) -> list[str]:
        """The table's entries a (draft, k, w candidates) row needs and lacks (JSON paths; empty when priced)."""
        key = self.key(draft)
        if key is None:
            return []
        return self.table.missing(key, k, target_n=k * w + 1 if w > 1 else None, every_j=ngram)

    def relative_se(self, draft, k, p_all_accepted=0.0):
        loop = self._loop(draft)
        if loop is None:
            return 0.0
        try:
            return loop.relative_se(k, p_all_accepted)
        except InvalidInput:
            return 0.0

    def ngram_costs(self, draft, k):
        loop = self._loop(draft)
        if loop is None:
            return None
        try:
            # j = 0: the lookup found nothing, the proposer's call then a plain step
            cost = np.array([loop.no_proposal_step_s() if j == 0 else loop.step_s(j) for j in range(k + 1)])
        except InvalidInput:  # the table does not reach k + 1 target positions
            return None
        return cost, loop.plain_step_s()

    def describe(self):
        return {"source": self.source, **self.table.info, "plain_step_s": self.table.plain_step_s()}


def over_sequences(stats) -> tuple[float, float, float]:
    """(m, se, ci95 half-width) of the mean acceptance length with the recorded sequences as clusters, from a
    :class:`fastspec.analysis.SpecStats` (tokens per sequence = accepted + steps)."""
    steps = stats.per_sequence_steps
    return ratio_ci(stats.per_sequence_accepted + steps, steps)


def speedup_interval(s: float | None, m: float, m_half: float, cost_rel_se: float) -> tuple[float, float] | None:
    """The 95% interval of a speed-up ``s`` predicted from mean acceptance length ``m`` (half-width ``m_half``
    over sequences) and step costs with relative standard error ``cost_rel_se`` (module docstring)."""
    if s is None or not (m > 0) or not math.isfinite(m_half):
        return None
    rel = math.hypot(m_half / m, Z95 * cost_rel_se)
    try:
        lo, hi = s * math.exp(-rel), s * math.exp(rel)
    except OverflowError:  # standard errors so large that the interval has no upper end
        return None
    return (float(lo), float(hi)) if math.isfinite(hi) else None


def best_row(rows):
    """The row with the highest predicted speed-up (sparse dumps: the lower bound, the conservative choice); ties:
    the smaller k, then fewer candidates, then the first.  None when no row is priced."""
    best, key = None, None
    for r in rows:
        s = r.speedup if r.speedup is not None else r.speedup_lower
        if s is None:
            continue
        cand = (s, -r.k, -r.candidates)
        if key is None or cand > key:
            best, key = r, cand
    return best


def best_per_draft(results, names, pricing) -> dict:
    """{draft: the k of its best row (:func:`best_row`) among its token-verification rows with one candidate (all
    its rows when it has none)}; None: not priced."""
    best = {}
    for name in names:
        rows = [r for r in results if r.draft == name]
        row = best_row([r for r in rows if r.verify == "token" and r.candidates == 1] or rows)
        best[name] = None if pricing is None or row is None else row.k
    return best


def best_overall(results) -> dict | None:
    """The (draft, k, variant) of :func:`best_row` over every row, as the JSON ``best_overall`` object; None when no
    row is priced."""
    best = best_row(results)
    if best is None:
        return None
    exact = best.speedup is not None
    return {"draft": best.draft, "k": best.k, "verify": best.verify, "candidates": best.candidates,
            "speedup": best.speedup if exact else None,
            "speedup_lower": None if exact else best.speedup_lower,
            "speedup_upper": None if exact else best.speedup_upper,
            "speedup_ci95": list(best.speedup_ci95) if best.speedup_ci95 is not None else None}


def verdict(best: dict | None, pricing: Pricing | None) -> str:
    """One plain sentence: what the best draft buys, with the interval's verdict."""
    if pricing is None:
        return ("speed-up not computed: the dump records no costs; measure them with `fastspec cost`, or give "
                "--costs FILE or --draft-cost/--verify-cost")
    if best is None:
        return "speed-up not computed: the cost table covers none of the simulated drafts at these k"
    where = "on the recorded machine" if pricing.source in ("dump", "file") else "under the given relative costs"
    variant = ""
    if best["verify"] != "token":
        variant = f", {best['verify']} verification"
    elif best["candidates"] > 1:
        variant = f", {best['candidates']} candidates"
    ci = best.get("speedup_ci95")
    if best["speedup"] is not None:
        s = best["speedup"]
        lo, hi = ci if ci is not None else (s, s)
        shown = f"{s:.2f}x" + (f" (95% interval {lo:.2f}-{hi:.2f})" if ci is not None else "")
    else:
        lo, hi = best["speedup_lower"], best["speedup_upper"]
        shown = f"{lo:.2f}x-{hi:.2f}x (bounds from a sparse dump"
        shown += f"; 95% interval {ci[0]:.2f}-{ci[1]:.2f})" if ci is not None else ")"
        lo, hi = ci if ci is not None else (lo, hi)
    if lo > 1.0:
        what = "faster than plain decoding"
    elif hi < 1.0:
        what = "slower than plain decoding"
    else:
        what = "not distinguishable from plain decoding"
    return f"best: {best['draft']} at k = {best['k']}{variant}, {shown} -- {what} {where}"
