"""What the real-model runs are run with -- a cost measurement (:func:`fastspec.hf.measure_costs`:
:class:`CostMeasureConfig`), a logit dump (:func:`fastspec.hf.dump_logits`: :class:`DumpConfig`), a measurement of
the real loop against its prediction (:func:`fastspec.hf.measure_and_predict`: :class:`MeasureConfig`) --
validated on construction before torch is imported or any model is loaded (this module imports neither), with the
bounds every real-model entry point takes (:mod:`fastspec.config`: tokens, rounds, row widths; a seed in
[0, 2**63))."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .config import DEFAULT_WARMUP, MAX_K, MAX_NEW_TOKENS, MAX_REPEATS, MAX_WARMUP, MAX_WIDTH
from .costs.table import CostTable, parse_batch_list
from .analysis import parse_k_list
from .errors import InvalidInput, InvalidType, about, check_int, int_in, positive_int
from .io import check_dump_path
from .params import GivenSampling
from .policies import parse_policies
from .simulation.config import check_trials

__all__ = ["CostMeasureConfig", "DumpConfig", "MeasureConfig", "cost_ks", "check_model_seed", "check_run",
           "check_request_seeds", "SEED_END", "ENGINE_SEED_END", "DUMP_DTYPES", "DEFAULT_COST_K"]

#: seeds of the real-model pipeline: [0, 2**63) (NumPy's generators take no negative seed, and the loop's derived
#: seeds keep 63 bits: 2**63 + s would repeat s)
SEED_END = 1 << 63
#: how dense logits are stored
DUMP_DTYPES = ("float16", "float32")
#: the draft lengths a dump's recorded cost table covers by default
DEFAULT_COST_K = tuple(range(1, 9))


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


def check_model_seed(seed, name: str = "seed", end: int = SEED_END) -> int:
    """A seed of the real-model pipeline: an integer in [0, 2**63) (:data:`SEED_END`); an engine's run: [0,
    2**32 - 1) (``end`` :data:`ENGINE_SEED_END`)."""
    try:
        return check_int(name, seed, 0, end - 1)
    except (InvalidInput, InvalidType) as exc:
        rule = _SEED_RULES[end]
        raise type(exc)(f"{name} = {seed!r} is invalid: use an integer in {rule}") from None


#: the seeds of an engine's run (vLLM, llama.cpp): vLLM seeds NumPy's legacy generator with it (np.random.seed takes
#: [0, 2**32)); llama.cpp reads a request's seed as a uint32 (larger values wrap) and 2**32 - 1 (LLAMA_DEFAULT_SEED)
#: means a random seed.  Each prompt's request seed, ``seed + prompt index``, stays below it.
ENGINE_SEED_END = (1 << 32) - 1
_SEED_RULES = {SEED_END: f"[0, 2**63) (0..{SEED_END - 1})",
               ENGINE_SEED_END: f"[0, 2**32 - 1) (0..{ENGINE_SEED_END - 1}: the engines' seeds are 32-bit, and "
                                "llama.cpp reads 2**32 - 1 as a random seed)"}


def check_run(*, ks, max_new_tokens, seed, max_prompts=None, seed_end: int = SEED_END) -> dict:
    """The settings every measurement of a real loop takes (fastspec's, vLLM's, llama.cpp's), checked one way, each
    error tagged with its argument (:func:`fastspec.errors.about`): ``ks`` (one draft length or several, read by the
    library's one parser, :func:`fastspec.analysis.parse_k_list`: sorted, each once), ``max_new_tokens`` in [1,
    :data:`~fastspec.config.MAX_NEW_TOKENS`], ``seed`` in [0, ``seed_end``) (:func:`check_model_seed`),
    ``max_prompts`` None (every prompt of the file) or a count >= 1.  Returns them checked, by name."""
    out = {}
    with about("ks"):
        out["ks"] = tuple(parse_k_list(ks))
    with about("max_new_tokens"):
        out["max_new_tokens"] = int_in("max_new_tokens", max_new_tokens, 1, MAX_NEW_TOKENS, " (tokens)")
    with about("seed"):
        out["seed"] = check_model_seed(seed, end=seed_end)
    out["max_prompts"] = None
    if max_prompts is not None:
        with about("max_prompts"):
            try:
                out["max_prompts"] = check_int("max_prompts", max_prompts, 1)
            except (InvalidInput, InvalidType) as exc:
                raise type(exc)(f"max_prompts = {max_prompts!r} is invalid: use a positive count") from None
    return out


def check_top_k_save(top_k_save) -> int | None:
    """None (a dense dump) or the width of a sparse one: 1..:data:`~fastspec.config.MAX_WIDTH`."""
    if top_k_save is None:
        return None
    return int_in("top_k_save", top_k_save, 1, MAX_WIDTH, " (2**24, the widest row a dump holds)")


def check_request_seeds(seed: int, prompts: int) -> None:
    """An engine's request seeds ``seed + i`` for ``prompts`` prompts stay below :data:`ENGINE_SEED_END`
    (InvalidInput tagged ``seed`` otherwise)."""
    if seed + prompts - 1 >= ENGINE_SEED_END:
        raise InvalidInput(f"seed = {seed} is invalid: the request seeds seed + prompt index (0..{prompts - 1}) "
                           f"reach 2**32 - 1; use a seed <= {ENGINE_SEED_END - prompts}", argument="seed")


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


def _check_bool(name: str, value) -> None:
    with about(name):
        if not isinstance(value, (bool, np.bool_)):
            raise InvalidType(f"{name} must be True or False, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class DumpConfig(GivenSampling):
    """The settings of :func:`fastspec.hf.dump_logits` (its docstring), as the caller gave them; validated on
    construction (typed errors tagged with the argument at fault, ``exc.arguments``), the fields then hold the
    validated values.  Bounds: ``max_new_tokens`` 1..:data:`fastspec.config.MAX_NEW_TOKENS`, ``top_k_save`` None
    or 1..:data:`~fastspec.config.MAX_WIDTH`, ``cost_repeats`` 1..:data:`~fastspec.config.MAX_REPEATS`, ``seed``
    in [0, 2**63); ``dtype`` one of :data:`DUMP_DTYPES`; with ``costs=True`` the measurement's own settings are
    :attr:`cost_config`."""

    max_new_tokens: int = 128
    top_k_save: int | None = None
    seed: int = 0
    ignore_eos: bool = False
    dtype: Any = "float16"
    compressed: bool | None = None
    costs: Any = True
    cost_k: Any = DEFAULT_COST_K
    cost_repeats: int = 10

    def __post_init__(self):
        checked = self.checked_sampling()
        with about("max_new_tokens"):
            checked["max_new_tokens"] = int_in("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS, " (tokens)")
        with about("top_k_save"):
            checked["top_k_save"] = check_top_k_save(self.top_k_save)
        with about("seed"):
            checked["seed"] = check_model_seed(self.seed)
        _check_bool("ignore_eos", self.ignore_eos)
        with about("dtype"):
            name = np.dtype(self.dtype).name if not isinstance(self.dtype, str) else self.dtype
            if name not in DUMP_DTYPES:
                raise InvalidInput(f"dtype {name}: use float16 or float32")
            checked["dtype"] = name
        with about("costs"):
            if not (isinstance(self.costs, (bool, CostTable, str, Mapping)) or self.costs is None):
                raise InvalidType(f"costs must be True (measure), False/None (none), or a cost table (CostTable, "
                                  f"dict or JSON), got {type(self.costs).__name__}")
        with about("cost_k"):
            try:
                checked["cost_k"] = tuple(positive_int("k", k, MAX_K) for k in self.cost_k)
            except TypeError:
                raise InvalidType(f"cost_k must be a sequence of draft lengths, got {type(self.cost_k).__name__}") \
                    from None
        with about("cost_repeats"):
            checked["cost_repeats"] = int_in("cost_repeats", self.cost_repeats, 1, MAX_REPEATS, " (rounds)")
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    @property
    def cost_config(self) -> CostMeasureConfig | None:
        """The settings of the cost measurement (``costs=True``), else None; its context is the dump's."""
        if self.costs is not True:
            return None
        return CostMeasureConfig(ks=self.cost_k, repeats=self.cost_repeats, seed=self.seed,
                                 **self.params.as_dict())


@dataclass(frozen=True, kw_only=True)
class MeasureConfig(GivenSampling):
    """The settings of :func:`fastspec.hf.measure_and_predict` (its docstring), as the caller gave them; validated on
    construction (typed errors tagged with the argument at fault, ``exc.arguments``), the fields then hold the
    validated values: ``ks`` the draft lengths sorted, each once, ``policies`` a tuple of
    :class:`~fastspec.policies.DraftPolicy`, ``costs`` a :class:`~fastspec.costs.CostTable` (read now: a mapping or
    a JSON file) or None (measured with the models).  Bounds: ``max_new_tokens`` 1..:data:`fastspec.config.
    MAX_NEW_TOKENS`, ``repeats`` and ``cost_repeats`` 1..:data:`~fastspec.config.MAX_REPEATS`, ``max_prompts`` None
    or >= 1, ``trials`` None or simulate's (:func:`fastspec.simulation.config.check_trials`), ``top_k_save`` None or
    1..:data:`~fastspec.config.MAX_WIDTH`, ``seed`` in [0, 2**63).  ``dump`` (an existing dump to predict from) and
    ``save_dump`` / ``top_k_save`` (how to keep and store the dump made now) exclude each other; ``save_dump`` must
    be a path a new dump can be written to (:func:`fastspec.io.check_dump_path`)."""

    ks: Any = (1, 2, 4)
    policies: Any = ()
    max_new_tokens: int = 64
    ignore_eos: bool = False
    seed: int = 0
    repeats: int = 1
    max_prompts: int | None = None
    dump: Any = None
    save_dump: Any = None
    top_k_save: int | None = None
    costs: Any = None
    cost_repeats: int = 20
    hf_generate: bool = True
    trials: int | None = None

    def __post_init__(self):
        checked = check_run(ks=self.ks, max_new_tokens=self.max_new_tokens, seed=self.seed,
                            max_prompts=self.max_prompts)
        checked.update(self.checked_sampling())
        with about("policies"):
            checked["policies"] = tuple(parse_policies(self.policies, name="policies"))
        if self.dump is not None:
            with about("dump"):
                if not isinstance(self.dump, (str, os.PathLike)):
                    raise InvalidType(f"dump must be a path, got {type(self.dump).__name__}")
                checked["dump"] = os.fspath(self.dump)
                if not os.path.exists(checked["dump"]):
                    raise InvalidInput(f"dump {checked['dump']}: no such file or directory")
            if self.save_dump is not None or self.top_k_save is not None:
                with about("dump", "save_dump", "top_k_save"):
                    raise InvalidInput("dump uses an existing dump; save_dump and top_k_save only apply to the dump "
                                       "measure_and_predict makes")
        if self.trials is not None:
            with about("trials"):
                checked["trials"] = check_trials(self.trials, "bernoulli")
        for name, note in (("repeats", "runs"), ("cost_repeats", "rounds")):
            with about(name):
                checked[name] = int_in(name, getattr(self, name), 1, MAX_REPEATS, f" ({note})")
        with about("top_k_save"):
            checked["top_k_save"] = check_top_k_save(self.top_k_save)
        _check_bool("ignore_eos", self.ignore_eos)
        _check_bool("hf_generate", self.hf_generate)
        if self.costs is not None:
            with about("costs"):
                checked["costs"] = CostTable.of(self.costs)
        if self.save_dump is not None:
            with about("save_dump"):
                checked["save_dump"] = check_dump_path(self.save_dump)
        for name, value in checked.items():
            object.__setattr__(self, name, value)
