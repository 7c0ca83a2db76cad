"""One (draft, k) row of a simulation: exact expectation, Monte-Carlo replay and its interval, sparse bounds,
candidate/block variants, n-gram rows; each priced when costs are known.  Used by :func:`fastspec.simulate`."""
from __future__ import annotations

import math

import numpy as np

from ..acceptance import DraftAcceptance
from ..analysis import expected_tokens_closed_form, expected_tokens_per_step
from ..stats import batch_means_ci
from . import runners
from .ngram import ngram_replay
from .results import BLOCK_EXACT_REASON, DraftKResult
from .speedup import over_sequences, speedup_interval


class Context:
    """What every (draft, k) row of one simulation shares: the open dump, the plan
    (:class:`~fastspec.simulation.config.SimulatePlan`), the progress callback, and the replay's mode and pricing
    (a candidates row replays beta_t(w) in Bernoulli mode and prices it itself: :meth:`but`)."""

    def __init__(self, d, plan, progress=None, *, mode=None, cost=None, priced=True):
        self.d, self.plan, self.progress = d, plan, progress
        self.lengths = d.lengths.astype(np.int64)
        self.row_ids = np.arange(d.N, dtype=np.int64)
        self.mode = plan.mode if mode is None else mode
        self.cost = (plan.pricing if cost is None else cost) if priced else None
        self.trials, self.batches, self.seed, self.sp = plan.trials, plan.batches, plan.seed, plan.sampling
        self.block_trials, self.candidate_sampling = plan.block_trials, plan.candidate_sampling
        #: "sampled" or "argmax" (fastspec.simulation.argmax): how a model draft proposes, and how it is judged
        self.draft_mode = plan.draft_sampling

    def but(self, *, mode: str, priced: bool) -> "Context":
        """This context with another replay mode, priced or not."""
        return Context(self.d, self.plan, self.progress, mode=mode, cost=self.cost, priced=priced)

    def tick(self, n=1):
        if self.progress is not None:
            self.progress(n)


def _interval(mc, alpha, valid, exact=None):
    """(estimate, standard error, ci95 half-width) of the replay's tokens per step from its batches; the standard
    error and half-width are None when the batches cannot give an interval: fewer than two of them verified
    anything, or every batch gave the same estimate of a random process (too few trials for the spread to show).
    A zero spread is exact when nothing was drafted, when the estimate equals ``exact``, or when every alpha_t
    is 0 or 1 (no randomness)."""
    est, se, half = batch_means_ci(mc["tokens"], mc["steps"], empty=1.0)
    if se == 0 and mc["steps"].sum() > 0 and not (exact is not None and _same(est, exact)):
        a = alpha[valid]
        if not np.all((a == 0) | (a == 1)):
            se = math.inf
    return (est, se, half) if math.isfinite(se) else (est, None, None)


def _same(a, b) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(b))  # equal up to rounding (e.g. greedy: every batch identical)


def _mc_fields(mc, est, se, half):
    steps = int(mc["steps"].sum())
    drafted = int(mc["drafted"].sum())
    return dict(mean_acceptance_length=float(est),
                ci95=None if half is None else (float(est - half), float(est + half)),
                draft_acceptance_rate=float(mc["accepted"].sum() / drafted) if drafted else 0.0,
                per_position_acceptance=(mc["pos_accepted"] / max(steps, 1)).tolist(),
                accepted_length_histogram=(mc["hist"] / max(steps, 1)).tolist(),
                standard_error=None if se is None else float(se), verify_steps=steps)


def _agreement(mc, est, se, exact):
    """(z, threshold, agrees) of the MC estimate against the exact value; z and agrees are None without an
    interval."""
    bound = runners.agreement_threshold(max(1, int((mc["steps"] > 0).sum()) - 1))
    if se is None:
        return None, bound, None
    if _same(est, exact):
        z = 0.0
    else:
        z = (est - exact) / se if se > 0 else math.inf  # a deterministic replay that is wrong
    return float(z), bound, bool(abs(z) <= bound)


