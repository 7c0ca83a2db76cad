"""``fastspec measure --engine vllm`` as a library call: the drafts as vLLM runs them, vLLM's environment, the
prompts, the teacher-forced prediction and the output audit, put together for
:func:`~fastspec.engines.vllm.compare.compare_vllm`.

Bad input raises :class:`~fastspec.errors.InvalidInput` tagged with the argument at fault (``exc.argument``:
``"target"``, ``"drafts"``, ``"prompts"``, ``"runs_dir"`` or ``"draft_sample_method"``; the message starts with
that argument's name, as the command line shows it with its flag); a missing vLLM raises
:class:`~fastspec.engines.errors.EngineError`.  torch and transformers are used through :mod:`fastspec.hf`
(imported inside :func:`measure_vllm` only).
"""
from __future__ import annotations

import os
from typing import Callable, Sequence

from ...errors import InvalidInput
from ...params import SamplingParams
from ...runs import ENGINE_SEED_END, check_request_seeds, check_run
from .compare import EngineComparison, EngineDraft, compare_vllm
from .conventions import DRAFT_SAMPLE_METHODS
from .runner import find_python

__all__ = ["engine_drafts", "check_draft_sample_method", "measure_vllm"]


def _bad(argument: str, message: str) -> InvalidInput:
    exc = InvalidInput(message)
    exc.argument = argument
    return exc


def check_draft_sample_method(method: str | None) -> str:
    """vLLM's ``draft_sample_method`` (None: its default, greedy)."""
    if method is None:
        return DRAFT_SAMPLE_METHODS[0]
    if method not in DRAFT_SAMPLE_METHODS:
        raise _bad("draft_sample_method", f"draft_sample_method {method} is unknown; choose one of: "
                   f"{', '.join(DRAFT_SAMPLE_METHODS)} (vLLM's speculative_config.draft_sample_method)")
    return method


def engine_drafts(specs: Sequence[str]) -> list[EngineDraft]:
    """``NAME=MODEL`` draft specifications as vLLM runs them: [NAME=]DIR (a Hugging Face model directory: vLLM's
    ``draft_model``) or vLLM's n-gram rule (``ngram.vllm``, ``ngram.vllmN``, ``ngram.vllmMIN-MAX``); anything vLLM
    cannot run (a .gguf file, exitL, fastspec's or Hugging Face's n-gram rules) is refused by name
    (InvalidInput, ``argument="drafts"``, the message starting ``draft SPEC:``)."""
    from ...ngram import ngram_name, parse_ngram_draft

    out, seen = [], set()
    for raw in specs:
        name, _, model = raw.partition("=") if "=" in raw else ("", "", raw)
        try:
            prop = parse_ngram_draft(model, 1)
        except InvalidInput as exc:
            raise _bad("drafts", str(exc)) from None
        if prop is not None:
            if prop.preset != "vllm":
                raise _bad("drafts", f"draft {raw}: vLLM's n-gram proposer has its own rule (earliest occurrence); "
                           "give ngram.vllm, ngram.vllmN or ngram.vllmMIN-MAX")
            draft = EngineDraft(name or ngram_name(prop), "ngram", min_n=prop.min_n, max_n=prop.max_n)
        else:
            if not os.path.isdir(model):
                raise _bad("drafts", f"draft {raw}: vLLM needs a Hugging Face model directory as a draft (a .gguf "
                           "file or exitL cannot run in vLLM)")
            # the path as typed (messages print it so); the runner hands vLLM its absolute form
            draft = EngineDraft(name or os.path.basename(os.path.normpath(model)), "model", model)
        if draft.name in seen:
            raise _bad("drafts", f"draft {raw}: the name {draft.name} is given twice")
        seen.add(draft.name)
        out.append(draft)
    return out


def measure_vllm(target: str, drafts: Sequence[str], prompts: str, ks: Sequence[int], *, sampling: SamplingParams,
                 max_new_tokens: int, seed: int, max_prompts: int | None = None,
                 draft_sample_method: str | None = None, python: str | None = None, runs_dir: str | None = None,
                 audit: bool = True, progress: Callable[[str], None] | None = None,
                 before_hf: Callable[[], object] | None = None) -> EngineComparison:
    """vLLM's own speculative decoding of ``target`` with ``drafts`` (:func:`engine_drafts`) over the first
    ``max_prompts`` prompts of the file ``prompts`` (at least two), for every k of ``ks``, against fastspec's exact
    prediction under vLLM's conventions; with ``audit``, every configuration's tokens are audited against the
    target's distribution (:func:`fastspec.hf.audit.audit_model_output`).  ``python``: vLLM's Python (default
    ``$FASTSPEC_VLLM_PYTHON``); ``runs_dir``: keep every run's token ids and counters there (JSON).  Every
    argument is checked, and vLLM's environment found, before ``before_hf()`` runs (the command line prepares
    torch there) and before any model loads."""
    run = check_run(ks=ks, max_new_tokens=max_new_tokens, seed=seed, max_prompts=max_prompts, seed_end=ENGINE_SEED_END)
    ks, max_new_tokens, seed, max_prompts = run["ks"], run["max_new_tokens"], run["seed"], run["max_prompts"]
    method = check_draft_sample_method(draft_sample_method)
    if runs_dir is not None and os.path.exists(runs_dir) and not os.path.isdir(runs_dir):
        raise _bad("runs_dir", f"runs_dir {runs_dir}: exists and is not a directory")
    if not os.path.isdir(target):
        raise _bad("target", f"target {target}: vLLM needs a Hugging Face model directory (save a GGUF model with "
                   "scripts/prepare_smollm2.py or transformers' save_pretrained)")
    parsed = engine_drafts(drafts)
    exe = find_python(python)
    if before_hf is not None:
        before_hf()
    from ...hf.audit import audit_model_output
    from ...hf.models import load_tokenizer
    from ...hf.prompts import read_prompts
    from ...hf.teacher import TeacherCache

    ids = read_prompts(prompts, load_tokenizer(target))
    if max_prompts is not None:
        ids = ids[:max_prompts]
    if len(ids) < 2:
        raise _bad("prompts", f"prompts {prompts}: give at least two prompts (the intervals are over prompts)")
    check_request_seeds(seed, len(ids))
    teacher = TeacherCache()

    def run_audit(_name, outputs):
        records = [(o["prompt_token_ids"], o["token_ids"]) for o in outputs]
        return audit_model_output(teacher.model(target), records, **sampling.as_dict(), seed=seed)

    return compare_vllm(target, parsed, ids, ks, sampling=sampling, seed=seed, max_new_tokens=max_new_tokens,
                        python=exe, draft_sample_method=method, teacher=teacher,
                        audit=run_audit if audit else None, progress=progress, runs_dir=runs_dir)
