"""Draft-length policies: how many tokens a speculative step drafts, decided online from the draft's own probabilities.

One :class:`DraftPolicy` (:func:`parse_policy` reads :data:`POLICY_GRAMMAR`) serves both the real loop
(``fastspec.hf.loop``, through the online :class:`PolicyState`) and the simulator
(:func:`fastspec.simulation.policy_eval.evaluate_policy`).  Every decision reads only tokens already drafted and
their probabilities, never a later one, so verification with min(1, p/q) and the normalized residual stays exact.

Kinds
-----
* ``fixed:k=4`` -- k drafts every step.
* ``conf:theta=0.4,kmax=8[,on=token|max]`` -- draft up to kmax; after drafting token j, stop when its confidence
  is below theta: ``on=token`` (default) the draft's processed probability of the token it drafted, q_j(x_j) (Hugging
  Face's ``ConfidenceCriteria``); ``on=max`` the draft's max probability max_v q_j(v).  The token that triggers the
  stop is kept (drafted and verified).
* ``specdec:h=0.5,kmax=8[,on=token|max]`` -- SpecDec++-style: after drafting token j, stop when
  ``1 - prod_{i<=j} a_i >= h`` (the estimated probability that some draft of the step is rejected), with the
  acceptance estimate ``a_i = q_i(x_i)`` (``on=token``, default: the draft's probability of its own token, what a
  calibrated draft would give as P(accept)) or ``a_i = max_v q_i(v)`` (``on=max``).  SpecDec++ trains a head for
  a_i; here the draft's probabilities stand in for it.
* ``hf[:k=20,schedule=constant,theta=0.4,tune=roc]`` -- Hugging Face's assisted generation (below); bare ``hf`` is
  transformers 5.24.0's defaults.  ``theta=0`` switches the confidence stop (and its tuning) off, as in HF.

The ``hf`` kind replays transformers 5.24.0's assisted generation: the adaptive settings are the assistant's
``generation_config`` (:meth:`DraftPolicy.hf_generation_config`); the schedules change the cap after each verify
step (``heuristic`` and ``heuristic_transient``: +2 when every draft was accepted, else -1, at least 1; only
``heuristic`` carries the cap over to the next ``generate()`` call, :meth:`DraftPolicy.start` with the previous
state); the confidence stop reads the processed q of the drafted token (``on=token``); ``tune=roc`` re-tunes the
threshold with :func:`hf_roc_threshold`, as HF does only when scikit-learn is importable (:func:`sklearn_available`),
and the tuned value does not persist across calls.  Each of these facts, with its place in transformers' source:
docs/engines/transformers.md.

:class:`PolicyState` (``DraftPolicy.start()``) is the online interface: ``budget()`` before a step, ``keep_drafting(j,
q_token, q_max)`` after drafting token j, ``update(n_drafted, n_accepted, drafted_q)`` after verification (HF's
``num_matches`` is ``n_accepted``; call it also for a plain step with ``(0, 0, ())`` to match HF's heuristic).
"""
from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass

import numpy as np

from .config import MAX_K
from .errors import InvalidInput, InvalidType, shown

__all__ = ["DraftPolicy", "PolicyState", "parse_policy", "parse_policies", "POLICY_GRAMMAR", "HF_DEFAULTS", "SCHEDULES",
           "roc_curve", "hf_roc_threshold", "sklearn_available", "FixedState", "StopState", "HFState"]

# ------------------------------------------------------------------ ROC (scikit-learn's roc_curve)
# The ROC curve of scikit-learn's ``roc_curve`` and Hugging Face's threshold choice from it, without scikit-learn.
#
# transformers 5.24.0 (``candidate_generator.py``: ``AssistedCandidateGenerator.update_candidate_strategy``) re-tunes
# the assistant's confidence threshold after every verify step, when scikit-learn is importable, from the drafted
# tokens' probabilities ``probs`` and whether each was accepted (``matches``)::
#
#     fpr, tpr, thresholds = sklearn.metrics.roc_curve(matches, probs)
#     costs = fpr + 3 * (1 - tpr)
#     threshold = thresholds[np.argmin(costs)]
#
# :func:`roc_curve` is scikit-learn's algorithm (``_binary_clf_curve`` then ``drop_intermediate=True``, the first
# threshold ``inf``), in the same float64 operations, so the chosen threshold is the same float.  The first point
# (fpr = tpr = 0, cost 3) never wins: the last point (1, 1) costs 1.

