"""Argument checks shared by the Hugging Face entry points (typed errors that name the argument)."""
from __future__ import annotations

import numpy as np
import torch

from ..config import MAX_K  # longest draft the loop accepts (one cap everywhere)
from ..errors import InvalidInput, InvalidType

__all__ = ["MAX_K", "positive_int", "check_k", "check_max_new_tokens", "as_token_ids", "eos_set"]


def positive_int(name: str, value, upper: int | None = None) -> int:
    """``value`` as an int in [1, ``upper``] (no upper bound when None); InvalidType for a non-integer (bool
    included), InvalidInput when out of range."""
    rule = "an integer >= 1" if upper is None else f"an integer in [1, {upper}]"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidType(f"{name} = {value!r} is invalid: use {rule}")
    if value < 1 or (upper is not None and value > upper):
        raise InvalidInput(f"{name} = {value!r} is invalid: use {rule}")
    return int(value)


def check_max_new_tokens(max_new_tokens) -> int:
    """``max_new_tokens`` as an int >= 1."""
    return positive_int("max_new_tokens", max_new_tokens)


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
