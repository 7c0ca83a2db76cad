"""What a cost measurement (:func:`fastspec.hf.measure_costs`) runs with: :class:`CostMeasureConfig`, validated on
construction before torch is imported or any model is loaded (this module imports neither), with the bounds every
real-model entry point takes (:mod:`fastspec.config`: tokens, rounds; a seed in [0, 2**63))."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..config import DEFAULT_WARMUP, MAX_K, MAX_NEW_TOKENS, MAX_REPEATS, MAX_WARMUP
from ..errors import InvalidInput, InvalidType, about, check_int, int_in, positive_int
from ..params import GivenSampling
from .table import parse_batch_list

__all__ = ["CostMeasureConfig", "cost_ks", "check_model_seed", "SEED_END"]

#: seeds of the real-model pipeline: [0, 2**63) (NumPy's generators take no negative seed, and the loop's derived
#: seeds keep 63 bits: 2**63 + s would repeat s)
SEED_END = 1 << 63


def cost_ks(kmax, ks) -> list[int]:
    """The draft lengths a cost table covers: ``ks`` (one k or several, sorted, each once) or 1..``kmax``."""
    if ks is None:
        return list(range(1, positive_int("k", kmax, MAX_K) + 1))
    if isinstance(ks, (int, np.integer)) and not isinstance(ks, bool):
        return [positive_int("k", ks, MAX_K)]
    out = sorted({positive_int("k", k, MAX_K) for k in ks})
    if not out:
        raise InvalidInput("ks: give at least one draft length")
    return out


def check_model_seed(seed, name: str = "seed") -> int:
    """A seed of the real-model pipeline: an integer in [0, 2**63) (:data:`SEED_END`)."""
    try:
        return check_int(name, seed, 0, SEED_END - 1)
    except (InvalidInput, InvalidType) as exc:
        raise type(exc)(f"{name} = {seed!r} is invalid: use an integer in [0, 2**63) (0..{SEED_END - 1})") from None


@dataclass(frozen=True, kw_only=True)
class CostMeasureConfig(GivenSampling):
    """The settings of :func:`fastspec.hf.measure_costs` (its docstring), as the caller gave them; validated on
    construction (typed errors tagged with the argument at fault, ``exc.arguments``: :func:`fastspec.errors.about`),
    the fields then hold the validated values (``ks`` the sorted draft lengths, ``batches`` the sorted batch sizes
    or None).  Bounds: ``max_new_tokens`` and ``context_length`` (None: from the prompts, else 128) at most
    :data:`fastspec.config.MAX_NEW_TOKENS`, ``repeats`` 1..:data:`~fastspec.config.MAX_REPEATS`, ``warmup``
    0..:data:`~fastspec.config.MAX_WARMUP`, ``seed`` in [0, 2**63)."""

    ks: Any = None
    kmax: int = 4
    context_length: int | None = None
    max_new_tokens: int = 64
    repeats: int = 20
    warmup: int = DEFAULT_WARMUP
    seed: int = 0
    batches: Any = None

    def __post_init__(self):
        checked = {}
        with about("ks"):
            checked["ks"] = cost_ks(self.kmax, self.ks)
        checked.update(self.checked_sampling())
        if self.batches is not None:
            with about("batches"):
                b = self.batches
                checked["batches"] = parse_batch_list(b if isinstance(b, (int, str)) else list(b), "batches")
        for name, low, high, note in (("repeats", 1, MAX_REPEATS, "rounds"), ("warmup", 0, MAX_WARMUP, "rounds"),
                                      ("max_new_tokens", 1, MAX_NEW_TOKENS, "tokens"),
                                      ("context_length", 1, MAX_NEW_TOKENS, "tokens")):
            if name != "context_length" or self.context_length is not None:
                with about(name):
                    checked[name] = int_in(name, getattr(self, name), low, high, f" ({note})")
        with about("seed"):
            checked["seed"] = check_model_seed(self.seed)
        for name, value in checked.items():
            object.__setattr__(self, name, value)