def roc_curve(y_true, y_score, *, drop_intermediate: bool = True):
    """(fpr, tpr, thresholds) as ``sklearn.metrics.roc_curve(y_true, y_score)`` (binary labels 0/1, no weights)."""
    y = np.asarray(y_true).ravel()
    s = np.asarray(y_score, dtype=np.float64).ravel()
    if y.shape != s.shape or y.size == 0:
        raise InvalidInput(f"y_true and y_score must be non-empty and of the same length, got {y.size} and {s.size}")
    if not np.isin(y, (0, 1)).all():
        raise InvalidInput("y_true must hold 0/1 labels")
    y = y == 1
    order = np.argsort(s, kind="mergesort")[::-1]
    s, y = s[order], y[order]
    distinct = np.where(np.diff(s))[0]
    idx = np.r_[distinct, y.size - 1]
    tps = np.cumsum(y, dtype=np.float64)[idx]
    fps = 1 + idx - tps
    thr = s[idx]
    if drop_intermediate and len(fps) > 2:
        keep = np.where(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])[0]
        fps, tps, thr = fps[keep], tps[keep], thr[keep]
    tps = np.r_[0, tps]
    fps = np.r_[0, fps]
    thr = np.r_[np.inf, thr]
    fpr = fps / fps[-1] if fps[-1] > 0 else np.full(fps.shape, np.nan)
    tpr = tps / tps[-1] if tps[-1] > 0 else np.full(tps.shape, np.nan)
    return fpr, tpr, thr


def hf_roc_threshold(matches, probs) -> float:
    """Hugging Face's tuned threshold: ``thresholds[argmin(fpr + 3 (1 - tpr))]`` (both labels must occur)."""
    fpr, tpr, thr = roc_curve(matches, probs)
    fnr = 1 - tpr
    costs = fpr + 3 * fnr
    return float(thr[int(np.argmin(costs))])


# ------------------------------------------------------------------ online state
# Online policy state: one per sequence (``DraftPolicy.start()``), driven by the real loop step by step.
#
# Protocol (``fastspec.policies`` module docstring): ``n = state.budget()`` before a step (>= 1; the loop still caps
# it by the tokens left); after drafting token j (0-based) with processed draft probability ``q_token = q_j(x_j)``
# and ``q_max = max_v q_j(v)``, ``state.keep_drafting(j, q_token, q_max)`` -- False: stop after this token (it is
# kept); after verification ``state.update(n_drafted, n_accepted, drafted_q)``.

def _check_prob(name, v) -> float:
    f = float(v)
    if not (0.0 <= f <= 1.0):
        raise InvalidInput(f"{name} = {v!r} must be a probability in [0, 1]")
    return f


def _check_update(n_drafted, n_accepted, drafted_q):
    n_drafted, n_accepted = int(n_drafted), int(n_accepted)
    if not 0 <= n_accepted <= n_drafted:
        raise InvalidInput(f"update: n_accepted = {n_accepted} must be in [0, n_drafted = {n_drafted}]")
    q = [float(x) for x in (drafted_q if drafted_q is not None else ())]
    if drafted_q is not None and len(q) != n_drafted:
        raise InvalidInput(f"update: drafted_q has {len(q)} values for {n_drafted} drafts")
    return n_drafted, n_accepted, q


class PolicyState:
    """The online state of one policy on one sequence."""

    policy = None

    def budget(self) -> int:
        raise NotImplementedError

    def keep_drafting(self, j: int, q_token: float, q_max: float) -> bool:  # noqa: ARG002 (one interface)
        return True

    def update(self, n_drafted: int, n_accepted: int, drafted_q=None) -> None:  # noqa: ARG002 (one interface)
        _check_update(n_drafted, n_accepted, drafted_q)

    def as_dict(self) -> dict:
        return {"budget": self.budget()}


