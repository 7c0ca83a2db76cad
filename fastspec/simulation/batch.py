"""Speculative decoding at batch size B: throughput, speed-up, best k and break-even batch sizes.

:func:`batch_predictions` turns a :class:`~fastspec.simulation.SimulationResult` (tokens per verify step per draft
and k, with their intervals over prompts) and a version-2 :class:`~fastspec.costs.CostTable` (step times at batch
size B, :class:`fastspec.costs.StepCost`) into predictions per batch size.  Explained in
docs/design/cost-model.md.

**The model.**  A step of a batch of B sequences with k drafts each costs
``step(B, k) = drafting(B, k) + target(B, k + 1) + overhead(B, k)`` seconds (:class:`fastspec.costs.StepCost`: k draft
forwards at batch B over one token, or one n-gram lookup call for the batch; one target forward over B (k + 1)
tokens; the per-step overhead at B); a plain step of the batch costs ``plain(B) = target(B, 1) + overhead(B, 0)``
and makes one token per sequence.

* **Continuous batching** (vLLM-style; what is reported): every sequence advances by its own accepted count each
  step and a finished sequence is replaced at once, so the batch stays at B and the aggregate throughput is
  ``B E[tokens per step] / step(B, k)`` tokens/s -- the *mean* acceptance length m matters (per sequence:
  ``m / step(B, k)``); plain decoding gives ``B / plain(B)``; the speed-up is ``m plain(B) / step(B, k)``.  Its
  95% interval combines the interval of m over the prompts and the table's standard errors at B, as at batch 1
  (:func:`fastspec.simulation.speedup.speedup_interval`).
* **Synchronous static batch** (optional, ``static``): B sequences start together and the batch ends when its
  slowest sequence does, so the time is ``E[max_i steps_i] step(B, k)`` -- the *expected maximum* over the batch
  of the number of steps matters.  It is computed when per-sequence figures are given (``per_sequence`` or rows
  carrying ``per_sequence_tokens`` / ``per_sequence_steps``): the B sequences are drawn with replacement from the
  recorded ones, each at its expected number of steps, and E[max] is exact over that draw (order statistics);
  the randomness of a sequence's own step count is left out, which makes E[max] too small (max is convex), so the
  static speed-up reported is optimistic.  Static speed-up = E[max tokens_i] plain(B) / (E[max steps_i]
  step(B, k)) (plain decoding needs one step per token); a ratio of expectations.

**Break-even.**  Per (draft, k), over the batch sizes asked for (sorted): the largest B up to which the predicted
speed-up (point estimate) stays above 1 and the first B where it does not, with the crossing interpolated
linearly in log B and log speed-up between them; "pays at every batch measured" / "never pays" when so; a
speed-up that crosses 1 more than once is listed as such.

**Assumptions** (:data:`BATCH_ASSUMPTIONS`): the same k for every sequence and step; acceptance does not depend
on the batch (it is the batch-1 simulation's); every cost at the table's one context length (KV caches do not grow
along the generation); no prefill of new requests interferes with decoding steps (continuous batching); the batch
is always full (B sequences in flight); an n-gram step earns the tokens per target forward of its replay (steps
whose lookup found nothing count as steps) and costs the lookup call plus a plain step of the batch with
probability f^B (f: the replay's share of forwards without a proposal, independent across sequences), else a full
k-draft step (a padded batch forward over k + 1 tokens per sequence, whatever each proposed: at B = 1 a step that
proposed j < k tokens is priced at k, so the figure is below the batch-1 simulation's); a sparse dump's rows use
their lower bound.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..costs.batch import break_even
from ..costs.step import MissingBatchEntries, StepCost, field_name, missing_error
from ..costs.table import CostTable, parse_batch_list
from ..errors import InvalidInput, InvalidType
from .results import SimulationResult
from .speedup import TablePricing, speedup_interval

__all__ = ["batch_predictions", "BatchPrediction", "BatchRow", "BATCH_ASSUMPTIONS", "expected_max",
           "MissingBatchEntries", "check_batch_table"]

BATCH_ASSUMPTIONS = [
    "continuous batching: each sequence advances by its own accepted count; aggregate tokens/s = B x mean tokens "
    "per step / step(B, k), step(B, k) = k draft(B, 1) (n-gram: one lookup call) + target(B, k + 1) + "
    "overhead(B, k); plain = B / (target(B, 1) + overhead(B, 0))",
    "the same k for every sequence and step; acceptance independent of the batch size (the batch-1 simulation's)",
    "costs at the table's one context length; no prefill interference; the batch is always full (B in flight)",
    "an n-gram step: the lookup call, then a plain step of the batch when no sequence's lookup found anything "
    "(probability f^B, f the replay's share of forwards without a proposal, independent across sequences), else a "
    "full k-draft step (a padded batch forward over k + 1 tokens per sequence, whatever each proposed); tokens per "
    "step = the replay's tokens per target forward",
    "break-even: judged on the point estimate of the speed-up over the batch sizes given; the crossing is "
    "interpolated in log B and log speed-up",
]
STATIC_ASSUMPTION = ("static synchronous batch: time = E[max over the batch of steps] x step(B, k), B sequences "
                     "drawn with replacement from the recorded ones, each at its expected step count (its own "
                     "randomness left out: E[max] too small, the static speed-up optimistic)")


def expected_max(values, b: int) -> float:
    """E[max of ``b`` draws with replacement from ``values``] exactly: sum_j x_(j) ((j/N)^b - ((j-1)/N)^b)."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = len(x)
    if n == 0:
        raise InvalidInput("expected_max needs at least one value")
    j = np.arange(1, n + 1, dtype=np.float64)
    w = (j / n) ** b - ((j - 1) / n) ** b
    return float(np.dot(x, w))


