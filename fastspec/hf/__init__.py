"""Real models (optional extra ``fastspec[hf]``): logit dumps and a real speculative decoding loop on the CPU.

This package imports torch (and, when loading models, transformers); ``fastspec/__init__.py`` and the other
library modules never import it, so the core library works without them.  Models load from local files only
(a Hugging Face model directory or a GGUF file); a draft can also be a self-speculative early exit ``exitL``.

One concept per module:

* :mod:`~fastspec.hf.models` -- :func:`load_model`, :func:`load_tokenizer`, :func:`early_exit`, the checks that a
  draft shares the target's tokenizer and vocabulary, :func:`parse_draft_specs` / :func:`resolve_models`
  (``NAME=MODEL`` specifications; MODEL may be ``exitL``, ``ngram`` or ``ngramMIN-MAX``), :func:`eos_ids`,
  :func:`set_threads`, :func:`quiet_logging`;
* :mod:`~fastspec.hf.prompts` -- :func:`read_prompts` (text or ``.jsonl`` chat messages, chat templates);
* :mod:`~fastspec.hf.runner` -- the KV-cached forward runner with rollback;
* :mod:`~fastspec.hf.loop` -- :func:`generate` / :func:`timed_generate`, :func:`speculative_generate` (a draft
  model or an n-gram proposer; :func:`fastspec.verify_logits` decides every step) and :class:`SpecResult`,
  :func:`hf_generate` (Hugging Face ``generate``, timed), :func:`teacher_forced_logits`;
* :mod:`~fastspec.hf.dumping` -- :func:`dump_logits`, the dump ``fastspec.simulate`` reads;
* :mod:`~fastspec.hf.timing` -- :func:`measure_costs`: the real loop's cost table (:mod:`fastspec.costs`) measured
  on this machine with the very models, batch axis included;
* :mod:`~fastspec.hf.assisted` -- Hugging Face's own assisted generation (``generate(assistant_model=...)``),
  run and counted: :func:`~fastspec.hf.assisted.hf_assisted_generate`, :class:`~fastspec.hf.assisted.AssistantSettings`;
* :mod:`~fastspec.hf.measure` -- :func:`measure` / :class:`Measurement`: the real loop over prompts, timed
  against plain decoding (interleaved), with measured speed-ups;
* :mod:`~fastspec.hf.prediction` -- :func:`ratio_ci`, :func:`speedup_ci`, :func:`predict` and :func:`compare`: a
  dump's prediction (``simulate``'s: model and n-gram drafts, speed-ups from a cost table) with its CI over
  prompts, relative error and z against a measurement (no torch needed there).
* :mod:`~fastspec.hf.pipeline` -- :func:`measure_and_predict` / :class:`MeasureReport`: load, read the prompts,
  measure the costs, make or read the dump, predict, run the timed loop and compare (``fastspec measure``);
* :mod:`~fastspec.hf.args` -- the argument checks the entry points share.

Sampling parameters follow :class:`fastspec.params.SamplingParams`; every token is drawn by
:func:`fastspec.processing.sample_tokens`; bad arguments raise :class:`fastspec.errors.InvalidInput` /
:class:`~fastspec.errors.InvalidType`.
The page that explains it: ``docs/guide/real-models.md``.
"""
from __future__ import annotations

from .timing import measure_costs
from .dumping import dump_logits
from .loop import GenerateResult, SpecResult, generate, hf_generate, speculative_generate, timed_generate
from .measure import ClockResult, MeasureResult, Measurement, measure
from .models import (check_same_tokenizer, check_vocab_size, early_exit, eos_ids, load_model, load_tokenizer,
                     model_files, parse_draft_specs, parse_ngram_spec, quiet_logging, resolve_models, set_threads)
from .prediction import (Prediction, compare, predict, prediction_over_prompts, ratio_ci, relative_error, speedup_ci,
                         z_difference)
from .pipeline import MeasureReport, measure_and_predict
from .prompts import read_prompts
from .teacher import teacher_forced_logits

__all__ = ["load_model", "load_tokenizer", "early_exit", "check_same_tokenizer", "resolve_models", "read_prompts",
           "generate", "teacher_forced_logits", "speculative_generate", "SpecResult", "dump_logits", "measure",
           "MeasureResult", "ratio_ci", "measure_costs",
           # also public (used by the command line and the tests)
           "check_vocab_size", "parse_draft_specs", "parse_ngram_spec", "model_files",
           "eos_ids", "set_threads", "quiet_logging",
           "Prediction", "predict", "prediction_over_prompts", "compare", "relative_error", "z_difference",
           "timed_generate", "hf_generate", "GenerateResult", "Measurement", "ClockResult", "speedup_ci",
           "measure_and_predict", "MeasureReport"]
