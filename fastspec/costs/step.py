"""One step-cost object, :class:`StepCost`: the seconds of a verify step, and of a plain step, from a cost table.

Every figure fastspec prices in seconds goes through it (the table: :mod:`fastspec.costs.table`):

* **batch 1, the real loop** (``batch=None``: the table's version-1 entries)::

      step(k) = draft(1 + a) + (k - 1) draft(1) + target(k + 1) + overhead(k),    plain = target(1) + overhead(0)

  ``draft(1 + a)``: the first draft forward, over two tokens with probability a (the previous step accepted every
  draft; ``drafts[name].forward_s["2"]`` when given, else the one-token time); a one-call draft (the n-gram
  lookup) costs its one call instead of every draft forward;
* **w candidates per depth** (trees, :meth:`StepCost.tree_step_s`): ``k draft(1) + target(k w + 1) +
  overhead(k)`` (a one-call draft: its call);
* **batch B** (``batch=B``: the version-2 batch axis; at B = 1 the version-1 entries serve where the axis lacks an
  entry)::

      step(B, k) = target(B, k + 1) + overhead(B, k) + drafting(B, k),     plain(B) = target(B, 1) + overhead(B, 0)

  drafting: k draft forwards at B over one token, the first over two when *any* sequence accepted every draft
  (probability ``1 - (1 - a)^B``, when the table has the (B, 2) entry), or the one call of a one-call draft;
  an n-gram step whose lookups each found nothing with probability f is a plain step after the call with
  probability f^B (:meth:`StepCost.ngram_step_s`).  Missing entries are named as (field, B, n)
  (:class:`MissingBatchEntries`); extrapolation only when asked (``extrapolate=True``: linear in B through the two
  nearest measured batch sizes, never below the nearest measured value above the range nor above it below,
  at least 1e-9 s, standard error the larger of the two), every such entry listed in :attr:`StepCost.extrapolated`;
* **n-gram proposers without a model**: the one call, and a lookup that found nothing is a plain step after it
  (:meth:`StepCost.no_proposal_step_s`);
* **vLLM's schedule** (:meth:`StepCost.scheduled_step_s`): a step with ``n_active`` sequences in flight and
  ``tokens`` new tokens in all costs target(B, n) at n = tokens / n_active, linear in n and in B between the
  table's entries (the end value beyond them), plus overhead(B, k) (overhead(B, 0) when nobody drafted).

Speed-up = tokens per step x plain / step.  Each case keeps its own order of floating-point operations, so the
figures are the same to the last bit as before the cost modules were merged.  The model, its assumptions and the
delta-method standard errors: docs/design/cost-model.md; the table: docs/reference/cost-tables.md.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from ..errors import InvalidInput, InvalidType
from .table import SECONDS_RANGE, CostTable, check_batch_size

__all__ = ["StepCost", "MissingBatchEntries", "missing_error", "field_name"]


class MissingBatchEntries(InvalidInput):
    """A batch step needs entries the table lacks; ``missing`` lists them as (field, B, n)."""

    def __init__(self, message: str, missing: list):
        super().__init__(message)
        self.missing = missing


def _fmt_pairs(pairs) -> str:
    return ", ".join(f"({b}, {n})" for b, n in sorted(set(pairs)))


def _at(table: dict, n: int, what: str) -> float:
    if n not in table:
        raise InvalidInput(f"cost table has no {what} for {'k' if what == 'overhead' else 'n'} = {n}; it covers "
                           f"{', '.join(map(str, sorted(table)))}")
    return table[n]


def _interp(xs: Sequence[int], x: float, f) -> float:
    """f linear in x between the sorted points ``xs`` (the end value beyond them)."""
    if x <= xs[0]:
        return f(xs[0])
    if x >= xs[-1]:
        return f(xs[-1])
    hi = next(v for v in xs if v >= x)
    lo = max(v for v in xs if v <= x)
    if hi == lo:
        return f(lo)
    w = (x - lo) / (hi - lo)
    return (1 - w) * f(lo) + w * f(hi)


class StepCost:
    """Seconds of one step of speculative decoding with ``draft`` (the table's entry; None: plain decoding only)
    from ``table`` (a :class:`~fastspec.costs.table.CostTable`), at batch 1 from the version-1 entries
    (``batch=None``, the real loop) or at batch size ``batch`` from the batch axis (module docstring)."""

    def __init__(self, table: CostTable, draft: str | None = None, *, batch: int | None = None,
                 extrapolate: bool = False):
        if not isinstance(table, CostTable):
            raise InvalidType(f"table must be a fastspec.costs.CostTable, got {type(table).__name__}")
        self.table = table
        self.batch = None if batch is None else check_batch_size(batch)
        if draft is not None and draft not in table.draft_forward_s:
            raise InvalidInput(f"cost table has no draft named {draft!r}; it has "
                               f"{', '.join(table.draft_forward_s) or 'none'}")
        self.draft = draft
        self.extrapolate = bool(extrapolate)
        #: entries read off the batch axis by extrapolation: [(what, B, n)]
        self.extrapolated: list[tuple[str, int, int]] = []
        self._missing: list[tuple[str, int, int]] = []

    # -- batch 1: the real loop, the version-1 entries ----------------------------------------------------------------
    def _loop_step_s(self, k: int, p_all_accepted: float) -> float:
        t = self.table
        drafting = 0.0
        if self.draft is not None:
            d = t.draft_forward_s[self.draft]
            d1 = _at(d, 1, f"{self.draft!r} forward")
            if self.draft in t.one_call:
                drafting = d1  # one call proposes every draft of the step
            else:
                drafting = p_all_accepted * d.get(2, d1) + (1.0 - p_all_accepted) * d1 + (k - 1) * d1
        return drafting + _at(t.target_forward_s, k + 1, "target forward") + _at(t.overhead_s, k, "overhead")

    def _loop_relative_se(self, k: int, p_all_accepted: float) -> float:
        t = self.table
        var_draft = 0.0
        if self.draft is not None:
            dse = t.draft_forward_se.get(self.draft, {})
            s1 = dse.get(1, 0.0)
            if self.draft in t.one_call:
                var_draft = s1 ** 2
            else:
                var_draft = ((p_all_accepted * dse.get(2, s1)) ** 2 + ((1 - p_all_accepted) * s1) ** 2
                             + ((k - 1) * s1) ** 2)
        var_step = var_draft + t.target_forward_se.get(k + 1, 0.0) ** 2 + t.overhead_se.get(k, 0.0) ** 2
        var_plain = t.target_forward_se.get(1, 0.0) ** 2 + t.overhead_se.get(0, 0.0) ** 2
        step, plain = self.step_s(k, p_all_accepted), self.plain_step_s()
        return math.sqrt(var_step / step ** 2 + var_plain / plain ** 2)

    # -- batch B: the batch axis, the version-1 entries as B = 1 --------------------------------------------------
    def _axis(self, what: str):
        t = self.table
        if what == "target":
            return t.target_batch_s, t.target_batch_se, t.target_forward_s, t.target_forward_se
        if what == "overhead":
            return t.overhead_batch_s, t.overhead_batch_se, t.overhead_s, t.overhead_se
        return (t.draft_batch_s.get(self.draft, {}), t.draft_batch_se.get(self.draft, {}),
                t.draft_forward_s[self.draft], t.draft_forward_se.get(self.draft, {}))

    def _column(self, what: str, n: int) -> dict:
        """{B: (seconds, se)} of every batch size that has entry n."""
        axis, axis_se, v1, v1_se = self._axis(what)
        out = {b: (row[n], axis_se.get(b, {}).get(n, 0.0)) for b, row in axis.items() if n in row}
        if 1 not in out and n in v1:
            out[1] = (v1[n], v1_se.get(n, 0.0))
        return out

    def entry(self, what: str, n: int) -> tuple[float, float] | None:
        """(seconds, standard error) of ``what`` ("target", "draft", "overhead") at (this batch, n); None when the
        table lacks it (and extrapolation is off or impossible: fewer than two measured batch sizes with n)."""
        if self.batch is None:
            raise InvalidInput("StepCost.entry reads the batch axis: give batch= (batch 1 from the version-1 "
                               "entries is the table itself)")
        col = self._column(what, n)
        b = self.batch
        if b in col:
            return col[b]
        if not self.extrapolate or len(col) < 2:
            return None
        bs = sorted(col)
        below, above = [x for x in bs if x < b], [x for x in bs if x > b]
        if below and above:
            p, q = below[-1], above[0]
        elif above:  # below the measured range
            p, q = above[0], above[1]
        else:
            p, q = below[-2], below[-1]
        (sp, ep), (sq, eq) = col[p], col[q]
        v = sp + (sq - sp) * (b - p) / (q - p)
        if not below:
            v = min(v, col[bs[0]][0])
        elif not above:
            v = max(v, col[bs[-1]][0])
        v = min(max(v, SECONDS_RANGE[0]), SECONDS_RANGE[1])
        self.extrapolated.append((what, b, n))
        return v, max(ep, eq)

    def _get(self, what: str, n: int) -> tuple[float, float]:
        got = self.entry(what, n)
        if got is None:
            self._missing.append((field_name(what, self.draft), self.batch, n))
            return math.nan, 0.0
        return got

    def _plain_parts(self):
        return [self._get("target", 1), self._get("overhead", 0)]

    def _step_parts(self, k: int, p_all_accepted: float):
        """[(seconds, se, weight)] of step(B, k)'s terms."""
        parts = [(*self._get("target", k + 1), 1.0), (*self._get("overhead", k), 1.0)]
        if self.draft is None:
            return parts
        if self.draft in self.table.one_call:
            return parts + [(*self._get("draft", 1), 1.0)]
        d1 = self._get("draft", 1)
        two = self.entry("draft", 2) if p_all_accepted > 0 else None
        q = 1.0 - (1.0 - min(max(p_all_accepted, 0.0), 1.0)) ** self.batch  # some sequence needs the catch-up
        if two is None:
            return parts + [(*d1, float(k))]
        return parts + [(*two, q), (*d1, (1.0 - q) + (k - 1))]

    def _check(self) -> None:
        if self._missing:
            missing, self._missing = self._missing, []
            raise missing_error(self.table, missing)

    # -- the step ----------------------------------------------------------------------------------------------------
    def plain_step_s(self) -> float:
        """Seconds of one plain decoding step (one token per sequence): target(1) + overhead(0), at B:
        target(B, 1) + overhead(B, 0)."""
        if self.batch is None:
            return self.table.plain_step_s()
        total = sum(s for s, _ in self._plain_parts())
        self._check()
        return total

    def step_s(self, k: int, p_all_accepted: float = 0.0) -> float:
        """Expected seconds of one verify step with k drafts (per sequence); ``p_all_accepted``: the share of steps
        that accepted every draft (the next step's first draft forward catches up on two tokens)."""
        if self.batch is None:
            return self._loop_step_s(k, p_all_accepted)
        total = sum(s * w for s, _, w in self._step_parts(k, p_all_accepted))
        self._check()
        return total

    def speedup(self, tokens_per_step: float, k: int, p_all_accepted: float = 0.0) -> float:
        """Tokens per second of speculative decoding relative to plain decoding: tokens per step x plain / step."""
        return tokens_per_step * self.plain_step_s() / self.step_s(k, p_all_accepted)

    def relative_se(self, k: int, p_all_accepted: float = 0.0) -> float:
        """Relative standard error of step(k) / plain from the table's standard errors (independent entries, delta
        method); 0 when the table gives none."""
        if self.batch is None:
            return self._loop_relative_se(k, p_all_accepted)
        step = self._step_parts(k, p_all_accepted)
        plain = self._plain_parts()
        self._check()
        s_step = sum(s * w for s, _, w in step)
        s_plain = sum(s for s, _ in plain)
        var_step = sum((e * w) ** 2 for _, e, w in step)
        var_plain = sum(e ** 2 for _, e in plain)
        return math.sqrt(var_step / s_step ** 2 + var_plain / s_plain ** 2)

    def tree_step_s(self, k: int, candidates: int) -> float:
        """Seconds of a batch-1 step with ``candidates`` candidates per depth: k draft forwards (a one-call draft:
        its call), one target forward over k w + 1 positions, overhead(k); InvalidInput when the table lacks
        target(k w + 1) or overhead(k)."""
        if self.batch is not None:
            raise InvalidInput("candidates per depth are priced at batch 1 only (batch=None)")
        t = self.table
        drafting = 0.0
        if self.draft is not None:
            d1 = t.draft_forward_s[self.draft][1]
            drafting = d1 if self.draft in t.one_call else k * d1
        n = k * candidates + 1
        return drafting + _at(t.target_forward_s, n, "target forward") + _at(t.overhead_s, k, "overhead")

    def no_proposal_step_s(self) -> float:
        """Seconds of a step whose proposer's one call found nothing: the call, then a plain step."""
        if self.batch is None:
            return self.plain_step_s() + self.table.draft_forward_s[self.draft][1]
        return self.plain_step_s() + self.entry("draft", 1)[0]

    def ngram_step_s(self, k: int, no_proposal_share: float, p_all_accepted: float = 0.0) -> float:
        """Expected seconds of a step of a one-call proposer at this batch size when each sequence's lookup finds
        nothing with probability f = ``no_proposal_share`` (independent across the B sequences): a plain step after
        the call with probability f^B (:meth:`no_proposal_step_s`), else a full k-draft step (a padded batch forward
        over k + 1 tokens per sequence, whatever each proposed)."""
        step = self.step_s(k, p_all_accepted)
        if no_proposal_share > 0:
            none = no_proposal_share ** (self.batch or 1)
            step = none * self.no_proposal_step_s() + (1.0 - none) * step
        return step

    @staticmethod
    def scheduled_step_s(table: CostTable | Mapping, n_active: int, tokens: int, k: int) -> float:
        """Seconds of one engine step with ``n_active`` sequences in flight and ``tokens`` new tokens in all
        (vLLM's schedule, module docstring): ``target(B, n)`` at n = tokens / n_active, linear in n between the
        table's integer n and in B between its batch sizes (the end value beyond the range), plus the overhead at B
        for k drafts when any sequence drafted (else for 0).  ``table``: a :class:`CostTable` or a JSON mapping
        holding at least ``target.batch_forward_s`` and ``batch_overhead_s``."""
        if isinstance(table, CostTable):
            fwd, ovh = table.target_batch_s, table.overhead_batch_s
        else:
            fwd = {int(b): {int(n): float(s) for n, s in row.items()}
                   for b, row in table["target"]["batch_forward_s"].items()}
            ovh = {int(b): {int(j): float(s) for j, s in row.items()} for b, row in table["batch_overhead_s"].items()}
        bs = sorted(fwd)
        n = tokens / n_active
        key = k if tokens > n_active else 0

        def at_b(b):
            ns = sorted(fwd[b])
            return _interp(ns, n, lambda m: fwd[b][m]) + ovh[b][key]
        return _interp(bs, n_active, at_b)

    def missing(self, ks=(), *, plain: bool = True) -> list[tuple[str, int, int]]:
        """The entries (field, B, n) a plain step and steps with each k of ``ks`` need and cannot get (field: the
        JSON name, e.g. ``target.batch_forward_s``; the optional (B, 2) catch-up entry of a draft is not listed)."""
        if self.batch is None:
            raise InvalidInput("StepCost.missing lists the batch axis's entries: give batch= (at batch 1 from the "
                               "version-1 entries: CostTable.missing)")
        if plain:
            self._plain_parts()
        for k in ks:
            self._step_parts(k, 0.5)
        out, self._missing = sorted(set(self._missing)), []
        return out


_FIELD = {"target": "target.batch_forward_s", "overhead": "batch_overhead_s"}


def field_name(what: str, draft: str | None) -> str:
    return _FIELD.get(what) or f"drafts[{draft!r}].batch_forward_s"


def missing_error(table: CostTable, missing) -> MissingBatchEntries:
    """One InvalidInput naming every missing entry ``(field, B, n)`` by field and (B, n) (or (B, k) for the
    overhead)."""
    by_field: dict[str, list] = {}
    for f, b, n in sorted(set(missing)):
        by_field.setdefault(f, []).append((b, n))
    parts = [f"{f} at (B, {'k' if f == 'batch_overhead_s' else 'n'}) = {_fmt_pairs(p)}" for f, p in by_field.items()]
    bs = sorted({b for _, b, _ in missing})
    v1 = " (a version-1 table covers batch 1 only)" if not table.has_batch_axis else ""
    return MissingBatchEntries(
        f"the cost table lacks {'; '.join(parts)}{v1}; it covers batch sizes "
        f"{', '.join(map(str, table.batch_sizes))}: measure B = {','.join(map(str, bs))} with `fastspec cost "
        "--batch`, or ask for extrapolation (--batch-extrapolate)", sorted(set(missing)))
