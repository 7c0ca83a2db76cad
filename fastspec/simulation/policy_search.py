"""Which draft-length policy to pick: a bounded grid search over (k_max, theta, schedule) that maximizes the
predicted wall-clock speed-up on a dump under a cost table (:func:`search_policies`).

The grid (:func:`default_grid`, limited to the draft lengths the cost table prices): fixed k; conf on=token and
on=max over theta x kmax; specdec on=max over h x kmax; Hugging Face's three schedules without tuning over theta,
and Hugging Face's default (``hf``: transformers 5.24's settings, ROC tuning included, Monte-Carlo).  One pass over
the dump computes every threshold's exact sums (:mod:`fastspec.simulation.policy_features`); each grid point is then
a DP over the recorded trajectories.  Bounds: ``budget_s`` seconds of evaluation (the points not reached are
counted and said), memory O(N T (|thetas| + trials)).  Each speed-up has its 95% interval over prompts and cost
standard errors (:meth:`fastspec.simulation.policy_eval.PolicyEstimate.speedup`).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..config import MAX_K
from .._numba.rng import seed_bits
from ..errors import InvalidInput, InvalidType, about, config_or_settings
from ..params import SamplingParams, SamplingSettings
from ..policies import DraftPolicy, parse_policy
from .config import check_trials
from .policy_eval import (DEFAULT_POLICY_TRIALS, MAX_POLICY_TRIALS, PolicyEstimate, _open_dump, check_policy_dump,
                          evaluate_features, needed_thetas, step_costs)
from .policy_features import MAX_DRAW_BYTES, policy_features

__all__ = ["PolicySearch", "PolicyChoice", "PolicySearchConfig", "search_policies", "default_grid", "HF_DEFAULT_SPEC"]

HF_DEFAULT_SPEC = "hf"
THETAS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
HS = (0.3, 0.5, 0.7, 0.9)


@dataclass
class PolicyChoice:
    """One evaluated policy: its estimate and predicted speed-up (None: not priced) with the 95% interval."""

    estimate: PolicyEstimate
    speedup: float | None
    speedup_ci95: tuple | None

    @property
    def policy(self) -> str:
        return self.estimate.policy

    def as_dict(self) -> dict:
        e = self.estimate
        return {"policy": e.policy, "method": e.method, "exact": e.exact,
                "mean_acceptance_length": e.mean_acceptance_length, "mean_draft_length": e.mean_draft_length,
                "speedup": self.speedup, "speedup_ci95": list(self.speedup_ci95) if self.speedup_ci95 else None}

    def shown(self) -> str:
        """"1.50x (95% interval 1.48-1.53)" or "not priced"."""
        if self.speedup is None:
            return "not priced by the cost table"
        ci = f" (95% interval {self.speedup_ci95[0]:.2f}-{self.speedup_ci95[1]:.2f})" if self.speedup_ci95 else ""
        return f"{self.speedup:.2f}x{ci}"


@dataclass
class PolicySearch:
    """What :func:`search_policies` found; ``verdict`` is one plain sentence naming the three side by side."""

    draft: str
    best_fixed: PolicyChoice | None
    hf_default: PolicyChoice | None
    best: PolicyChoice | None
    evaluated: list = field(default_factory=list)
    total: int = 0
    elapsed_s: float = 0.0
    notes: list = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        return len(self.evaluated) < self.total

    @property
    def verdict(self) -> str:
        if self.best is None:
            return (f"no policy could be priced for draft {self.draft}: the cost table lacks the draft lengths they "
                    "use (measure more k with `fastspec cost`)")
        fx = (f"best fixed k = {parse_policy(self.best_fixed.policy).k} gives "
              f"{self.best_fixed.shown()}" if self.best_fixed else "no fixed k is priced")
        hf = ("Hugging Face's default (" + self.hf_default.policy + ", " + self.hf_default.estimate.method + ") gives "
              + self.hf_default.shown() if self.hf_default else "Hugging Face's default was not evaluated")
        same = " (no adaptive policy beats it)" if self.best is self.best_fixed else ""
        part = "" if not self.truncated else f"; searched {len(self.evaluated)} of {self.total} points in the budget"
        return (f"{self.draft}: {fx}, {hf}, and the best policy, {self.best.policy}, gives {self.best.shown()}{same}"
                f"{part}.")

    def as_dict(self) -> dict:
        one = lambda c: c.as_dict() if c is not None else None  # noqa: E731
        return {"draft": self.draft, "best_fixed": one(self.best_fixed), "hf_default": one(self.hf_default),
                "best": one(self.best), "evaluated": [c.as_dict() for c in self.evaluated],
                "searched": len(self.evaluated), "total": self.total, "truncated": self.truncated,
                "notes": self.notes, "verdict": self.verdict}  # elapsed_s (the wall clock) left out: same input,
        # same bytes


def _priced_max(cost, draft, p_all=0.0) -> int:
    """The largest n such that every draft length 1..n is priced."""
    n = 0
    while n < MAX_K and step_costs(cost, draft, n + 1, p_all, needed=[n + 1]) is not None:
        n += 1
    return n


def default_grid(k_priced: int) -> list[DraftPolicy]:
    """The search grid for draft lengths up to ``k_priced`` (module docstring)."""
    K = max(1, min(k_priced, MAX_K))
    kmaxes = sorted({k for k in (2, 3, 4, 6, 8, 12, 16, 20) if k <= K} | {K})
    specs = [f"fixed:k={k}" for k in range(1, K + 1)]
    specs += [f"conf:theta={t},kmax={k},on={on}" for on in ("token", "max") for t in THETAS for k in kmaxes]
    specs += [f"specdec:h={h},kmax={k},on=max" for h in HS for k in kmaxes]
    specs += [f"hf:k={k},schedule={s},theta={t},tune=off" for s in ("constant", "heuristic", "heuristic_transient")
              for t in (0, 0.2, 0.4, 0.6) for k in kmaxes]
    return [parse_policy(s) for s in specs]


def _cost_of(costs):
    from ..costs import CostTable, StepCost
    from .speedup import FlagPricing, TablePricing

    if isinstance(costs, (StepCost, TablePricing, FlagPricing, CostTable)):
        return costs
    if costs is None:
        raise InvalidInput("costs: a policy search needs a cost table (fastspec cost --out FILE, or the dump's "
                           "recorded costs)")
    return CostTable.of(costs)


@dataclass(frozen=True, kw_only=True)
class PolicySearchConfig(SamplingSettings):
    """What :func:`search_policies` searches, as the caller gave it; validated on construction, before any dump is
    read (typed errors tagged with the argument(s) at fault, ``exc.arguments``: :func:`fastspec.errors.about`).
    The fields are :func:`search_policies`'s settings (its docstring); ``costs="dump"``: the dump's recorded
    table (checked once the dump is open).  The validated forms are :attr:`checked`."""

    costs: Any
    draft: str | None = None
    grid: Any = None
    budget_s: float = 120.0
    trials: int = DEFAULT_POLICY_TRIALS
    seed: int = 0
    include_hf_default: bool = True

    @cached_property
    def checked(self) -> dict:
        """{"overrides": the explicit sampling settings, "trials", "cost": the cost model (or "dump"), "grid": the
        parsed policies (None: :func:`default_grid`)}; the checks run in the command line's order of its flags."""
        overrides = self.overrides()
        with about("seed"):
            seed_bits(self.seed)  # the typed check the verify functions use: an integer in [-2**63, 2**64)
        with about("trials"):
            trials = check_trials(self.trials, high=MAX_POLICY_TRIALS)
        with about("budget_s"):
            b = self.budget_s
            if isinstance(b, bool) or not isinstance(b, (int, float)):
                raise InvalidType(f"budget_s must be a number of seconds > 0, got {type(b).__name__}")
            if not (b > 0 and math.isfinite(b)):
                raise InvalidInput(f"budget_s = {b:g} is invalid: give a number of seconds > 0")
        with about("costs"):
            cost = "dump" if isinstance(self.costs, str) and self.costs == "dump" else _cost_of(self.costs)
        with about("grid"):
            grid = None if self.grid is None else [parse_policy(g, name="grid") for g in self.grid]
        return {"overrides": overrides, "trials": trials, "cost": cost, "grid": grid}


