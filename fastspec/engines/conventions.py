"""Engines' conventions as data, and the exact prediction of an engine's speculative-decoding counters.

:class:`EngineConventions` says how an engine drafts and counts; each engine states its own as data, with every
fact cited from its source (vLLM's: :mod:`fastspec.engines.vllm.conventions`).  :data:`FASTSPEC` is fastspec's
own loop: the first generated token can come from a speculative step, drafts are sampled from q and judged with
min(1, p/q), nothing past the budget is counted, and its n-gram rule is the latest occurrence.

:func:`expected_counters` is the trajectory DP under these rules: for each recorded sequence, the probability
that a step starts at each position, from ``first_step`` while fewer than ``budget`` tokens exist, with the
per-draft conditional acceptance probabilities ``accept(s)`` of the step starting at ``s``; it returns the
expected counters exactly (no Monte-Carlo).  The record must reach ``budget + k - 1`` positions (a step at the
last position still drafts ``k`` tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import InvalidInput
from ..stats import ratio_ci

__all__ = ["EngineConventions", "FASTSPEC", "Counters", "expected_counters", "counters_summary"]


@dataclass(frozen=True)
class EngineConventions:
    """How an engine drafts and counts (the counters are vLLM's names: ``num_drafts``, ``num_draft_tokens``,
    ``num_accepted_tokens``, ``num_accepted_tokens_per_pos``)."""

    name: str
    first_step: int            # index of the first generated token that a speculative step can produce
    counts_past_budget: bool   # drafts accepted past max_tokens are counted
    model_drafts: str          # "argmax" (one-hot q) or "sampled" (q as sampled)
    ngram_preset: str          # the n-gram rule: a preset name of fastspec.ngram


FASTSPEC = EngineConventions("fastspec", first_step=0, counts_past_budget=False, model_drafts="sampled",
                             ngram_preset="fastspec")


@dataclass(frozen=True)
class Counters:
    """Expected (or measured) speculative-decoding counters of one sequence, vLLM's names."""

    num_drafts: float
    num_draft_tokens: float
    num_accepted_tokens: float
    num_accepted_tokens_per_pos: tuple

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts > 0 else 1.0


def expected_counters(accept: Callable[[int], Sequence[float]], budget: int, k: int, *,
                      first_step: int = 1) -> Counters:
    """Exact expected counters of one sequence (see the module docstring).

    ``accept(s)``: the conditional acceptance probabilities of the drafts of a step that starts at generated
    position ``s`` (at most ``k`` values in [0, 1]; empty when the proposer finds nothing: a plain step);
    ``budget``: the engine's ``max_tokens``.  Steps start at ``first_step``..``budget - 1``."""
    if not 0 <= first_step < budget:
        raise InvalidInput(f"budget {budget} must exceed first_step {first_step}")
    visit = np.zeros(budget + k + 2, np.float64)
    visit[first_step] = 1.0
    drafts = tokens = accepted = 0.0
    per_pos = np.zeros(k, np.float64)
    for s in range(first_step, budget):
        v = visit[s]
        if v == 0.0:
            continue
        a = np.asarray(accept(s), np.float64)
        d = len(a)
        if d > k or (d and not (np.all(a >= 0.0) and np.all(a <= 1.0))):
            raise InvalidInput(f"accept({s}) gave {d} probabilities (at most k = {k}, each in [0, 1])")
        if d == 0:
            visit[s + 1] += v
            continue
        drafts += v
        tokens += v * d
        surv = 1.0
        for j in range(d):
            visit[s + j + 1] += v * surv * (1.0 - a[j])
            surv *= a[j]
            per_pos[j] += v * surv
            accepted += v * surv
        visit[s + d + 1] += v * surv
    return Counters(drafts, tokens, accepted, tuple(float(x) for x in per_pos))


def counters_summary(per_sequence: Sequence[Counters], k: int) -> dict:
    """Totals over sequences, the mean acceptance length (1 + accepted / drafts) with its 95% interval over
    sequences (ratio of totals, delta method), the draft acceptance rate and the per-position acceptance
    (accepted at j / drafts, unconditional)."""
    drafts = np.array([c.num_drafts for c in per_sequence])
    acc = np.array([c.num_accepted_tokens for c in per_sequence])
    toks = np.array([c.num_draft_tokens for c in per_sequence])
    pos = np.array([list(c.num_accepted_tokens_per_pos) + [0.0] * (k - len(c.num_accepted_tokens_per_pos))
                    for c in per_sequence]).reshape(len(per_sequence), k)
    est, se, half = ratio_ci(drafts + acc, drafts)
    total = float(drafts.sum())
    return {
        "num_drafts": total, "num_draft_tokens": float(toks.sum()), "num_accepted_tokens": float(acc.sum()),
        "mean_acceptance_length": float(est) if total > 0 else 1.0,
        "ci95_sequences": [float(est - half), float(est + half)] if np.isfinite(half) and total > 0 else None,
        "draft_acceptance_rate": float(acc.sum() / toks.sum()) if toks.sum() > 0 else None,
        "per_position_acceptance": [float(x) for x in pos.sum(axis=0) / total] if total > 0 else [0.0] * k,
    }
