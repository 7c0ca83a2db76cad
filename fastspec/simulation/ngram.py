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

import numpy as np

from .._kernels.process import probabilities_at
from .._kernels.replay import (N_STEPWISE, SW_ACCEPTED, SW_ALL_ACCEPTED, SW_DRAFTED, SW_OFF_RECORD, SW_PLAIN,
                               SW_STEPS, SW_TIME, expected_counts_stepwise)
from ..errors import InvalidInput
from ..ngram import NgramProposer, ngram_name
from ..processing import kernel_view
from ..stats import ratio_ci

__all__ = ["ngram_replay", "NGRAM_ASSUMPTION"]

NGRAM_ASSUMPTION = ("n-gram draft: proposals from the recorded prompt + generated tokens; draft j of a step is "
                    "accepted with the recorded target probability of the proposed token (q one-hot); exact under "
                    "greedy decoding, otherwise it assumes the context stays the recorded one after an accepted "
                    "draft (off_record: the expected share of accepted drafts that differ from the recording)")


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