class FixedState(PolicyState):
    def __init__(self, k: int):
        self.k = k

    def budget(self) -> int:
        return self.k


class StopState(PolicyState):
    """conf and specdec: at most kmax drafts, a stop rule on the draft's confidence (prefix only)."""

    def __init__(self, policy):
        self.policy = policy
        self._prod = 1.0

    def budget(self) -> int:
        return self.policy.kmax

    def keep_drafting(self, j, q_token, q_max) -> bool:
        pol = self.policy
        c = _check_prob("q_token", q_token) if pol.on == "token" else _check_prob("q_max", q_max)
        if pol.kind == "conf":
            return c >= pol.theta
        if int(j) == 0:
            self._prod = 1.0
        self._prod *= c
        return 1.0 - self._prod < pol.h


class HFState(PolicyState):
    """transformers 5.24.0's AssistedCandidateGenerator state: ``num_assistant_tokens``, the confidence threshold and
    (tuning) the ``probs`` / ``matches`` lists (docs/engines/transformers.md)."""

    def __init__(self, policy, num_assistant_tokens: int):
        self.policy = policy
        self.num_assistant_tokens = int(num_assistant_tokens)
        self.threshold = float(policy.theta)
        self.tuning = policy.tune == "roc" and self.threshold != 0.0  # HF: lists exist iff sklearn and threshold
        self.probs: list[float] = []
        self.matches: list[int] = []

    def budget(self) -> int:
        return max(1, min(self.num_assistant_tokens, MAX_K))

    def keep_drafting(self, j, q_token, q_max) -> bool:  # noqa: ARG002 (one interface)
        q = _check_prob("q_token", q_token)
        return not (self.threshold > 0 and q < self.threshold)

    def update(self, n_drafted, n_accepted, drafted_q=None) -> None:
        n_drafted, n_accepted, q = _check_update(n_drafted, n_accepted, drafted_q)
        if self.policy.schedule in ("heuristic", "heuristic_transient"):
            if n_accepted == n_drafted:
                self.num_assistant_tokens += 2
            else:
                self.num_assistant_tokens = max(1, self.num_assistant_tokens - 1)
        if self.tuning and self.threshold:
            if drafted_q is None and n_drafted:
                raise InvalidInput("update: hf with tune=roc needs drafted_q (the q of each drafted token)")
            self.probs.extend(q)
            self.matches.extend([1] * n_accepted)
            if len(self.probs) > len(self.matches):
                self.matches.append(0)
            excess = len(self.probs) - len(self.matches)
            if excess > 0:
                del self.probs[-excess:]
            if len(self.probs) > 5 and 0 in self.matches and 1 in self.matches:
                self.threshold = hf_roc_threshold(self.matches, self.probs)

    def as_dict(self) -> dict:
        return {"num_assistant_tokens": self.num_assistant_tokens, "threshold": self.threshold,
                "observed": len(self.probs)}


#: transformers 5.24.0's defaults for assisted generation (GenerationConfig._get_default_generation_params)
HF_DEFAULTS = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
               "assistant_confidence_threshold": 0.4}
SCHEDULES = ("constant", "heuristic", "heuristic_transient")
KINDS = ("fixed", "conf", "hf", "specdec")

POLICY_GRAMMAR = ("fixed:k=K | conf:theta=T,kmax=K[,on=token|max] | specdec:h=H,kmax=K[,on=token|max] | "
                  "hf[:k=20,schedule=constant|heuristic|heuristic_transient,theta=0.4,tune=roc|off] "
                  f"(K an integer in [1, {MAX_K}], T and H in (0, 1); hf's theta in [0, 1), 0 = off; bare hf = "
                  "transformers 5.24's defaults)")

_FIELDS = {"fixed": ("k",), "conf": ("theta", "kmax", "on"), "specdec": ("h", "kmax", "on"),
           "hf": ("k", "schedule", "theta", "tune")}
_DEFAULTS = {"fixed": {}, "conf": {"on": "token"}, "specdec": {"on": "token"},
             "hf": {"k": 20, "schedule": "constant", "theta": 0.4, "tune": "roc"}}
