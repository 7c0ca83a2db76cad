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
  (the JSON rows of ``fastspec measure``), and per (draft, policy): a measured row run under a draft-length policy
  (fastspec's loop with ``policy=``, or Hugging Face's assisted generation, whose settings stand for a policy:
  ``MeasureResult.predicted_as``) is compared with
  :func:`fastspec.simulation.policy_eval.evaluate_policy` of that policy on the same dump (``predict(...,
  policies=...)``).
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
                            top_p=None, min_p=None, sampling=None) -> dict[tuple[str, int], tuple[float, float, float]]:
    """{(draft, k): (estimate, se, ci95 half-width)}: the exact prediction of the mean acceptance length with
    its uncertainty over prompts.  Each recorded trajectory is one sample: expected tokens and verify steps per
    prompt from the trajectory DP (:func:`fastspec.expected_tokens_per_step`), combined by :func:`ratio_ci`.
    Sampling parameters (``sampling``, a :class:`fastspec.SamplingParams`, or one by one) default to the dump's
    recorded ones.  Dense dumps only: a sparse dump has only bounds, and gives ``{}``."""
    from ..acceptance import dump_acceptance, expected_tokens_per_step
    from ..io import open_dump

    out = {}
    with open_dump(dump) as d:
        if d.kind != "dense":
            return out
        accs = dump_acceptance(d, sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
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
    """What a dump predicts per (draft, k): ``simulation`` (:class:`fastspec.simulation.SimulationResult`),
    ``over_prompts`` ({(draft, k): (estimate, se, ci95 half-width)} of the exact mean acceptance length over the
    recorded sequences; none for a sparse dump's model drafts), ``names`` ({draft: simulate's row name}, for
    n-gram drafts: ``ngramMIN-MAX``), ``costs`` (the :class:`fastspec.costs.CostTable` that priced the steps, or
    None) and notes of its own."""

    simulation: object
    over_prompts: dict
    names: dict = field(default_factory=dict)
    costs: object = None
    notes: list = field(default_factory=list)
    policies: dict = field(default_factory=dict)  # {(draft, policy name): PolicyEstimate}
    policy_costs: object = None  # the table that prices the policies (costs, else the dump's recorded one)

    def policy_figures(self, draft: str, policy: str) -> dict | None:
        """The predicted figures of ``draft`` under ``policy`` (a policy name): ``method`` (exact DP or
        Monte-Carlo), the mean acceptance length (``mean_acceptance_length_exact`` when exact, else
        ``mean_acceptance_length_mc`` with its Monte-Carlo interval), its interval and standard error over the
        recorded sequences, the mean draft length and the expected steps per draft length; None when not
        predicted (no such estimate: a sparse dump, an n-gram draft)."""
        est = self.policies.get((draft, policy))
        if est is None:
            return None
        m, se, half = ratio_ci(est.per_sequence_tokens, est.per_sequence_steps)
        mal = est.mean_acceptance_length
        return {"policy": est.policy, "method": est.method, "exact": bool(est.exact),
                "mean_acceptance_length_exact": mal if est.exact else None,
                "mean_acceptance_length_mc": None if est.exact else mal,
                "mc_ci95": list(est.mc_ci95) if est.mc_ci95 else None, "ci95": None, "lower": None, "upper": None,
                "ci95_over_prompts": [m - half, m + half] if math.isfinite(half) else None,
                "standard_error_over_prompts": se if math.isfinite(se) else None,
                "mean_draft_length": est.mean_draft_length, "p_all_accepted": est.p_all_accepted,
                "draft_length_steps": est.draft_length_steps.tolist()}

    def policy_speedup(self, draft: str, policy: str) -> dict | None:
        """The predicted speed-up of ``draft`` under ``policy`` from the cost table (estimate, standard error,
        ci95); None without a table, an estimate, or costs for every draft length the policy uses."""
        est = self.policies.get((draft, policy))
        if est is None or self.policy_costs is None:
            return None
        s, ci = est.speedup(self.policy_costs, draft)
        if s is None or ci is None:
            return None
        lo, hi = ci
        return {"estimate": s, "standard_error": s * math.log(hi / lo) / (2 * Z95) if lo > 0 else None,
                "ci95": [lo, hi], "p_all_accepted": est.p_all_accepted}

    @property
    def warnings(self) -> list[str]:
        return list(self.simulation.warnings) + list(self.notes)

    @property
    def dump_kind(self) -> str:
        return self.simulation.config["dump_kind"]

    def row(self, draft: str, k: int):
        """simulate's row (:class:`fastspec.simulation.DraftKResult`) of one (draft, k)."""
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
    from ..ngram import ngram_name

    obj = CostTable.of(costs).as_dict()
    for name, p in ngram.items():
        alias = ngram_name(p)
        if name in obj["drafts"] and alias not in obj["drafts"]:
            obj["drafts"][alias] = obj["drafts"][name]
    return CostTable.from_dict(obj)


def predict(dump, drafts: Sequence[str], ks: Sequence[int], *, temperature=None, top_k=None, top_p=None,
            min_p=None, trials=None, seed: int = 0, ngram: Mapping | None = None, costs=None,
            policies: Sequence = (), sampling=None) -> Prediction:
    """``simulate``'s prediction for every (draft, k) of ``dump`` (model drafts by name) and of the n-gram
    drafts ``ngram`` ({name: :class:`fastspec.ngram.NgramProposer`}, replayed from the dump's prompt and
    generated tokens: a dense dump, or a greedy analysis), with the exact mean acceptance length's interval over
    the recorded sequences.  ``costs``: a :class:`fastspec.costs.CostTable` (or its mapping, or a path) measured
    with the same models, for the predicted speed-ups (:meth:`Prediction.speedup`); None: the dump's recorded
    table if any; False: none.  ``policies``: draft-length policies (specs or Policies) evaluated for every model
    draft by :func:`fastspec.simulation.policy_eval.evaluate_policy` (``trials`` Monte-Carlo replays where it is
    not exact, ``seed``; :meth:`Prediction.policy_figures`); a sparse dump gives a note instead.  Sampling
    (``sampling``, a :class:`fastspec.SamplingParams`, or one by one): the dump's recorded settings by default."""
    from ..simulation import simulate
    from ..ngram import ngram_name

    settings = dict(sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
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
    sim = simulate(dump, k=list(ks), drafts=wanted, trials=trials, seed=seed, costs=table, **settings)
    over = {}
    for draft in drafts + list(names):
        for k in ks:
            r = next(r for r in sim.results if (r.draft, r.k) == (names.get(draft, draft), k)
                     and (getattr(r, "verify", "token"), getattr(r, "candidates", 1)) == ("token", 1))
            if r.mean_acceptance_length_exact is not None and r.ci95_sequences is not None:
                lo, hi = r.ci95_sequences
                over[(draft, k)] = (r.mean_acceptance_length_exact, r.standard_error_sequences, (hi - lo) / 2)
    out = Prediction(sim, over, names, table if table not in (None, False) else None)
    _predict_policies(out, dump, drafts, policies, settings, trials, seed, priced=costs is not False)
    return out


def _predict_policies(out: Prediction, dump, drafts, policies, settings: dict, trials, seed, *, priced: bool) -> None:
    """Fill ``out.policies`` (and ``out.policy_costs``) with every (model draft, policy)'s estimate."""
    from ..io import open_dump
    from ..policies import parse_policies
    from ..simulation.policy_eval import DEFAULT_POLICY_TRIALS, evaluate_policy

    pols = parse_policies(list(policies), name="policy")
    if not pols:
        return
    if out.dump_kind != "dense":
        out.notes.append(f"policies ({', '.join(p.name for p in pols)}) are replayed from dense dumps only: no "
                         "prediction for them from this sparse dump")
        return
    if priced:
        out.policy_costs = out.costs
        if out.policy_costs is None:
            with open_dump(dump) as d:
                out.policy_costs = d.costs
    given = {k: v for k, v in settings.items() if v is not None}
    for draft in drafts:
        for pol in pols:
            out.policies[(draft, pol.name)] = evaluate_policy(dump, draft, pol, trials=trials or DEFAULT_POLICY_TRIALS,
                                                              seed=seed, **given)


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


def _predicted(m, prediction: Prediction):
    """(figures, over-prompts (estimate, se, half) or None, predicted speed-up) of one measured row: its policy's
    estimate when it ran under one (``predicted_as``), else simulate's (draft, k); (None, None, None) when the
    prediction has neither."""
    pol = getattr(m, "predicted_as", None)
    if pol is not None:
        p = prediction.policy_figures(m.draft, pol)
        if p is None:
            return None, None, None
        se = p["standard_error_over_prompts"]
        ci = p["ci95_over_prompts"]
        point = p["mean_acceptance_length_exact"] if p["exact"] else p["mean_acceptance_length_mc"]
        po = (point, se, (ci[1] - ci[0]) / 2) if se is not None and ci else None
        return p, po, prediction.policy_speedup(m.draft, pol)
    try:
        p = prediction.figures(m.draft, m.k)
    except StopIteration:  # a k simulate was not asked for (a fixed policy of an n-gram draft)
        return None, None, None
    return p, prediction.over_prompts.get((m.draft, m.k)), prediction.speedup(m.draft, m.k)


def compare(measured: Sequence, prediction: Prediction) -> list[dict]:
    """One row per measured configuration (:class:`fastspec.hf.MeasureResult`): ``draft``, ``k`` (and for a row
    run under a policy or by another engine ``policy``, ``engine`` and ``label``), ``predicted``
    (:meth:`Prediction.figures`, or :meth:`Prediction.policy_figures` for a row run under a policy; None when not
    predicted), ``measured`` (its ``as_dict()``), ``relative_error`` (exact or
    Monte-Carlo prediction, or the sparse interval), ``z_difference`` (dense: the over-prompts prediction vs the
    measurement) and ``measured_inside_prediction_interval`` (sparse only); and ``speedup`` when the measurement
    has a clock or the prediction a cost table: ``predicted`` (:meth:`Prediction.speedup` /
    :meth:`Prediction.policy_speedup`), ``measured`` (the measured speed-up over plain decoding; for Hugging
    Face's assisted generation over Hugging Face's plain ``generate`` when it ran, the same code path),
    ``relative_error``, ``z_difference`` and ``agrees`` (|relative error| <= 10% or |z| <= 1.96, i.e. inside the
    combined 95% interval)."""
    rows = []
    for m in measured:
        p, po, sp_pred = _predicted(m, prediction)
        point = lo = hi = None
        if p is not None:
            point, lo, hi = p["mean_acceptance_length_exact"], p["lower"], p["upper"]
            if point is None and p.get("mean_acceptance_length_mc") is not None and lo is None:
                point = p["mean_acceptance_length_mc"]
        row = {
            "draft": m.draft, "k": m.k, "predicted": p, "measured": m.as_dict(),
            "relative_error": relative_error(m.mean_acceptance_length, point, lo, hi),
            "z_difference": (z_difference(po[0], po[1], m.mean_acceptance_length, m.standard_error)
                             if po is not None else None),
            "measured_inside_prediction_interval": (bool(lo <= m.mean_acceptance_length <= hi)
                                                    if point is None and lo is not None else None),
        }
        if getattr(m, "policy", None) is not None or getattr(m, "engine", "fastspec") != "fastspec":
            row.update(policy=m.policy, engine=m.engine, label=m.label)
        sp_meas = getattr(m, "speedup", None)
        if getattr(m, "engine", "fastspec") != "fastspec" and getattr(m, "speedup_vs_hf_plain", None) is not None:
            sp_meas = m.speedup_vs_hf_plain
        if sp_pred is not None or sp_meas is not None:
            rel = z = None
            if sp_pred is not None and sp_meas is not None:
                rel = relative_error(sp_meas["estimate"], sp_pred["estimate"])
                if sp_pred["standard_error"] is not None:
                    z = z_difference(sp_pred["estimate"], sp_pred["standard_error"], sp_meas["estimate"],
                                     sp_meas["standard_error"])
            agrees = None if rel is None else bool(abs(rel) <= 0.10 or (z is not None and abs(z) <= Z95))
            row["speedup"] = {"predicted": sp_pred, "measured": sp_meas, "relative_error": rel, "z_difference": z,
                              "agrees": agrees}
        rows.append(row)
    return rows