@dataclass
class BatchRow:
    """One (draft, k) at one batch size."""

    draft: str
    k: int
    batch: int
    tokens_per_step: float
    step_s: float
    tokens_per_s: float
    tokens_per_s_per_sequence: float
    speedup: float
    speedup_ci95: tuple[float, float] | None
    static_speedup: float | None = None
    static_tokens_per_s: float | None = None
    bound: str | None = None  # "lower" for a sparse dump's row

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["speedup_ci95"] = list(self.speedup_ci95) if self.speedup_ci95 is not None else None
        return d


@dataclass
class BatchPrediction:
    """What :func:`batch_predictions` computed; ``as_dict()`` is the ``batch`` object of ``simulate --json``."""

    batches: list[int]
    plain: list[dict]
    rows: list[BatchRow]
    best: dict  # {B: {draft: k}}
    best_overall: dict  # {B: {"draft", "k", "speedup"} or None}
    break_even: list[dict]
    extrapolated: list[str] = field(default_factory=list)
    static: bool = False
    assumptions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"model": "continuous batching" + (" (and static synchronous batch)" if self.static else ""),
                "batches": self.batches, "plain": self.plain, "rows": [r.as_dict() for r in self.rows],
                "best": {str(b): v for b, v in self.best.items()},
                "best_overall": {str(b): v for b, v in self.best_overall.items()},
                "break_even": self.break_even, "extrapolated": self.extrapolated, "static": self.static,
                "assumptions": self.assumptions, "warnings": self.warnings}


def _rows_of(result):
    """[(draft, k, m, half, p_all, kind, row)] of the token-verification, one-candidate rows that have a tokens per
    step figure."""
    out = []
    for r in result.results:
        if r.verify != "token" or r.candidates != 1:
            continue
        bound = None
        if r.kind == "ngram":
            m = r.tokens_per_target_forward if r.tokens_per_target_forward is not None else r.mean_acceptance_length
            ref = r.mean_acceptance_length_exact
        elif r.kind == "bounds":
            m, ref, bound = r.mean_acceptance_length_lower, r.mean_acceptance_length_lower, "lower"
        else:
            m = r.mean_acceptance_length_exact if r.mean_acceptance_length_exact is not None \
                else r.mean_acceptance_length
            ref = m
        if m is None or not m > 0:
            continue
        half = math.inf
        ci = r.ci95_sequences
        if ci is not None and ref:  # the relative half-width of the interval over prompts, applied to m
            half = m * (ci[1] - ci[0]) / 2 / ref if r.kind != "bounds" else m - ci[0]
        out.append((r.draft, r.k, float(m), float(half), r.p_all_accepted, r, bound))
    return out


def _no_proposal_share(row, positions) -> float:
    """An n-gram row's share of target forwards whose lookup proposed nothing (plain steps), from its counts:
    forwards = positions / tokens per target forward; 0 for other rows or when unknown."""
    if row.kind != "ngram" or not row.plain_steps or not row.tokens_per_target_forward or not positions:
        return 0.0
    return min(max(float(row.plain_steps) * row.tokens_per_target_forward / positions, 0.0), 1.0)


