"""The offline prediction a real-loop measurement is compared with, and the comparison itself.

Needs neither torch nor a model: everything here reads a logit dump through :func:`fastspec.simulate` (exact
expectations, their intervals over the recorded sequences, n-gram drafts, speed-ups from a cost table) or
results already measured.

* :func:`ratio_ci` -- sum(num) / sum(den) with prompts as clusters (delta method, Student t): the 95% CI of a
  mean acceptance length, measured (tokens / steps per prompt) or predicted (expected tokens / steps).
* :func:`speedup_ci` -- (sum a / sum b) / (sum c / sum d) with prompts as clusters: a measured speed-up
  (tokens per second of one configuration over plain decoding's, paired by prompt).
* :func:`prediction_over_prompts` -- the exact prediction per (draft, k) with its uncertainty over prompts.
* :func:`predict` -- :class:`Prediction`: ``simulate``'s figures for the model drafts of one dump and for n-gram
  drafts (replayed from the dump's prompt and generated tokens), and, with a cost table, the predicted
  speed-ups with their intervals (over the recorded sequences and the table's standard errors).
* :func:`relative_error`, :func:`z_difference`, :func:`compare` -- predicted vs measured, one row per (draft, k)
  (the JSON rows of ``fastspec measure``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

from ..errors import InvalidInput
from ..stats import Z95, ratio_ci, t_quantile_975

__all__ = ["ratio_ci", "speedup_ci", "prediction_over_prompts", "Prediction", "predict", "relative_error",
           "z_difference", "compare", "Z95"]


def speedup_ci(tokens, seconds, base_tokens, base_seconds) -> tuple[float, float, float]:
    """(estimate, se, ci95 half-width) of ``(sum tokens / sum seconds) / (sum base_tokens / sum base_seconds)``,
    one entry per cluster (prompt): the throughput of one configuration relative to a baseline measured on the
    same prompts.

    Delta method on the four totals with prompts as clusters: ``z_n = S (a_n/A - b_n/B - c_n/C + d_n/D)``,
    ``se^2 = n/(n-1) sum z_n^2``, Student t with n - 1 degrees of freedom -- the pairing by prompt is in
    ``z_n`` (a slow prompt slows both configurations and cancels).  With equal token counts per prompt it is
    :func:`ratio_ci` of (base seconds, seconds).  Fewer than two prompts: infinite se and half-width; a zero
    total: estimate NaN."""
    a, b, c, d = (np.asarray(v, np.float64).reshape(-1) for v in (tokens, seconds, base_tokens, base_seconds))
    n = len(a)
    if not (len(b) == len(c) == len(d) == n):
        raise InvalidInput(f"speedup_ci: tokens, seconds, base_tokens and base_seconds need one entry per prompt, "
                           f"got lengths {len(a)}, {len(b)}, {len(c)}, {len(d)}")
    A, B, C, D = a.sum(), b.sum(), c.sum(), d.sum()
    if not (A > 0 and B > 0 and C > 0 and D > 0):
        return float("nan"), float("inf"), float("inf")
    est = float((A / B) / (C / D))
    if n < 2:
        return est, float("inf"), float("inf")
    z = est * (a / A - b / B - c / C + d / D)
    se = math.sqrt(n / (n - 1) * float((z ** 2).sum()))
    return est, se, se * t_quantile_975(n - 1)


def prediction_over_prompts(dump, drafts: Sequence[str], ks: Sequence[int], *, temperature=None, top_k=None,
                            top_p=None, min_p=None) -> dict[tuple[str, int], tuple[float, float, float]]:
    """{(draft, k): (estimate, se, ci95 half-width)}: the exact prediction of the mean acceptance length with
    its uncertainty over prompts.  Each recorded trajectory is one sample: expected tokens and verify steps per
    prompt from the trajectory DP (:func:`fastspec.expected_tokens_per_step`), combined by :func:`ratio_ci`.
    Sampling parameters default to the dump's recorded ones.  Dense dumps only: a sparse dump has only bounds,
    and gives ``{}``."""
    from ..acceptance import dump_acceptance, expected_tokens_per_step
    from ..io import load_dump

    out = {}
    with load_dump(dump) as d:
        if d.kind != "dense":
            return out
        accs = dump_acceptance(d, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                               drafts=list(drafts))
        L = d.lengths.astype(np.int64)
        for name in drafts:
            a = accs[name].alpha
            for k in ks:
                tok, st = [], []
                for n in range(d.N):
                    s = expected_tokens_per_step(a[n:n + 1], k, lengths=L[n:n + 1])
                    tok.append(s.accepted + s.steps)
                    st.append(s.steps)
                out[(name, k)] = ratio_ci(tok, st)
    return out


@dataclass
class Prediction:
    """What a dump predicts per (draft, k): ``simulation`` (:class:`fastspec.simulate.SimulationResult`),
    ``over_prompts`` ({(draft, k): (estimate, se, ci95 half-width)} of the exact mean acceptance length over the
    recorded sequences; none for a sparse dump's model drafts), ``names`` ({draft: simulate's row name}, for
    n-gram drafts: ``ngramMIN-MAX``), ``costs`` (the :class:`fastspec.costs.CostTable` that priced the steps, or
    None) and notes of its own."""

    simulation: object
    over_prompts: dict
    names: dict = field(default_factory=dict)
    costs: object = None
    notes: list = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        return list(self.simulation.warnings) + list(self.notes)

    @property
    def dump_kind(self) -> str:
        return self.simulation.config["dump_kind"]

    def row(self, draft: str, k: int):
        """simulate's row (:class:`fastspec.simulate.DraftKResult`) of one (draft, k)."""
        name = self.names.get(draft, draft)
        return next(r for r in self.simulation.results if (r.draft, r.k) == (name, k)
                    and (getattr(r, "verify", "token"), getattr(r, "candidates", 1)) == ("token", 1))

    def figures(self, draft: str, k: int) -> dict:
        """The predicted figures of one (draft, k) (the ``predicted`` object of a :func:`compare` row)."""
        p = self.row(draft, k)
        po = self.over_prompts.get((draft, k))
        return {"mean_acceptance_length_exact": p.mean_acceptance_length_exact,
                "mean_acceptance_length_mc": p.mean_acceptance_length,
                "ci95": list(p.ci95) if p.ci95 else None, "lower": p.mean_acceptance_length_lower,
                "upper": p.mean_acceptance_length_upper, "alpha": p.alpha, "alpha_lower": p.alpha_lower,
                "alpha_upper": p.alpha_upper,
                "ci95_over_prompts": [po[0] - po[2], po[0] + po[2]] if po else None,
                "standard_error_over_prompts": po[1] if po else None}

    def speedup(self, draft: str, k: int) -> dict | None:
        """The predicted speed-up of one (draft, k): ``estimate`` and ``ci95`` (simulate's, over the recorded
        sequences and the cost table's standard errors), ``standard_error`` = s x the log interval's half-width /
        1.96 (slightly conservative: the sequences' part uses Student t), ``p_all_accepted``; None without a cost
        table, without an entry for the draft or for k + 1 target positions, or for a sparse dump."""
        p = self.row(draft, k)
        s, ci = getattr(p, "speedup", None), getattr(p, "speedup_ci95", None)
        if s is None or ci is None:
            return None
        lo, hi = ci  # [s exp(-h), s exp(h)]: the log scale's standard error h / 1.96, times s (delta method)
        return {"estimate": s, "standard_error": s * math.log(hi / lo) / (2 * Z95), "ci95": [lo, hi],
                "p_all_accepted": getattr(p, "p_all_accepted", None)}