def token_row(ctx, name, acc, k) -> DraftKResult:
    """Token verification, one candidate: exact DP and a Monte-Carlo replay (or sparse bounds)."""
    valid, pricing = acc.valid, ctx.cost
    if not acc.exact:  # sparse: exact bounds only (the DP is monotone in every alpha_t)
        lo = expected_tokens_per_step(acc.lower, k, lengths=ctx.lengths)
        hi = expected_tokens_per_step(acc.upper, k, lengths=ctx.lengths)
        ctx.tick(len(ctx.lengths))
        m_lo, _, h_lo = over_sequences(lo)
        m_hi, _, h_hi = over_sequences(hi)
        seq_ci = (float(m_lo - h_lo), float(m_hi + h_hi)) if math.isfinite(h_lo) and math.isfinite(h_hi) else None
        res = DraftKResult(
            draft=name, k=k, alpha=None, mean_acceptance_length=None, ci95=None, mean_acceptance_length_exact=None,
            draft_acceptance_rate=None, per_position_acceptance=None, accepted_length_histogram=None, speedup=None,
            alpha_lower=float(acc.lower[valid].mean()), alpha_upper=float(acc.upper[valid].mean()),
            mean_acceptance_length_lower=lo.mean_acceptance_length,
            mean_acceptance_length_upper=hi.mean_acceptance_length, ci95_sequences=seq_ci, kind="bounds",
            draft_sampling=ctx.draft_mode)
        if pricing is not None:
            a_lo, a_hi = _all_accepted(lo, k), _all_accepted(hi, k)
            res.speedup_lower = pricing.speedup(name, lo.mean_acceptance_length, k, a_lo)
            res.speedup_upper = pricing.speedup(name, hi.mean_acceptance_length, k, a_hi)
            i_lo = speedup_interval(res.speedup_lower, m_lo, h_lo, pricing.relative_se(name, k, a_lo))
            i_hi = speedup_interval(res.speedup_upper, m_hi, h_hi, pricing.relative_se(name, k, a_hi))
            if i_lo is not None and i_hi is not None:
                res.speedup_ci95 = (i_lo[0], i_hi[1])
        return res
    alpha = acc.alpha
    ex = expected_tokens_per_step(alpha, k, lengths=ctx.lengths)
    if ctx.mode == "bernoulli":
        mc = runners.bernoulli(alpha, ctx.lengths, ctx.row_ids, k, ctx.trials, ctx.batches, ctx.seed,
                               progress=ctx.progress)
    else:
        mc = runners.token_replay(ctx.d, name, alpha, k, ctx.trials, ctx.batches, ctx.seed, ctx.sp, ctx.progress,
                                  argmax=ctx.draft_mode == "argmax")
    est, se, half = _interval(mc, alpha, valid, ex.mean_acceptance_length)
    z, bound, agrees = _agreement(mc, est, se, ex.mean_acceptance_length)
    a_mean = float(alpha[valid].mean())
    closed = expected_tokens_closed_form(a_mean, k)
    m, se_m, half_m = over_sequences(ex)
    ok = math.isfinite(half_m)
    p_all = _all_accepted(ex, k)
    s = pricing.speedup(name, ex.mean_acceptance_length, k, p_all) if pricing else None
    return DraftKResult(
        draft=name, k=k, alpha=a_mean, mean_acceptance_length_exact=ex.mean_acceptance_length,
        draft_sampling=ctx.draft_mode,
        speedup=s, mc_vs_exact_z=z, mc_agrees_with_exact=agrees, mc_vs_exact_threshold=bound,
        draft_acceptance_rate_exact=ex.draft_acceptance_rate,
        per_position_acceptance_exact=ex.per_position_acceptance.tolist(),
        mean_acceptance_length_closed_form=closed,
        speedup_closed_form=pricing.speedup(name, closed, k, a_mean ** k) if pricing else None,
        token_check=mc.get("token_check"), ci95_sequences=(float(m - half_m), float(m + half_m)) if ok else None,
        standard_error_sequences=float(se_m) if ok else None, p_all_accepted=p_all,
        speedup_ci95=speedup_interval(s, m, half_m, pricing.relative_se(name, k, p_all)) if pricing else None,
        **_mc_fields(mc, est, se, half))


def _all_accepted(stats, k) -> float:
    """Expected share of verify steps that accepted every draft (the last draft position's acceptance; a step near
    the end that drafted fewer than k counts as not)."""
    return float(stats.per_position_acceptance[k - 1]) if stats.steps > 0 else 0.0


