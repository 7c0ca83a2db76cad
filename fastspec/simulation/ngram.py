"""The n-gram (prompt lookup) draft in the simulator: what lookup would buy, from a dump of the target alone.

A dump records, per sequence, the prompt tokens, the generated tokens and the target's logits at every generated
position.  For a proposer (:class:`fastspec.ngram.NgramProposer`) the replay is:

* a verify step starting at generated position t proposes ``d = min(len(proposal), k, L - 1 - t)`` tokens from
  the recorded context (prompt + generated tokens before t); ``d = 0`` is a plain target step (one token);
* the proposal is deterministic, so q is one-hot: draft j is accepted with probability
  ``beta[t, j] = p_{t+j}(x_{t,j})``, the processed target probability of the proposed token at position t + j, while
  the earlier drafts were; the step emits the accepted drafts plus one token and the next step starts after them.

The expected figures follow by dynamic programming over start positions (the acceptance of a draft depends on
where its step started, unlike a model draft's alpha_t): exact, no Monte-Carlo.  Under greedy decoding (a greedy
dump analysed at temperature 0) beta is 0 or 1 and the replay is exactly what the real loop does.  Under sampling
it rests on the trajectory-replay assumption: after an accepted draft the context is the recorded one.  That holds
whenever the accepted draft *is* the recorded token; ``off_record`` is the expected share of accepted drafts that
are not (there the real loop would continue from another context) -- the size of the assumption's reach.

Costs (:mod:`fastspec.costs`): a step costs the proposer's call + a target forward over d + 1 tokens + fastspec's
overhead(d) (d = 0: the call, then a plain step); plain decoding costs target(1) + overhead(0) per token.  With
relative costs (``draft_cost`` c, ``verify_cost``) a step costs c + verify(d), a plain step 1.  The speed-up is
plain time / expected time for the same tokens.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from .._kernels.process import probabilities_at
from .._kernels.replay import (N_STEPWISE, SW_ACCEPTED, SW_ALL_ACCEPTED, SW_DRAFTED, SW_OFF_RECORD, SW_PLAIN,
                               SW_STEPS, SW_TIME, expected_counts_stepwise)
from ..errors import InvalidInput, shown
from ..ngram import MAX_NGRAM, PRESETS, NgramProposer, preset
from ..processing import kernel_view
from ..stats import ratio_ci

__all__ = ["ngram_replay", "parse_ngram_draft", "ngram_name", "NGRAM_ASSUMPTION", "NGRAM_GRAMMAR"]

NGRAM_ASSUMPTION = ("n-gram draft: proposals from the recorded prompt + generated tokens; draft j of a step is "
                    "accepted with the recorded target probability of the proposed token (q one-hot); exact under "
                    "greedy decoding, otherwise it assumes the context stays the recorded one after an accepted "
                    "draft (off_record: the expected share of accepted drafts that differ from the recording)")


#: the grammar, as error messages and help texts state it (fastspec.ngram's module docstring has the table)
NGRAM_GRAMMAR = ("ngram or ngramMIN-MAX (fastspec's rule: latest occurrence, n from 1 to 3 by default), or a named "
                 "rule: ngram.vllm, ngram.vllmN, ngram.vllmMIN-MAX (vLLM's: earliest occurrence, both bounds 5 by "
                 "default), ngram.hf, ngram.hfMAX (Hugging Face prompt lookup: earliest, n from 1 to 2 by default)")

_SPEC = re.compile(r"ngram(?:\.([a-z]+))?(.*)", re.DOTALL)


def parse_ngram_draft(spec, k: int) -> NgramProposer | None:
    """The one parser of n-gram draft specifications (the ``--draft`` of ``simulate``, ``measure`` and ``dump``,
    :func:`fastspec.simulate`'s ``drafts``, :func:`fastspec.hf.parse_ngram_spec`); the grammar is the table in
    :mod:`fastspec.ngram`'s docstring:

    ``"ngram"`` -> n in [1, 3], latest occurrence; ``"ngramA-B"``, ``"ngram:A-B"`` or ``"ngram[A-B]"`` -> n in
    [A, B]; ``"ngram.RULE"``, ``"ngram.RULEN"``, ``"ngram.RULEA-B"`` -> :func:`fastspec.ngram.preset` (RULE: vllm,
    hf, fastspec) with the bounds given; an :class:`~fastspec.ngram.NgramProposer` -> itself with this ``k``; a spec
    not starting with "ngram" -> None (a model draft's name).  Anything else starting with "ngram": InvalidInput
    naming the spec and the grammar."""
    if isinstance(spec, NgramProposer):
        return dataclasses.replace(spec, k=k)
    if not isinstance(spec, str) or not spec.startswith("ngram"):
        return None
    m = _SPEC.fullmatch(spec)
    rule, rest = m.group(1), m.group(2)
    if rule is not None and rule not in PRESETS:
        raise InvalidInput(f"draft {shown(spec)}: unknown n-gram rule {rule!r}; use {', '.join(PRESETS)} "
                           f"({NGRAM_GRAMMAR})")
    if rule is None:
        rest = rest.lstrip(":")
    if rest.startswith("[") and rest.endswith("]"):
        rest = rest[1:-1]
    lo, sep, hi = rest.partition("-")
    if rest and not (_decimal(lo) and (not sep and rule in ("vllm", "hf") or sep and _decimal(hi))):
        raise InvalidInput(f"draft {shown(spec)}: write {NGRAM_GRAMMAR}, with decimal digits (e.g. ngram1-3, "
                           "ngram.vllm)")
    bounds = [int(v) for v in ((lo, hi) if sep else (lo,) if rest else ())]
    for n in bounds:
        if not 1 <= n <= MAX_NGRAM:
            raise InvalidInput(f"draft {shown(spec)}: n-gram lengths must lie in [1, {MAX_NGRAM}] (e.g. ngram1-3)")
    if len(bounds) == 2 and bounds[0] > bounds[1]:
        raise InvalidInput(f"draft {shown(spec)}: MIN {bounds[0]} is greater than MAX {bounds[1]}; write "
                           "ngramMIN-MAX (e.g. ngram1-3)")
    if rule is None:
        return NgramProposer(k) if not bounds else NgramProposer(k, bounds[0], bounds[1])
    if rule == "hf":
        if len(bounds) == 2 and bounds[0] != 1:
            raise InvalidInput(f"draft {shown(spec)}: Hugging Face prompt lookup has no minimum n-gram length "
                               "(n runs down to 1): write ngram.hfMAX or ngram.hf1-MAX")
        return preset("hf", max_n=bounds[-1] if bounds else None, k=k)
    if len(bounds) == 1:
        return preset(rule, bounds[0], bounds[0], k=k) if rule == "vllm" else None  # fastspec: refused above
    return preset(rule, *bounds, k=k) if bounds else preset(rule, k=k)


def _decimal(text: str) -> bool:
    """ASCII digits only, at most 6 (``str.isdigit`` also accepts superscripts such as '²', which ``int`` refuses)."""
    return text.isascii() and text.isdigit() and len(text) <= 6


def ngram_name(proposer: NgramProposer) -> str:
    """The draft name of an n-gram proposer in results and cost tables; it says the rule and parses back to the
    same proposer (:func:`parse_ngram_draft`): ``"ngram1-3"`` (fastspec's rule, latest occurrence),
    ``"ngram.vllm5-5"`` (the earliest occurrence: vLLM's rule, also a hand-built ``occurrence="earliest"``),
    ``"ngram.hf1-2"`` (the ``hf`` preset)."""
    if proposer.occurrence == "latest":
        return f"ngram{proposer.min_n}-{proposer.max_n}"
    rule = "hf" if proposer.preset == "hf" else "vllm"
    return f"ngram.{rule}{proposer.min_n}-{proposer.max_n}"


def _contexts(d):
    """(prompt_tokens [N, P], prompt_lengths [N]) of the dump, or InvalidInput."""
    pt = d.prompt_tokens
    if pt is None or d.tokens is None:
        raise InvalidInput(f"{d.path}: n-gram analysis needs the prompt and generated tokens (arrays "
                           "'prompt_tokens', 'prompt_lengths' and 'tokens'); fastspec dump records them")
    return pt, d.prompt_lengths


def _proposals(d, proposer: NgramProposer, kmax: int):
    """draft tokens [N, T, kmax] (-1 padded), num_draft [N, T], matches [N, T, kmax] along every sequence."""
    pt, pl = _contexts(d)
    N, T = d.N, d.T
    drafts = np.full((N, T, kmax), -1, np.int64)
    num = np.zeros((N, T), np.int64)
    matches = np.zeros((N, T, kmax), np.int64)
    sized = NgramProposer(kmax, proposer.min_n, proposer.max_n, proposer.occurrence)
    for n in range(N):
        L = int(d.lengths[n])
        ctx = np.concatenate([pt[n, :pl[n]], d.tokens[n, :L]]).astype(np.int64)
        p = sized.proposals_along(ctx, int(pl[n]))
        drafts[n, :L] = p.draft_tokens[:L]
        num[n, :L] = p.num_draft[:L]
        rec = np.full(L + kmax, -2, np.int64)
        rec[:L] = d.tokens[n, :L]
        for j in range(kmax):
            matches[n, :L, j] = drafts[n, :L, j] == rec[j:L + j]
    return drafts, num, matches


def _betas(d, drafts, num, sp):
    """beta [N, T, kmax]: the processed target probability at position t + j of draft j proposed at t."""
    N, T, kmax = drafts.shape
    ids = np.full((N, T, kmax), -1, np.int64)  # ids[n, r, j]: draft j of the step that started at r - j
    for j in range(min(kmax, T)):  # draft j >= T lies past every sequence's end (a step proposes < L - t tokens)
        ids[:, j:, j] = np.where(j < num[:, :T - j], drafts[:, :T - j, j], -1)
    probs = np.zeros((N * T, kmax))
    flat = ids.reshape(N * T, kmax)
    for ch in d.iter_chunks(drafts=()):
        rows = slice(ch.start, ch.stop)
        if ch.stop <= ch.start:
            continue
        if isinstance(ch.target, tuple):  # sparse top-k (greedy only: ngram_replay checked): one-hot at the argmax
            probs[rows] = flat[rows] == _top_id(*ch.target)[:, None]
        else:
            probabilities_at(kernel_view(ch.target), sp.rows(ch.stop - ch.start), np.ascontiguousarray(flat[rows]),
                             probs[rows])
    probs = probs.reshape(N, T, kmax)
    beta = np.zeros((N, T, kmax))
    for j in range(min(kmax, T)):
        beta[:, :T - j, j] = probs[:, j:, j]
    return beta


def _top_id(ids: np.ndarray, logprobs: np.ndarray) -> np.ndarray:
    """The greedy token of each row of a top-k list: the highest log-probability, the lowest id among ties (the
    dense kernels' rule; a token outside the list cannot exceed the list's maximum)."""
    lp = logprobs.astype(np.float64)
    top = lp.max(axis=1, keepdims=True)
    big = np.iinfo(np.int64).max
    return np.where(lp == top, ids.astype(np.int64), big).min(axis=1)


def ngram_replay(d, proposer: NgramProposer, ks, sp, pricing=None) -> list[dict]:
    """Expected figures of the n-gram draft for every k of ``ks`` (one dict per k; see the module docstring).

    ``d``: an open dense dump with prompt and generated tokens; ``sp``: the SamplingParams analysed;
    ``pricing``: a :class:`fastspec.simulation.speedup.Pricing` (None: no speed-up; a cost table without an n-gram
    entry, or that does not reach k + 1 target positions, gives no speed-up at that k).  Intervals are over the
    recorded sequences (prompts as clusters); the speed-up's also carries the cost table's standard errors."""
    if d.kind != "dense" and not sp.greedy:
        raise InvalidInput(f"{d.path}: n-gram analysis of a sparse top-k dump needs temperature 0 (the proposed "
                           "token's probability is not known from top-k lists)")
    from .speedup import speedup_interval

    kmax = max(ks)
    drafts, num, matches = _proposals(d, proposer, kmax)
    beta = _betas(d, drafts, num, sp)
    lengths = d.lengths.astype(np.int64)
    out = []
    name = ngram_name(proposer)
    for k in ks:
        priced = pricing.ngram_costs(name, k) if pricing is not None else None
        cost = priced[0] if priced is not None else None
        totals = np.empty((d.N, N_STEPWISE))
        per_pos = np.empty((d.N, k))
        expected_counts_stepwise(beta, num, matches, lengths, k, cost if cost is not None else np.ones(k + 1),
                                 totals, per_pos)
        tot = totals.sum(0)
        steps, acc = tot[SW_STEPS], tot[SW_ACCEPTED]
        m, se_m, half_m = ratio_ci(totals[:, SW_ACCEPTED] + totals[:, SW_STEPS], totals[:, SW_STEPS])
        ok = steps > 0 and np.isfinite(half_m)
        res = {"draft": ngram_name(proposer), "k": k, "verify_steps": steps, "plain_steps": tot[SW_PLAIN],
               "mean_acceptance_length_exact": 1.0 + acc / steps if steps > 0 else 1.0,
               "ci95_sequences": [float(m - half_m), float(m + half_m)] if ok else None,
               "standard_error_sequences": float(se_m) if ok else None,
               "draft_acceptance_rate_exact": acc / tot[SW_DRAFTED] if tot[SW_DRAFTED] > 0 else 0.0,
               "per_position_acceptance_exact": (per_pos.sum(0) / steps if steps > 0 else np.zeros(k)).tolist(),
               "tokens_per_target_forward": float(lengths.sum() / (steps + tot[SW_PLAIN])),
               "p_all_accepted": tot[SW_ALL_ACCEPTED] / steps if steps > 0 else 0.0,
               "off_record": tot[SW_OFF_RECORD] / acc if acc > 0 else 0.0, "speedup": None, "speedup_ci95": None}
        if cost is not None:
            plain = priced[1]
            est, _, half = ratio_ci(lengths * plain, totals[:, SW_TIME])
            res["speedup"] = float(lengths.sum() * plain / tot[SW_TIME])
            ci = speedup_interval(res["speedup"], est, half, pricing.relative_se(name, k))
            res["speedup_ci95"] = list(ci) if ci is not None else None
        out.append(res)
    return out