def _cost_table(costs, ngram: Mapping):
    """``costs`` (a CostTable, its JSON mapping or a path) with each n-gram draft's entry also under simulate's
    name for it (``ngramMIN-MAX``), so that a draft named otherwise (``look=ngram:2-3``) is priced by its own
    measured call."""
    from ..costs import CostTable
    from ..simulation.ngram import ngram_name

    obj = CostTable.of(costs).as_dict()
    for name, p in ngram.items():
        alias = ngram_name(p)
        if name in obj["drafts"] and alias not in obj["drafts"]:
            obj["drafts"][alias] = obj["drafts"][name]
    return CostTable.from_dict(obj)


def predict(dump, drafts: Sequence[str], ks: Sequence[int], *, temperature=None, top_k=None, top_p=None,
            min_p=None, trials=None, seed: int = 0, ngram: Mapping | None = None, costs=None) -> Prediction:
    """``simulate``'s prediction for every (draft, k) of ``dump`` (model drafts by name) and of the n-gram
    drafts ``ngram`` ({name: :class:`fastspec.ngram.NgramProposer`}, replayed from the dump's prompt and
    generated tokens: a dense dump, or a greedy analysis), with the exact mean acceptance length's interval over
    the recorded sequences.  ``costs``: a :class:`fastspec.costs.CostTable` (or its mapping, or a path) measured
    with the same models, for the predicted speed-ups (:meth:`Prediction.speedup`); None: the dump's recorded
    table if any; False: none."""
    from ..simulation import simulate
    from ..simulation.ngram import ngram_name

    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    drafts = list(drafts)
    ngram = dict(ngram or {})
    names = {name: ngram_name(p) for name, p in ngram.items()}
    if len(set(names.values()) | set(drafts)) != len(set(names.values())) + len(set(drafts)):
        raise InvalidInput(f"predict: an n-gram draft's name {sorted(set(names.values()) & set(drafts))} is also "
                           "a draft model's")
    table = _cost_table(costs, ngram) if costs not in (None, False) else costs
    wanted = drafts + sorted(set(names.values()))
    if not wanted:
        raise InvalidInput("predict: give at least one draft")
    sim = simulate(dump, k=list(ks), drafts=wanted, trials=trials, seed=seed, costs=table, **sampling)
    over = {}
    for draft in drafts + list(names):
        for k in ks:
            r = next(r for r in sim.results if (r.draft, r.k) == (names.get(draft, draft), k)
                     and (getattr(r, "verify", "token"), getattr(r, "candidates", 1)) == ("token", 1))
            if r.mean_acceptance_length_exact is not None and r.ci95_sequences is not None:
                lo, hi = r.ci95_sequences
                over[(draft, k)] = (r.mean_acceptance_length_exact, r.standard_error_sequences, (hi - lo) / 2)
    return Prediction(sim, over, names, table if table not in (None, False) else None)


