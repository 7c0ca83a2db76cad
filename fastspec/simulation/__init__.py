"""What-if analysis of draft models from logit dumps: Monte-Carlo and exact.

:func:`simulate` (``fastspec.simulate``) answers "how many tokens per verify step, and how much faster, would this
draft give this target under this sampling config?" offline; :class:`SimulateConfig` is what to simulate, as the caller
gave it, and :class:`SimulatePlan` how (the config resolved against the dump).  :func:`simulate` runs in named stages:
open the dump, resolve the plan (drafts, sampling, costs), the acceptance pass, the replays (:mod:`.rows`,
:mod:`.runners`), the policies, then pricing (best k, verdict, serving batch sizes) and the result.

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

Uncertainty. ``ci95`` is a batch-means interval for the Monte-Carlo estimate: the trials are split into ``batches``
independent groups (Monte-Carlo batches of trials; the serving batch sizes are ``batch_sizes``), each replaying
every sequence; the interval is the ratio-of-totals estimate +- t_{0.975, batches-1} times the standard error of the
batch estimates. It is Monte-Carlo uncertainty *given the recorded trajectories*, not uncertainty over prompts. The
MC estimate and the exact value are flagged as disagreeing (``mc_agrees_with_exact`` False) when z = (MC - exact) /
standard error exceeds, in absolute value, ``mc_vs_exact_threshold``: the two-sided Student-t quantile with
(batches - 1) degrees of freedom at the false-alarm probability :data:`AGREEMENT_FALSE_ALARM` (1e-4 per check: 4.90
with the default 20 batches, 28.0 with 4); the token-mode acceptance check is judged at the same probability against
the normal (3.89). A correct replay fails a check with that probability; a replay that under-accepts by 3% is
flagged by the defaults on the 12 sequences of data/synthetic_pair.npz. Two batches (``trials >= 2``) are the
minimum. When every batch gives the same estimate of a random process (too few trials for the spread to show), no
interval is reported (``ci95``, ``standard_error`` and ``mc_vs_exact_z`` are None), the agreement is not checked
(None) and a warning says so; a process without randomness (every alpha_t 0 or 1, e.g. greedy) has an exact
zero-width interval.

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
The page that explains it: ``docs/guide/simulate.md``.
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from ..acceptance import alpha_summary, dump_acceptance
from ..config import AGREEMENT_FALSE_ALARM
from ..errors import InvalidInput, InvalidType
from ..io import open_dump
from ..io.dump import DumpBase
from ..methods import VERIFICATION_METHODS
from ..stats import batch_means_ci
from .argmax import argmax_acceptance
from .config import (DRAFT_SAMPLING, MODES, SIMULATED_SAMPLING, SimulateConfig, SimulatePlan, ngram_argmax_message,
                     ngram_variants_message, parse_k_list)
from ..costs.relative import CostModel, VerifyCost
from .ngram import NGRAM_ASSUMPTION
from .policy_eval import PolicyEstimate, evaluate_policy
from .policy_rows import POLICY_ASSUMPTION, check_policy_drafts, policy_rows
from .policy_search import PolicySearch, PolicySearchConfig, search_policies
from .results import (ARGMAX_ASSUMPTION, ASSUMPTIONS, SPEEDUP_ASSUMPTIONS, VARIANT_ASSUMPTIONS, DraftKResult,
                      SimulationResult, sampling_warnings)
from .rows import Context, ngram_rows, token_row, variant_row
from .speedup import FlagPricing, TablePricing, best_overall, best_per_draft, verdict

__all__ = ["simulate", "SimulateConfig", "SimulatePlan", "VerifyCost", "CostModel", "parse_k_list", "DraftKResult",
           "SimulationResult", "batch_means_ci", "MODES", "AGREEMENT_FALSE_ALARM", "VERIFY_METHODS",
           "SIMULATED_SAMPLING", "DRAFT_SAMPLING", "evaluate_policy", "search_policies", "PolicyEstimate",
           "PolicySearch", "PolicySearchConfig"]

#: the verification methods the simulator replays: the registry's (:data:`fastspec.methods.VERIFICATION_METHODS`)
VERIFY_METHODS = tuple(VERIFICATION_METHODS)


def simulate(dump, config: SimulateConfig | None = None, *, client=None,
             progress: Callable[[int], None] | None = None, progress_total: Callable[[int], None] | None = None,
             verify_integrity: bool = True, **settings) -> SimulationResult:
    """Simulate speculative decoding of each draft in ``dump`` against its target, for each k.

    ``dump``: a path (a dump, or a directory of shards) or an open :class:`fastspec.io.Dump`.  ``k``: an int, a
    list, or ``"1-8"`` / ``"1,2,4"``.  Sampling settings (``sampling``: a :class:`fastspec.params.SamplingParams`,
    or ``temperature``, ``top_k``, ``top_p``, ``min_p`` one by one) default to the dump's recorded metadata.
    ``mode``: "bernoulli" or "token" (module docstring).  ``drafts``: names (a repeated name counts once); default
    every draft.  ``trials``: replays per sequence, from 2 to 10**7 (default 200 in Bernoulli mode, 20 in token
    mode), rounded up to a multiple of ``batches`` (the Monte-Carlo batches of trials, 2 to 1000, at most
    ``trials``).  ``draft_cost`` (c, one draft forward relative to one target forward) and ``verify_cost``
    (:meth:`VerifyCost.parse`) define a relative cost model and override ``costs``: a
    :class:`fastspec.costs.CostTable` of measured seconds (or its JSON mapping, or a path); ``costs=None`` takes
    the dump's recorded table when it has one, ``costs=False`` none.  Without any, ``speedup`` is None.  A draft
    named ``ngram``, ``ngramMIN-MAX``, ``ngram.vllm``, ``ngram.hf`` ... (the grammar in :mod:`fastspec.ngram`), or an
    :class:`fastspec.ngram.NgramProposer` (its own ``k`` is replaced by each simulated k), is the prompt-lookup
    proposer, replayed from the dump's prompt and generated tokens (:mod:`fastspec.simulation.ngram`); a
    target-only dump with prompt tokens simulates ``ngram`` by default.  ``draft_sampling``: "sampled" (default:
    drafts x ~ q, judged with q) or "argmax" (each model draft proposes its top-1 token, judged with a one-hot q,
    as vLLM V1: acceptance p_t(argmax q_t); :mod:`fastspec.simulation.argmax`); with w candidates, argmax drafts
    are the top-w draft tokens (the same as ``candidate_sampling="deterministic"``, which implies argmax drafts at
    every w).  ``client``: a ``dask.distributed.Client`` for the alpha pass.  ``policies``: draft-length policies
    (``"conf:theta=0.4,kmax=8"``, ... :data:`fastspec.policies.POLICY_GRAMMAR`) replayed on every model draft of a
    dense dump, as ``result.policies`` (rows of kind "policy": exact DP or Monte-Carlo with ``trials`` replays,
    :mod:`fastspec.simulation.policy_eval`).  ``batch_sizes``: serving batch sizes (``"1,2,4,8"``): the result's
    ``batch`` (:mod:`fastspec.simulation.batch`), from a cost table with those batch sizes (``costs`` or the
    dump's; ``batch_extrapolate``: read missing ones off a line through the nearest measured two).
    ``verify``, ``candidates``, ``candidate_sampling``, ``block_trials`` (2 to 10**7 replays per sequence):
    verification variants reported side by side.  ``progress_total(n)`` is called once with the units of work
    and ``progress(n)`` as n more are done (a unit: one replay of one sequence; a Bernoulli row, an n-gram draft
    and the alpha pass count one per sequence).  ``verify_integrity``: a dump opened from a path checks the
    CRC-32 of its stored ``.npz`` members as they are read (default); False skips that (an open dump keeps the
    setting it was loaded with).
    The settings are a :class:`SimulateConfig` (``config``) or its fields as keyword arguments (``k=4``,
    ``temperature=0.7``, ...; not both); the run-time arguments (``client``, the progress callbacks,
    ``verify_integrity``) are not part of it.  Every argument is checked before the dump is read.
    """
    config = _config(config, settings)
    progress, progress_total = _check_callback("progress", progress), _check_callback("progress_total", progress_total)
    d, own = _open(dump, client, verify_integrity)
    try:
        plan = _plan(d, config)
        if progress_total is not None:
            progress_total(_progress_total(d, plan))
        accs = _acceptance(d, plan, _sequence_ticks(progress, d.T))
        ctx = Context(d, plan, progress)
        results, summaries = _replay(ctx, accs)
        prows = (policy_rows(d, plan.model_drafts, plan.policies, plan.sampling, plan.trials, plan.seed, plan.pricing,
                             progress) if plan.policies else [])
        return _price(_result(d, plan, results, summaries, prows))
    finally:
        if own:
            d.close()


# ------------------------------------------------------------------ the stages


def _config(config, settings) -> SimulateConfig:
    """The settings as a :class:`SimulateConfig`: ``config``, or built from the keyword arguments (not both)."""
    if config is None:
        return SimulateConfig.from_kwargs(**settings)
    if not isinstance(config, SimulateConfig):
        raise InvalidType(f"config must be a SimulateConfig or None, got {type(config).__name__}")
    if settings:
        raise InvalidInput(f"give the settings either as config= or as keyword arguments ({', '.join(settings)}), "
                           "not both")
    return config


def _open(dump, client, verify_integrity):
    """(dump object, whether we opened it)."""
    if isinstance(dump, DumpBase):
        return dump, False
    if not isinstance(dump, (str, bytes, os.PathLike)):
        raise InvalidType(f"dump must be a path or an open fastspec.io.Dump, got {type(dump).__name__}")
    return open_dump(dump, client=client, verify_integrity=verify_integrity), True


def _plan(d, config: SimulateConfig) -> SimulatePlan:
    """The config resolved against the open dump (drafts, sampling, costs), every check made before any work."""
    plan = config.resolve(d)
    check_policy_drafts(d, plan.model_drafts, plan.policies)
    return plan


def _acceptance(d, plan: SimulatePlan, tick) -> dict:
    """alpha_t of every model draft: the dump's own pass (a sharded dump computes it on a cluster)."""
    if not plan.model_drafts:
        return {}
    return dump_acceptance(d, sampling=plan.sampling, drafts=plan.model_drafts, progress=tick)


def _replay(ctx: Context, accs: dict) -> tuple[list[DraftKResult], dict]:
    """The rows of every (draft, k, variant), and the alpha summary of each model draft."""
    d, plan = ctx.d, ctx.plan
    results: list[DraftKResult] = []
    summaries = {}
    for name in plan.model_drafts:
        acc = accs[name]
        if plan.draft_sampling == "argmax":  # p_t(argmax q_t) replaces alpha_t (fastspec.simulation.argmax)
            acc = argmax_acceptance(d, name, plan.sampling, acc)
        summaries[name] = (alpha_summary(acc.alpha, acc.valid) if acc.exact else
                           {"lower": alpha_summary(acc.lower, acc.valid), "upper": alpha_summary(acc.upper, acc.valid)})
        betas: dict = {}
        for kk in plan.ks:
            for v, w in plan.variants:
                if (v, w) == ("token", 1):
                    results.append(token_row(ctx, name, acc, kk))
                else:
                    results.append(variant_row(ctx, name, acc, kk, v, w, betas))
    for name, proposer in plan.ngrams.items():
        results.extend(ngram_rows(ctx, name, proposer, plan.ks))
    return results, summaries


def _result(d, plan: SimulatePlan, results, summaries, prows) -> SimulationResult:
    """The result before pricing: the JSON ``config``, the rows, the assumptions and warnings."""
    pricing, names = plan.pricing, list(plan.model_drafts) + list(plan.ngrams)
    extra, ngrams = plan.extra_variants, plan.ngrams
    shown = [a for a, on in (("candidates", any(w > 1 for _, w in plan.variants)),
                             ("block", ("block", 1) in plan.variants)) if on]
    # measured seconds replace the relative formula (the last line); without costs it stays, and says so
    assumptions = (list(ASSUMPTIONS[:-1]) + [SPEEDUP_ASSUMPTIONS["table"]] if isinstance(pricing, TablePricing)
                   else list(ASSUMPTIONS) + ([SPEEDUP_ASSUMPTIONS["none"]] if pricing is None else []))
    assumptions += [VARIANT_ASSUMPTIONS[a] for a in shown] + ([NGRAM_ASSUMPTION] if ngrams else [])
    warnings = (sampling_warnings(d.metadata, plan.sampling) + _interval_warnings(results)
                + _pricing_warnings(pricing, results, names))
    if extra and ngrams:
        warnings.append(ngram_variants_message(extra, ngrams, refused=False))
    if plan.draft_sampling == "argmax" and ngrams:
        warnings.append(ngram_argmax_message(ngrams, refused=False))
    if plan.draft_sampling == "argmax" and plan.model_drafts:
        assumptions.append(ARGMAX_ASSUMPTION)
    if isinstance(pricing, TablePricing) and pricing.source == "dump" and d.costs_differ:
        warnings.append("the shards recorded different cost tables (measured apart), or some recorded none; the "
                        "first recorded table is used: give one table with --costs to choose")
    if plan.policies:
        assumptions.append(POLICY_ASSUMPTION)
    return SimulationResult(d.path, _config_section(d, plan), results, {}, warnings, summaries, assumptions,
                            policies=prows, plan=plan)


def _price(res: SimulationResult) -> SimulationResult:
    """Best k per draft, the best row overall, the verdict, and the serving batch sizes' predictions."""
    plan = res.plan
    res.best = best_per_draft(res.results, list(plan.model_drafts) + list(plan.ngrams), plan.pricing)
    res.best_overall = best_overall(res.results) if plan.pricing is not None else None
    res.verdict = verdict(res.best_overall, plan.pricing)
    if plan.batch_sizes is not None:
        from .batch import batch_predictions  # only with batch sizes (import time of the plain command)

        res.batch = batch_predictions(res, plan.batch_table, plan.batch_sizes, plan.batch_extrapolate)
    return res


# ------------------------------------------------------------------ helpers of the stages


def _check_callback(name, f):
    if f is not None and not callable(f):
        raise InvalidType(f"{name} must be a function of one integer (or None), got {type(f).__name__}")
    return f


def _config_section(d, plan: SimulatePlan) -> dict:
    """The JSON ``config`` object (names and order stable)."""
    sp, pricing = plan.sampling, plan.pricing
    flags = pricing.model if isinstance(pricing, FlagPricing) else None
    config = {"k": plan.ks, "drafts": list(plan.model_drafts) + list(plan.ngrams), "temperature": sp.temperature,
              "top_k": sp.top_k, "top_p": sp.top_p, "min_p": sp.min_p, "mode": plan.mode, "trials": plan.trials,
              "batches": plan.batches, "seed": int(plan.seed), "draft_cost": flags.draft_cost if flags else None,
              "verify_cost": flags.verify.describe() if flags else None,
              "costs": pricing.describe() if pricing is not None else None, "sequences": int(d.N),
              "positions": int(d.lengths.astype(np.int64).sum()), "vocab_size": d.V, "dump_kind": d.kind,
              "draft_sampling": plan.draft_sampling}
    if plan.ngrams:
        config["ngram"] = {n: p.as_dict() for n, p in plan.ngrams.items()}
    if plan.extra_variants:
        config["variants"] = [{"verify": v, "candidates": w} for v, w in plan.variants]
        config["candidate_sampling"] = plan.candidate_sampling
        config["block_trials"] = plan.block_trials if ("block", 1) in plan.variants else None
    if plan.policies:
        config["policies"] = [p.name for p in plan.policies]
    return config


def _progress_total(d, plan: SimulatePlan) -> int:
    """Units of progress of the whole run: the alpha pass counts one unit per sequence."""
    names = plan.model_drafts
    return (len(names) * len(plan.ks) * sum(_progress_units(d, plan, v, w) for v, w in plan.variants)
            + len(plan.ngrams) * d.N + (d.N if names else 0) + len(names) * len(plan.policies) * d.N)


def _interval_warnings(results) -> list[str]:
    rows = [r for r in results if r.mean_acceptance_length is not None and r.ci95 is None
            and r.kind != "ngram"]  # n-gram rows are exact: no Monte-Carlo, no interval to miss
    if not rows:
        return []
    which = ", ".join(f"{r.draft} k={r.k}" + ("" if (r.verify, r.candidates) == ("token", 1) else
                                              f" ({r.verify}, {r.candidates} candidates)") for r in rows)
    return [f"no Monte-Carlo interval for {which}: every batch of trials gave the same estimate, so the spread "
            "cannot be estimated (ci95 and standard_error are null) and the agreement with the exact value was not "
            "checked; use more trials"]


def _sequence_ticks(progress, T):
    """progress(n) in whole sequences from the alpha pass's position counts (None without a callback)."""
    if progress is None:
        return None
    state = {"positions": 0, "shown": 0}

    def tick(n):
        state["positions"] += n
        seqs = state["positions"] // T
        if seqs > state["shown"]:
            progress(seqs - state["shown"])
            state["shown"] = seqs

    return tick


def _progress_units(d, plan: SimulatePlan, verify, w):
    """Units of progress of one (draft, k) row: replays of one sequence (token and block replays), or sequences
    (a Bernoulli replay runs every trial of a sequence at once; sparse bounds count a sequence each)."""
    if verify == "block":
        return d.N * plan.block_trials
    return d.N * plan.trials if w == 1 and plan.mode == "token" and d.kind == "dense" else d.N


def _pricing_warnings(pricing, results, names) -> list[str]:
    """Drafts or k the cost table cannot price (say so rather than print a blank)."""
    if pricing is None:
        return []
    out = []
    missing = [n for n in names if not pricing.covers(n)]
    if missing:
        out.append(f"the cost table has no entry for {', '.join(missing)}: no speed-up for "
                   f"{'it' if len(missing) == 1 else 'them'} (measure with `fastspec cost`, or give --costs FILE)")
    if isinstance(pricing, TablePricing):
        lacking: dict[str, set] = {}  # entry -> the k it leaves unpriced
        for r in results:
            if r.draft in missing or r.priced_speedup is not None:
                continue
            for entry in pricing.missing(r.draft, r.k, r.candidates, ngram=r.kind == "ngram"):
                lacking.setdefault(entry, set()).add(r.k)
        if lacking:
            ks = sorted(set().union(*lacking.values()))
            out.append(f"the cost table lacks {', '.join(sorted(lacking, key=_entry_order))}: no speed-up at "
                       f"k = {', '.join(map(str, ks))} (nothing is substituted; measure those k with "
                       "`fastspec cost`)")
    return out


def _entry_order(entry: str):
    """target.forward_s["10"] after ["9"]: the table's entries in their numeric order."""
    head, _, n = entry.partition('["')
    return head, int(n.rstrip('"]')) if n.rstrip('"]').isdigit() else 0
