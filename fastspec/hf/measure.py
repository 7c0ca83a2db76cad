"""Measured acceptance and wall-clock speed-up: the real speculative loop over prompts, per draft and k, timed
against plain decoding in the same run, with 95% CIs over prompts.

What :func:`measure` runs, per prompt and repeat, **interleaved**: one round visits every configuration once --
plain decoding with fastspec's runner (:func:`fastspec.hf.timed_generate`, the baseline of every speed-up),
optionally Hugging Face ``generate`` (:func:`fastspec.hf.hf_generate`, the runner's own check), and
:func:`fastspec.hf.speculative_generate` for every (draft, k) -- the starting configuration rotating from
round to round, so that load drift on a shared machine and cache effects hit every configuration alike.  All
use the same prompts, sampling parameters and token budget (``ignore_eos=True``: exactly ``max_new_tokens``
tokens per run, the fixed-length runs that make tokens per second comparable).  One untimed warm-up run per
configuration first (Numba compilation, torch's first calls).

Figures (:class:`ClockResult`, :class:`MeasureResult`):

* tokens per second = tokens / seconds, summed over prompts and repeats, for the **decoding** phase (after the
  prompt is prefilled into every KV cache: what :mod:`fastspec.costs` models) and **end to end** (the whole
  call, prefill included);
* measured speed-up of a (draft, k) = its tokens per second / plain decoding's, a ratio of totals with prompts
  as clusters and a 95% CI from the delta method (:func:`fastspec.hf.prediction.speedup_ci`): paired by
  prompt, so a prompt that is slow for every configuration does not widen the interval, and the same
  estimator (tokens over time summed over prompts) as the prediction it is compared with.  A mean of
  per-prompt ratios would weight a short prompt like a long one and is biased upwards for noisy ratios.

Draft-length policies (issue 23): ``policies`` runs fastspec's loop with each policy
(:func:`fastspec.policies.parse_policy`) for every draft model (n-gram drafts: only ``fixed`` policies; the
others are skipped and named in ``settings["skipped"]``), next to the fixed-k configurations.  ``hf_engine``
also runs Hugging Face's own assisted generation (:func:`fastspec.hf.assisted.hf_assisted_generate`) with
transformers' defaults (policy ``hf``), with each fixed k, and with each ``fixed`` / ``hf`` policy given, for every
draft model (``ngram.hf`` drafts: transformers' prompt lookup with each k), interleaved with the rest; its
rows carry ``engine="hf"`` and, when plain Hugging Face generate ran too, ``speedup_vs_hf_plain`` (the same
code path's baseline).  Seeds: the policy runs use (draft index, 2**20 + policy index, prompt, repeat); the HF
engine's runs ``torch.manual_seed`` of (draft index, 2**21 + configuration index, prompt, repeat).

Compare the result with a dump's prediction through :func:`fastspec.hf.prediction.compare`.
The page that explains it: ``docs/guide/real-models.md``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from ..errors import InvalidInput
from ..ngram import NgramProposer
from ..params import SamplingParams, given_sampling
from ..policies import parse_policy, sklearn_available
from .args import as_token_ids, check_generation_positions, check_k, check_max_new_tokens, positive_int
from .assisted import HF_DEFAULTS, AssistantSettings, hf_assisted_generate
from .loop import as_ngram, as_policy, derive_seed, speculative_generate, timed_generate
from .loop import hf_generate as _hf_generate
from .prediction import ratio_ci, speedup_ci

__all__ = ["MeasureResult", "ClockResult", "Measurement", "measure", "predicted_policies", "speculative_configs",
           "PLAIN", "HF_GENERATE"]

PLAIN = "plain"
HF_GENERATE = "hf_generate"
_TOTALS = ("verify_steps", "drafted", "accepted", "emitted")
_TIMES = {"draft": "draft_s", "target": "target_s", "verify": "verify_s", "prefill": "prefill_s",
          "decode": "decode_s", "total": "total_s"}


def _ci_dict(est: float, se: float, half: float) -> dict:
    return {"estimate": est, "standard_error": se, "ci95": [est - half, est + half]}


@dataclass
class ClockResult:
    """Wall-clock figures of one configuration (``plain``, ``hf_generate`` or ``DRAFT k=K``), per prompt
    summed over repeats: tokens generated, tokens made by decoding forwards (all but the first for Hugging
    Face generate, whose prefill forward emits it), decoding seconds and whole-call seconds."""

    config: str
    tokens: list
    decode_tokens: list
    decode_s: list
    total_s: list
    runs: int

    @property
    def tokens_per_s(self) -> float:
        """Decoding throughput: decoding-forward tokens / decoding seconds (prefill excluded)."""
        return sum(self.decode_tokens) / sum(self.decode_s) if sum(self.decode_s) > 0 else float("nan")

    @property
    def end_to_end_tokens_per_s(self) -> float:
        """Tokens / whole-call seconds (prefill included)."""
        return sum(self.tokens) / sum(self.total_s) if sum(self.total_s) > 0 else float("nan")

    def relative_to(self, base: "ClockResult", *, end_to_end: bool = False) -> dict:
        """This configuration's tokens per second over ``base``'s: estimate, standard error and 95% CI with
        prompts as clusters (:func:`~fastspec.hf.prediction.speedup_ci`)."""
        if end_to_end:
            return _ci_dict(*speedup_ci(self.tokens, self.total_s, base.tokens, base.total_s))
        return _ci_dict(*speedup_ci(self.decode_tokens, self.decode_s, base.decode_tokens, base.decode_s))

    def as_dict(self) -> dict:
        return {"config": self.config, "tokens_per_s": self.tokens_per_s,
                "end_to_end_tokens_per_s": self.end_to_end_tokens_per_s, "tokens": sum(self.tokens),
                "decode_tokens": sum(self.decode_tokens), "decode_s": sum(self.decode_s),
                "total_s": sum(self.total_s), "runs": self.runs,
                "per_prompt": {"tokens": list(self.tokens), "decode_tokens": list(self.decode_tokens),
                               "decode_s": list(self.decode_s), "total_s": list(self.total_s)}}


@dataclass
class MeasureResult:
    """Figures of one (draft, k) over every prompt and repeat: mean acceptance length = emitted / verify steps,
    its 95% CI and standard error (prompts as clusters, :func:`ratio_ci`), totals, plain steps (no n-gram
    match, or the last token) and empty n-gram proposals, per-position acceptance (steps whose draft j was
    accepted / verify steps), times in seconds summed over runs, and the run count; with a clock, ``clock``
    (:class:`ClockResult`) and ``speedup`` / ``speedup_end_to_end`` over plain decoding (estimate, standard
    error, ci95).  ``as_dict()`` is the ``measured`` object of a :func:`fastspec.hf.compare` row."""

    draft: str
    k: int
    mean_acceptance_length: float
    ci95: tuple[float, float]
    standard_error: float
    verify_steps: int
    drafted: int
    accepted: int
    emitted: int
    draft_acceptance_rate: float
    per_position_acceptance: list[float]
    time_s: dict = field(default_factory=dict)
    runs: int = 0
    plain_steps: int = 0
    empty_steps: int = 0
    clock: ClockResult | None = None
    speedup: dict | None = None
    speedup_end_to_end: dict | None = None
    policy: str | None = None
    engine: str = "fastspec"
    draft_length_histogram: list = field(default_factory=list)
    target_forwards: int | None = None
    draft_forwards: int | None = None
    speedup_vs_hf_plain: dict | None = None
    hf_settings: dict | None = None
    predicted_as: str | None = None

    @property
    def label(self) -> str:
        """How tables name the row: ``DRAFT k=K`` or ``DRAFT POLICY``, prefixed ``hf:`` for the HF engine."""
        body = f"{self.draft} k={self.k}" if self.policy is None else f"{self.draft} {self.policy}"
        return body if self.engine == "fastspec" else f"{self.engine}: {body}"

    @property
    def mean_draft_length(self) -> float:
        """Tokens drafted per verify step."""
        return self.drafted / self.verify_steps if self.verify_steps else float("nan")

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__}
        d["ci95"] = list(self.ci95)
        d["clock"] = None if self.clock is None else self.clock.as_dict()
        d["label"] = self.label
        d["mean_draft_length"] = self.mean_draft_length if self.verify_steps else None
        return d


@dataclass
class Measurement:
    """What :func:`measure` returns: ``results`` (one :class:`MeasureResult` per (draft, k), in the order of
    the drafts then the ks; iterating a Measurement iterates them), ``plain`` and ``hf_generate``
    (:class:`ClockResult`, None when not run), ``runner_vs_generate`` (plain decoding's tokens per second with
    fastspec's runner over Hugging Face generate's, decoding and end to end, with CIs; None unless both ran),
    ``schedule`` (the (prompt, repeat, configuration) of every timed run, in execution order) and
    ``settings``."""

    results: list
    plain: ClockResult | None = None
    hf_generate: ClockResult | None = None
    runner_vs_generate: dict | None = None
    schedule: list = field(default_factory=list)
    settings: dict = field(default_factory=dict)

    def __iter__(self) -> Iterator[MeasureResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, i):
        return self.results[i]

    def as_dict(self) -> dict:
        return {"results": [r.as_dict() for r in self.results],
                "plain": None if self.plain is None else self.plain.as_dict(),
                "hf_generate": None if self.hf_generate is None else self.hf_generate.as_dict(),
                "runner_vs_generate": self.runner_vs_generate, "settings": self.settings,
                "schedule": [list(s) for s in self.schedule]}


def _clock(config: str, runs: list[list]) -> ClockResult:
    """ClockResult from ``runs[i]`` (results of prompt i: SpecResult or GenerateResult)."""
    def dtok(r):
        return getattr(r, "decode_tokens", len(r.tokens))

    return ClockResult(config, [sum(len(r.tokens) for r in rs) for rs in runs],
                       [sum(dtok(r) for r in rs) for rs in runs],
                       [sum(r.decode_s for r in rs) for rs in runs], [sum(r.total_s for r in rs) for rs in runs],
                       sum(len(rs) for rs in runs))


def _lengths(r) -> list[int]:
    """Tokens drafted per verify step of one run (a SpecResult or an HF engine result)."""
    return [int(d) for d in r.draft_lengths if int(d) > 0]


def _aggregate(name: str, k: int, runs: list[list], plain: ClockResult | None, *, policy: str | None = None,
               engine: str = "fastspec", hf_plain: ClockResult | None = None, hf_settings: dict | None = None,
               ngram: bool = False, predicted_as: str | None = None) -> MeasureResult:
    """The :class:`MeasureResult` of one configuration from its runs (``runs[i]``: the results of prompt i:
    :class:`~fastspec.hf.SpecResult` or :class:`~fastspec.hf.assisted.HFAssistedResult`)."""
    flat = [r for per_prompt in runs for r in per_prompt]
    est, se, half = ratio_ci([sum(r.emitted for r in rs) for rs in runs],
                             [sum(r.verify_steps for r in rs) for rs in runs])
    tot = {f: sum(getattr(r, f) for r in flat) for f in _TOTALS}
    lengths = [d for r in flat for d in _lengths(r)]
    width = max([k, *lengths])
    hist = np.bincount(np.asarray(lengths, np.int64), minlength=width + 1) if lengths else np.zeros(width + 1, int)
    pos = np.zeros(width, np.int64)
    for r in flat:
        for a in r.accepted_per_step:
            pos[:int(a)] += 1
    label = f"{name} k={k}" if policy is None else f"{name} {policy}"
    clock = _clock(label if engine == "fastspec" else f"{engine}: {label}", runs)
    times = {key: sum(getattr(r, attr) for r in flat) for key, attr in _TIMES.items()
             if all(hasattr(r, attr) for r in flat)}
    if engine == "fastspec":
        tf = sum(r.verify_steps + r.plain_steps for r in flat)
        df = None if ngram else tot["drafted"]
    else:
        tf, df = sum(r.target_forwards for r in flat), sum(r.draft_forwards for r in flat)
    return MeasureResult(
        draft=name, k=k, mean_acceptance_length=est, ci95=(est - half, est + half), standard_error=se,
        verify_steps=tot["verify_steps"], drafted=tot["drafted"], accepted=tot["accepted"], emitted=tot["emitted"],
        draft_acceptance_rate=tot["accepted"] / tot["drafted"] if tot["drafted"] else float("nan"),
        per_position_acceptance=(pos / max(tot["verify_steps"], 1)).tolist(),
        time_s=times, runs=len(flat),
        plain_steps=sum(r.plain_steps for r in flat), empty_steps=sum(getattr(r, "empty_steps", 0) for r in flat),
        clock=clock, speedup=None if plain is None else clock.relative_to(plain),
        speedup_end_to_end=None if plain is None else clock.relative_to(plain, end_to_end=True), policy=policy,
        engine=engine, draft_length_histogram=hist.tolist(), target_forwards=tf, draft_forwards=df,
        speedup_vs_hf_plain=None if hf_plain is None else clock.relative_to(hf_plain), hf_settings=hf_settings,
        predicted_as=predicted_as)


@dataclass(frozen=True)
class _Config:
    """One timed configuration: ``kind`` plain / hf_generate / fixed (fastspec's loop, fixed k) / policy
    (fastspec's loop under a policy) / hf (Hugging Face's assisted generation); ``index`` keys its seeds."""

    kind: str
    di: int = 0
    name: str = ""
    k: int = 0
    index: int = 0
    policy: object = None
    settings: object = None

    @property
    def label(self) -> str:
        if self.kind in (PLAIN, HF_GENERATE):
            return self.kind
        if self.kind == "fixed":
            return f"{self.name} k={self.k}"
        if self.kind == "policy":
            return f"{self.name} {self.policy.name}"
        return f"hf: {self.name} {self.settings.label}"


def predicted_policies(policies: Sequence = (), hf_engine: bool = False) -> list[str]:
    """The policy names a prediction needs for :func:`measure`'s rows (``MeasureResult.predicted_as``): every
    policy given, and with ``hf_engine`` those Hugging Face's runs stand for (its defaults ``hf``, each ``hf``
    policy; with ``tune=off`` when scikit-learn is not importable, since transformers then never tunes)."""
    pols = [as_policy(p, False) for p in policies]
    out = [p.name for p in pols]
    if hf_engine:
        sk = sklearn_available()
        hf_runs = [AssistantSettings.defaults()] + [AssistantSettings.from_policy(p) for p in pols
                                                    if p.kind in ("fixed", "hf")]
        out += [name for st in hf_runs if (name := st.predicted_as(sk)) is not None]
    return list(dict.fromkeys(out))


def _hf_defaults():
    return parse_policy(HF_DEFAULTS)


def speculative_configs(drafts: Mapping, ks: Sequence[int], policies: Sequence = (), hf_engine: bool = False) -> list:
    """The labels of the speculative configurations :func:`measure` times for these drafts ({name: model or
    n-gram proposer / specification}), in its order (fixed k, policies, the HF engine's); skipped ones left out."""
    drafts = {name: (as_ngram(d) or d) for name, d in drafts.items()}
    return [c.label for c in _engine_configs(drafts, [check_k(k) for k in ks], [as_policy(p, False) for p in policies],
                                             hf_engine, [])]


def _engine_configs(drafts: Mapping, ks, policies, hf_engine: bool, skipped: list) -> list:
    """The speculative configurations in order: fixed k per draft, each policy per draft, then the HF engine's."""

    out = [_Config("fixed", di, name, k) for di, name in enumerate(drafts) for k in ks]
    for di, (name, d) in enumerate(drafts.items()):
        for pi, pol in enumerate(policies):
            if isinstance(d, NgramProposer) and pol.kind != "fixed":
                skipped.append(f"{name} {pol.name}: an n-gram draft runs fixed policies only")
                continue
            out.append(_Config("policy", di, name, int(pol.k_max), 2 ** 20 + pi, policy=pol))
    if not hf_engine:
        return out
    for di, (name, d) in enumerate(drafts.items()):
        if isinstance(d, NgramProposer):
            if d.preset != "hf":
                skipped.append(f"hf: {name}: transformers' prompt lookup has its own rule; give ngram.hf drafts")
                continue
            settings = [AssistantSettings.ngram(k, d.max_n, label=f"k={k}") for k in ks]
        else:
            settings = [AssistantSettings.defaults()] + [AssistantSettings.fixed(k) for k in ks]
            for pol in policies:
                if (pol.kind == "fixed" and pol.k in ks) or pol == _hf_defaults():
                    continue  # run already (a k of ks; transformers' defaults)
                if pol.kind in ("fixed", "hf"):
                    settings.append(AssistantSettings.from_policy(pol))
                else:
                    skipped.append(f"hf: {name} {pol.name}: transformers has no {pol.kind} policy")
        for ci, st in enumerate(settings):
            k = st.prompt_lookup[0] if st.prompt_lookup else (st.num_assistant_tokens or 0)
            out.append(_Config("hf", di, name, int(k), 2 ** 21 + ci, settings=st))
    return out


def measure(target, drafts: Mapping, prompts: Sequence[Sequence[int]], ks: Sequence[int], *, temperature=1.0,
            top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128, eos_token_id=None, ignore_eos: bool = False,
            repeats: int = 1, plain: bool = True, hf_generate: bool = False, warmup: bool = True,
            progress: Callable[[int], None] | None = None, policies: Sequence = (),
            hf_engine: bool = False, sampling: SamplingParams | None = None) -> Measurement:
    """Run plain decoding, optionally Hugging Face ``generate``, and :func:`fastspec.hf.speculative_generate`
    for every (draft, k) over every prompt (``repeats`` times each), interleaved round-robin per prompt and
    repeat with a rotating start (module docstring), and aggregate.

    ``drafts``: {name: draft model, :class:`fastspec.ngram.NgramProposer` or n-gram specification}.  Seeds:
    (draft index, k, prompt, repeat) for the speculative runs, (prompt) for plain decoding's first repeat (the
    seed of the continuation :func:`fastspec.hf.dump_logits` samples) and (prompt, repeat) after it.  ``ignore_eos``:
    every run makes exactly ``max_new_tokens`` tokens (``eos_token_id`` is not used).  Mean acceptance length
    = total emitted / total verify steps with a 95% CI from :func:`ratio_ci` over prompts (repeats of a prompt
    pooled); speed-ups as in the module docstring (``plain=False``: none).  ``policies``: draft-length policies
    (spec strings or :class:`fastspec.policies.DraftPolicy`) run in fastspec's loop; ``hf_engine``: also Hugging
    Face's assisted generation (module docstring).  ``progress(1)`` is called after each timed run.  Returns a
    :class:`Measurement` (its results: fixed k per draft, then the policies, then the HF engine's rows)."""

    params = given_sampling(sampling, temperature, top_k, top_p, min_p)
    ks = [check_k(k) for k in ks]
    max_new_tokens = check_max_new_tokens(max_new_tokens)
    repeats = positive_int("repeats", repeats)
    prompts = [as_token_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    if not drafts or not prompts or not ks:
        raise InvalidInput("measure needs at least one draft, one prompt and one k")
    pols = [as_policy(p, False) for p in policies]
    drafts = {name: (as_ngram(d) or d) for name, d in drafts.items()}
    check_generation_positions({"the target": target, **{f"draft {name}": d for name, d in drafts.items()}}, prompts,
                               max_new_tokens)  # before any run: a budget the models cannot hold fails at once
    eos = None if ignore_eos else eos_token_id
    sp = params.as_dict()

    def run(c: _Config, i, rep, n_new):
        if c.kind == PLAIN:
            s = derive_seed(seed, i) if rep == 0 else derive_seed(seed, i, rep)
            return timed_generate(target, prompts[i], **sp, seed=s, max_new_tokens=n_new, eos_token_id=eos)
        if c.kind == HF_GENERATE:
            return _hf_generate(target, prompts[i], **sp, seed=derive_seed(seed, i, rep, 1), max_new_tokens=n_new,
                                eos_token_id=eos)
        d = drafts[c.name]
        if c.kind == "hf":
            return hf_assisted_generate(target, None if isinstance(d, NgramProposer) else d, prompts[i],
                                        settings=c.settings, **sp, seed=derive_seed(seed, c.di, c.index, i, rep),
                                        max_new_tokens=n_new, eos_token_id=eos)
        if c.kind == "policy":
            return speculative_generate(target, d, prompts[i], **sp, seed=derive_seed(seed, c.di, c.index, i, rep),
                                        max_new_tokens=n_new, eos_token_id=eos, policy=c.policy)
        return speculative_generate(target, d, prompts[i], c.k, **sp, seed=derive_seed(seed, c.di, c.k, i, rep),
                                    max_new_tokens=n_new, eos_token_id=eos)

    skipped: list[str] = []
    configs = ([_Config(PLAIN)] if plain else []) + ([_Config(HF_GENERATE)] if hf_generate else []) + \
        _engine_configs(drafts, ks, pols, hf_engine, skipped)
    if warmup:
        for c in configs:
            run(c, 0, 0, min(max_new_tokens, 2 * max(ks) + 2))
    runs = {c: [[] for _ in prompts] for c in configs}
    schedule = []
    rnd = 0
    for i in range(len(prompts)):
        for rep in range(repeats):
            start = rnd % len(configs)
            for c in configs[start:] + configs[:start]:
                runs[c][i].append(run(c, i, rep, max_new_tokens))
                schedule.append((i, rep, c.label))
                if progress is not None:
                    progress(1)
            rnd += 1
    plain_clock = _clock(PLAIN, runs[configs[0]]) if plain else None
    hf_clock = _clock(HF_GENERATE, runs[configs[int(plain)]]) if hf_generate else None
    results = []
    sklearn = sklearn_available()
    for c in configs:
        if c.kind in (PLAIN, HF_GENERATE):
            continue
        ngram = isinstance(drafts[c.name], NgramProposer)
        if c.kind == "hf":
            results.append(_aggregate(c.name, c.k, runs[c], plain_clock, policy=c.settings.label, engine="hf",
                                      hf_plain=hf_clock, hf_settings=c.settings.as_dict(), ngram=ngram,
                                      predicted_as=c.settings.predicted_as(sklearn)))
        else:
            name = None if c.policy is None else c.policy.name
            results.append(_aggregate(c.name, c.k, runs[c], plain_clock, ngram=ngram, policy=name,
                                      predicted_as=None if ngram else name))
    versus = None
    if plain_clock is not None and hf_clock is not None:
        versus = {"decode": plain_clock.relative_to(hf_clock),
                  "end_to_end": plain_clock.relative_to(hf_clock, end_to_end=True)}
    settings = {**sp, "seed": seed, "max_new_tokens": max_new_tokens, "ignore_eos": bool(ignore_eos),
                "repeats": repeats, "num_prompts": len(prompts), "warmup": bool(warmup),
                "order": "round-robin per prompt and repeat, start rotating by one configuration each round",
                "policies": [p.name for p in pols], "hf_engine": bool(hf_engine), "skipped": skipped}
    if hf_engine:
        settings["sklearn_importable"] = sklearn
    return Measurement(results, plain_clock, hf_clock, versus, schedule, settings)