_REQUIRED = {"fixed": ("k",), "conf": ("theta", "kmax"), "specdec": ("h", "kmax"), "hf": ()}
#: the fields that name one of a few words, and those words
_CHOICES = {"on": ("token", "max"), "schedule": SCHEDULES, "tune": ("roc", "off")}
_ALL_FIELDS = tuple(dict.fromkeys(f for fields in _FIELDS.values() for f in fields))


def sklearn_available() -> bool:
    """Whether scikit-learn is importable here, i.e. whether transformers' assisted generation tunes its threshold
    (``hf:tune=roc`` replays it; in an environment without scikit-learn real HF behaves as ``hf:tune=off``)."""
    import importlib.util

    return importlib.util.find_spec("sklearn") is not None


def _fmt(v) -> str:
    if isinstance(v, float):
        return format(v, ".15g")
    return str(v)


def _range_text(kind: str, key: str) -> str:
    if key in ("k", "kmax"):
        return f"an integer in [1, {MAX_K}] (drafts per step)"
    return "in [0, 1) (0 switches it off)" if (kind, key) == ("hf", "theta") else "in (0, 1)"


def _field_value(kind: str, key: str, v):
    """One field of a DraftPolicy built directly, checked as :func:`parse_policy` checks it (InvalidType /
    InvalidInput naming the field)."""
    if key in ("k", "kmax"):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral):
            raise InvalidType(f"{key} = {shown(v)} must be {_range_text(kind, key)}", argument=key)
        if not 1 <= v <= MAX_K:
            raise InvalidInput(f"{key} = {int(v)} must be {_range_text(kind, key)}", argument=key)
        return int(v)
    if key in ("theta", "h"):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise InvalidType(f"{key} = {shown(v)} must be a number {_range_text(kind, key)}", argument=key)
        f = float(v)
        zero_ok = (kind, key) == ("hf", "theta")
        if not (math.isfinite(f) and (f >= 0.0 and math.copysign(1.0, f) > 0 if zero_ok else f > 0.0) and f < 1.0):
            raise InvalidInput(f"{key} = {_fmt(f)} must be {_range_text(kind, key)}", argument=key)
        return f
    choices = _CHOICES[key]
    if not isinstance(v, str) or v not in choices:
        raise InvalidInput(f"{key} = {shown(v)} must be {' or '.join(choices)}", argument=key)
    return v


def _check_fields(policy) -> None:
    """What :func:`parse_policy` enforces, for a DraftPolicy built directly: a known kind, its required fields,
    no field of another kind, every value in its range (defaults filled in as the grammar gives them)."""
    kind = policy.kind
    if not isinstance(kind, str):
        raise InvalidType(f"kind must be a policy kind ({', '.join(KINDS)}), got {type(kind).__name__}",
                          argument="kind")
    if kind not in KINDS:
        raise InvalidInput(f"kind = {shown(kind)} is unknown (known: {', '.join(KINDS)})", argument="kind")
    own = _FIELDS[kind]
    for key in _ALL_FIELDS:
        v = getattr(policy, key)
        if key not in own:
            if v is not None:
                raise InvalidInput(f"{key} = {shown(v)}: {kind} has no field {key!r} (its fields: {', '.join(own)})",
                                   argument=key)
            continue
        if v is None:
            if key not in _DEFAULTS[kind]:
                raise InvalidInput(f"{kind} needs {key} ({key}={'T' if key in ('theta', 'h') else 'K'}: "
                                   f"{_range_text(kind, key)})", argument=key)
            v = _DEFAULTS[kind][key]
        object.__setattr__(policy, key, _field_value(kind, key, v))