def _p_all(row, p_all, m, table, key, plain_s) -> float:
    """The share of steps that accepted every draft: the row's; for a sparse dump's lower-bound row (which does
    not record it) recovered from its batch-1 speed-up when that was priced with this very table (``plain_s``, the
    simulation's plain step, equals the table's), so that B = 1 reproduces the simulation's figure; else 0."""
    if p_all is not None:
        return float(p_all)
    s = getattr(row, "speedup_lower", None)
    if row.kind != "bounds" or not s or key in table.one_call or plain_s is None \
            or not math.isclose(plain_s, table.plain_step_s(), rel_tol=1e-12):
        return 0.0
    d = table.draft_forward_s[key]
    diff = d.get(2, d[1]) - d[1]
    try:
        base = StepCost(table, key).step_s(row.k, 0.0)
    except InvalidInput:
        return 0.0
    if not diff > 0:
        return 0.0
    return min(max((m * plain_s / s - base) / diff, 0.0), 1.0)


def _per_sequence(per_sequence, row, draft, k):
    if per_sequence is not None and (draft, k) in per_sequence:
        tokens, steps = per_sequence[(draft, k)]
    else:
        tokens, steps = getattr(row, "per_sequence_tokens", None), getattr(row, "per_sequence_steps", None)
    if tokens is None or steps is None:
        return None
    tokens, steps = np.asarray(tokens, np.float64), np.asarray(steps, np.float64)
    if tokens.shape != steps.shape or tokens.ndim != 1 or not len(tokens) or not np.all(np.isfinite(tokens)) \
            or not np.all(np.isfinite(steps)) or np.any(steps <= 0) or np.any(tokens < steps):
        raise InvalidInput(f"per_sequence[({draft!r}, {k})]: tokens and steps must be equal-length 1-d arrays of "
                           "finite numbers with 0 < steps <= tokens per sequence")
    return tokens, steps


#: the JSON of ``simulate --batch``'s break-even statuses, by :func:`fastspec.costs.break_even`'s
_STATUS = {"pays at every batch": "pays at every batch measured", "not monotone": "pays at some batch sizes"}


def _break_even(draft, k, points) -> dict:
    """The ``break_even`` entry of (draft, k) (:func:`fastspec.costs.break_even` over points: [(B, speedup)] sorted
    by B), with its sentence."""
    be = break_even(points)
    status = _STATUS.get(be["status"], be["status"])
    out = {"draft": draft, "k": k, "pays_up_to": be["pays_up_to"], "stops_at": be["stops_at"],
           "break_even_estimate": be["estimate"], "status": status}
    if status == "pays at every batch measured":
        return {**out, "text": f"pays at every batch measured (up to B = {points[-1][0]})"}
    if status == "never pays":
        return {**out, "text": "never pays at the batch sizes measured"}
    if status == "pays at some batch sizes":
        which = ", ".join(str(b) for b, s in points if s > 1.0)
        return {**out, "text": f"pays at B = {which} only (not monotone)"}
    b1, b2, est = be["pays_up_to"], be["stops_at"], be["estimate"]
    return {**out, "text": f"stops paying above B = {b1} (not at B = {b2}; speed-up 1 near B = {est:.1f})"}


