"""Measured costs of the real speculative loop, and the speed-up they predict.

A **cost table** records, in seconds, what one step of the real loop (:func:`fastspec.hf.speculative_generate`)
spends, measured on one machine with the very models of a dump.  It is JSON (the same schema whether
``fastspec dump`` recorded it inside a dump -- the 0-d string array ``costs`` -- or ``fastspec cost`` wrote it
to a file, or someone measured a GPU deployment by hand)::

    {
      "version": 1,
      "machine": "AMD EPYC (znver4), 2 threads",         # free text
      "threads": 2, "context_length": 96,                # where it was measured (informational)
      "target": {"forward_s": {"1": 0.0213, "2": 0.0221, ..., "9": 0.0290},
                 "forward_s_se": {"1": 0.0002, ...}},    # optional standard errors
      "drafts": {"exit24": {"forward_s": {"1": 0.0175, "2": 0.0181}, "forward_s_se": {...}},
                 "ngram":  {"forward_s": {"1": 0.00002}, "one_call_per_step": true}},
      "overhead_s": {"0": 0.0004, "1": 0.0009, ..., "8": 0.0011},   # fastspec per step: verify, sampling, crop
      "overhead_s_se": {...}                                        # optional
    }

* ``target.forward_s[n]``: a target forward over ``n`` new tokens with a KV cache (``n = 1`` is a plain decode
  step; ``n = k + 1`` verifies k drafts);
* ``drafts[name].forward_s[n]``: a draft forward over ``n`` new tokens (``n = 1``; ``n = 2`` when the previous
  step accepted every draft and the draft catches up on the last draft and the bonus token); a proposer
  without a model that proposes all its tokens in one call (n-gram lookup) records the time of that call as
  ``forward_s["1"]`` and ``"one_call_per_step": true``;
* ``overhead_s[k]``: everything else fastspec does in a step with k drafts (sampling the drafts, ``verify_logits``,
  cropping both caches); ``overhead_s["0"]`` is a plain decoding step's sampling.

The loop's calls give the **cost model** (:class:`LoopCost`): a verify step with k drafts costs

    step(k) = draft(1 + a) + (k - 1) draft(1) + target(k + 1) + overhead(k)

where ``draft(1 + a)`` is the first draft forward of the step (two tokens with probability ``a``, the probability
that the previous step accepted every draft -- the simulator knows it -- else one), and plain decoding costs
``target(1) + overhead(0)`` per token.  **Speed-up** = (tokens per verify step / step(k)) / (1 / plain), the
wall-clock tokens per second of speculative decoding relative to plain decoding on the recorded machine.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Mapping

from .errors import InvalidInput, InvalidType

__all__ = ["CostTable", "LoopCost", "COST_TABLE_VERSION"]

COST_TABLE_VERSION = 1
_TOP_KEYS = {"version", "machine", "threads", "context_length", "target", "drafts", "overhead_s", "overhead_s_se",
             "repeats", "note"}


def int_keyed(obj, where: str, first: int, form: str) -> list:
    """[(n, key, value)] of a non-empty JSON object whose keys are integers >= first (``form``: what such an
    object looks like, for the message)."""
    if not isinstance(obj, Mapping) or not obj:
        raise InvalidInput(f"{where} must be a non-empty object {form}")
    out = []
    for key, val in obj.items():
        try:
            n = int(key)
        except (TypeError, ValueError):
            raise InvalidInput(f"{where}: key {key!r} is not an integer") from None
        if n < first or str(n) != str(key).strip():
            raise InvalidInput(f"{where}: key {key!r} must be an integer >= {first}")
        out.append((n, key, val))
    return out


def _seconds(obj, where: str, *, first: int, positive: bool = True) -> dict[int, float]:
    """{n: seconds} from a JSON object keyed by integers >= first: finite values > 0 (a measured time is never
    zero, and a zero would divide), or >= 0 when not ``positive`` (standard errors)."""
    out = {}
    for n, key, val in int_keyed(obj, f"cost table: {where}", first, '{"n": seconds, ...}'):
        if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val) or val < 0 or \
                (positive and val == 0):
            raise InvalidInput(f"cost table: {where}[{key!r}] = {val!r} must be a finite number of seconds "
                               f"{'> 0' if positive else '>= 0'}")
        out[n] = float(val)
    return out


def _optional(obj, key, where, first):
    """Standard errors (``*_se``): optional, >= 0."""
    return _seconds(obj[key], f"{where}.{key}", first=first, positive=False) if key in obj else {}


@dataclass(frozen=True)
class CostTable:
    """A validated cost table (module docstring); build it with :meth:`from_json` or :meth:`from_dict`."""

    target_forward_s: dict
    draft_forward_s: dict  # name -> {n: seconds}
    one_call: frozenset  # drafts whose forward_s["1"] is one call per step (n-gram lookup)
    overhead_s: dict
    target_forward_se: dict
    draft_forward_se: dict
    overhead_se: dict
    info: dict  # machine, threads, context_length, repeats, note

    @classmethod
    def from_dict(cls, obj) -> "CostTable":
        if not isinstance(obj, Mapping):
            raise InvalidType(f"cost table must be a JSON object, got {type(obj).__name__}")
        unknown = set(obj) - _TOP_KEYS
        if unknown:
            raise InvalidInput(f"cost table: unknown key(s) {', '.join(sorted(map(repr, unknown)))}; expected "
                               f"{', '.join(sorted(_TOP_KEYS))}")
        if obj.get("version", COST_TABLE_VERSION) != COST_TABLE_VERSION:
            raise InvalidInput(f"cost table: version {obj.get('version')!r} is not supported (expected "
                               f"{COST_TABLE_VERSION})")
        for key in ("target", "drafts", "overhead_s"):
            if key not in obj:
                raise InvalidInput(f"cost table: {key!r} is missing")
        target = obj["target"]
        if not isinstance(target, Mapping) or "forward_s" not in target:
            raise InvalidInput("cost table: target must be an object with forward_s {\"1\": seconds, ...}")
        tf = _seconds(target["forward_s"], "target.forward_s", first=1)
        if 1 not in tf:
            raise InvalidInput("cost table: target.forward_s needs n = 1 (a plain decoding step)")
        drafts = obj["drafts"]
        if not isinstance(drafts, Mapping):
            raise InvalidInput("cost table: drafts must be an object {name: {forward_s: {...}}}")
        df, dse, one = {}, {}, set()
        for name, entry in drafts.items():
            if not isinstance(entry, Mapping) or "forward_s" not in entry:
                raise InvalidInput(f"cost table: drafts[{name!r}] must be an object with forward_s")
            df[name] = _seconds(entry["forward_s"], f"drafts[{name!r}].forward_s", first=1)
            if 1 not in df[name]:
                raise InvalidInput(f"cost table: drafts[{name!r}].forward_s needs n = 1")
            dse[name] = _optional(entry, "forward_s_se", f"drafts[{name!r}]", 1)
            extra = set(entry) - {"forward_s", "forward_s_se", "one_call_per_step"}
            if extra:
                raise InvalidInput(f"cost table: drafts[{name!r}]: unknown key(s) {', '.join(sorted(extra))}")
            flag = entry.get("one_call_per_step", False)
            if not isinstance(flag, bool):
                raise InvalidInput(f"cost table: drafts[{name!r}].one_call_per_step must be true or false")
            if flag:
                one.add(name)
        ov = _seconds(obj["overhead_s"], "overhead_s", first=0)
        info = {k: obj[k] for k in ("machine", "threads", "context_length", "repeats", "note") if k in obj}
        return cls(tf, df, frozenset(one), ov, _optional(target, "forward_s_se", "target", 1), dse,
                   _optional(obj, "overhead_s_se", "cost table", 0), info)

    @classmethod
    def from_json(cls, text: str) -> "CostTable":
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"cost table: not valid JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(obj)

    @classmethod
    def from_file(cls, path) -> "CostTable":
        try:
            with open(path, encoding="utf-8") as fh:
                return cls.from_json(fh.read())
        except FileNotFoundError:
            raise InvalidInput(f"cost table: no such file {str(path)!r}") from None

    def as_dict(self) -> dict:
        def keyed(d):
            return {str(k): v for k, v in sorted(d.items())}

        target = {"forward_s": keyed(self.target_forward_s)}
        if self.target_forward_se:
            target["forward_s_se"] = keyed(self.target_forward_se)
        drafts = {}
        for name, f in self.draft_forward_s.items():
            drafts[name] = {"forward_s": keyed(f)}
            if self.draft_forward_se.get(name):
                drafts[name]["forward_s_se"] = keyed(self.draft_forward_se[name])
            if name in self.one_call:
                drafts[name]["one_call_per_step"] = True
        out = {"version": COST_TABLE_VERSION, **self.info, "target": target, "drafts": drafts,
               "overhead_s": keyed(self.overhead_s)}
        if self.overhead_se:
            out["overhead_s_se"] = keyed(self.overhead_se)
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)

    def loop_cost(self, draft: str) -> "LoopCost":
        """The cost model of speculative decoding with ``draft`` (:class:`LoopCost`)."""
        if draft not in self.draft_forward_s:
            raise InvalidInput(f"cost table has no draft named {draft!r}; it has "
                               f"{', '.join(self.draft_forward_s) or 'none'}")
        return LoopCost(self, draft)


def _at(table: dict, n: int, what: str) -> float:
    if n not in table:
        raise InvalidInput(f"cost table has no {what} for n = {n}; it covers n = {', '.join(map(str, sorted(table)))}")
    return table[n]


class LoopCost:
    """Step times of speculative decoding with one draft, from a :class:`CostTable` (module docstring)."""

    def __init__(self, table: CostTable, draft: str):
        self.table = table
        self.draft = draft

    def plain_step_s(self) -> float:
        """Seconds per token of plain decoding: target(1) + overhead(0)."""
        return _at(self.table.target_forward_s, 1, "target forward") + self._overhead(0)

    def step_s(self, k: int, p_all_accepted: float = 0.0) -> float:
        """Expected seconds of one verify step with k drafts (the first draft forward feeds two tokens with
        probability ``p_all_accepted``)."""
        t = self.table
        d = t.draft_forward_s[self.draft]
        d1 = _at(d, 1, f"{self.draft!r} forward")
        if self.draft in t.one_call:
            drafting = d1  # one call proposes every draft of the step
        else:
            drafting = p_all_accepted * d.get(2, d1) + (1.0 - p_all_accepted) * d1 + (k - 1) * d1
        return drafting + _at(t.target_forward_s, k + 1, "target forward") + self._overhead(k)

    def _overhead(self, k: int) -> float:
        over = self.table.overhead_s
        return over[k] if k in over else over[max(over)]

    def speedup(self, tokens_per_step: float, k: int, p_all_accepted: float = 0.0) -> float:
        """Tokens per second of speculative decoding relative to plain decoding."""
        return tokens_per_step * self.plain_step_s() / self.step_s(k, p_all_accepted)

    def relative_se(self, k: int, p_all_accepted: float = 0.0) -> float:
        """Relative standard error of step(k) / plain from the table's per-entry standard errors (independent
        entries, delta method); 0 when the table gives none."""
        t = self.table
        dse = t.draft_forward_se.get(self.draft, {})
        s1 = dse.get(1, 0.0)
        if self.draft in t.one_call:
            var_draft = s1 ** 2
        else:
            var_draft = (p_all_accepted * dse.get(2, s1)) ** 2 + ((1 - p_all_accepted) * s1) ** 2 + ((k - 1) * s1) ** 2
        var_step = var_draft + t.target_forward_se.get(k + 1, 0.0) ** 2 + t.overhead_se.get(k, 0.0) ** 2
        var_plain = t.target_forward_se.get(1, 0.0) ** 2 + t.overhead_se.get(0, 0.0) ** 2
        step, plain = self.step_s(k, p_all_accepted), self.plain_step_s()
        return math.sqrt(var_step / step ** 2 + var_plain / plain ** 2)