def variant_row(ctx, name, acc, k, verify, w, betas) -> DraftKResult:
    """One (draft, k) row for block verification or w > 1 candidates per position."""
    pricing = ctx.cost
    if verify == "token":
        # beta_t(w) replaces alpha_t: each position is drafted at most once and its w candidates are fresh, so
        # acceptance at t is an independent Bernoulli(beta_t(w)) and the DP and the Bernoulli replay apply unchanged.
        if w not in betas:
            betas[w] = runners.candidate_beta(ctx.d, name, ctx.sp, w, ctx.candidate_sampling, acc.valid)
        beta_ctx = ctx.but(mode="bernoulli", priced=False)
        res = token_row(beta_ctx, name, DraftAcceptance(name, acc.valid, alpha=betas[w]), k)
        res.verify, res.candidates, res.candidate_sampling, res.kind = "token", w, ctx.candidate_sampling, "candidates"
        res.mc_method = f"bernoulli replay of beta_t({w}) (exact per-position acceptance of {w} candidates)"
        if pricing is not None:  # a tree of k*w drafted nodes: k draft forwards (one per depth), k*w verified
            res.speedup = pricing.tree_speedup(name, res.mean_acceptance_length_exact, k, w)
            if res.ci95_sequences is not None:
                m = res.mean_acceptance_length_exact
                res.speedup_ci95 = speedup_interval(res.speedup, m, res.ci95_sequences[1] - m,
                                                    pricing.relative_se(name, k))
        res.mean_acceptance_length_closed_form = None
        return res
    bt = ctx.block_trials
    nb = min(ctx.batches, bt)
    mc = runners.token_replay(ctx.d, name, acc.alpha, k, bt, nb, ctx.seed, ctx.sp, ctx.progress, method="block")
    est, se, half = _interval(mc, acc.alpha, acc.valid)
    # no exact figure to compare with; the token-verification row of the same (draft, k) is the reference
    return DraftKResult(
        draft=name, k=k, alpha=float(acc.alpha[acc.valid].mean()), mean_acceptance_length_exact=None,
        draft_sampling=ctx.draft_mode,
        speedup=(pricing.speedup(name, float(est), k, float(mc["hist"][k] / max(int(mc["steps"].sum()), 1)))
                 if pricing else None), verify="block", candidates=1, kind="block",
        exact_reason=BLOCK_EXACT_REASON,
        mc_method=f"{bt} replays per sequence through verify_logits(method='block') (real drafted tokens)",
        **_mc_fields(mc, est, se, half))


def ngram_rows(ctx, name, proposer, ks) -> list[DraftKResult]:
    """The n-gram draft's rows: exact expectations of the step-dependent replay (no Monte-Carlo)."""
    rows = []
    for r in ngram_replay(ctx.d, proposer, ks, ctx.sp, ctx.cost):
        rows.append(DraftKResult(
            draft=name, k=r["k"], alpha=None, mean_acceptance_length=r["mean_acceptance_length_exact"], ci95=None,
            mean_acceptance_length_exact=r["mean_acceptance_length_exact"],
            draft_acceptance_rate=r["draft_acceptance_rate_exact"],
            per_position_acceptance=r["per_position_acceptance_exact"], accepted_length_histogram=None,
            speedup=r["speedup"], draft_acceptance_rate_exact=r["draft_acceptance_rate_exact"],
            per_position_acceptance_exact=r["per_position_acceptance_exact"],
            verify_steps=None, exact_reason=None,
            mc_method="none: the n-gram replay is computed exactly (dynamic programming over step starts)",
            ci95_sequences=tuple(r["ci95_sequences"]) if r["ci95_sequences"] else None,
            standard_error_sequences=r["standard_error_sequences"],
            speedup_ci95=tuple(r["speedup_ci95"]) if r["speedup_ci95"] else None,
            p_all_accepted=r["p_all_accepted"], plain_steps=r["plain_steps"],
            tokens_per_target_forward=r["tokens_per_target_forward"], off_record=r["off_record"], kind="ngram"))
    ctx.tick(ctx.d.N)
    return rows
