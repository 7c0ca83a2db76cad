"""Teacher forcing: a model's logits along a given continuation of a prompt, one forward per prompt.

``teacher_forced_logits(model, prompt_ids, continuation)`` runs the model once over ``prompt + continuation[:-1]``
and returns the logits that predicted each continuation token, float32 [len(continuation), V] (row t is the
distribution the model had for ``continuation[t]`` given the prompt and ``continuation[:t]``).  Positions are
checked against the model's ``max_position_embeddings`` first.  :class:`TeacherCache` loads each model path once
(a directory or a GGUF file, :func:`fastspec.hf.load_model`) and is what callers that get paths pass around.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..errors import InvalidInput

__all__ = ["teacher_forced_logits", "TeacherCache"]


@torch.no_grad()
def teacher_forced_logits(model, prompt_ids: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
    """float32 [len(continuation), V]: the logits that predicted each continuation token (module docstring)."""
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
    ids = torch.tensor([prompt + cont[:-1]], dtype=torch.long)
    out = model(input_ids=ids, use_cache=False)
    logits = out.logits[0, len(prompt) - 1:, :]
    return logits.to(torch.float32).numpy().copy()


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
