"""What-if analysis of draft models from logit dumps: Monte-Carlo and exact.

:func:`simulate` answers "how many tokens per verify step, and how much faster, would this draft give this target
under this sampling config?" offline.  ``fastspec.simulate`` is this module and is also callable:
``fastspec.simulate(dump, k=4)`` is ``fastspec.simulate.simulate(dump, k=4)``.

Method (trajectory replay).  The dump records, for each sequence, the target's and each draft's distribution at
every position of one sampled trajectory.  fastspec computes the per-position acceptance rate
alpha_t = sum_v min(p_t, q_t) after applying the requested sampling config to both models
(:func:`fastspec.acceptance.dump_acceptance`) and replays speculative decoding along the recorded contexts:

* ``mode="bernoulli"`` (default): each drafted position t is accepted with probability alpha_t (a counter-based
  uniform per (seed, sequence, trial, position)).  Fast: hundreds of millions of draft positions per second.
* ``mode="token"``: real tokens through fastspec's own verifier -- draft tokens sampled from q_t, acceptance and
  recovered/bonus sampling by :func:`fastspec.verify_logits` -- so the shipped kernel is exercised on the
  user's distributions.  Its acceptance frequency over judged positions is compared with the alpha_t of those
  positions (``token_check``).

Both are compared with the exact expectation of the same process (:func:`fastspec.analysis.
expected_tokens_per_step`, dynamic programming).  End of sequence: a step at t drafts ``min(k, L - 1 - t)``
tokens; a step that would draft nothing is a plain target step and is not counted.

Uncertainty.  ``ci95`` is a batch-means interval for the Monte-Carlo estimate: the trials are split into
``batches`` independent groups, each replaying every sequence; the interval is the ratio-of-totals estimate
+- t_{0.975, batches-1} times the standard error of the batch estimates.  It is Monte-Carlo uncertainty *given
the recorded trajectories*, not uncertainty over prompts.  The MC estimate and the exact value are flagged as
disagreeing when they are more than 4 standard errors apart: that means a bug or too few trials.

Sparse dumps.  Only an interval [lower_t, upper_t] containing alpha_t is known.  The exact mean acceptance
length is non-decreasing in every alpha_t, so the DP evaluated at the lower and upper ends bounds the true
value.  Proof sketch (one coin u_t per position, accept iff u_t <= alpha_t, so raising alpha only turns failures
into successes): the next start ``nxt(t) = t + 1 + min(run(t), d(t))`` (run = consecutive successes from t,
d(t) = min(k, L-1-t)) is non-decreasing in t and in the success set, so after every m steps the position with
more successes is at least as far; hence it needs no more verify steps S, and the emitted tokens A + S lie in
{L-1, L} with A + S = L-1 only when it also saved a step.  With E[A+S] >= E[S], (E[A+S] - q)/(E[S] - q) >=
E[A+S]/E[S] for the saved mass q, per sequence and for the ratio of totals.  (The draft acceptance rate has no
such guarantee and is not bounded.)

Assumptions to keep in mind: contexts follow the recorded sequences (when the requested sampling config
differs from the one the trajectories were sampled with, a warning says so); this is an offline estimate, not a
deployment measurement.
"""
from __future__ import annotations

import math
import os
import sys
import types
from typing import Callable

import numpy as np

from .._numba.rng import seed_bits
from ..acceptance import DraftAcceptance, alpha_summary, dump_acceptance, resolve_sampling
from ..analysis import expected_tokens_closed_form, expected_tokens_per_step
from ..config import AGREEMENT_Z, DEFAULT_BATCHES
from ..errors import InvalidInput
from ..stats import batch_means_ci
from . import runners
from .config import MODES, block_trials as _block_trials, check_trials, parse_k_list, variants as _variants
from .costs import CostModel, VerifyCost
from .results import (ASSUMPTIONS, BLOCK_EXACT_REASON, VARIANT_ASSUMPTIONS, DraftKResult, SimulationResult,
                      sampling_warnings)

__all__ = ["simulate", "VerifyCost", "CostModel", "parse_k_list", "DraftKResult", "SimulationResult",
           "batch_means_ci", "MODES", "AGREEMENT_Z", "VERIFY_METHODS", "CANDIDATE_SAMPLING"]

VERIFY_METHODS = ("token", "block")
CANDIDATE_SAMPLING = ("iid", "deterministic")


def _check_int(name, v, lo, hi=None):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise InvalidInput(f"{name} = {v!r} is invalid: give an integer")
    if v < lo or (hi is not None and v > hi):
        rng = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise InvalidInput(f"{name} = {v!r} is invalid: give an integer {rng}")
    return int(v)