def batch_predictions(result, table, batches, extrapolate: bool = False, *, per_sequence=None) -> BatchPrediction:
    """Predicted throughput and speed-up of every (draft, k) of ``result`` at each batch size of ``batches``
    (module docstring).  ``table``: a :class:`~fastspec.costs.CostTable` (or its JSON mapping, or a path) with the
    batch sizes asked for (version 2; a version-1 table prices batch 1 only); a missing entry raises
    :class:`~fastspec.costs.MissingBatchEntries` naming every (field, B, n) unless ``extrapolate`` (then the
    extrapolated entries are listed in ``extrapolated`` and a warning says so).  ``per_sequence``: optional
    ``{(draft, k): (tokens per sequence, steps per sequence)}`` for the static-batch figure."""
    if not isinstance(result, SimulationResult):
        raise InvalidType(f"result must be a fastspec.simulation.SimulationResult, got {type(result).__name__}")
    table = CostTable.of(table, "table")
    bs = parse_batch_list(batches, "batches")
    if not isinstance(extrapolate, bool):
        raise InvalidType(f"extrapolate must be True or False, got {type(extrapolate).__name__}")
    if not table.has_batch_axis and max(bs) > 1:
        raise InvalidInput(_v1_message(bs))
    pricing = TablePricing(table, "file")
    rows = _rows_of(result)
    warnings = []
    skipped = sorted({d for d, *_ in rows if pricing.key(d) is None})
    if skipped:
        warnings.append(f"the cost table has no entry for {', '.join(skipped)}: no batch prediction for it")
    rows = [r for r in rows if pricing.key(r[0]) is not None]
    plain_1 = (result.config.get("costs") or {}).get("plain_step_s")
    rows = [(d, k, m, half, _p_all(row, p_all, m, table, pricing.key(d), plain_1), row, bound)
            for d, k, m, half, p_all, row, bound in rows]
    # every entry first: one error naming everything missing
    costs = {(b, key): StepCost(table, key, batch=b, extrapolate=extrapolate)
             for b in bs for key in {None, *(pricing.key(r[0]) for r in rows)}}
    missing = []
    for (_, key), c in costs.items():
        missing += c.missing(sorted({r[1] for r in rows if pricing.key(r[0]) == key}), plain=key is None)
    if missing:
        raise missing_error(table, missing)
    extrapolated = sorted({f"{field_name(w, key)} (B={b}, {'k' if w == 'overhead' else 'n'}={n})"
                           for (_, key), c in costs.items() for w, b, n in c.extrapolated})
    if extrapolated:
        warnings.append(f"extrapolated, not measured ({len(extrapolated)} entries, linear in B from the two nearest "
                        f"measured batch sizes): {', '.join(extrapolated)}")
    plain, out_rows, static_any = [], [], False
    for b in bs:
        p = costs[(b, None)].plain_step_s()
        plain.append({"batch": b, "step_s": p, "tokens_per_s": b / p, "tokens_per_s_per_sequence": 1.0 / p})
        for draft, k, m, half, p_all, row, bound in rows:
            c = costs[(b, pricing.key(draft))]
            # an n-gram row: a plain step after the lookup call when no sequence of the batch proposed
            step = c.ngram_step_s(k, _no_proposal_share(row, result.config.get("positions")), p_all)
            s = m * p / step
            ci = speedup_interval(s, m, half, c.relative_se(k, p_all)) if math.isfinite(half) else None
            br = BatchRow(draft, k, b, m, step, b * m / step, m / step, s, ci, bound=bound)
            seq = _per_sequence(per_sequence, row, draft, k)
            if seq is not None:
                tokens, steps = seq
                em_spec, em_plain = expected_max(steps, b), expected_max(tokens, b)
                br.static_speedup = em_plain * p / (em_spec * step)
                br.static_tokens_per_s = b * float(tokens.mean()) / (em_spec * step)
                static_any = True
            out_rows.append(br)
    best, best_overall = {}, {}
    for b in bs:
        here = [r for r in out_rows if r.batch == b]
        best[b] = {}
        for draft in dict.fromkeys(r.draft for r in here):
            top = max((r for r in here if r.draft == draft), key=lambda r: (r.speedup, -r.k))
            best[b][draft] = top.k
        top = max(here, key=lambda r: (r.speedup, -r.k), default=None)
        best_overall[b] = None if top is None else {"draft": top.draft, "k": top.k, "speedup": top.speedup}
    breaks = []
    for draft, k, *_ in rows:
        pts = [(r.batch, r.speedup) for r in out_rows if r.draft == draft and r.k == k]
        breaks.append(_break_even(draft, k, pts))
    assumptions = list(BATCH_ASSUMPTIONS) + ([STATIC_ASSUMPTION] if static_any else [])
    if any(r[6] for r in rows):
        assumptions.append("sparse dump: model-draft rows use the lower bound of tokens per step")
    return BatchPrediction(bs, plain, out_rows, best, best_overall, breaks, extrapolated, static_any, assumptions,
                           warnings)



def check_batch_table(table, batches, ks=(), extrapolate: bool = False) -> list[int]:
    """The checks :func:`batch_predictions` makes that need no simulation, for a command line to run before any
    work: the batch sizes (returned sorted), a version-1 table asked for B > 1, and the target's and overhead's
    entries at every B for plain decoding and each k of ``ks`` (the drafts' are checked by
    :func:`batch_predictions`).  InvalidInput names what is wrong or missing."""
    table = CostTable.of(table, "table")
    bs = parse_batch_list(batches, "batches")
    if not table.has_batch_axis and max(bs) > 1:
        raise InvalidInput(_v1_message(bs))
    missing = []
    for b in bs:
        missing += StepCost(table, None, batch=b, extrapolate=extrapolate).missing(list(ks))
    if missing:
        raise missing_error(table, missing)
    return bs


def _v1_message(bs) -> str:
    return (f"the cost table is version 1 (batch 1 only) but batch sizes {', '.join(str(b) for b in bs if b > 1)} "
            "were asked for: measure a version-2 table with `fastspec cost --batch 1,2,4,8` (or ask for batch 1 "
            "only)")
