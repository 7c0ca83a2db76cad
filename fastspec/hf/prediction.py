"""The offline prediction a real-loop measurement is compared with, and the comparison itself.

Needs neither torch nor a model: everything here reads a logit dump (through :func:`fastspec.simulate` and
:func:`fastspec.acceptance.dump_acceptance`) or results already measured.

* :func:`ratio_ci` -- sum(num) / sum(den) with prompts as clusters (delta method, Student t): the 95% CI of a
  mean acceptance length, measured (tokens / steps per prompt) or predicted (expected tokens / steps).
* :func:`prediction_over_prompts` -- the exact prediction per (draft, k) with its uncertainty over prompts.
* :func:`predict` -- :class:`Prediction`: ``simulate``'s figures plus the over-prompts CIs for one dump.
* :func:`relative_error`, :func:`z_difference`, :func:`compare` -- predicted vs measured, one row per (draft, k)
  (the JSON rows of ``fastspec measure``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..stats import ratio_ci  # noqa: E402  (re-exported: fastspec.hf.ratio_ci)

__all__ = ["ratio_ci", "prediction_over_prompts", "Prediction", "predict", "relative_error", "z_difference",
           "compare"]


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
    """What a dump predicts per (draft, k): ``simulation`` (:class:`fastspec.simulate.SimulationResult`) and
    ``over_prompts`` (:func:`prediction_over_prompts`; empty for a sparse dump)."""

    simulation: object
    over_prompts: dict

    @property
    def warnings(self) -> list[str]:
        return self.simulation.warnings

    @property
    def dump_kind(self) -> str:
        return self.simulation.config["dump_kind"]

    def figures(self, draft: str, k: int) -> dict:
        """The predicted figures of one (draft, k) (the ``predicted`` object of a :func:`compare` row)."""
        p = next(r for r in self.simulation.results if (r.draft, r.k) == (draft, k))
        po = self.over_prompts.get((draft, k))
        return {"mean_acceptance_length_exact": p.mean_acceptance_length_exact,
                "mean_acceptance_length_mc": p.mean_acceptance_length,
                "ci95": list(p.ci95) if p.ci95 else None, "lower": p.mean_acceptance_length_lower,
                "upper": p.mean_acceptance_length_upper, "alpha": p.alpha, "alpha_lower": p.alpha_lower,
                "alpha_upper": p.alpha_upper,
                "ci95_over_prompts": [po[0] - po[2], po[0] + po[2]] if po else None,
                "standard_error_over_prompts": po[1] if po else None}


def predict(dump, drafts: Sequence[str], ks: Sequence[int], *, temperature=None, top_k=None, top_p=None,
            min_p=None, trials=None, seed: int = 0) -> Prediction:
    """``simulate``'s prediction for every (draft, k) of ``dump`` plus its uncertainty over prompts."""
    from ..simulate import simulate

    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    sim = simulate(dump, k=list(ks), drafts=list(drafts), trials=trials, seed=seed, **sampling)
    return Prediction(sim, prediction_over_prompts(dump, drafts, ks, **sampling))


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
    ``measured_inside_prediction_interval`` (sparse only)."""
    rows = []
    for m in measured:
        p = prediction.figures(m.draft, m.k)
        point, lo, hi = p["mean_acceptance_length_exact"], p["lower"], p["upper"]
        po = prediction.over_prompts.get((m.draft, m.k))
        rows.append({
            "draft": m.draft, "k": m.k, "predicted": p, "measured": m.as_dict(),
            "relative_error": relative_error(m.mean_acceptance_length, point, lo, hi),
            "z_difference": (z_difference(po[0], po[1], m.mean_acceptance_length, m.standard_error)
                             if po is not None else None),
            "measured_inside_prediction_interval": (lo <= m.mean_acceptance_length <= hi) if point is None else None,
        })
    return rows
