"""Hugging Face's own assisted generation (``target.generate(assistant_model=draft, ...)``), run and counted by
fastspec: the engine a policy's prediction and fastspec's loop are checked against (issue 23, item 3).

What :func:`hf_assisted_generate` runs: ``target.generate(input_ids, assistant_model=draft, do_sample=T > 0,
temperature / top_k / top_p / min_p, max_new_tokens)`` with transformers' own ``AssistedCandidateGenerator``,
``ConfidenceCriteria``, ``_speculative_sampling`` (T > 0) or greedy matching (T = 0) -- nothing re-implemented.
How the assistant drafts comes from the draft model's ``generation_config`` (transformers reads
``num_assistant_tokens``, ``num_assistant_tokens_schedule`` and ``assistant_confidence_threshold`` from the
*assistant's* config, not from the one passed to ``generate``); :class:`AssistantSettings` sets them for one call
and restores them afterwards (so the ``heuristic`` schedule, which transformers writes back into the assistant's
config at the end of a call, starts every prompt from the same value here):

* ``AssistantSettings.defaults()`` -- transformers' defaults, untouched (5.24: 20 tokens, ``constant``, threshold
  0.4, the threshold re-tuned from an ROC of past matches only when scikit-learn is importable);
* ``AssistantSettings.fixed(k)`` -- k tokens per step: ``num_assistant_tokens=k``, schedule ``constant``,
  ``assistant_confidence_threshold=0.0`` (transformers adds ``ConfidenceCriteria`` only for a threshold > 0 and
  tunes it only when it is truthy: 0.0 turns both off).

Counting is by observation, not re-derivation: forward hooks on both models count their forwards, and the
candidate generator transformers builds is wrapped so that every ``get_candidates`` records the drafted length
(and the assistant's ``num_assistant_tokens`` and threshold at that step) and every ``update_candidate_strategy``
records the accepted drafts transformers itself computed (``n_matches``, after its length / EOS crop).  A step
that drafts nothing (the last token of the budget) is a plain target step, as in :mod:`fastspec.hf.loop`.

Clock: transformers has no separate prefill -- its first step feeds the whole prompt to the draft and the whole
prompt plus the first drafts to the target.  ``prefill_s`` is the time to the first step's tokens (a streamer
stamp) and ``decode_tokens`` excludes that step's tokens, so tokens / ``decode_s`` is the steady decoding
throughput, comparable with :class:`fastspec.hf.GenerateResult` of ``hf_generate`` (which excludes its first
token likewise).

EOS: ``eos_token_id=None`` runs exactly ``max_new_tokens`` tokens with EOS an ordinary token: both models'
``generation_config.eos_token_id`` is set to None for the call (not ``min_new_tokens``, which would mask EOS and
change the distribution).  Seeds: ``torch.manual_seed(seed)`` right before the call (torch's global generator
draws the draft's and the target's samples: same law as fastspec's loop, not the same draws).

torch and transformers are used through :mod:`fastspec.hf.loop` (imported inside the functions only).  Whether
transformers tunes its threshold (scikit-learn importable): :func:`fastspec.policies.sklearn_available`.
The page that explains it: ``docs/engines/transformers.md``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidInput

__all__ = ["AssistantSettings", "HFAssistedResult", "hf_assisted_generate", "HF_DEFAULTS"]

#: the label of transformers' own defaults for assisted generation
HF_DEFAULTS = "hf"


@dataclass(frozen=True)
class AssistantSettings:
    """The assistant's ``generation_config`` fields for one call (None: left as the draft model has them, i.e.
    transformers' defaults when the model sets none).  ``label``: how rows name it (``hf``, ``fixed:k=4``, ...)."""

    num_assistant_tokens: int | None = None
    schedule: str | None = None
    confidence_threshold: float | None = None
    label: str = HF_DEFAULTS
    prompt_lookup: tuple | None = None  # (num_tokens, max_matching_ngram_size): transformers' prompt lookup
    policy: object = None  # the fastspec.policies.DraftPolicy it stands for (None: transformers' defaults, or fixed k)

    _FIELDS = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")

    @classmethod
    def defaults(cls) -> "AssistantSettings":
        return cls(label=HF_DEFAULTS)

    @classmethod
    def fixed(cls, k: int) -> "AssistantSettings":
        from .args import check_k

        k = check_k(k)
        return cls(k, "constant", 0.0, label=f"fixed:k={k}")

    @classmethod
    def ngram(cls, k: int, max_n: int = 2, label: str | None = None) -> "AssistantSettings":
        """transformers' prompt lookup (``prompt_lookup_num_tokens=k``, ``max_matching_ngram_size=max_n``)."""
        from .args import check_k, positive_int

        k, max_n = check_k(k), positive_int("max_n", max_n)
        return cls(label=label or f"ngram.hf{max_n} k={k}", prompt_lookup=(k, max_n))

    @classmethod
    def from_policy(cls, policy) -> "AssistantSettings":
        """The settings a :class:`fastspec.policies.DraftPolicy` (or its spec string) stands for in transformers:
        ``fixed`` (k tokens, no threshold) or ``hf`` (its num_assistant_tokens, schedule and threshold).  The
        other kinds (``conf``, ``specdec``) have no transformers counterpart: InvalidInput naming ``policy``."""
        if isinstance(policy, str):
            from ..policies import parse_policy

            policy = parse_policy(policy)
        kind = getattr(policy, "kind", None)
        name = getattr(policy, "name", str(policy))
        if kind == "fixed":
            return cls(int(policy.k_max), "constant", 0.0, label=name, policy=policy)
        if kind == "hf":
            return cls(int(policy.hf_num_assistant_tokens), str(policy.hf_schedule),
                       float(policy.hf_confidence_threshold), label=name, policy=policy)
        raise InvalidInput(f"policy {name}: Hugging Face's assisted generation runs only fixed and hf policies "
                           f"(its num_assistant_tokens / schedule / assistant_confidence_threshold), not {kind}")

    def predicted_as(self, sklearn: bool) -> str | None:
        """The fastspec policy whose prediction this run is compared with (None: :meth:`fixed` k, or prompt lookup,
        whose prediction is simulate's (draft, k)): transformers' defaults are policy ``hf``; without scikit-learn
        transformers never tunes the threshold, so an ``hf`` policy with ``tune=roc`` is predicted as
        ``tune=off``."""
        import dataclasses

        from ..policies import parse_policy

        if self.prompt_lookup is not None or (self.policy is None and self.label != HF_DEFAULTS):
            return None  # prompt lookup, or AssistantSettings.fixed(k)
        pol = self.policy if self.policy is not None else parse_policy(HF_DEFAULTS)
        if pol.kind == "hf" and pol.tune == "roc" and pol.theta > 0 and not sklearn:
            pol = dataclasses.replace(pol, tune="off")
        return pol.name

    def values(self) -> dict:
        values = (self.num_assistant_tokens, self.schedule, self.confidence_threshold)
        return dict(zip(self._FIELDS, values, strict=True))

    def as_dict(self) -> dict:
        d = {"label": self.label, **self.values()}
        if self.prompt_lookup is not None:
            d["prompt_lookup_num_tokens"], d["max_matching_ngram_size"] = self.prompt_lookup
        return d


