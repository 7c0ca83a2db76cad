"""The rows of kind ``policy`` of :func:`fastspec.simulate` (``SimulateConfig(policies=[...])``, ``fastspec simulate
--policy SPEC``): one per (model draft, policy), exact DP or Monte-Carlo (:mod:`fastspec.simulation.policy_eval`)."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidInput
from .policy_eval import check_policy_dump, evaluate_features, needed_thetas
from .policy_features import policy_features

__all__ = ["PolicyRow", "policy_rows", "POLICY_ASSUMPTION"]

POLICY_ASSUMPTION = ("policy rows: the draft length of each step is decided online by the policy from the draft's "
                     "processed probabilities (fastspec.policies); exact DP over (start position, policy state) where "
                     "the state is finite along a trajectory, else Monte-Carlo (method says which); drafts made after "
                     "a draft that is rejected are priced with the recorded positions' statistics; speed-up = tokens / "
                     "sum_n E[steps drafting n] x step(n), times the plain step")


@dataclass
class PolicyRow:
    """One policy on one model draft (JSON names stable; ``kind`` is always "policy")."""

    draft: str
    policy: str
    method: str
    exact: bool
    mean_acceptance_length: float
    ci95_sequences: tuple | None
    mc_ci95: tuple | None
    mc_standard_error: float | None
    steps: float
    mean_draft_length: float
    draft_acceptance_rate: float | None
    p_all_accepted: float
    draft_length_steps: list
    draft_length_all_accepted: list
    speedup: float | None = None
    speedup_ci95: tuple | None = None
    kind: str = "policy"

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        for f in ("ci95_sequences", "mc_ci95", "speedup_ci95"):
            d[f] = list(d[f]) if d[f] is not None else None
        return d


def _row(est, pricing) -> PolicyRow:
    s, ci = est.speedup(pricing, est.draft) if pricing is not None else (None, None)
    return PolicyRow(est.draft, est.policy, est.method, est.exact, est.mean_acceptance_length, est.ci95_sequences,
                     est.mc_ci95, est.mc_standard_error, est.steps, est.mean_draft_length,
                     est.accepted / est.drafted if est.drafted > 0 else None, est.p_all_accepted,
                     est.draft_length_steps.tolist(), est.draft_length_all_accepted.tolist(), s, ci)


def check_policy_drafts(d, names, policies) -> None:
    """Before any work: every policy can run on every model draft simulated, and there is one."""
    if not policies:
        return
    if not names:
        p = policies[0]
        raise InvalidInput(f"--policy {p.name}: policies replay model drafts and this simulation has none (an n-gram "
                           "draft has no probabilities; use --k for it)")
    for name in names:
        for p in policies:
            check_policy_dump(d, name, p)


def policy_rows(d, names, policies, sp, trials, seed, pricing, progress=None) -> list[PolicyRow]:
    """Rows for every (model draft, policy): one pass over the dump per draft, then one DP / replay per policy."""
    rows = []
    for name in names:
        thetas = sorted({t for p in policies for t in needed_thetas(p)})
        mc = any(not p.exact_replay for p in policies)
        f = policy_features(d, name, sp, thetas=thetas, trials=trials if mc else 0, seed=seed)
        for p in policies:
            rows.append(_row(evaluate_features(f, p), pricing))
            if progress is not None:
                progress(d.N)
    return rows