@dataclass(frozen=True)
class DraftPolicy:
    """A draft-length policy (module docstring).  Build it with :func:`parse_policy`."""

    kind: str
    k: int | None = None          # fixed: k; hf: num_assistant_tokens (initial)
    theta: float | None = None    # conf: stop threshold; hf: assistant_confidence_threshold (0 = off)
    kmax: int | None = None       # conf / specdec: cap
    on: str | None = None         # conf / specdec: "token" or "max"
    h: float | None = None        # specdec: stop when 1 - prod a_j >= h
    schedule: str | None = None   # hf
    tune: str | None = None       # hf: "roc" or "off"

    def __post_init__(self):
        _check_fields(self)

    @property
    def name(self) -> str:
        """Canonical spec, e.g. ``conf(theta=0.4,kmax=8,on=token)``; :func:`parse_policy` reads it back."""
        vals = ", ".join(f"{f}={_fmt(getattr(self, f))}" for f in _FIELDS[self.kind]).replace(", ", ",")
        return f"{self.kind}({vals})"

    def __str__(self) -> str:
        return self.name

    @property
    def k_max(self) -> int:
        """The most drafts one step can have (hf with a heuristic schedule: :data:`MAX_K`; HF itself caps only by
        the tokens left, which is the same whenever the token budget is at most MAX_K + 1)."""
        if self.kind == "fixed":
            return self.k
        if self.kind == "hf":
            return self.k if self.schedule == "constant" else MAX_K
        return self.kmax

    @property
    def needs_draft_probs(self) -> bool:
        """Whether the policy reads the draft's probabilities (every kind but fixed, and hf with theta 0)."""
        return not (self.kind == "fixed" or (self.kind == "hf" and self.theta == 0.0))

    @property
    def exact_replay(self) -> bool:
        """True when the simulator computes it exactly (finite deterministic state along a trajectory): fixed, conf,
        specdec on=max and hf without tuning; else Monte-Carlo (specdec on=token, hf with ROC tuning)."""
        if self.kind == "specdec":
            return self.on == "max"
        if self.kind == "hf":
            return self.tune == "off" or self.theta == 0.0
        return True

    @property
    def confidence_on(self) -> str | None:
        """Which confidence the stop rule reads ("token" or "max"; None: none)."""
        if self.kind in ("conf", "specdec"):
            return self.on
        if self.kind == "hf" and self.theta > 0:
            return "token"
        return None

    # HF kind: the assistant's GenerationConfig, 1:1
    @property
    def hf_num_assistant_tokens(self) -> int | None:
        return self.k if self.kind == "hf" else None

    @property
    def hf_schedule(self) -> str | None:
        return self.schedule if self.kind == "hf" else None

    @property
    def hf_confidence_threshold(self) -> float | None:
        return self.theta if self.kind == "hf" else None

    @property
    def hf_tune(self) -> str | None:
        return self.tune if self.kind == "hf" else None

    def hf_generation_config(self) -> dict:
        """The assistant's ``generation_config`` attributes that make transformers run this policy (hf kind only)."""
        if self.kind != "hf":
            raise InvalidInput(f"policy {self.name} is not an hf policy")
        return {"num_assistant_tokens": self.k, "num_assistant_tokens_schedule": self.schedule,
                "assistant_confidence_threshold": self.theta}

    def start(self, previous: "PolicyState | None" = None) -> PolicyState:
        """A fresh online state for one sequence (one ``generate()`` call).  ``previous``: the state at the end of
        the previous call with the same draft; only hf with ``schedule=heuristic`` carries anything over (HF's
        ``num_assistant_tokens``, docs/engines/transformers.md)."""
        if previous is not None and not isinstance(previous, PolicyState):
            raise InvalidType(f"previous must be a PolicyState or None, got {type(previous).__name__}")
        if self.kind == "fixed":
            return FixedState(self.k)
        if self.kind == "hf":
            n = self.k
            if self.schedule == "heuristic" and isinstance(previous, HFState) and previous.policy == self:
                n = previous.num_assistant_tokens
            return HFState(self, n)
        return StopState(self)

    def as_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "k_max": self.k_max, "needs_draft_probs": self.needs_draft_probs,
                "exact_replay": self.exact_replay,
                **{f: getattr(self, f) for f in _FIELDS[self.kind]}}


_SPEC = re.compile(r"^\s*([a-z_]+)\s*(?:[:(]\s*(.*?)\s*\)?\s*)?$")


def _bad(label, spec, why, grammar=False) -> InvalidInput:
    return InvalidInput(f"{label} {spec!r}: {why}" + (f"; write {POLICY_GRAMMAR}" if grammar else ""))


