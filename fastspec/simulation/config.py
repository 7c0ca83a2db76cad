"""What to simulate: draft lengths, verification variants, modes and trial counts (validated up front)."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

from .._numba.rng import seed_bits
from ..config import (DEFAULT_BATCHES, DEFAULT_BLOCK_TRIALS, DEFAULT_TRIALS, MAX_BATCHES, MAX_CANDIDATES, MAX_K,
                      MAX_TRIALS, MIN_TRIALS)
from ..errors import InvalidInput, InvalidType
from ..methods import check_candidate_sampling, check_method
from ..params import NAMES as SAMPLING_NAMES, SamplingParams, _scalar, format_value

__all__ = ["parse_k_list", "MODES", "DRAFT_SAMPLING", "variants", "draft_modes", "block_trials", "check_mode",
           "check_trials", "SimulateConfig"]

MODES = ("bernoulli", "token")
SIMULATED_SAMPLING = ("iid", "deterministic")
#: how a model draft proposes: sampled from q (judged with q), or its argmax (judged with a one-hot q, as vLLM V1)
DRAFT_SAMPLING = ("sampled", "argmax")


def parse_k_list(spec) -> list[int]:
    """``4`` / ``"4"`` / ``"1,2,4,8"`` / ``"1-8"`` (and mixtures ``"1-3,8"``) -> sorted unique ks in
    [1, MAX_K].  Ranges are checked against the cap before they are expanded."""
    items: list[int] = []
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        items = [int(spec)]
    elif isinstance(spec, str):
        for part in spec.split(","):
            part = part.strip()
            m = re.fullmatch(r"(-?\d+)\s*-\s*(-?\d+)", part)
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                if hi < lo:
                    raise InvalidInput(f"k range {part!r} is empty; write low-high, e.g. 1-8")
                if lo < 1 or hi > MAX_K:
                    raise InvalidInput(f"k range {part!r} is outside [1, {MAX_K}] (drafted tokens per step)")
                items.extend(range(lo, hi + 1))
            else:
                try:
                    items.append(int(part))
                except ValueError:
                    raise InvalidInput(f"k {part!r} is not an integer; write e.g. 4, 1,2,4,8 or 1-8") from None
    elif isinstance(spec, Sequence):
        for v in spec:
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise InvalidType(f"k values must be integers, got {type(v).__name__} {format_value(v)}")
            items.append(int(v))
    else:
        raise InvalidType(f"k must be an integer, a list of integers or a string like '1-8', got "
                          f"{type(spec).__name__}")
    if not items:
        raise InvalidInput("k is empty; give at least one draft length, e.g. 4")
    bad = [v for v in items if v < 1]
    if bad:
        raise InvalidInput(f"k = {bad[0]} is invalid: the draft length must be >= 1")
    if max(items) > MAX_K:
        raise InvalidInput(f"k = {max(items)} is too large (at most {MAX_K} drafted tokens per step)")
    return sorted(set(items))


def _as_list(value, name):
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return [value]  # one value (an integral float such as 2.0 counts, 2.5 is refused by the caller)
    try:
        return list(value)
    except TypeError:
        raise InvalidType(f"{name} must be a value or a list of values, got {type(value).__name__}") from None


def _shown(v) -> str:
    """A value in a message as it was written: text as it is (a list item of "1,2.5"), numbers as typed."""
    return v if isinstance(v, str) else format_value(v)


def variants(verify, candidates, candidate_sampling) -> list[tuple[str, int]]:
    """[(verify method, candidates)] rows to compute per (draft, k): token verification with each w, block
    verification with w = 1."""
    methods = [check_method(m, name="verify") for m in _as_list(verify, "verify")]
    ws = []
    for w in _as_list(candidates, "candidates"):
        try:
            wi = int(w)
        except (TypeError, ValueError, OverflowError):
            raise InvalidInput(f"candidates {_shown(w)} is not an integer; write e.g. 1, 2 or 1,2,4") from None
        if isinstance(w, (bool, np.bool_)) or wi != w and not isinstance(w, str) or wi < 1 or wi > MAX_CANDIDATES:
            raise InvalidInput(f"candidates = {_shown(w)} is invalid: use an integer in [1, {MAX_CANDIDATES}] "
                               "(candidates per position)")
        ws.append(wi)
    if not methods or not ws:
        raise InvalidInput("verify and candidates must each name at least one value")
    why = (" (without replacement the per-position acceptance depends on which candidates were drawn; it is "
           "supported by fastspec.verify_tree_probs and fastspec.exact, not by the simulator)"
           if candidate_sampling == "without_replacement" else "")
    if candidate_sampling is not None:
        check_candidate_sampling(candidate_sampling, SIMULATED_SAMPLING, why=why)
    out = [(m, w) for m in methods for w in sorted(set(ws)) if not (m == "block" and w > 1)]
    if not out:
        raise InvalidInput("block verification judges one candidate per position: use candidates 1 with block "
                           "verification")
    return list(dict.fromkeys(out))


def check_mode(mode) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidInput(f"mode {format_value(mode)} is unknown; choose one of: {', '.join(MODES)}")
    return mode


def _count(name, v, lo, hi, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise InvalidInput(f"{name} = {format_value(v)} is invalid: give an integer from {lo} to {hi} ({what})")
    return int(v)


def check_trials(trials, mode) -> int:
    """Monte-Carlo replays per sequence (default by mode), an integer in [MIN_TRIALS, MAX_TRIALS]."""
    return _count("trials", DEFAULT_TRIALS[check_mode(mode)] if trials is None else trials, MIN_TRIALS, MAX_TRIALS,
                  "replays per sequence")


def block_trials(n, batches) -> int:
    """Replays per sequence for block verification, rounded up to a multiple of the batches."""
    n = _count("block_trials", DEFAULT_BLOCK_TRIALS if n is None else n, MIN_TRIALS, MAX_TRIALS,
               "block-verification replays per sequence")
    b = min(batches, n)
    return int(-(-n // b) * b)


def _check_int(name, v, lo, hi):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise InvalidType(f"{name} must be an integer from {lo} to {hi}, got {type(v).__name__} {format_value(v)}")
    if not lo <= v <= hi:
        raise InvalidInput(f"{name} = {format_value(v)} is invalid: give an integer from {lo} to {hi}")
    return int(v)


def draft_names(drafts):
    """The requested drafts in order, each once (a repeated name is simulated once); None: every draft."""
    if drafts is None:
        return None
    if isinstance(drafts, str):
        drafts = [drafts]
    try:
        items = list(drafts)
    except TypeError:
        raise InvalidType(f"drafts must be a draft name or a list of names, got {type(drafts).__name__}") from None
    from ..ngram import NgramProposer

    for name in items:
        if not isinstance(name, (str, NgramProposer)):
            raise InvalidType(f"drafts must be draft names (strings) or fastspec.ngram.NgramProposer objects, got "
                              f"{type(name).__name__} {format_value(name)}")
    return tuple(dict.fromkeys(items)) or None


def draft_modes(draft_sampling, candidate_sampling) -> tuple[str, str]:
    """(draft mode, candidate sampling) resolved: ``draft_sampling`` "sampled" (drafts x ~ q, judged with q) or
    "argmax" (the draft's top-1 token, judged with a one-hot q: vLLM V1), ``candidate_sampling`` "iid" or
    "deterministic" (the top-w draft tokens as point masses).  Deterministic candidates *are* argmax drafts (w = 1:
    the top-1), so either one implies the other; None: the other's counterpart (both None: sampled, iid).  Given
    both and contradictory (argmax with iid, sampled with deterministic): InvalidInput."""
    if draft_sampling is not None and (not isinstance(draft_sampling, str) or draft_sampling not in DRAFT_SAMPLING):
        raise InvalidInput(f"draft_sampling {format_value(draft_sampling)} is unknown; choose one of: "
                           f"{', '.join(DRAFT_SAMPLING)}")
    if candidate_sampling is not None:
        why = (" (without replacement the per-position acceptance depends on which candidates were drawn; it is "
               "supported by fastspec.verify_tree_probs and fastspec.exact, not by the simulator)"
               if candidate_sampling == "without_replacement" else "")
        check_candidate_sampling(candidate_sampling, SIMULATED_SAMPLING, why=why)
    implied = {"iid": "sampled", "deterministic": "argmax"}
    if draft_sampling is None:
        draft_sampling = implied.get(candidate_sampling, "sampled")
    want = "deterministic" if draft_sampling == "argmax" else "iid"
    if candidate_sampling is not None and candidate_sampling != want:
        raise InvalidInput(f"draft_sampling {draft_sampling!r} and candidate_sampling {candidate_sampling!r} "
                           "contradict each other: deterministic candidates are the top-w draft tokens (argmax "
                           "drafts), i.i.d. candidates are sampled from q; give one of them")
    return draft_sampling, want


def sampling_overrides(sampling) -> dict:
    """{name: value} of the explicitly requested sampling settings (validated); the others come from the dump.

    ``sampling``: None (the dump's recorded settings), a :class:`fastspec.params.SamplingParams` (every setting
    given) or a mapping of some of ``temperature``, ``top_k``, ``top_p``, ``min_p`` (None values: the dump's)."""
    if sampling is None:
        return {}
    if isinstance(sampling, SamplingParams):
        return sampling.as_dict()
    if not isinstance(sampling, Mapping):
        raise InvalidType(f"sampling must be a SamplingParams, a mapping of its settings or None (the dump's "
                          f"recorded settings), got {type(sampling).__name__}")
    unknown = set(sampling) - set(SAMPLING_NAMES)
    if unknown:
        raise InvalidInput(f"unknown sampling parameter(s): {', '.join(sorted(map(str, unknown)))}")
    return {n: _scalar(n, sampling[n]) for n in SAMPLING_NAMES if sampling.get(n) is not None}


def _cost_model(draft_cost, verify_cost, ks):
    from ..costs.relative import CostModel, VerifyCost

    if draft_cost is None and verify_cost is None:
        return None
    if draft_cost is not None and (isinstance(draft_cost, (bool, np.bool_))
                                   or not isinstance(draft_cost, (int, float, np.integer, np.floating))):
        raise InvalidType(f"draft_cost must be a number >= 0, got {type(draft_cost).__name__} "
                          f"{format_value(draft_cost)}")
    c = 0.0 if draft_cost is None else float(draft_cost)
    if not (math.isfinite(c) and c >= 0):
        raise InvalidInput(f"draft_cost = {format_value(draft_cost)} is invalid: give a finite number >= 0 (one draft "
                           "forward relative to one target forward)")
    cost = CostModel(c, VerifyCost.parse(verify_cost))
    for kk in ks:
        cost.step_cost(kk)  # table coverage and positivity, before any heavy work
    return cost


def _cost_table(costs):
    """A :class:`fastspec.costs.CostTable` from ``costs``: a table, a mapping (the JSON schema) or a path."""
    from ..costs import CostTable

    if not isinstance(costs, (CostTable, Mapping, str, os.PathLike)):
        raise InvalidType(f"costs must be a CostTable, a mapping in its JSON schema, a path to a JSON cost table, "
                          f"None (the dump's recorded costs) or False (none), got {type(costs).__name__}")
    return CostTable.of(costs)


def _pricing(draft_cost, verify_cost, costs, ks):
    """The pricing fixed before the dump is read: relative flags (they override everything) or a given table;
    None: the dump's recorded costs, if any, decide after opening it."""
    from .speedup import FlagPricing, TablePricing

    model = _cost_model(draft_cost, verify_cost, ks)
    if model is not None:
        return FlagPricing(model)
    if costs is None or costs is False:
        return None
    return TablePricing(_cost_table(costs), "file")


@dataclass(frozen=True)
class SimulateConfig:
    """What :func:`fastspec.simulate` simulates, validated once, on construction (before any dump is read).

    The fields are :func:`fastspec.simulate`'s settings (its docstring): ``k``, ``drafts``, ``sampling`` (None:
    the dump's recorded settings; a :class:`fastspec.params.SamplingParams`; or a mapping of some of
    ``temperature``, ``top_k``, ``top_p``, ``min_p``), ``mode``, ``trials``, ``seed``, ``batches``,
    ``draft_cost``, ``verify_cost``, ``costs``, ``verify``, ``candidates``, ``candidate_sampling`` (None: "iid",
    or "deterministic" with argmax drafts), ``block_trials`` and ``draft_sampling`` ("sampled" or "argmax"; None:
    "argmax" with deterministic candidates, else "sampled"; :func:`draft_modes`).  The validated forms are
    attributes: ``ks`` (sorted draft lengths), ``variant_list``
    (``[(verify, candidates)]``), ``trials`` / ``batches`` / ``block_trials`` (rounded to whole batches),
    ``seed_value`` (the seed's 64 bits), ``draft_list`` (names or None), ``overrides`` (the explicit sampling
    settings), ``pricing`` (relative flags or a given cost table; None: the dump's recorded table, if any),
    ``draft_mode`` and ``candidate_mode`` (the resolved draft and candidate sampling).  ``policies``: draft-length
    policies (specs of :data:`fastspec.policies.POLICY_GRAMMAR` or Policy objects) reported as rows of kind
    "policy" (``policy_list``, parsed).
    A new simulator setting is one new field here (with its check in ``__post_init__``).
    """

    k: Any = 4
    drafts: Any = None
    sampling: Any = None
    mode: str = "bernoulli"
    trials: int | None = None
    seed: int = 0
    batches: int = DEFAULT_BATCHES
    draft_cost: Any = None
    verify_cost: Any = None
    costs: Any = None
    verify: Any = "token"
    candidates: Any = 1
    candidate_sampling: str | None = None
    block_trials: int | None = None
    draft_sampling: str | None = None
    policies: Any = None
    ks: list = field(init=False, repr=False, compare=False)
    variant_list: list = field(init=False, repr=False, compare=False)
    seed_value: int = field(init=False, repr=False, compare=False)
    draft_list: Any = field(init=False, repr=False, compare=False)
    overrides: dict = field(init=False, repr=False, compare=False)
    pricing: Any = field(init=False, repr=False, compare=False)
    draft_mode: str = field(init=False, repr=False, compare=False)
    candidate_mode: str = field(init=False, repr=False, compare=False)
    policy_list: list = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        put = object.__setattr__
        put(self, "ks", parse_k_list(self.k))
        put(self, "variant_list", variants(self.verify, self.candidates, self.candidate_sampling))
        trials = check_trials(self.trials, self.mode)
        put(self, "seed_value", seed_bits(self.seed))
        batches = min(_check_int("batches", self.batches, 2, MAX_BATCHES), trials)
        put(self, "batches", batches)
        put(self, "trials", int(-(-trials // batches) * batches))
        put(self, "block_trials", block_trials(self.block_trials, batches))
        put(self, "pricing", _pricing(self.draft_cost, self.verify_cost, self.costs, self.ks))
        put(self, "draft_list", draft_names(self.drafts))
        put(self, "overrides", sampling_overrides(self.sampling))
        draft_mode, candidate_mode = draft_modes(self.draft_sampling, self.candidate_sampling)
        put(self, "draft_mode", draft_mode)
        put(self, "candidate_mode", candidate_mode)
        from ..policies import parse_policies

        put(self, "policy_list", parse_policies(self.policies, name="policies"))
        if self.policy_list and draft_mode == "argmax":
            raise InvalidInput("policies replay sampled drafts (x ~ q, as Hugging Face and fastspec's loop draft): "
                               "drop --draft-sampling argmax / deterministic candidates, or the policies")
        if draft_mode == "argmax" and any(v == "block" for v, _ in self.variant_list):
            raise InvalidInput("block verification with argmax drafts is not simulated: its acceptance with a one-hot "
                               "q is not derived here; use token verification (--verify token) with argmax drafts, "
                               "or sampled drafts with block verification")

    @classmethod
    def from_kwargs(cls, *, temperature=None, top_k=None, top_p=None, min_p=None, **settings) -> "SimulateConfig":
        """A configuration from :func:`fastspec.simulate`'s keyword arguments (the sampling settings one by one
        or as ``sampling``); an unknown keyword is refused with the known ones."""
        known = {f.name for f in fields(cls) if f.init}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise InvalidType(f"simulate() got unknown argument(s) {', '.join(unknown)}; the settings are: "
                              f"{', '.join(sorted(known | set(SAMPLING_NAMES)))}")
        loose = {n: v for n, v in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                                   ("min_p", min_p)) if v is not None}
        if loose:
            if settings.get("sampling") is not None:
                raise InvalidInput("give the sampling settings either as sampling= or one by one "
                                   "(temperature=, top_k=, top_p=, min_p=), not both")
            settings["sampling"] = loose
        return cls(**settings)