def _cost_model(draft_cost, verify_cost, ks):
    if draft_cost is None and verify_cost is None:
        return None
    c = 0.0 if draft_cost is None else float(draft_cost)
    if not (math.isfinite(c) and c >= 0):
        raise InvalidInput(f"draft_cost = {draft_cost!r} must be a finite number >= 0 (one draft forward relative "
                           "to one target forward)")
    cost = CostModel(c, VerifyCost.parse(verify_cost))
    for kk in ks:
        cost.step_cost(kk)  # table coverage and positivity, before any heavy work
    return cost


def _open(dump, client, verify_integrity):
    """(dump object, whether we opened it)."""
    if hasattr(dump, "iter_chunks"):
        return dump, False
    if client is not None or os.path.isdir(os.fspath(dump)):  # a directory of shards / a Dask client
        from ..shards import load_any

        return load_any(dump, client=client, verify_integrity=verify_integrity), True
    from ..io import load_dump

    return load_dump(dump, verify_integrity=verify_integrity), True


def simulate(dump, *, k=4, drafts=None, temperature=None, top_k=None, top_p=None, min_p=None,
             mode: str = "bernoulli", trials: int | None = None, seed: int = 0, draft_cost=None,
             verify_cost=None, batches: int = DEFAULT_BATCHES, progress: Callable[[int], None] | None = None,
             progress_total: Callable[[int], None] | None = None, client=None, verify="token", candidates=1,
             candidate_sampling: str = "iid", block_trials: int | None = None,
             verify_integrity: bool = True) -> SimulationResult:
    """Simulate speculative decoding of each draft in ``dump`` against its target, for each k.

    ``dump``: a path (a dump, or a directory of shards) or an open :class:`fastspec.io.Dump`.  ``k``: an int, a
    list, or ``"1-8"`` / ``"1,2,4"``.  Sampling settings default to the dump's recorded metadata.  ``mode``:
    "bernoulli" or "token" (module docstring).  ``trials``: replays per sequence (default 200 in Bernoulli mode,
    4 in token mode), rounded up to a multiple of ``batches``.  ``draft_cost`` (c, one draft forward relative
    to one target forward) and ``verify_cost`` (:meth:`VerifyCost.parse`) define the cost model; without
    either, ``speedup`` is None.  ``client``: a ``dask.distributed.Client`` for the alpha pass.  ``verify``,
    ``candidates``, ``candidate_sampling``, ``block_trials``: verification variants reported side by side.
    ``verify_integrity``: a dump opened from a path checks the CRC-32 of its stored ``.npz`` members as they are
    read (default); False skips that (an open dump keeps the setting it was loaded with).
    """
    ks = parse_k_list(k)
    variant_list = _variants(verify, candidates, candidate_sampling)
    trials = check_trials(trials, mode)
    seed = seed_bits(seed)
    batches = _check_int("batches", batches, 2)
    batches = min(batches, trials)
    trials = int(-(-trials // batches) * batches)
    bt = _block_trials(block_trials, batches)
    cost = _cost_model(draft_cost, verify_cost, ks)
    d, own = _open(dump, client, verify_integrity)
    try:
        names = d.drafts if not drafts else tuple(drafts)
        for name in names:
            if name not in d.drafts:
                raise InvalidInput(f"{d.path}: no draft named {name!r}; the dump holds {', '.join(d.drafts)}")
        if mode == "token" and d.kind != "dense":
            raise InvalidInput(f"{d.path}: token mode needs dense logits; this dump is sparse top-k (the "
                               "Bernoulli mode reports alpha bounds)")
        sp = resolve_sampling(d, temperature, top_k, top_p, min_p)
        extra = [v for v in variant_list if v != ("token", 1)]
        if extra and (d.kind != "dense" or not hasattr(d, "iter_chunks") or not hasattr(d, "arrays")):
            what = " and ".join(sorted({"block verification" if v == "block" else "candidates > 1" for v, _ in extra}))
            raise InvalidInput(f"{d.path}: {what} needs the full target and draft distributions (dense logits); "
                               "this dump is sparse top-k: use token verification with one candidate, or a dense "
                               "dump")
        if hasattr(d, "acceptance"):  # e.g. a sharded dump computing alpha on a cluster
            accs = d.acceptance(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=names)
        else:
            accs = dump_acceptance(d, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=names)
        lengths = d.lengths.astype(np.int64)
        row_ids = np.arange(d.N, dtype=np.int64) + int(getattr(d, "row_offset", 0))
        config = {"k": ks, "drafts": list(names), "temperature": sp.temperature, "top_k": sp.top_k,
                  "top_p": sp.top_p, "min_p": sp.min_p, "mode": mode, "trials": trials, "batches": batches,
                  "seed": int(seed), "draft_cost": cost.draft_cost if cost else None,
                  "verify_cost": cost.verify.describe() if cost else None, "sequences": int(d.N),
                  "positions": int(lengths.sum()), "vocab_size": d.V, "dump_kind": d.kind}
        if extra:
            config["variants"] = [{"verify": v, "candidates": w} for v, w in variant_list]
            config["candidate_sampling"] = candidate_sampling
            config["block_trials"] = bt if ("block", 1) in variant_list else None
        if progress_total is not None:
            per_row = {"block": d.N, "token": d.N if mode == "token" else 1}
            progress_total(len(names) * len(ks) * sum(per_row["block"] if v == "block" else
                                                      (per_row["token"] if w == 1 else 1) for v, w in variant_list))
        ctx = _Context(d, lengths, row_ids, mode, trials, batches, seed, cost, sp, progress, bt, candidate_sampling)
        results: list[DraftKResult] = []
        summaries = {}
        for name in names:
            acc = accs[name]
            summaries[name] = (alpha_summary(acc.alpha, acc.valid) if acc.exact else
                               {"lower": alpha_summary(acc.lower, acc.valid),
                                "upper": alpha_summary(acc.upper, acc.valid)})
            betas: dict = {}
            for kk in ks:
                for v, w in variant_list:
                    if (v, w) == ("token", 1):
                        results.append(_one(ctx, name, acc, kk))
                    else:
                        results.append(_variant_row(ctx, name, acc, kk, v, w, betas))
        best = _best(results, names, cost)
        shown = [a for a, on in (("candidates", any(w > 1 for _, w in variant_list)),
                                 ("block", ("block", 1) in variant_list)) if on]
        assumptions = list(ASSUMPTIONS) + [VARIANT_ASSUMPTIONS[a] for a in shown]
        return SimulationResult(d.path, config, results, best, sampling_warnings(d.metadata, sp), summaries,
                                assumptions)
    finally:
        if own:
            d.close()


class _Context:
    """What every (draft, k) row of one simulation shares."""

    def __init__(self, d, lengths, row_ids, mode, trials, batches, seed, cost, sp, progress, block_trials,
                 candidate_sampling):
        self.d, self.lengths, self.row_ids, self.mode = d, lengths, row_ids, mode
        self.trials, self.batches, self.seed, self.cost, self.sp = trials, batches, seed, cost, sp
        self.progress, self.block_trials, self.candidate_sampling = progress, block_trials, candidate_sampling

    def tick(self, n=1):
        if self.progress is not None:
            self.progress(n)


def _best(results, names, cost):
    best = {}
    for name in names:
        rows = [r for r in results if r.draft == name]
        base = [r for r in rows if r.verify == "token" and r.candidates == 1]
        rows = base or [r for r in rows if r.speedup is not None] or rows  # best k: token verification rows
        if cost is None:
            best[name] = None
        else:
            key = (lambda r: r.speedup) if rows[0].speedup is not None else (lambda r: r.speedup_lower)
            best[name] = max(rows, key=lambda r: (key(r), -r.k)).k
    return best


def _mc_fields(mc, est, se, half):
    steps = int(mc["steps"].sum())
    drafted = int(mc["drafted"].sum())
    return dict(mean_acceptance_length=float(est), ci95=(float(est - half), float(est + half)),
                draft_acceptance_rate=float(mc["accepted"].sum() / drafted) if drafted else 0.0,
                per_position_acceptance=(mc["pos_accepted"] / max(steps, 1)).tolist(),
                accepted_length_histogram=(mc["hist"] / max(steps, 1)).tolist(), standard_error=float(se),
                verify_steps=steps)


def _one(ctx, name, acc, k) -> DraftKResult:
    """Token verification, one candidate: exact DP and a Monte-Carlo replay (or sparse bounds)."""
    valid, cost = acc.valid, ctx.cost
    if not acc.exact:  # sparse: exact bounds only (the DP is monotone in every alpha_t)
        lo = expected_tokens_per_step(acc.lower, k, lengths=ctx.lengths)
        hi = expected_tokens_per_step(acc.upper, k, lengths=ctx.lengths)
        ctx.tick()
        res = DraftKResult(
            draft=name, k=k, alpha=None, mean_acceptance_length=None, ci95=None, mean_acceptance_length_exact=None,
            draft_acceptance_rate=None, per_position_acceptance=None, accepted_length_histogram=None, speedup=None,
            alpha_lower=float(acc.lower[valid].mean()), alpha_upper=float(acc.upper[valid].mean()),
            mean_acceptance_length_lower=lo.mean_acceptance_length,
            mean_acceptance_length_upper=hi.mean_acceptance_length)
        if cost is not None:
            res.speedup_lower = cost.speedup(lo.mean_acceptance_length, k)
            res.speedup_upper = cost.speedup(hi.mean_acceptance_length, k)
        return res
    alpha = acc.alpha
    ex = expected_tokens_per_step(alpha, k, lengths=ctx.lengths)
    if ctx.mode == "bernoulli":
        mc = runners.bernoulli(alpha, ctx.lengths, ctx.row_ids, k, ctx.trials, ctx.batches, ctx.seed)
        ctx.tick()
    else:
        mc = runners.token_replay(ctx.d, name, alpha, k, ctx.trials, ctx.batches, ctx.seed, ctx.sp, ctx.progress)
    est, se, half = batch_means_ci(mc["tokens"], mc["steps"], empty=1.0)
    diff = est - ex.mean_acceptance_length
    if abs(diff) <= 1e-9 * max(1.0, abs(ex.mean_acceptance_length)):
        z = 0.0  # equal up to rounding (e.g. greedy: every batch identical, standard error ~1e-16)
    else:
        z = diff / se if se > 0 and math.isfinite(se) else math.inf
    a_mean = float(alpha[valid].mean())
    closed = expected_tokens_closed_form(a_mean, k)
    return DraftKResult(
        draft=name, k=k, alpha=a_mean, mean_acceptance_length_exact=ex.mean_acceptance_length,
        speedup=cost.speedup(ex.mean_acceptance_length, k) if cost else None,
        mc_vs_exact_z=float(z), mc_agrees_with_exact=bool(abs(z) <= AGREEMENT_Z),
        draft_acceptance_rate_exact=ex.draft_acceptance_rate,
        per_position_acceptance_exact=ex.per_position_acceptance.tolist(),
        mean_acceptance_length_closed_form=closed,
        speedup_closed_form=cost.speedup(closed, k) if cost else None,
        token_check=mc.get("token_check"), **_mc_fields(mc, est, se, half))


def _variant_row(ctx, name, acc, k, verify, w, betas) -> DraftKResult:
    """One (draft, k) row for block verification or w > 1 candidates per position."""
    cost = ctx.cost
    if verify == "token":
        # beta_t(w) replaces alpha_t: each position is drafted at most once and its w candidates are fresh, so
        # acceptance at t is an independent Bernoulli(beta_t(w)) and the DP and the Bernoulli replay apply unchanged.
        if w not in betas:
            betas[w] = runners.candidate_beta(ctx.d, name, ctx.sp, w, ctx.candidate_sampling, acc.valid)
        beta_ctx = _Context(ctx.d, ctx.lengths, ctx.row_ids, "bernoulli", ctx.trials, ctx.batches, ctx.seed, cost,
                            ctx.sp, ctx.progress, ctx.block_trials, ctx.candidate_sampling)
        res = _one(beta_ctx, name, DraftAcceptance(name, acc.valid, alpha=betas[w]), k)
        res.verify, res.candidates, res.candidate_sampling = "token", w, ctx.candidate_sampling
        res.mc_method = f"bernoulli replay of beta_t({w}) (exact per-position acceptance of {w} candidates)"
        if cost is not None:
            try:  # a tree of k*w drafted nodes: k draft forwards (one per depth), verify cost of k*w positions
                res.speedup = res.mean_acceptance_length_exact / (k * cost.draft_cost + cost.verify(k * w))
                res.speedup_closed_form = None
            except InvalidInput:
                res.speedup = None
        res.mean_acceptance_length_closed_form = None
        return res
    bt = ctx.block_trials
    nb = min(ctx.batches, bt)
    mc = runners.token_replay(ctx.d, name, acc.alpha, k, bt, nb, ctx.seed, ctx.sp, ctx.progress, method="block")
    est, se, half = batch_means_ci(mc["tokens"], mc["steps"], empty=1.0)
    # no exact figure to compare with; the token-verification row of the same (draft, k) is the reference
    return DraftKResult(
        draft=name, k=k, alpha=float(acc.alpha[acc.valid].mean()), mean_acceptance_length_exact=None,
        speedup=cost.speedup(float(est), k) if cost else None, verify="block", candidates=1,
        exact_reason=BLOCK_EXACT_REASON,
        mc_method=f"{bt} replays per sequence through verify_logits(method='block') (real drafted tokens)",
        **_mc_fields(mc, est, se, half))


class _CallableModule(types.ModuleType):
    """``fastspec.simulate`` is this module and also the function (``fastspec.simulate(dump, k=4)``)."""

    def __call__(self, *args, **kwargs):
        return simulate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
