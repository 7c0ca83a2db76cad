"""Expected figures of a draft-length policy (:mod:`fastspec.policies`) replayed along a dump's trajectories.

Method.  The recorded sequences are replayed as by :func:`fastspec.simulate` (a step at s drafts at most
``min(cap, L - 1 - s)``, never past the recorded end; s = L - 1 is a plain target step, not counted), with the
policy deciding how many tokens each step drafts:

* **exact DP** where the policy's state is finite and deterministic along a recorded trajectory -- fixed k; conf
  (on=token: the exact vocabulary sums of :mod:`fastspec.simulation.policy_features`; on=max: a deterministic
  stop); specdec on=max; hf without threshold tuning, whose heuristic schedule adds the cap to the state: the
  dynamic programme over (start position, cap) of :func:`fastspec._kernels.policy.policy_dp`.  It generalizes
  :func:`fastspec.analysis.expected_tokens_per_step` (which it reproduces for fixed k) to a random number of
  drafts per step, so it cannot reuse that kernel; it gives the expected number of verify steps by draft length.
* **Monte-Carlo** otherwise -- hf with ROC tuning (the threshold depends on every past draft's probability) and
  specdec on=token (a product of drafted tokens' probabilities): ``trials`` replays per sequence from keyed draws
  (fixed seed), with a batch-means interval over the trials.

A policy keeps drafting after a draft that verification will reject; the dump has no distribution for those
drafts, so the recorded positions' statistics stand in for them: this affects the draft counts (cost), never the
accepted tokens.  Hugging Face's ``heuristic`` schedule carries its cap across ``generate()`` calls; here every
recorded sequence starts from the configured cap (as ``heuristic_transient``, and as the first call), unless
``carry=True``: then the sequences are one assistant's successive calls in dump order (Monte-Carlo; the plain step
of the last token counts as HF's +2; a sequence that ended at EOS before its token budget is treated as if the
budget ended there).

Speed-up: wall time of a sequence = sum_n E[steps drafting n] x step_s(n) (:meth:`fastspec.costs.StepCost.step_s`,
the draft catching up on two tokens with the policy's overall all-accepted share), tokens = accepted + steps,
speed-up = (tokens / time) x plain step time; its interval combines the spread over prompts (ratio of totals,
prompts as clusters) with the cost table's standard errors (:func:`fastspec.simulation.speedup.speedup_interval`).
For fixed k this prices the shorter steps at the end of a sequence at their own length (and the catch-up with the
share of all-accepted steps of any length), so it can differ from ``simulate``'s speed-up, which prices every step at
k, by the share of such steps (about 1% on 64-token sequences); the mean acceptance length is the same.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import numpy as np

from .._kernels.codes import RULE_FIXED, RULE_SPECDEC, RULE_THRESHOLD
from .._kernels.policy import N_P, P_ACCEPTED, P_DRAFTED, P_STEPS, policy_dp, policy_mc
from .._numba.rng import seed_bits
from ..errors import InvalidInput, InvalidType
from ..params import SamplingParams
from ..policies import DraftPolicy, parse_policy
from ..stats import batch_means_ci, ratio_ci
from ..params import sampling_overrides
from .config import check_trials
from .policy_features import PolicyFeatures, policy_features
from .speedup import speedup_interval

__all__ = ["PolicyEstimate", "evaluate_policy", "evaluate_features", "check_policy_dump", "DEFAULT_POLICY_TRIALS",
           "POLICY_BATCHES", "step_costs"]

DEFAULT_POLICY_TRIALS = 200
#: the policy replays' cap on Monte-Carlo replays per sequence (fastspec.simulation.config.check_trials)
MAX_POLICY_TRIALS = 10 ** 6
POLICY_BATCHES = 20
METHODS = ("auto", "exact", "mc")


@dataclass
class PolicyEstimate:
    """Expected figures of one policy on one draft (module docstring).  Per-sequence arrays are [N]; the draft-length
    histograms are indexed by the number of drafts n (entry 0 unused)."""

    policy: str
    draft: str
    exact: bool
    method: str
    per_sequence_steps: np.ndarray = field(repr=False)
    per_sequence_drafted: np.ndarray = field(repr=False)
    per_sequence_accepted: np.ndarray = field(repr=False)
    per_sequence_draft_lengths: np.ndarray = field(repr=False)   # [N, nmax + 1]
    per_sequence_all_accepted: np.ndarray = field(repr=False)    # [N, nmax + 1]
    mc_ci95: tuple | None = None        # Monte-Carlo interval of the mean acceptance length (given the trajectories)
    mc_standard_error: float | None = None

    @property
    def per_sequence_tokens(self) -> np.ndarray:
        return self.per_sequence_accepted + self.per_sequence_steps

    @property
    def steps(self) -> float:
        return float(self.per_sequence_steps.sum())

    @property
    def drafted(self) -> float:
        return float(self.per_sequence_drafted.sum())

    @property
    def accepted(self) -> float:
        return float(self.per_sequence_accepted.sum())

    @property
    def draft_length_steps(self) -> np.ndarray:
        """Expected verify steps drafting n tokens, n = 0..nmax (summed over sequences)."""
        return self.per_sequence_draft_lengths.sum(axis=0)

    @property
    def draft_length_all_accepted(self) -> np.ndarray:
        """Of those, the expected steps whose every draft was accepted."""
        return self.per_sequence_all_accepted.sum(axis=0)

    @property
    def mean_acceptance_length(self) -> float:
        S = self.steps
        return 1.0 + self.accepted / S if S > 0 else 1.0

    @property
    def mean_draft_length(self) -> float:
        S = self.steps
        return self.drafted / S if S > 0 else 0.0

    @property
    def p_all_accepted(self) -> float:
        S = self.steps
        return float(self.draft_length_all_accepted.sum() / S) if S > 0 else 0.0

    @property
    def ci95_sequences(self) -> tuple | None:
        m, _, half = ratio_ci(self.per_sequence_tokens, self.per_sequence_steps)
        return (float(m - half), float(m + half)) if math.isfinite(half) else None

    def speedup(self, cost, draft: str | None = None) -> tuple[float | None, tuple | None]:
        """(speed-up, 95% interval over prompts and costs) under ``cost``: a :class:`fastspec.costs.StepCost`, a
        :class:`fastspec.costs.CostTable` (its entry for ``draft``, default this estimate's draft) or a simulator
        pricing (:mod:`fastspec.simulation.speedup`); (None, None) when the costs do not cover every draft length
        the policy uses."""
        got = step_costs(cost, draft or self.draft, self.per_sequence_draft_lengths.shape[1] - 1,
                         self.p_all_accepted, needed=np.flatnonzero(self.draft_length_steps > 0))
        if got is None:
            return None, None
        steps_cost, plain, rel_se = got
        time = self.per_sequence_draft_lengths @ steps_cost
        tok = self.per_sequence_tokens
        T = float(time.sum())
        if not T > 0:
            return None, None
        s = float(tok.sum()) / T * plain
        m, _, half = ratio_ci(tok, time)
        return s, speedup_interval(s, m, half, rel_se(self.draft_length_steps))

    def as_dict(self, cost=None) -> dict:
        out = {"policy": self.policy, "draft": self.draft, "exact": self.exact, "method": self.method,
               "steps": self.steps, "drafted": self.drafted, "accepted": self.accepted,
               "mean_acceptance_length": self.mean_acceptance_length,
               "ci95_sequences": list(self.ci95_sequences) if self.ci95_sequences else None,
               "mean_draft_length": self.mean_draft_length, "p_all_accepted": self.p_all_accepted,
               "draft_length_steps": self.draft_length_steps.tolist(),
               "draft_length_all_accepted": self.draft_length_all_accepted.tolist(),
               "mc_ci95": list(self.mc_ci95) if self.mc_ci95 else None, "mc_standard_error": self.mc_standard_error}
        if cost is not None:
            s, ci = self.speedup(cost)
            out["speedup"], out["speedup_ci95"] = s, (list(ci) if ci else None)
        return out


def _relative_se(loop, hist, p_all) -> float:
    """Relative standard error of (sum_n hist[n] step(n)) / plain from the table's standard errors, by the delta
    method with the conventions of :meth:`fastspec.costs.StepCost.relative_se` (which it equals when every step
    drafts the same n)."""
    t = loop.table
    dse = t.draft_forward_se.get(loop.draft, {})
    s1 = dse.get(1, 0.0)
    ns = [n for n in range(1, len(hist)) if hist[n] > 0]
    if not ns:
        return 0.0
    H = {n: float(hist[n]) for n in ns}
    total = sum(H[n] * loop.step_s(n, p_all) for n in ns)
    if loop.draft in t.one_call:
        var = (sum(H.values()) * s1) ** 2
    else:
        var = ((sum(H.values()) * p_all * dse.get(2, s1)) ** 2 + (sum(H.values()) * (1 - p_all) * s1) ** 2
               + (sum(H[n] * (n - 1) for n in ns) * s1) ** 2)
    var += sum((H[n] * t.target_forward_se.get(n + 1, 0.0)) ** 2 + (H[n] * t.overhead_se.get(n, 0.0)) ** 2
               for n in ns)
    plain = loop.plain_step_s()
    var_plain = t.target_forward_se.get(1, 0.0) ** 2 + t.overhead_se.get(0, 0.0) ** 2
    return math.sqrt(var / total ** 2 + var_plain / plain ** 2)


def step_costs(cost, draft, nmax, p_all, needed=None):
    """(cost of a step drafting n = 0..nmax [nmax + 1] (entry 0 unused), plain step cost, relative se as a function
    of the draft-length histogram) or None when ``cost`` does not price every n in ``needed``."""
    from ..costs import CostTable, StepCost
    from .speedup import FlagPricing, TablePricing

    needed = range(1, nmax + 1) if needed is None else [int(n) for n in needed if n > 0]
    out = np.zeros(nmax + 1)
    if isinstance(cost, CostTable):
        if draft not in cost.draft_forward_s:
            return None
        cost = StepCost(cost, draft)
    if isinstance(cost, TablePricing):
        cost = cost._loop(draft)
        if cost is None:
            return None
    if isinstance(cost, StepCost):
        try:
            for n in needed:
                out[n] = cost.step_s(n, p_all)
        except InvalidInput:
            return None

        def rel(hist, loop=cost):
            return _relative_se(loop, hist, p_all)

        return out, cost.plain_step_s(), rel
    if isinstance(cost, FlagPricing):
        try:
            for n in needed:
                out[n] = cost.model.step_cost(n)
        except InvalidInput:
            return None
        return out, 1.0, lambda _h: 0.0
    raise InvalidType(f"cost must be a StepCost, a CostTable or a simulator pricing, got {type(cost).__name__}")


def check_policy_dump(d, draft: str, policy: DraftPolicy, *, flag: str = "--policy") -> None:
    """InvalidInput when ``policy`` cannot be replayed on ``draft`` of dump ``d`` (n-gram draft, sparse dump)."""
    if draft not in d.drafts:
        need = "needs the draft's probabilities; an n-gram draft has none" if policy.needs_draft_probs else \
            "replays a model draft; use --k for an n-gram draft"
        raise InvalidInput(f"{flag} {policy.name}: {need} (the dump's model drafts: "
                           f"{', '.join(d.drafts) or 'none'})")
    if d.kind != "dense":
        if policy.needs_draft_probs:
            raise InvalidInput(f"{flag} {policy.name}: needs the draft's full distribution (the probability of the "
                               f"token it drafts, its max); {d.path} is a sparse top-k dump: dump dense logits")
        raise InvalidInput(f"{flag} {policy.name}: policies are replayed from dense dumps; for a sparse dump use "
                           f"--k {policy.k} (bounds)")


def _codes(policy: DraftPolicy):
    """(rule, on_token, theta, h, k0, heuristic, tune) of the kernels."""
    if policy.kind == "fixed":
        return RULE_FIXED, True, 0.0, 0.0, policy.k, False, False
    if policy.kind == "conf":
        return RULE_THRESHOLD, policy.on == "token", policy.theta, 0.0, policy.kmax, False, False
    if policy.kind == "specdec":
        return RULE_SPECDEC, policy.on == "token", 0.0, policy.h, policy.kmax, False, False
    heur = policy.schedule != "constant"
    rule = RULE_THRESHOLD if policy.theta > 0 else RULE_FIXED
    return rule, True, policy.theta, 0.0, policy.k, heur, policy.tune == "roc" and policy.theta > 0


def needed_thetas(policy: DraftPolicy, method: str = "auto") -> list[float]:
    """The on=token thresholds whose exact sums the exact DP of ``policy`` needs."""
    if _method(policy, method) != "exact":
        return []
    rule, on_token, theta, h, *_ = _codes(policy)
    return [theta] if rule == RULE_THRESHOLD and on_token and h == 0.0 else []


def _method(policy, method):
    if method not in METHODS:
        raise InvalidInput(f"method {method!r} is unknown; choose one of: {', '.join(METHODS)}")
    if method == "exact" and not policy.exact_replay:
        raise InvalidInput(f"{policy.name} has no exact replay (its state is not finite along a trajectory); use "
                           "method='mc'")
    return "exact" if method == "auto" and policy.exact_replay else ("mc" if method == "auto" else method)


def _nmax(policy, T):
    return max(1, min(policy.k_max if policy.kind != "hf" or policy.schedule == "constant" else T, T))


def _check_carry(policy, carry) -> bool:
    if not isinstance(carry, (bool, np.bool_)):
        raise InvalidType(f"carry must be True or False, got {type(carry).__name__}")
    if carry and not (policy.kind == "hf" and policy.schedule == "heuristic"):
        raise InvalidInput(f"carry: {policy.name} keeps nothing across generate() calls; only hf with "
                           "schedule=heuristic carries its cap (num_assistant_tokens) over")
    return bool(carry)


def evaluate_features(f: PolicyFeatures, policy, *, method: str = "auto", batches: int = POLICY_BATCHES,
                      progress=None, carry: bool = False) -> PolicyEstimate:
    """:class:`PolicyEstimate` of ``policy`` from the per-position features of one draft (module docstring).
    ``carry``: hf with schedule=heuristic only -- the sequences are one assistant's successive generate() calls in
    dump order, each starting from the cap the previous one ended with (Monte-Carlo)."""
    policy = parse_policy(policy, name="policy")
    carry = _check_carry(policy, carry)
    how = _method(policy, "mc" if carry else method)
    rule, on_token, theta, h, k0, heur, tune = _codes(policy)
    N, T = f.alpha.shape
    nmax = _nmax(policy, T)
    width = max(nmax, T) + 2
    tot = np.zeros((N, N_P))
    hist = np.zeros((N, width))
    hall = np.zeros((N, width))
    mc_ci = mc_se = None
    if how == "exact":
        if rule == RULE_FIXED:
            c, g = f.alpha, np.ones_like(f.alpha)
        elif on_token and h == 0.0:
            if theta not in f.c:
                raise InvalidInput(f"{policy.name}: the features lack the sums at theta = {theta} (pass it in thetas)")
            c, g = f.c[theta], f.g[theta]
        else:
            g = (f.qmax >= theta).astype(np.float64)
            c = f.alpha * g
        for n in range(N):
            L = int(f.lengths[n])
            policy_dp(f.alpha[n], c[n], g[n], f.qmax[n], h if rule == RULE_SPECDEC else 0.0, L, k0, heur, tot[n],
                      hist[n], hall[n])
            if progress is not None:
                progress(1)
        label = "exact DP"
    else:
        if f.qx is None:
            raise InvalidInput(f"{policy.name}: a Monte-Carlo replay needs draws (trials > 0)")
        trials = f.qx.shape[1]
        per_trial = np.zeros((N, trials, 2))
        cap = np.zeros(trials, np.int64)
        for n in range(N):
            L = int(f.lengths[n])
            if not carry:
                cap[:] = 0
            policy_mc(f.qx[n], f.acc[n], f.qmax[n], L, (rule, on_token, theta, h, k0, heur, tune), tot[n], hist[n],
                      hall[n], per_trial[n], cap)
            if progress is not None:
                progress(1)
        tot /= trials
        hist /= trials
        hall /= trials
        b = max(2, min(batches, trials))
        groups = np.array_split(np.arange(trials), b)
        num = [float(per_trial[:, gi, 1].sum() + per_trial[:, gi, 0].sum()) for gi in groups]
        den = [float(per_trial[:, gi, 0].sum()) for gi in groups]
        est, se, half = batch_means_ci(num, den, empty=1.0)
        if math.isfinite(half):
            mc_ci, mc_se = (float(est - half), float(est + half)), float(se)
        label = f"Monte-Carlo (trials={trials}, seed={f.seed}" + (
            ", cap carried across sequences in dump order)" if carry else ")")
    return PolicyEstimate(policy.name, f.draft, how == "exact", label, tot[:, P_STEPS].copy(),
                          tot[:, P_DRAFTED].copy(), tot[:, P_ACCEPTED].copy(), hist[:, :nmax + 1].copy(),
                          hall[:, :nmax + 1].copy(), mc_ci, mc_se)


def _open_dump(dump):
    from ..io.dump import DumpBase

    if isinstance(dump, DumpBase):
        return dump, False
    if not isinstance(dump, (str, bytes, os.PathLike)):
        raise InvalidType(f"dump must be a path or an open fastspec.io.Dump, got {type(dump).__name__}")
    from ..io import open_dump

    return open_dump(dump), True


def evaluate_policy(dump, draft: str | None, policy, *, sampling: SamplingParams | None = None, temperature=None,
                    top_k=None, top_p=None, min_p=None, trials: int = DEFAULT_POLICY_TRIALS, seed: int = 0,
                    progress=None, method: str = "auto", carry: bool = False) -> PolicyEstimate:
    """Expected figures of ``policy`` (a spec or :class:`fastspec.policies.DraftPolicy`) for ``draft`` (None: the dump's
    only draft) of a dense ``dump`` (path or open dump), by exact DP or Monte-Carlo (``method`` "auto": exact where
    the policy allows).  ``sampling``: None (the dump's recorded settings) or a SamplingParams; or single settings
    one by one (``temperature=`` etc., the others the dump's).  ``trials`` (Monte-Carlo replays per sequence, 2 to
    10**6) and ``seed`` key the draws.
    ``progress(n)``: positions read, then sequences replayed.  ``carry`` (hf with schedule=heuristic): replay the
    sequences as successive generate() calls of one assistant, the cap carried over (Monte-Carlo)."""
    from ..acceptance import resolve_sampling

    policy = parse_policy(policy, name="policy")
    how = _method(policy, "mc" if _check_carry(policy, carry) else method)
    trials = check_trials(trials, high=MAX_POLICY_TRIALS)
    seed_bits(seed)  # the typed check the verify functions use: an integer in [-2**63, 2**64)
    overrides = sampling_overrides(sampling, dict(temperature=temperature, top_k=top_k, top_p=top_p,
                                                               min_p=min_p))
    d, own = _open_dump(dump)
    try:
        if draft is None:
            if len(d.drafts) != 1:
                raise InvalidInput(f"draft: name one of the dump's drafts ({', '.join(d.drafts) or 'none'})")
            draft = d.drafts[0]
        check_policy_dump(d, draft, policy, flag="policy")
        sp = resolve_sampling(d, **overrides)
        f = policy_features(d, draft, sp, thetas=needed_thetas(policy, how), trials=trials if how == "mc" else 0,
                            seed=seed, progress=progress)
        return evaluate_features(f, policy, method=how, progress=progress, carry=carry)
    finally:
        if own:
            d.close()
