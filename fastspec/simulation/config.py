"""What to simulate (:class:`SimulateConfig`, as the caller gave it, validated on construction) and how
(:class:`SimulatePlan`: the validated settings with the defaults filled in, then bound to one open dump by
:meth:`SimulateConfig.resolve`).

A typed error raised while checking a setting carries the name(s) of the argument(s) at fault as
``exc.arguments`` (:func:`about`), so a front end can speak of its own names (the command line: its flags)."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any, Mapping, NamedTuple

import numpy as np

from .._numba.rng import seed_bits
from ..config import (DEFAULT_BATCHES, DEFAULT_BLOCK_TRIALS, DEFAULT_TRIALS, MAX_BATCHES, MAX_CANDIDATES, MAX_TRIALS,
                      MIN_TRIALS)
from ..acceptance import resolve_sampling
from ..costs import CostTable
from ..errors import InvalidInput, InvalidType, about
from ..methods import check_candidate_sampling, check_method
from ..ngram import NgramProposer
from ..analysis import parse_k_list
from ..params import NAMES as SAMPLING_NAMES, format_value, sampling_overrides
from ..policies import parse_policies
from ..costs.relative import CostModel, VerifyCost
from ..ngram import NGRAM_GRAMMAR, ngram_name, parse_ngram_draft
from .speedup import FlagPricing, TablePricing

__all__ = ["parse_k_list", "MODES", "DRAFT_SAMPLING", "variants", "draft_modes", "block_trials", "check_mode",
           "check_trials", "SimulateConfig", "SimulatePlan", "about"]

MODES = ("bernoulli", "token")
SIMULATED_SAMPLING = ("iid", "deterministic")
#: how a model draft proposes: sampled from q (judged with q), or its argmax (judged with a one-hot q, as vLLM V1)
DRAFT_SAMPLING = ("sampled", "argmax")


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
    with about("verify"):
        methods = [check_method(m, name="verify") for m in _as_list(verify, "verify")]
        if not methods:
            raise InvalidInput("verify and candidates must each name at least one value")
    ws = []
    with about("candidates"):
        for w in _as_list(candidates, "candidates"):
            try:
                wi = int(w)
            except (TypeError, ValueError, OverflowError):
                raise InvalidInput(f"candidates {_shown(w)} is not an integer; write e.g. 1, 2 or 1,2,4") from None
            if (isinstance(w, (bool, np.bool_)) or wi != w and not isinstance(w, str) or wi < 1
                    or wi > MAX_CANDIDATES):
                raise InvalidInput(f"candidates = {_shown(w)} is invalid: use an integer in [1, {MAX_CANDIDATES}] "
                                   "(candidates per position)")
            ws.append(wi)
        if not ws:
            raise InvalidInput("verify and candidates must each name at least one value")
    if candidate_sampling is not None:
        with about("candidate_sampling"):
            _check_candidate_sampling(candidate_sampling)
    out = [(m, w) for m in methods for w in sorted(set(ws)) if not (m == "block" and w > 1)]
    if not out:
        with about("verify", "candidates"):
            raise InvalidInput("block verification judges one candidate per position: use candidates 1 with block "
                               "verification")
    return list(dict.fromkeys(out))


def _check_candidate_sampling(candidate_sampling) -> str:
    why = (" (without replacement the per-position acceptance depends on which candidates were drawn; it is "
           "supported by fastspec.verify_tree_probs and fastspec.exact, not by the simulator)"
           if candidate_sampling == "without_replacement" else "")
    return check_candidate_sampling(candidate_sampling, SIMULATED_SAMPLING, why=why)


def check_mode(mode) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise InvalidInput(f"mode {format_value(mode)} is unknown; choose one of: {', '.join(MODES)}")
    return mode


def _count(name, v, lo, hi, what):
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise InvalidInput(f"{name} = {format_value(v)} is invalid: give an integer from {lo} to {hi} ({what})")
    return int(v)


def check_trials(trials, mode: str = "bernoulli", *, high: int = MAX_TRIALS) -> int:
    """Monte-Carlo replays per sequence, an integer in [MIN_TRIALS, ``high``]; None: the default of ``mode``
    (:data:`fastspec.config.DEFAULT_TRIALS`).  The one check of a trial count (the simulator, the policy replays
    with their own default and cap, the measure command)."""
    return _count("trials", DEFAULT_TRIALS[check_mode(mode)] if trials is None else trials, MIN_TRIALS, high,
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


def draft_names(drafts, k_max: int = 1):
    """The requested drafts in order, each once (a repeated name is simulated once); None: every draft.  A name
    starting with "ngram" must follow the n-gram grammar (:func:`fastspec.simulation.ngram.parse_ngram_draft`)."""
    if drafts is None:
        return None
    if isinstance(drafts, str):
        drafts = [drafts]
    try:
        items = list(drafts)
    except TypeError:
        raise InvalidType(f"drafts must be a draft name or a list of names, got {type(drafts).__name__}") from None
    for name in items:
        if not isinstance(name, (str, NgramProposer)):
            raise InvalidType(f"drafts must be draft names (strings) or fastspec.ngram.NgramProposer objects, got "
                              f"{type(name).__name__} {format_value(name)}")
        if isinstance(name, str):
            parse_ngram_draft(name, k_max)
    return tuple(dict.fromkeys(items)) or None


def draft_modes(draft_sampling, candidate_sampling) -> tuple[str, str]:
    """(draft mode, candidate sampling) resolved: ``draft_sampling`` "sampled" (drafts x ~ q, judged with q) or
    "argmax" (the draft's top-1 token, judged with a one-hot q: vLLM V1), ``candidate_sampling`` "iid" or
    "deterministic" (the top-w draft tokens as point masses).  Deterministic candidates *are* argmax drafts (w = 1:
    the top-1), so either one implies the other; None: the other's counterpart (both None: sampled, iid).  Given
    both and contradictory (argmax with iid, sampled with deterministic): InvalidInput."""
    if draft_sampling is not None and (not isinstance(draft_sampling, str) or draft_sampling not in DRAFT_SAMPLING):
        with about("draft_sampling"):
            raise InvalidInput(f"draft_sampling {format_value(draft_sampling)} is unknown; choose one of: "
                               f"{', '.join(DRAFT_SAMPLING)}")
    if candidate_sampling is not None:
        with about("candidate_sampling"):
            _check_candidate_sampling(candidate_sampling)
    implied = {"iid": "sampled", "deterministic": "argmax"}
    if draft_sampling is None:
        draft_sampling = implied.get(candidate_sampling, "sampled")
    want = "deterministic" if draft_sampling == "argmax" else "iid"
    if candidate_sampling is not None and candidate_sampling != want:
        with about("draft_sampling", "candidate_sampling"):
            raise InvalidInput(f"draft_sampling {draft_sampling!r} and candidate_sampling {candidate_sampling!r} "
                               "contradict each other: deterministic candidates are the top-w draft tokens (argmax "
                               "drafts), i.i.d. candidates are sampled from q; give one of them")
    return draft_sampling, want


def _cost_model(draft_cost, verify_cost, ks):
    if draft_cost is None and verify_cost is None:
        return None
    with about("draft_cost"):
        if draft_cost is not None and (isinstance(draft_cost, (bool, np.bool_))
                                       or not isinstance(draft_cost, (int, float, np.integer, np.floating))):
            raise InvalidType(f"draft_cost must be a number >= 0, got {type(draft_cost).__name__} "
                              f"{format_value(draft_cost)}")
        c = 0.0 if draft_cost is None else float(draft_cost)
        if not (math.isfinite(c) and c >= 0):
            raise InvalidInput(f"draft_cost = {format_value(draft_cost)} is invalid: use a finite value >= 0")
    with about("verify_cost"):
        cost = CostModel(c, VerifyCost.parse(verify_cost))
    for kk in ks:
        cost.step_cost(kk)  # table coverage and positivity, before any heavy work (its message names the table)
    return cost


def _cost_table(costs):
    """A :class:`fastspec.costs.CostTable` from ``costs``: a table, a mapping (the JSON schema) or a path."""
    if not isinstance(costs, (CostTable, Mapping, str, os.PathLike)):
        raise InvalidType(f"costs must be a CostTable, a mapping in its JSON schema, a path to a JSON cost table, "
                          f"None (the dump's recorded costs) or False (none), got {type(costs).__name__}")
    return CostTable.of(costs)


def _pricing(draft_cost, verify_cost, costs, ks):
    """The pricing fixed before the dump is read: relative flags (they override everything) or a given table;
    None: the dump's recorded costs, if any, decide after opening it."""
    model = _cost_model(draft_cost, verify_cost, ks)
    if model is not None:
        return FlagPricing(model)
    if costs is None or costs is False:
        return None
    with about("costs"):
        return TablePricing(_cost_table(costs), "file")


def _batch_sizes(batch_sizes, extrapolate, pricing, costs, ks):
    """The serving batch sizes to predict (sorted), checked against the pricing known before the dump is read."""
    with about("batch_extrapolate"):
        if not isinstance(extrapolate, (bool, np.bool_)):
            raise InvalidType(f"batch_extrapolate must be True or False, got {type(extrapolate).__name__}")
    if batch_sizes is None:
        if extrapolate:
            with about("batch_extrapolate", "batch_sizes"):
                raise InvalidInput("batch_extrapolate needs batch_sizes (the serving batch sizes to predict)")
        return None
    from ..costs.table import parse_batch_list  # only with batch sizes (import time of the plain command)
    from .batch import check_batch_table

    with about("batch_sizes"):
        bs = parse_batch_list(batch_sizes, "batch_sizes")
    if isinstance(pricing, FlagPricing):
        with about("batch_sizes", "draft_cost", "verify_cost"):
            raise InvalidInput("batch_sizes needs measured seconds at each batch size (a cost table with a batch "
                               "axis, costs=), not the relative draft_cost/verify_cost")
    if costs is False:
        with about("batch_sizes", "costs"):
            raise InvalidInput("batch_sizes needs a cost table; costs=False gives none")
    if pricing is not None:
        with about("batch_sizes"):
            check_batch_table(pricing.table, bs, ks, bool(extrapolate))
    return bs


class SimulatePlan(NamedTuple):
    """How :func:`fastspec.simulate` runs a :class:`SimulateConfig`: its settings validated, with the defaults
    filled in (:attr:`SimulateConfig.checked`), then bound to one open dump (:meth:`SimulateConfig.resolve`: the
    fields after ``batch_table``; before, they are None)."""

    #: sorted draft lengths
    ks: list
    #: [(verify method, candidates)]
    variants: list
    mode: str
    #: Monte-Carlo replays per sequence (the mode's default when not given), rounded up to whole ``batches``
    trials: int
    #: Monte-Carlo batches (groups of trials) of the batch-means interval, at most ``trials``
    batches: int
    #: block-verification replays per sequence, rounded up to whole batches
    block_trials: int
    #: the seed's 64 bits
    seed: int
    #: the requested drafts (names or NgramProposer objects, each once), None: every draft of the dump
    drafts: Any
    #: the explicit sampling settings {name: value}; the others come from the dump
    sampling_overrides: dict
    #: relative flags or a given cost table (None: the dump's recorded table, if any)
    pricing: Any
    #: "sampled" or "argmax"
    draft_sampling: str
    #: "iid" or "deterministic"
    candidate_sampling: str
    #: parsed draft-length policies (fastspec.policies.DraftPolicy objects)
    policies: list
    #: serving batch sizes to predict (None: none)
    batch_sizes: Any
    batch_extrapolate: bool
    #: the resolved sampling (fastspec.params.SamplingParams)
    sampling: Any = None
    #: the model drafts and the n-gram proposers (by name) to simulate
    model_drafts: Any = None
    ngrams: Any = None
    #: the cost table of the batch-size predictions
    batch_table: Any = None
    #: the dump's kind: "dense" or "sparse"
    dump_kind: Any = None

    @property
    def extra_variants(self) -> list:
        """The verification variants beyond token verification with one candidate."""
        return [v for v in self.variants if v != ("token", 1)]


@dataclass(frozen=True)
class SimulateConfig:
    """What :func:`fastspec.simulate` simulates, as the caller gave it; validated on construction, before any dump is
    read (typed errors naming the argument).  The fields keep their given values (``dataclasses.replace`` works);
    the validated forms, with the defaults filled in, are :attr:`checked`, and :meth:`resolve` binds them to a dump.

    The fields are :func:`fastspec.simulate`'s settings (its docstring): ``k``, ``drafts``, ``sampling`` (None:
    the dump's recorded settings; or a :class:`fastspec.params.SamplingParams`), or the settings one by one
    ``temperature``, ``top_k``, ``top_p``, ``min_p`` (None: the dump's), ``mode``, ``trials`` (None: 200 in
    Bernoulli mode, 20 in token mode), ``seed``, ``batches`` (Monte-Carlo batches of trials), ``draft_cost``,
    ``verify_cost``, ``costs``, ``verify``, ``candidates``, ``candidate_sampling`` (None: "iid", or "deterministic"
    with argmax drafts), ``block_trials``, ``draft_sampling`` ("sampled" or "argmax"; None: "argmax" with
    deterministic candidates, else "sampled"; :func:`draft_modes`), ``policies`` (draft-length policies: specs of
    :data:`fastspec.policies.POLICY_GRAMMAR` or policy objects, reported as rows of kind "policy"),
    ``batch_sizes`` (serving batch sizes, e.g. ``"1,2,4,8"``: the result's ``batch`` section,
    :mod:`fastspec.simulation.batch`; needs a cost table with a batch axis) and ``batch_extrapolate``.
    A new simulator setting is one new field here, with its check in :attr:`checked`.
    """

    k: Any = 4
    drafts: Any = None
    sampling: Any = None
    temperature: Any = None
    top_k: Any = None
    top_p: Any = None
    min_p: Any = None
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
    batch_sizes: Any = None
    batch_extrapolate: bool = False

    def __post_init__(self):
        self.checked  # noqa: B018 - validated on construction (cached: the plan's settings)

    @cached_property
    def checked(self) -> SimulatePlan:
        """The settings validated, with the defaults filled in (no dump yet); the checks run in the command line's
        order of its flags, each error tagged with its argument(s) (:func:`about`)."""
        with about("k"):
            ks = parse_k_list(self.k)
        with about("policies"):
            policies = parse_policies(self.policies, name="policies")
        overrides = sampling_overrides(self.sampling, {n: getattr(self, n) for n in SAMPLING_NAMES})
        with about("mode"):
            mode = check_mode(self.mode)
        with about("trials"):
            trials = check_trials(self.trials, mode)
        with about("block_trials"):
            block_trials(self.block_trials, 1)
        variant_list = variants(self.verify, self.candidates, self.candidate_sampling)
        draft_mode, candidate_mode = draft_modes(self.draft_sampling, self.candidate_sampling)
        if draft_mode == "argmax" and any(v == "block" for v, _ in variant_list):
            with about("verify", "draft_sampling"):
                raise InvalidInput("block verification with argmax drafts is not simulated: its acceptance with a "
                                   "one-hot q is not derived here; use token verification (--verify token) with "
                                   "argmax drafts, or sampled drafts with block verification")
        if policies and draft_mode == "argmax":
            raise InvalidInput("policies replay sampled drafts (x ~ q, as Hugging Face and fastspec's loop draft): "
                               "drop --draft-sampling argmax / deterministic candidates, or the policies")
        with about("seed"):
            seed = seed_bits(self.seed)
        pricing = _pricing(self.draft_cost, self.verify_cost, self.costs, ks)
        with about("drafts"):
            drafts = draft_names(self.drafts, max(ks))
        with about("batches"):
            batches = min(_check_int("batches", self.batches, 2, MAX_BATCHES), trials)
        sizes = _batch_sizes(self.batch_sizes, self.batch_extrapolate, pricing, self.costs, ks)
        return SimulatePlan(
            ks=ks, variants=variant_list, mode=mode, trials=int(-(-trials // batches) * batches), batches=batches,
            block_trials=block_trials(self.block_trials, batches), seed=seed, drafts=drafts,
            sampling_overrides=overrides, pricing=pricing, draft_sampling=draft_mode, candidate_sampling=candidate_mode,
            policies=policies, batch_sizes=sizes, batch_extrapolate=bool(self.batch_extrapolate))

    @property
    def ks(self) -> list:
        """The sorted draft lengths (:attr:`checked`)."""
        return self.checked.ks

    @property
    def draft_mode(self) -> str:
        """"sampled" or "argmax", resolved (:func:`draft_modes`)."""
        return self.checked.draft_sampling

    @property
    def candidate_mode(self) -> str:
        """"iid" or "deterministic", resolved (:func:`draft_modes`)."""
        return self.checked.candidate_sampling

    def resolve(self, dump) -> SimulatePlan:
        """The plan for one open ``dump``: its model drafts and n-gram proposers, the sampling resolved once
        against its recorded settings, its recorded cost table when none was given, and every check that needs the
        dump (before any heavy work)."""
        plan = self.checked
        pricing = plan.pricing
        if pricing is None and self.costs is None and dump.costs is not None:
            pricing = TablePricing(dump.costs, "dump")
        table = _batch_table(dump, plan, pricing)
        names, ngrams = _split_drafts(dump, plan.drafts, plan.ks)
        if plan.mode == "token" and dump.kind != "dense":
            raise InvalidInput(f"{dump.path}: token mode needs dense logits; this dump is sparse top-k (the "
                               "Bernoulli mode reports alpha bounds)")
        sp = resolve_sampling(dump, **plan.sampling_overrides)
        extra = plan.extra_variants
        if extra and ngrams and not names:
            raise InvalidInput(ngram_variants_message(extra, ngrams, refused=True))
        if plan.draft_sampling == "argmax" and ngrams and not names:
            raise InvalidInput(ngram_argmax_message(ngrams, refused=True))
        if extra and dump.kind != "dense":
            what = " and ".join(sorted({"block verification" if v == "block" else "candidates > 1" for v, _ in extra}))
            raise InvalidInput(f"{dump.path}: {what} needs the full target and draft distributions (dense logits); "
                               "this dump is sparse top-k: use token verification with one candidate, or a dense "
                               "dump")
        return plan._replace(pricing=pricing, sampling=sp, model_drafts=names, ngrams=ngrams,
                             batch_table=table, dump_kind=dump.kind)

    @classmethod
    def from_kwargs(cls, **settings) -> "SimulateConfig":
        """A configuration from :func:`fastspec.simulate`'s keyword arguments; an unknown keyword is refused with
        the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise InvalidType(f"simulate() got unknown argument(s) {', '.join(unknown)}; the settings are: "
                              f"{', '.join(sorted(known))}")
        return cls(**settings)


def _batch_table(dump, plan, pricing):
    """The cost table of the batch-size predictions (None without batch sizes): the given one, checked on
    construction, or the dump's recorded one, checked here."""
    if plan.batch_sizes is None:
        return None
    from .batch import check_batch_table  # only with batch sizes (import time of the plain command)

    if pricing is None:
        with about("batch_sizes", "dump"):
            raise InvalidInput(f"batch_sizes needs a cost table with the batch sizes "
                               f"{','.join(map(str, plan.batch_sizes))}: {dump.path} records none; give one measured "
                               "with them (fastspec cost --batch ... --out FILE)")
    if pricing.source == "dump":
        with about("batch_sizes"):
            check_batch_table(pricing.table, plan.batch_sizes, plan.ks, plan.batch_extrapolate)
    return pricing.table


def _split_drafts(d, wanted, ks):
    """(model draft names, n-gram proposers by name) from the requested names (None: every model draft of the dump;
    a target-only dump with prompt tokens: the n-gram draft)."""
    if wanted is None:
        if d.drafts:
            return tuple(d.drafts), {}
        if d.prompt_tokens is not None:
            wanted = ("ngram",)
        else:
            raise InvalidInput(f"{d.path}: the dump has no draft model and no prompt tokens, so there is nothing to "
                               "simulate: dump with a draft (--draft), or record the prompt tokens for an n-gram draft")
    models, ngrams = [], {}
    for name in wanted:
        if isinstance(name, str) and name in d.drafts:
            models.append(name)
            continue
        proposer = parse_ngram_draft(name, max(ks))
        if proposer is None:
            have = ", ".join(d.drafts) if d.drafts else "none (a target-only dump)"
            raise InvalidInput(f"{d.path}: no draft named {name!r}; the dump's draft models: {have}; an n-gram draft "
                               f"is written {NGRAM_GRAMMAR}")
        ngrams[ngram_name(proposer)] = proposer
    return tuple(models), ngrams


def ngram_variants_message(extra, ngrams, refused: bool) -> str:
    """An n-gram proposal is one deterministic token per position: it has no block or multi-candidate variant."""
    what = " and ".join(sorted({"block verification" if v == "block" else f"{w} candidates" for v, w in extra}))
    which = ", ".join(ngrams)
    if refused:
        return (f"{what} cannot apply to the n-gram draft {which}: its proposal is one deterministic token per "
                "position, verified token by token; drop --verify block / --candidates, or add a model draft")
    return (f"{what} apply to the model drafts only: the n-gram draft {which} is verified token by token with one "
            "candidate (its rows are token rows)")


def ngram_argmax_message(ngrams, refused: bool) -> str:
    """An n-gram proposal is deterministic already: argmax drafts are a mode of model drafts."""
    which = ", ".join(ngrams)
    if refused:
        return (f"argmax drafts (--draft-sampling argmax, or deterministic candidates) apply to model drafts: the "
                f"n-gram draft {which} is a deterministic proposal judged with a one-hot q already; drop the flag, "
                "or add a model draft")
    return (f"argmax drafts apply to the model drafts only: the n-gram draft {which} is its own deterministic "
            "proposal (judged with a one-hot q either way)")
