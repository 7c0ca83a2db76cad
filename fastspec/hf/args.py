"""Argument checks shared by the Hugging Face entry points (typed errors that name the argument)."""
from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from ..config import MAX_K, MAX_NEW_TOKENS  # one cap everywhere: the longest draft, the longest continuation
from ..errors import InvalidInput, positive_int

__all__ = ["MAX_K", "MAX_NEW_TOKENS", "positive_int", "check_k", "check_max_new_tokens", "as_token_ids",
           "eos_set", "position_limit", "check_positions", "check_generation_positions"]


def check_max_new_tokens(max_new_tokens) -> int:
    """``max_new_tokens`` as an int in [1, :data:`MAX_NEW_TOKENS`]."""
    return positive_int("max_new_tokens", max_new_tokens, MAX_NEW_TOKENS)


def check_k(k) -> int:
    """The draft length ``k`` as an int in [1, :data:`MAX_K`]."""
    return positive_int("k", k, MAX_K)


def as_token_ids(input_ids, name: str = "input_ids") -> list[int]:
    """Token ids of one prompt: a non-empty 1-D integer sequence (or shape [1, n]; a torch tensor is fine)."""
    if isinstance(input_ids, torch.Tensor):
        input_ids = input_ids.detach().cpu().numpy()
    a = np.asarray(input_ids)
    if a.ndim == 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 1 or a.size == 0 or not np.issubdtype(a.dtype, np.integer):
        raise InvalidInput(f"{name} must be a non-empty 1-D sequence of token ids (or shape [1, n]), got shape "
                           f"{list(a.shape)} dtype {a.dtype}")
    return [int(t) for t in a]


def eos_set(eos_token_id) -> frozenset:
    """End-of-sequence ids as a set: None (none), one id, or an iterable of ids."""
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset([int(eos_token_id)])
    return frozenset(int(i) for i in eos_token_id)


def position_limit(model) -> int | None:
    """The positions ``model`` takes: its config's ``max_position_embeddings`` (None when it declares none)."""
    limit = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(limit, (bool, np.bool_)) or not isinstance(limit, (int, np.integer)) or limit < 1:
        return None
    return int(limit)


def check_positions(models: Mapping[str, object], needed: int, name: str, value, detail: str,
                    largest: Callable[[int], int] | None = None) -> None:
    """InvalidInput ``"{name} = {value}: {detail} need N positions but MODEL takes L ..."`` for the first of
    ``models`` ({label: model}; n-gram proposers and other non-models are skipped) whose :func:`position_limit`
    is below ``needed``; ``largest(L)``, when given, is the largest value of ``name`` that fits L positions (named
    in the message when >= 1).  Called before any generation, so a run that cannot fit fails in milliseconds."""
    for label, model in models.items():
        limit = position_limit(model) if isinstance(model, torch.nn.Module) else None
        if limit is None or needed <= limit:
            continue
        fix = ""
        if largest is not None:
            best = largest(limit)
            fix = f"; at most {best} fit" if best >= 1 else "; none fits"
        raise InvalidInput(f"{name} = {value}: {detail} need {needed} positions but {label} takes {limit} (its "
                           f"max_position_embeddings){fix}")


def check_generation_positions(models: Mapping[str, object], prompts, max_new_tokens: int) -> None:
    """A continuation of ``max_new_tokens`` tokens after each of ``prompts`` (token-id lists) feeds the prompt and
    every new token but the last: len(prompt) + max_new_tokens - 1 positions, for the target and every model
    draft (teacher-forced or drafting); InvalidInput (:func:`check_positions`) when the longest prompt's run does
    not fit one of ``models``."""
    P = max(len(p) for p in prompts)
    check_positions(models, P + max_new_tokens - 1, "max_new_tokens", max_new_tokens,
                    f"the longest prompt ({P} tokens) + {max_new_tokens} new tokens", lambda L: L - P + 1)
