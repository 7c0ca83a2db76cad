"""One model with its KV cache: forwards over the tokens the cache has not seen, and rollback.

:class:`KVRunner` is what the loops (:mod:`fastspec.hf.loop`) use for every forward pass.  It works with the
cache API of transformers 4.5x and 5.x: the forward argument is ``cache`` or ``past_key_values``, and
``Cache.crop`` is used with a negative length (remove that many positions), which means the same under both
the old absolute and the new relative semantics.
"""
from __future__ import annotations

import inspect
from typing import Sequence

import numpy as np
import torch

__all__ = ["KVRunner", "BatchKVRunner"]


def _cache_kw(model) -> str:
    """Name of the cache argument of ``model.forward`` ('cache' in transformers >= 5.x, else 'past_key_values')."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _new_cache(model):
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:
        return DynamicCache()


def _crop(cache, length: int) -> None:
    """Roll ``cache`` back to its first ``length`` positions."""
    cur = cache.get_seq_length()
    if length < cur:
        cache.crop(-(cur - length))


class KVRunner:
    """One model plus its KV cache: feeds the tokens the cache has not seen and returns the last n logits.

    ``use_cache=False`` recomputes every forward from the full sequence (the reference a cached run is checked
    against)."""

    def __init__(self, model, use_cache: bool = True):
        self.model = model
        self.use_cache = use_cache
        self.kw = _cache_kw(model)
        self.keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache = _new_cache(model) if use_cache else None
        self.length = 0  # positions in the cache

    def logits(self, seq: Sequence[int], n: int) -> np.ndarray:
        """float32 [n, V]: logits at the last n positions of ``seq`` (the cache must hold a prefix of seq)."""
        if self.use_cache:
            new = list(seq[self.length:])
            if len(new) < n:
                raise RuntimeError(f"internal: {len(new)} uncached tokens but {n} logits asked for")
            kwargs = {self.kw: self.cache, "use_cache": True}
        else:
            new = list(seq)
            kwargs = {"use_cache": False}
        if self.keep:
            kwargs["logits_to_keep"] = n
        ids = torch.tensor([new], dtype=torch.long)
        out = self.model(ids, **kwargs)
        if self.use_cache:
            self.length = len(seq)
            got = self.cache.get_seq_length()
            if got != self.length:
                raise RuntimeError(f"internal: cache holds {got} positions, expected {self.length}")
        return out.logits[0, -n:].to(torch.float32).numpy()

    def prefill(self, seq: Sequence[int]) -> None:
        """Feed ``seq`` into the cache without keeping its logits (a no-op without a cache or for an empty
        ``seq``): the prompt before its last token, so that every later call is a decoding step."""
        if not self.use_cache or len(seq) <= self.length:
            return
        self.logits(seq, 1)

    def rollback(self, length: int) -> None:
        """Keep only the first ``length`` cached positions (no-op without a cache or when it holds fewer)."""
        if self.use_cache and length < self.length:
            _crop(self.cache, length)
            self.length = length


class BatchKVRunner:
    """One model with a batched KV cache of ``batch`` copies of one context (the batch axis of the cost table,
    :func:`fastspec.hf.timing.batch_axis`)."""

    def __init__(self, model, ctx: Sequence[int], batch: int):
        self.model, self.batch, self.C = model, batch, len(ctx)
        self.kw = _cache_kw(model)
        self.keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache = _new_cache(model)
        ids = torch.tensor([list(ctx)] * batch, dtype=torch.long)
        model(ids, **{self.kw: self.cache, "use_cache": True})

    def logits(self, new: Sequence[int]) -> np.ndarray:
        """float32 [B, n, V] of a forward over ``new`` (n tokens, the same for every sequence)."""
        n = len(new)
        ids = torch.tensor([list(new)] * self.batch, dtype=torch.long)
        kwargs = {self.kw: self.cache, "use_cache": True}
        if self.keep:
            kwargs["logits_to_keep"] = n
        out = self.model(ids, **kwargs)
        return out.logits[:, -n:].to(torch.float32).numpy()

    def rollback(self) -> None:
        _crop(self.cache, self.C)
        got = self.cache.get_seq_length()
        if got != self.C:
            raise RuntimeError(f"internal: batched cache holds {got} positions, expected {self.C}")
