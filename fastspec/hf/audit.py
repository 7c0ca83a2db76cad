"""Teacher-forced output audit with a real target model: do an engine's emitted tokens follow the target's
processed distribution?  (:mod:`fastspec.audit` holds the statistics; this module feeds them.)

For each prompt, the target runs over prompt + emitted tokens (no sampling; a KV-cached forward in chunks of
positions, one forward when ``T x V`` is small), the logits at the positions that predicted each emitted token
are processed with :func:`fastspec.probabilities` (the sampling config) and added to a
:class:`fastspec.audit.OutputAudit`.  Memory: one prompt's chunk of logits at a time.

Token files (:func:`read_token_file`, :func:`write_token_file`) are JSONL, one object per prompt with vLLM's
field names ``prompt_token_ids`` and ``token_ids`` (the emitted ids), optionally ``prompt`` (text).
"""
from __future__ import annotations

import json
import os
from typing import Callable, Iterable, Sequence

import numpy as np

from ..audit import (DEFAULT_ALPHA, DEFAULT_EPSILON, DEFAULT_GREEDY_TOLERANCE, DEFAULT_TAIL_TOLERANCE, AuditConfig,
                     AuditResult, OutputAudit, TokenRecord, check_token_ids, read_token_file)
from ..errors import InvalidInput, config_or_settings
from ..params import SamplingParams
from .teacher import teacher_forced_logit_chunks, vocab_size

__all__ = ["teacher_forced_logit_chunks", "audit_model_output", "write_token_file", "read_token_file", "vocab_size",
           "check_context", "check_token_ids", "check_prompts_match", "TokenRecord"]

def check_context(model, records: Sequence[TokenRecord], name: str = "tokens") -> None:
    """Every prompt + emitted tokens - 1 fits the model's ``max_position_embeddings`` (InvalidInput naming the
    line)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if not limit:
        return
    for r in records:
        need = len(r.prompt_token_ids) + len(r.token_ids) - 1
        if need > limit:
            raise InvalidInput(f"{name} line {r.line}: prompt ({len(r.prompt_token_ids)} tokens) + emitted "
                               f"({len(r.token_ids)}) - 1 = {need} positions exceed the target's "
                               f"max_position_embeddings {limit}")


def audit_model_output(model, records: Iterable, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0,
                       epsilon=DEFAULT_EPSILON, alpha=DEFAULT_ALPHA, tail_tolerance=DEFAULT_TAIL_TOLERANCE,
                       greedy_tolerance=DEFAULT_GREEDY_TOLERANCE, chunk: int | None = None,
                       progress: Callable[[int], None] | None = None,
                       sampling: SamplingParams | None = None, config: AuditConfig | None = None) -> AuditResult:
    """Audit emitted tokens against ``model`` (a causal LM, :func:`fastspec.hf.load_model`) under the sampling
    config: ``records`` are :class:`TokenRecord` (from :func:`read_token_file`) or ``(prompt_token_ids,
    token_ids)`` pairs, one per prompt.  The settings are an :class:`fastspec.audit.AuditConfig` (``config``) or
    its fields as arguments, not both; they are checked first, then the ids against the model's vocabulary and the
    contexts against its position limit, all before any forward.  ``progress(1)`` after each prompt."""
    config = config_or_settings(AuditConfig, config, dict(
        sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
        epsilon=epsilon, alpha=alpha, tail_tolerance=tail_tolerance, greedy_tolerance=greedy_tolerance))
    recs = []
    for i, r in enumerate(records):
        if isinstance(r, TokenRecord):
            recs.append(r)
        else:
            try:
                prompt_ids, token_ids = r
            except (TypeError, ValueError):
                raise InvalidInput(f"records[{i}] must be a TokenRecord or a (prompt_token_ids, token_ids) "
                                   "pair") from None
            recs.append(TokenRecord(i + 1, _ids(prompt_ids, f"records[{i}] prompt_token_ids"),
                                    _ids(token_ids, f"records[{i}] token_ids"), None))
    if not recs:
        raise InvalidInput("no records to audit")
    check_token_ids(recs, vocab_size(model), "records")
    check_context(model, recs, "records")
    audit = OutputAudit(config=config)
    for i, r in enumerate(recs):
        toks = np.asarray(r.token_ids, np.int64)
        for s, logits in teacher_forced_logit_chunks(model, r.prompt_token_ids, r.token_ids, chunk=chunk):
            n = logits.shape[0]
            audit.add_logits(i, np.arange(s, s + n), logits, toks[s:s + n])
        if progress is not None:
            progress(1)
    return audit.result()


def _ids(value, name: str) -> tuple:
    arr = np.asarray(value)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)) or arr.dtype == bool:
        raise InvalidInput(f"{name} must be a list of integer token ids")
    return tuple(int(t) for t in arr)


def write_token_file(path, records: Iterable, prompts: Sequence[str] | None = None) -> str:
    """Write a token file (JSONL, one object per prompt: ``prompt_token_ids``, ``token_ids``, and ``prompt`` when
    ``prompts`` is given) from ``records``: ``(prompt_ids, result)`` pairs where ``result`` is a
    :class:`fastspec.hf.SpecResult` / :class:`fastspec.hf.GenerateResult` (its ``tokens``) or the emitted ids.
    Written to a temporary file and renamed, so a failure leaves nothing half-written.  Returns the path."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for i, (prompt_ids, result) in enumerate(records):
                toks = getattr(result, "tokens", result)
                obj = {"prompt_token_ids": [int(t) for t in np.asarray(prompt_ids).reshape(-1)],
                       "token_ids": [int(t) for t in np.asarray(toks).reshape(-1)]}
                if prompts is not None:
                    obj["prompt"] = prompts[i]
                fh.write(json.dumps(obj) + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def check_prompts_match(records: Sequence[TokenRecord], prompt_ids: Sequence[Sequence[int]], tokens_name: str,
                        prompts_name: str) -> None:
    """Each record's ``prompt_token_ids`` equal the project's tokenization of the same-numbered prompt
    (:func:`fastspec.hf.read_prompts`), else InvalidInput naming the line and the first difference."""
    if len(prompt_ids) != len(records):
        raise InvalidInput(f"{prompts_name} holds {len(prompt_ids)} prompts but {tokens_name} holds {len(records)} "
                           "lines: one line per prompt, in the same order")
    for r, want in zip(records, prompt_ids, strict=True):
        got = list(r.prompt_token_ids)
        want = [int(t) for t in want]
        if got != want:
            j = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
            at = (f"first difference at index {j}: {got[j] if j < len(got) else 'end'} vs "
                  f"{want[j] if j < len(want) else 'end'}")
            raise InvalidInput(f"{tokens_name} line {r.line}: prompt_token_ids ({len(got)} ids) differ from the "
                               f"tokenization of prompt {r.line} of {prompts_name} ({len(want)} ids; {at}): the "
                               "tokens were emitted for another context (chat template? special tokens?)")
