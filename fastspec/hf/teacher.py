"""Teacher forcing: a model's logits along a given continuation of a prompt, one forward per prompt.

``teacher_forced_logits(model, prompt_ids, continuation)`` runs the model once over ``prompt + continuation[:-1]``
and returns the logits that predicted each continuation token, float32 [len(continuation), V] (row t is the
distribution the model had for ``continuation[t]`` given the prompt and ``continuation[:t]``).  Positions are
checked against the model's ``max_position_embeddings`` first; ``cached=False`` runs the one forward without a KV
cache.  :class:`TeacherCache` loads each model path once
(a directory or a GGUF file, :func:`fastspec.hf.load_model`) and is what callers that get paths pass around.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..errors import InvalidInput, InvalidType
from .runner import KVRunner

__all__ = ["teacher_forced_logits", "teacher_forced_logit_chunks", "TeacherCache", "vocab_size", "CHUNK_FLOATS"]

#: a chunk of teacher-forced logits holds at most this many floats (64 MiB of float32)
CHUNK_FLOATS = 1 << 24


def vocab_size(model) -> int:
    v = getattr(model.config, "vocab_size", None)
    if v is None:
        v = int(model.get_output_embeddings().weight.shape[0])
    return int(v)


@torch.inference_mode()
def teacher_forced_logit_chunks(model, prompt_ids: Sequence[int], token_ids: Sequence[int], *,
                                chunk: int | None = None):
    """Yield ``(start, logits)``: float32 [n, V] logits of ``model`` at the positions that predicted
    ``token_ids[start:start + n]`` given the prompt and the earlier emitted tokens, ``chunk`` positions at a time
    (default: as many as fit in :data:`CHUNK_FLOATS` floats; one forward when they all fit)."""
    prompt = [int(t) for t in prompt_ids]
    cont = [int(t) for t in token_ids]
    if not prompt:
        raise InvalidInput("prompt_ids is empty: the first emitted token needs a context")
    if not cont:
        return
    v = vocab_size(model)
    step = int(chunk) if chunk else max(1, CHUNK_FLOATS // max(v, 1))
    runner = KVRunner(model, use_cache=True)
    runner.prefill(prompt[:-1])
    for s in range(0, len(cont), step):
        e = min(len(cont), s + step)
        yield s, runner.logits(prompt + cont[:e - 1], e - s)




def teacher_forced_logits(model, prompt_ids: Sequence[int], continuation: Sequence[int], *,
                          cached: bool = True) -> np.ndarray:
    """float32 [len(continuation), V]: the logits that predicted each continuation token (module docstring),
    ids and positions checked first.  ``cached`` True (default): one KV-cached pass, the prompt prefilled first
    (:func:`teacher_forced_logit_chunks`); False: one forward over ``prompt + continuation[:-1]`` without a KV
    cache (what the dumps and the timing crops use: the same numbers as the target's own no-cache pass)."""
    if not isinstance(cached, bool):
        raise InvalidType(f"cached must be True or False, got {type(cached).__name__}", argument="cached")
    prompt = [int(t) for t in prompt_ids]
    cont = [int(t) for t in continuation]
    if not prompt:
        raise InvalidInput("prompt_ids is empty: teacher forcing needs at least one prompt token")
    if not cont:
        return np.zeros((0, int(model.config.vocab_size)), np.float32)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    bad = next((i for i, t in enumerate(prompt + cont) if not 0 <= t < vocab), None)
    if bad is not None:
        where = f"prompt_ids[{bad}]" if bad < len(prompt) else f"continuation[{bad - len(prompt)}]"
        raise InvalidInput(f"{where} = {(prompt + cont)[bad]} is outside the model's vocabulary [0, {vocab})")
    limit = getattr(model.config, "max_position_embeddings", None)
    n = len(prompt) + len(cont) - 1
    if limit is not None and n > int(limit):
        raise InvalidInput(f"prompt + continuation need {n} positions, more than the model's "
                           f"max_position_embeddings {limit}")
    if not cached:
        with torch.inference_mode():
            return np.asarray(KVRunner(model, use_cache=False).logits(prompt + cont[:-1], len(cont)), np.float32)
    return np.concatenate([np.asarray(lg, np.float32) for _, lg in
                           teacher_forced_logit_chunks(model, prompt, cont, chunk=len(cont))])


class TeacherCache:
    """``cache(model_path, prompt_ids, continuation)`` -> :func:`teacher_forced_logits`, each path loaded once."""

    def __init__(self):
        self._models = {}

    def model(self, path):
        from .models import load_model

        if path not in self._models:
            self._models[path] = load_model(path)[0]
        return self._models[path]

    def __call__(self, path, prompt_ids, continuation) -> np.ndarray:
        return teacher_forced_logits(self.model(path), prompt_ids, continuation)