@dataclass
class HFAssistedResult:
    """One :func:`hf_assisted_generate` call, counted through hooks.

    tokens: int64 [n]; per step (in order): ``draft_lengths`` (tokens the candidate generator returned),
    ``accepted_per_step`` (transformers' ``n_matches``), ``budgets`` (the assistant's ``num_assistant_tokens``
    when it drafted) and ``thresholds`` (its confidence threshold then; None when off); ``target_forwards`` /
    ``draft_forwards`` (forward calls seen by hooks); times in seconds (``prefill_s`` = time to the first step's
    tokens); ``first_step_tokens``; ``settings`` (the effective assistant fields transformers used);
    ``roc_tuning`` (whether transformers could tune the threshold: scikit-learn importable and a threshold on)."""

    tokens: np.ndarray
    draft_lengths: list
    accepted_per_step: list
    budgets: list
    thresholds: list
    target_forwards: int
    draft_forwards: int
    prefill_s: float
    total_s: float
    first_step_tokens: int
    settings: dict = field(default_factory=dict)
    roc_tuning: bool = False

    @property
    def verify_steps(self) -> int:
        return sum(1 for d in self.draft_lengths if d > 0)

    @property
    def plain_steps(self) -> int:
        return sum(1 for d in self.draft_lengths if d == 0)

    @property
    def drafted(self) -> int:
        return int(sum(self.draft_lengths))

    @property
    def accepted(self) -> int:
        return int(sum(a for d, a in zip(self.draft_lengths, self.accepted_per_step, strict=True) if d > 0))

    @property
    def emitted(self) -> int:
        """Tokens produced by verify steps (accepted drafts + the recovered / bonus token)."""
        return int(sum(a + 1 for d, a in zip(self.draft_lengths, self.accepted_per_step, strict=True) if d > 0))

    @property
    def mean_acceptance_length(self) -> float:
        return self.emitted / self.verify_steps if self.verify_steps else float("nan")

    @property
    def decode_s(self) -> float:
        return self.total_s - self.prefill_s

    @property
    def decode_tokens(self) -> int:
        return max(len(self.tokens) - self.first_step_tokens, 0)

    def as_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "verify_steps": self.verify_steps, "plain_steps": self.plain_steps,
                "drafted": self.drafted, "accepted": self.accepted, "emitted": self.emitted,
                "mean_acceptance_length": self.mean_acceptance_length if self.verify_steps else None,
                "draft_lengths": list(self.draft_lengths), "accepted_per_step": list(self.accepted_per_step),
                "budgets": list(self.budgets), "thresholds": list(self.thresholds),
                "target_forwards": self.target_forwards, "draft_forwards": self.draft_forwards,
                "decode_tokens": self.decode_tokens, "first_step_tokens": self.first_step_tokens,
                "settings": dict(self.settings), "roc_tuning": self.roc_tuning,
                "time_s": {"prefill": self.prefill_s, "decode": self.decode_s, "total": self.total_s}}


