"""Step times at batch size B from a version-2 cost table (:mod:`fastspec.costs`): the batch cost model.

A speculative step of a batch of B sequences, each with k drafts, costs

    step(B, k) = drafting(B, k) + target(B, k + 1) + overhead(B, k)

* ``target(B, n)``: ``target.batch_forward_s[B][n]``, one forward over B sequences with n new tokens each;
* ``drafting(B, k)`` for a model draft: k draft forwards at batch B over one token each, the first of them over two
  tokens when *any* sequence of the batch accepted every draft of the previous step (a padded batch forward; with
  the share ``a`` of steps that accept every draft, independent across sequences, that is probability
  ``1 - (1 - a)^B``; the (B, 2) entry is used when the table has it, else (B, 1)) -- at B = 1 exactly
  :class:`fastspec.costs.LoopCost`'s ``draft(1 + a) + (k - 1) draft(1)``;
  for a one-call draft (the n-gram lookup): the one call ``drafts[name].batch_forward_s[B]["1"]``;
* ``overhead(B, k)``: ``batch_overhead_s[B][k]``;
* a plain decoding step of the batch: ``target(B, 1) + overhead(B, 0)``.

At B = 1 a batch-axis entry takes precedence over the version-1 entry, which serves otherwise.  **Missing
entries** are named as (B, n) pairs (:class:`MissingBatchEntries`, an :class:`~fastspec.errors.InvalidInput`).
**Extrapolation** only when asked (``extrapolate=True``): an entry (B, n) the table lacks is read off the straight
line through the two measured batch sizes nearest to B that have that n (interpolation between them when B lies
inside the measured range), never below the nearest measured value when B lies above the range nor above it when
below (a forward does not get cheaper with more sequences), at least 1e-9 s; its standard error is the larger of
the two points'.  Every such entry is listed in :attr:`BatchCost.extrapolated` so that the output can say so.
"""
from __future__ import annotations

import math

import numpy as np

from .costs import MAX_BATCH_SIZE, SECONDS_RANGE, CostTable
from .errors import InvalidInput, InvalidType

__all__ = ["BatchCost", "MissingBatchEntries", "check_batch_size", "parse_batch_list", "MAX_BATCH_SIZE"]


class MissingBatchEntries(InvalidInput):
    """A batch step needs entries the table lacks; ``missing`` lists them as (field, B, n)."""

    def __init__(self, message: str, missing: list):
        super().__init__(message)
        self.missing = missing


def check_batch_size(b, name: str = "batch") -> int:
    """``b`` as an int in [1, :data:`MAX_BATCH_SIZE`], else InvalidInput / InvalidType naming ``name``."""
    if isinstance(b, np.integer) and not isinstance(b, np.bool_):
        b = int(b)
    if isinstance(b, bool) or not isinstance(b, int):
        raise InvalidType(f"{name} must be an integer in [1, {MAX_BATCH_SIZE}], got {type(b).__name__} {b!r}")
    if not 1 <= b <= MAX_BATCH_SIZE:
        raise InvalidInput(f"{name} = {b} is outside [1, {MAX_BATCH_SIZE}] (sequences decoded together)")
    return b


def parse_batch_list(spec, name: str = "batch") -> list[int]:
    """``8`` / ``"1,2,4,8"`` / ``[1, 2, 4]`` -> the sorted unique batch sizes, each in [1, MAX_BATCH_SIZE]."""
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",")]
        if not spec.strip() or any(not p for p in parts):
            raise InvalidInput(f"{name} {spec!r} is not a list of batch sizes; write e.g. 1,2,4,8")
        out = []
        for i, p in enumerate(parts):
            if not (p.isascii() and p.lstrip("+-").isdigit()) or len(p) > 12:
                raise InvalidInput(f"{name} {spec!r}: item {i} {p!r} is not an integer; write e.g. 1,2,4,8")
            out.append(check_batch_size(int(p), f"{name} item {i}"))
    elif isinstance(spec, (list, tuple)):
        out = [check_batch_size(b, f"{name}[{i}]") for i, b in enumerate(spec)]
    else:
        out = [check_batch_size(spec, name)]
    if not out:
        raise InvalidInput(f"{name} is empty; give at least one batch size, e.g. 1,2,4,8")
    return sorted(set(out))


def _fmt_pairs(pairs) -> str:
    return ", ".join(f"({b}, {n})" for b, n in sorted(set(pairs)))


class BatchCost:
    """Step times of a batch of ``batch`` sequences (module docstring); ``draft`` names the table's draft entry
    (None: plain decoding only)."""

    def __init__(self, table: CostTable, batch: int, draft: str | None = None, *, extrapolate: bool = False):
        if not isinstance(table, CostTable):
            raise InvalidType(f"table must be a fastspec.costs.CostTable, got {type(table).__name__}")
        self.table = table
        self.batch = check_batch_size(batch)
        if draft is not None and draft not in table.draft_forward_s:
            raise InvalidInput(f"cost table has no draft named {draft!r}; it has "
                               f"{', '.join(table.draft_forward_s) or 'none'}")
        self.draft = draft
        self.extrapolate = bool(extrapolate)
        #: entries read off the batch axis by extrapolation: [(field, B, n)]
        self.extrapolated: list[tuple[str, int, int]] = []
        self._missing: list[tuple[str, int, int]] = []

    # -- the three axes: {B: {n: s}} with the version-1 entries as B = 1 -------------------------------------------
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

    # -- the cost model ----------------------------------------------------------------------------------------------
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

    def plain_step_s(self) -> float:
        """Seconds of one plain decoding step of the batch (B tokens): target(B, 1) + overhead(B, 0)."""
        total = sum(s for s, _ in self._plain_parts())
        self._check()
        return total

    def step_s(self, k: int, p_all_accepted: float = 0.0) -> float:
        """Expected seconds of one speculative step of the batch with k drafts per sequence."""
        total = sum(s * w for s, _, w in self._step_parts(k, p_all_accepted))
        self._check()
        return total

    def relative_se(self, k: int, p_all_accepted: float = 0.0) -> float:
        """Relative standard error of step(B, k) / plain(B) (independent entries, delta method)."""
        step = self._step_parts(k, p_all_accepted)
        plain = self._plain_parts()
        self._check()
        s_step = sum(s * w for s, _, w in step)
        s_plain = sum(s for s, _ in plain)
        var_step = sum((e * w) ** 2 for _, e, w in step)
        var_plain = sum(e ** 2 for _, e in plain)
        return math.sqrt(var_step / s_step ** 2 + var_plain / s_plain ** 2)

    def missing(self, ks=(), *, plain: bool = True) -> list[tuple[str, int, int]]:
        """The entries (field, B, n) a plain step and steps with each k of ``ks`` need and cannot get (field: the
        JSON name, e.g. ``target.batch_forward_s``; the optional (B, 2) catch-up entry of a draft is not listed)."""
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