def search_policies(dump, draft: str | None = None, costs=None, *, grid=None, budget_s: float = 120.0,
                    progress=None, sampling: SamplingParams | None = None, temperature=None, top_k=None, top_p=None,
                    min_p=None, trials: int = DEFAULT_POLICY_TRIALS, seed: int = 0, include_hf_default: bool = True,
                    config: PolicySearchConfig | None = None) -> PolicySearch:
    """Search ``grid`` (policy specs / Policies; None: :func:`default_grid`) for the largest predicted speed-up of
    ``draft`` (None: the dump's only draft) of a dense ``dump`` (a path or an open dump) under ``costs`` (a
    :class:`fastspec.costs.CostTable`, its mapping or path, a StepCost, a simulator pricing; "dump": the dump's
    recorded table).  ``budget_s``: seconds of evaluation after the pass (> 0).  ``progress(done, total)`` after
    each point.  Monte-Carlo points (HF's default) use ``trials`` replays per sequence keyed by ``seed``.
    ``sampling``: None (the dump's recorded settings) or a SamplingParams; or single settings one by one
    (``temperature=`` etc.).  The settings are a :class:`PolicySearchConfig` (``config``) or its fields as
    arguments, not both; every one is checked before the dump is read."""
    from ..acceptance import resolve_sampling

    settings = dict(costs=costs, draft=draft, grid=grid, budget_s=budget_s, trials=trials, seed=seed,
                    sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                    include_hf_default=include_hf_default)
    config = config_or_settings(PolicySearchConfig, config, settings)
    if progress is not None and not callable(progress):
        raise InvalidType("progress must be a function (done, total) or None")
    plan = config.checked
    draft, budget_s, trials, seed = config.draft, config.budget_s, plan["trials"], config.seed
    d, own = _open_dump(dump)
    try:
        cost = plan["cost"]
        if isinstance(cost, str):  # "dump"
            if d.costs is None:
                with about("costs", "dump"):
                    raise InvalidInput(f"costs: {d.path} records no cost table; give one (fastspec cost --out FILE)")
            cost = d.costs
        if draft is None:
            if len(d.drafts) != 1:
                raise InvalidInput(f"draft: name one of the dump's drafts ({', '.join(d.drafts) or 'none'})")
            draft = d.drafts[0]
        kp = _priced_max(cost, draft)
        if kp == 0:
            raise InvalidInput(f"costs: the cost table does not price draft {draft!r} at k = 1 (it needs its "
                               "forward time, target.forward_s[\"2\"] and overhead_s[\"1\"])")
        given = plan["grid"]
        pols = given if given is not None else default_grid(min(kp, d.T - 1))
        pols = list(dict.fromkeys(pols))
        hf_def = parse_policy(HF_DEFAULT_SPEC)
        if config.include_hf_default and hf_def not in pols:
            pols.append(hf_def)
        for p in pols:
            check_policy_dump(d, draft, p, flag="grid")
        sp = resolve_sampling(d, **plan["overrides"])
        thetas = sorted({t for p in pols for t in needed_thetas(p)})
        mc = any(not p.exact_replay for p in pols)
        notes = []
        fit = MAX_DRAW_BYTES // max(1, d.N * d.T * 9)
        if mc and trials > fit:  # bounded memory: fewer Monte-Carlo replays rather than no answer
            if fit < 2:
                raise InvalidInput(f"the dump is too large for Monte-Carlo draws ({d.N} x {d.T} positions); search "
                                   "exact policies only (a grid without hf's ROC tuning or specdec on=token)")
            notes.append(f"Monte-Carlo trials lowered from {trials} to {fit} to keep the draws within "
                         f"{MAX_DRAW_BYTES >> 30} GiB")
            trials = int(fit)
        f = policy_features(d, draft, sp, thetas=thetas, trials=trials if mc else 0, seed=seed)
        t0 = time.monotonic()
        # HF's default and the fixed k first: the sentence needs them even if the budget runs out
        order = sorted(pols, key=lambda p: (p != hf_def, p.kind != "fixed"))
        chosen: list[PolicyChoice] = []
        for i, p in enumerate(order):
            if time.monotonic() - t0 > budget_s and i > 0:
                notes.append(f"time budget of {budget_s:g} s reached after {i} of {len(order)} points")
                break
            est = evaluate_features(f, p)
            s, ci = est.speedup(cost, draft)
            chosen.append(PolicyChoice(est, s, ci))
            if progress is not None:
                progress(i + 1, len(order))
        if not sp.greedy and hf_def in pols and not any(c.policy == hf_def.name and c.speedup is not None
                                                         for c in chosen):
            notes.append(f"Hugging Face's default drafts up to {hf_def.k} tokens: the cost table must price every "
                         f"draft length up to {hf_def.k} (it prices up to {kp})")
        priced = [c for c in chosen if c.speedup is not None]
        key = lambda c: (c.speedup, -c.estimate.mean_draft_length)  # noqa: E731
        fixed = [c for c in priced if c.policy.startswith("fixed(")]
        hf = next((c for c in chosen if c.policy == hf_def.name), None)
        return PolicySearch(draft, max(fixed, key=key) if fixed else None, hf, max(priced, key=key) if priced else None,
                            chosen, len(order), time.monotonic() - t0, notes)
    finally:
        if own:
            d.close()