def relative_error(measured: float | None, predicted: float | None, lower: float | None = None,
                   upper: float | None = None) -> float | None:
    """(predicted - measured) / measured; for an interval prediction [lower, upper] (``predicted`` None), 0
    inside it, else to the nearest end.  None when it is undefined (measured missing, 0 or not finite)."""
    if measured is None or not math.isfinite(measured) or measured == 0:
        return None
    if predicted is not None:
        return (predicted - measured) / measured
    if lower is None or upper is None:
        return None
    if lower <= measured <= upper:
        return 0.0
    near = lower if measured < lower else upper
    return (near - measured) / measured


def z_difference(predicted: float, predicted_se: float, measured: float, measured_se: float) -> float | None:
    """(predicted - measured) / sqrt(se_p² + se_m²); None when either standard error is not finite or both
    are 0."""
    if not (math.isfinite(predicted_se) and math.isfinite(measured_se)):
        return None
    se = math.hypot(predicted_se, measured_se)
    return (predicted - measured) / se if se > 0 else None


def compare(measured: Sequence, prediction: Prediction) -> list[dict]:
    """One row per measured (draft, k) (:class:`fastspec.hf.MeasureResult`): ``draft``, ``k``, ``predicted``
    (:meth:`Prediction.figures`), ``measured`` (its ``as_dict()``), ``relative_error`` (exact prediction, or
    the sparse interval), ``z_difference`` (dense: the over-prompts prediction vs the measurement) and
    ``measured_inside_prediction_interval`` (sparse only); and ``speedup`` when the measurement has a clock
    or the prediction a cost table: ``predicted`` (:meth:`Prediction.speedup`), ``measured`` (the measured
    speed-up over plain decoding), ``relative_error``, ``z_difference`` and ``agrees`` (|relative error| <= 10%
    or |z| <= 1.96, i.e. inside the combined 95% interval)."""
    rows = []
    for m in measured:
        p = prediction.figures(m.draft, m.k)
        point, lo, hi = p["mean_acceptance_length_exact"], p["lower"], p["upper"]
        po = prediction.over_prompts.get((m.draft, m.k))
        row = {
            "draft": m.draft, "k": m.k, "predicted": p, "measured": m.as_dict(),
            "relative_error": relative_error(m.mean_acceptance_length, point, lo, hi),
            "z_difference": (z_difference(po[0], po[1], m.mean_acceptance_length, m.standard_error)
                             if po is not None else None),
            "measured_inside_prediction_interval": (bool(lo <= m.mean_acceptance_length <= hi)
                                                    if point is None and lo is not None else None),
        }
        sp_pred = prediction.speedup(m.draft, m.k)
        sp_meas = getattr(m, "speedup", None)
        if sp_pred is not None or sp_meas is not None:
            rel = z = None
            if sp_pred is not None and sp_meas is not None:
                rel = relative_error(sp_meas["estimate"], sp_pred["estimate"])
                z = z_difference(sp_pred["estimate"], sp_pred["standard_error"], sp_meas["estimate"],
                                 sp_meas["standard_error"])
            agrees = None if rel is None else bool(abs(rel) <= 0.10 or (z is not None and abs(z) <= Z95))
            row["speedup"] = {"predicted": sp_pred, "measured": sp_meas, "relative_error": rel, "z_difference": z,
                              "agrees": agrees}
        rows.append(row)
    return rows