def _int_field(label, spec, key, v) -> int:
    try:
        f = float(v)
    except ValueError:
        raise _bad(label, spec, f"{key}={v} is not an integer") from None
    if not f.is_integer() or not 1 <= f <= MAX_K:
        raise _bad(label, spec, f"{key}={v} must be an integer in [1, {MAX_K}] (drafts per step)")
    return int(f)


def _prob_field(label, spec, key, v, *, zero_ok=False) -> float:
    try:
        f = float(v)
    except ValueError:
        raise _bad(label, spec, f"{key}={v} is not a number") from None
    lo_ok = f >= 0.0 and math.copysign(1.0, f) > 0 if zero_ok else f > 0.0  # -0 is not the "off" 0
    if not (math.isfinite(f) and lo_ok and f < 1.0):
        rng = "[0, 1) (0 switches it off)" if zero_ok else "(0, 1)"
        raise _bad(label, spec, f"{key}={v} must be in {rng}")
    return f


def parse_policy(spec, *, name: str = "--policy") -> DraftPolicy:
    """A :class:`DraftPolicy` from its spec (:data:`POLICY_GRAMMAR`; also the canonical ``kind(a=b,...)`` form), or the
    DraftPolicy itself.  ``name`` labels the input in messages (the CLI flag).  InvalidInput names the field and why."""
    if isinstance(spec, DraftPolicy):
        return spec
    if not isinstance(spec, str):
        raise InvalidType(f"{name} must be a policy spec string or a DraftPolicy, got {type(spec).__name__}")
    m = _SPEC.match(spec)
    if not m or m.group(1) not in KINDS:
        raise _bad(name, spec, f"unknown policy kind (known: {', '.join(KINDS)})", True)
    kind, body = m.group(1), (m.group(2) or "")
    rest = spec.strip()[len(kind):].strip()
    if rest.startswith("(") != rest.endswith(")") or "(" in rest[1:] or ")" in rest[:-1]:
        raise _bad(name, spec, "unbalanced parentheses", True)
    vals = dict(_DEFAULTS[kind])
    seen = set()
    for item in filter(None, (x.strip() for x in body.split(","))):
        key, eq, v = (s.strip() for s in item.partition("="))
        if not eq or not v:
            raise _bad(name, spec, f"{item!r} is not key=value", True)
        if key not in _FIELDS[kind]:
            raise _bad(name, spec, f"{kind} has no field {key!r} (its fields: {', '.join(_FIELDS[kind])})")
        if key in seen:
            raise _bad(name, spec, f"{key} is given twice")
        seen.add(key)
        vals[key] = v
    out = {}
    for key, v in vals.items():
        if key in ("k", "kmax"):
            out[key] = _int_field(name, spec, key, v)
        elif key in ("theta", "h"):
            out[key] = _prob_field(name, spec, key, v, zero_ok=(kind == "hf"))
        elif key == "on":
            if v not in ("token", "max"):
                raise _bad(name, spec, f"on={v} must be token or max")
            out[key] = v
        elif key == "schedule":
            if v not in SCHEDULES:
                raise _bad(name, spec, f"schedule={v} is unknown (known: {', '.join(SCHEDULES)})")
            out[key] = v
        elif key == "tune":
            if v not in ("roc", "off"):
                raise _bad(name, spec, f"tune={v} must be roc or off")
            out[key] = v
    missing = [f for f in _REQUIRED[kind] if f not in seen]  # after the values: a bad value is named first
    if missing:
        raise _bad(name, spec, f"{kind} needs {', '.join(missing)}")
    return DraftPolicy(kind, **out)


def parse_policies(specs, *, name: str = "--policy") -> list[DraftPolicy]:
    """Policies from one spec, a list of specs, or None (empty); each policy once, in order."""
    if specs is None:
        return []
    if isinstance(specs, (str, DraftPolicy)):
        specs = [specs]
    try:
        items = list(specs)
    except TypeError:
        raise InvalidType(f"policies must be a policy spec, a DraftPolicy or a list of them, got "
                          f"{type(specs).__name__}") from None
    return list(dict.fromkeys(parse_policy(s, name=name) for s in items))