@contextlib.contextmanager
def _config_fields(model, values: dict):
    """Set ``model.generation_config``'s fields to ``values`` for the block, then restore them."""
    if model is None:
        yield
        return
    gc = model.generation_config
    old = {k: getattr(gc, k, None) for k in values}
    try:
        for k, v in values.items():
            setattr(gc, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(gc, k, v)


@contextlib.contextmanager
def _counting(target, draft, rec: dict):
    """Forward hooks on both models and a wrapper around the candidate generator transformers builds."""
    handles = [target.register_forward_hook(lambda *_: rec.__setitem__("target", rec["target"] + 1))]
    if draft is not None:
        handles.append(draft.register_forward_hook(lambda *_: rec.__setitem__("draft", rec["draft"] + 1)))
    original = target._get_candidate_generator

    def build(*args, **kwargs):
        cg = original(*args, **kwargs)
        get, update = cg.get_candidates, cg.update_candidate_strategy

        def get_candidates(input_ids, **kw):
            budget = getattr(cg, "num_assistant_tokens", getattr(cg, "num_output_tokens", None))
            gc = getattr(cg, "generation_config", None)
            thr = getattr(gc, "assistant_confidence_threshold", None) if draft is not None else None
            ids, logits = get(input_ids, **kw)
            rec["drafted"].append(int(ids.shape[1] - input_ids.shape[1]))
            rec["budgets"].append(None if budget is None else int(budget))
            rec["thresholds"].append(None if not thr else float(thr))
            return ids, logits

        def update_candidate_strategy(input_ids, scores, num_matches):
            rec["accepted"].append(int(num_matches))
            return update(input_ids, scores, num_matches)

        cg.get_candidates = get_candidates
        cg.update_candidate_strategy = update_candidate_strategy
        agc = getattr(cg, "assistant_generation_config", None)
        if agc is not None:
            rec["settings"] = {"num_assistant_tokens": agc.num_assistant_tokens,
                               "num_assistant_tokens_schedule": agc.num_assistant_tokens_schedule,
                               "assistant_confidence_threshold": agc.assistant_confidence_threshold}
        rec["roc"] = hasattr(cg, "probs") and hasattr(cg, "matches")
        return cg

    target._get_candidate_generator = build
    try:
        yield
    finally:
        del target._get_candidate_generator  # the instance attribute; the class method shows again
        for h in handles:
            h.remove()


def hf_assisted_generate(target, draft, input_ids, *, settings: AssistantSettings | None = None, k: int | None = None,
                         temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128,
                         eos_token_id=None, sampling=None) -> HFAssistedResult:
    """Hugging Face's assisted generation of ``target`` with the assistant ``draft`` (a model; None with
    ``settings.prompt_lookup``: transformers' prompt lookup), counted (module docstring).

    ``settings``: :class:`AssistantSettings` (default: transformers' defaults); ``k``: shorthand for
    ``AssistantSettings.fixed(k)`` (give one of them).  Greedy at temperature 0, else sampling with the given
    temperature / top-k (0 disables) / top-p / min-p, applied by transformers to target and draft alike.
    ``eos_token_id=None``: no EOS, exactly ``max_new_tokens`` tokens (checked: a shorter output is an error)."""
    from .args import as_token_ids, check_max_new_tokens, eos_set
    from .loop import hf_generation_config, run_hf_generate, start_numba_pool
    from ..params import given_sampling

    if k is not None and settings is not None:
        raise InvalidInput("hf_assisted_generate: give settings or k, not both")
    if k is not None:
        settings = AssistantSettings.fixed(k)
    settings = settings or AssistantSettings.defaults()
    if (draft is None) != (settings.prompt_lookup is not None):
        raise InvalidInput("hf_assisted_generate: draft must be a model, except with prompt-lookup settings "
                           "(AssistantSettings.ngram), which take draft=None")
    params = given_sampling(sampling, temperature, top_k, top_p, min_p)
    seq = as_token_ids(input_ids)
    n_new = check_max_new_tokens(max_new_tokens)
    eos = sorted(eos_set(eos_token_id))
    start_numba_pool()
    kw, extra = {}, {}
    if settings.prompt_lookup is not None:
        kw["prompt_lookup_num_tokens"], kw["max_matching_ngram_size"] = settings.prompt_lookup
    else:
        extra["assistant_model"] = draft
    config = hf_generation_config(params, n_new, eos, **kw)
    eos_fields = {"eos_token_id": eos or None}
    assistant = {k_: v for k_, v in settings.values().items() if v is not None}
    rec = {"target": 0, "draft": 0, "drafted": [], "accepted": [], "budgets": [], "thresholds": [], "settings": {},
           "roc": False}
    with _config_fields(target, eos_fields), _config_fields(draft, eos_fields), _config_fields(draft, assistant), \
            _counting(target, draft, rec):
        tokens, first, total, first_tokens = run_hf_generate(target, seq, config, seed, **extra)
    if not eos and len(tokens) != n_new:
        raise RuntimeError(f"transformers generated {len(tokens)} tokens, not max_new_tokens = {n_new}, with EOS off")
    if settings.prompt_lookup is not None:
        rec["settings"] = {"prompt_lookup_num_tokens": settings.prompt_lookup[0],
                           "max_matching_ngram_size": settings.prompt_lookup[1]}
    return HFAssistedResult(tokens=tokens, draft_lengths=rec["drafted"], accepted_per_step=rec["accepted"],
                            budgets=rec["budgets"], thresholds=rec["thresholds"], target_forwards=rec["target"],
                            draft_forwards=rec["draft"], prefill_s=first, total_s=total,
                            first_step_tokens=first_tokens, settings=rec["settings"], roc_tuning=bool(rec["roc"]))
