"""The cost table: measured seconds of the real loop's calls, and its strict reader and one (atomic) writer.

A cost table is JSON (the same schema inside a dump -- the 0-d string array ``costs`` -- or in a file written by
``fastspec cost`` or by hand): ``target.forward_s[n]`` (a target forward over n new tokens with a KV cache),
``drafts[name].forward_s[n]`` (n = 1, 2; a one-call proposer such as the n-gram lookup: ``forward_s["1"]`` with
``"one_call_per_step": true``), ``overhead_s[k]`` (fastspec's per-step work with k drafts; ``"0"``: plain
decoding's, required), optional ``*_se`` standard errors and informational fields (machine, threads,
context_length, repeats, note).  Version 2 adds the batch axis: ``target.batch_forward_s[B][n]``,
``drafts[name].batch_forward_s[B][n]`` and ``batch_overhead_s[B][k]`` for B in [1, :data:`MAX_BATCH_SIZE`]; at
B = 1 a batch-axis entry takes precedence over the version-1 one; a version-1 table naming a batch field is
refused.

The reader (:meth:`CostTable.from_dict` / :meth:`~CostTable.from_json` / :meth:`~CostTable.from_file` /
:meth:`~CostTable.of`) substitutes nothing and refuses unknown keys at every level; times lie in [1e-9, 1e6]
seconds, keys are integers up to 2**20, a table is at most :data:`MAX_TABLE_BYTES` of UTF-8 JSON, and a file must be
a regular file (a FIFO or a device is refused before it is opened).  The writer is :meth:`CostTable.save`
(atomic: a temporary file renamed over the target); :meth:`CostTable.as_dict` writes version 2 exactly when the
table has a batch field (or was read as version 2).  Pricing a step from a table is
:class:`fastspec.costs.step.StepCost`'s.

Schema, field by field: docs/reference/cost-tables.md; the cost model: docs/design/cost-model.md.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..config import MAX_ENTRY_N, MAX_TABLE_BYTES, SECONDS_RANGE
from ..errors import InvalidInput, InvalidType, shown

__all__ = ["CostTable", "COST_TABLE_VERSION", "COST_TABLE_VERSIONS", "MAX_BATCH_SIZE", "MAX_TABLE_BYTES",
           "SECONDS_RANGE", "read_json_file", "parse_json", "int_keyed", "check_batch_size", "parse_batch_list"]

#: the newest schema (2: the batch axis); every version in COST_TABLE_VERSIONS is read
COST_TABLE_VERSION = 2
COST_TABLE_VERSIONS = (1, 2)
#: the largest batch size a table (and ``simulate --batch``) may name
MAX_BATCH_SIZE = 4096
_BATCH_KEYS = {"batch_forward_s", "batch_forward_s_se"}
_TOP_KEYS = {"version", "machine", "threads", "context_length", "target", "drafts", "overhead_s", "overhead_s_se",
             "repeats", "note", "batch_overhead_s", "batch_overhead_s_se"}
_TARGET_KEYS = {"forward_s", "forward_s_se"} | _BATCH_KEYS
_DRAFT_KEYS = {"forward_s", "forward_s_se", "one_call_per_step"} | _BATCH_KEYS
_MAX_TEXT = 10_000  # characters of the free-text fields (machine, note)


def parse_json(text: str, what: str):
    """``json.loads(text)`` whose every failure is an :class:`InvalidInput` naming ``what``: syntax errors,
    NaN/Infinity (not JSON), nesting too deep for the parser, numbers with more digits than Python converts."""
    def constant(name):
        raise InvalidInput(f"{what}: {name} is not valid JSON (give finite numbers)")

    try:
        return json.loads(text, parse_constant=constant)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InvalidInput(f"{what}: JSON nested too deeply to be a table") from None
    except ValueError as exc:  # the int-digit limit of int(), raised by the decoder (not a JSONDecodeError)
        if isinstance(exc, InvalidInput):
            raise
        raise InvalidInput(f"{what}: a number has too many digits ({exc})") from None


def read_json_file(path, what: str, max_bytes: int = MAX_TABLE_BYTES):
    """The JSON value of the regular file ``path`` (at most ``max_bytes``, UTF-8), or an :class:`InvalidInput`
    naming ``what`` and the path: missing, a directory, a FIFO or a device (refused before anything is opened, so
    nothing blocks or reads without end), too large, not UTF-8, not JSON."""
    from ..io.files import DIRECTORY, MISSING, REGULAR, entry_kind

    path = os.fspath(path)
    kind = entry_kind(path)
    if kind == MISSING:
        raise InvalidInput(f"{what}: no such file {path!r}")
    if kind != REGULAR:
        hint = "; give a JSON file inside it" if kind == DIRECTORY else ""
        raise InvalidInput(f"{what}: {path!r} is {kind}, not a regular file{hint}")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInput(f"{what}: cannot read {path!r} ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InvalidInput(f"{what}: {path!r} is larger than {max_bytes} bytes; a cost table is a few kilobytes "
                           "of JSON")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what}: {path!r} is not UTF-8 text (byte {exc.start})") from None
    return parse_json(text, f"{what} ({path})")


def int_keyed(obj, where: str, first: int, form: str) -> list:
    """[(n, key, value)] of a non-empty JSON object whose keys are integers in [first, MAX_ENTRY_N] (``form``: what
    such an object looks like, for the message)."""
    if not isinstance(obj, Mapping) or not obj:
        raise InvalidInput(f"{where} must be a non-empty object {form}")
    out = []
    for key, val in obj.items():
        text = str(key)
        canonical = text.isascii() and text.isdigit() and len(text) <= 7 and str(int(text)) == text
        if not canonical:  # " 3", "3 ", "+3", "03": each would collide with "3", the later value silently winning
            plain = text.strip().lstrip("+")
            if not (plain.isascii() and plain.isdigit()) or len(plain) > 7:
                raise InvalidInput(f"{where}: key {shown(text)} is not an integer in [{first}, {MAX_ENTRY_N}]")
            raise InvalidInput(f"{where}: key {shown(text)} is not a canonical decimal integer (no spaces, sign or "
                               f'leading zeros); write it as "{int(plain)}"')
        n = int(text)
        if n < first or n > MAX_ENTRY_N:
            raise InvalidInput(f"{where}: key {key!r} must be an integer in [{first}, {MAX_ENTRY_N}]")
        out.append((n, key, val))
    return out


def _seconds(obj, where: str, *, first: int, positive: bool = True) -> dict[int, float]:
    """{n: seconds} from a JSON object keyed by integers >= first: times in :data:`SECONDS_RANGE` (a measured time is
    never zero, and a zero would divide), or standard errors in [0, max] when not ``positive``."""
    lo, hi = SECONDS_RANGE
    out = {}
    for n, key, val in int_keyed(obj, f"cost table: {where}", first, '{"n": seconds, ...}'):
        ok = not isinstance(val, bool) and isinstance(val, (int, float))
        if ok:
            try:
                f = float(val)
            except OverflowError:  # an integer too large for a float
                f = math.inf
            ok = math.isfinite(f) and (lo <= f <= hi if positive else 0 <= f <= hi)
        if not ok:
            want = f"> 0 (in [{lo:g}, {hi:g}])" if positive else f">= 0 (at most {hi:g})"
            raise InvalidInput(f"cost table: {where}[{key!r}] = {shown(val)} must be a finite number of seconds {want}")
        out[n] = f
    return out


def _optional(obj, key, where, first):
    """Standard errors (``*_se``): optional, >= 0."""
    return _seconds(obj[key], f"{where}.{key}", first=first, positive=False) if key in obj else {}


def _batch_axis(obj, key, where, *, first: int, positive: bool = True, only_n1: bool = False) -> dict:
    """{B: {n: seconds}} of a version-2 batch field (``batch_forward_s``, ``batch_overhead_s`` and their ``_se``):
    batch sizes B in [1, :data:`MAX_BATCH_SIZE`], each an object of n (or k) >= ``first`` -> seconds; absent: {}.
    ``only_n1``: a one-call draft's entries are ``{"B": {"1": s}}``."""
    if key not in obj:
        return {}
    out = {}
    for b, bkey, val in int_keyed(obj[key], f"cost table: {where}{key}", 1, '{"B": {"n": seconds, ...}, ...}'):
        if b > MAX_BATCH_SIZE:
            raise InvalidInput(f"cost table: {where}{key}: batch size {bkey!r} is outside [1, {MAX_BATCH_SIZE}]")
        out[b] = _seconds(val, f"{where}{key}[{bkey!r}]", first=first, positive=positive)
        if only_n1 and set(out[b]) != {1}:
            raise InvalidInput(f"cost table: {where}{key}[{bkey!r}] must be {{\"1\": seconds}}: a one-call draft "
                               "(one_call_per_step) records one proposal call for the whole batch")
    return out


def _batch_pair(obj, key, where, *, first: int, only_n1: bool = False) -> tuple[dict, dict]:
    """The batch field ``key`` and its standard errors ``key_se``; a standard error of an entry the field lacks (a
    batch size, or an n at a batch size) is refused: it would be ignored without a word."""
    values = _batch_axis(obj, key, where, first=first, only_n1=only_n1)
    errors = _batch_axis(obj, key + "_se", where, first=first, positive=False, only_n1=only_n1)
    for b, row in sorted(errors.items()):
        if b not in values:
            raise InvalidInput(f"cost table: {where}{key}_se has batch size \"{b}\" but {where}{key} has none; add "
                               f"{where}{key}[\"{b}\"] or remove the standard error")
        orphan = sorted(set(row) - set(values[b]))
        if orphan:
            raise InvalidInput(f"cost table: {where}{key}_se[\"{b}\"] has \"{orphan[0]}\" but "
                               f"{where}{key}[\"{b}\"] has none; add that time or remove the standard error")
    return values, errors


def _batch_fields_need_v2(obj) -> None:
    """A version-1 table names no batch field (it is batch 1 only)."""
    drafts = obj.get("drafts")
    places = [("", obj), ("target.", obj.get("target"))]
    places += [(f"drafts[{n!r}].", e) for n, e in drafts.items()] if isinstance(drafts, Mapping) else []
    for where, o in places:
        keys = sorted(str(key) for key in o if str(key).startswith("batch_")) if isinstance(o, Mapping) else []
        if keys:
            raise InvalidInput(f"cost table: {where}{keys[0]} needs \"version\": 2 (a version-1 table is batch 1 "
                               "only)")


def _unknown(obj, allowed, where):
    extra = set(obj) - allowed
    if extra:
        raise InvalidInput(f"cost table: {where}unknown key(s) {', '.join(sorted(map(repr, extra)))}; expected "
                           f"{', '.join(sorted(allowed))}")


def _info(obj) -> dict:
    """The informational fields, checked: machine and note are text, threads/repeats integers >= 1,
    context_length an integer >= 0."""
    info = {}
    for key in ("machine", "threads", "context_length", "repeats", "note"):
        if key not in obj:
            continue
        val = obj[key]
        if key in ("machine", "note"):
            if not isinstance(val, str) or len(val) > _MAX_TEXT:
                raise InvalidInput(f"cost table: {key} must be text of at most {_MAX_TEXT} characters")
        else:
            low = 0 if key == "context_length" else 1
            if isinstance(val, bool) or not isinstance(val, int) or not low <= val <= MAX_ENTRY_N * 64:
                raise InvalidInput(f"cost table: {key} = {shown(val)} must be an integer in "
                                   f"[{low}, {MAX_ENTRY_N * 64}]")
        info[key] = val
    return info


def check_batch_size(b, name: str = "batch") -> int:
    """``b`` as an int in [1, :data:`MAX_BATCH_SIZE`], else InvalidInput / InvalidType naming ``name``."""
    if isinstance(b, np.integer) and not isinstance(b, np.bool_):
        b = int(b)
    if isinstance(b, bool) or not isinstance(b, int):
        raise InvalidType(f"{name} must be an integer in [1, {MAX_BATCH_SIZE}], got {type(b).__name__} {b!r}")
    if not 1 <= b <= MAX_BATCH_SIZE:
        raise InvalidInput(f"{name} = {b} is outside [1, {MAX_BATCH_SIZE}] (sequences decoded together)")
    return b


def parse_batch_list(spec, name: str = "batch") -> list[int]:
    """``8`` / ``"1,2,4,8"`` / ``[1, 2, 4]`` -> the sorted unique batch sizes, each in [1, MAX_BATCH_SIZE]."""
    if isinstance(spec, str):
        parts = [p.strip() for p in spec.split(",")]
        if not spec.strip() or any(not p for p in parts):
            raise InvalidInput(f"{name} {spec!r} is not a list of batch sizes; write e.g. 1,2,4,8")
        out = []
        for i, p in enumerate(parts):
            if not (p.isascii() and p.lstrip("+-").isdigit()) or len(p) > 12:
                raise InvalidInput(f"{name} {spec!r}: item {i} {p!r} is not an integer; write e.g. 1,2,4,8")
            out.append(check_batch_size(int(p), f"{name} item {i}"))
    elif isinstance(spec, (list, tuple)):
        out = [check_batch_size(b, f"{name}[{i}]") for i, b in enumerate(spec)]
    else:
        out = [check_batch_size(spec, name)]
    if not out:
        raise InvalidInput(f"{name} is empty; give at least one batch size, e.g. 1,2,4,8")
    return sorted(set(out))


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
    #: the schema version read (1 or 2); :meth:`as_dict` writes 2 whenever a batch field is present
    version: int = 1
    #: version 2, the batch axis: {B: {n: seconds}} of a target forward over B sequences with n new tokens each
    target_batch_s: dict = field(default_factory=dict)
    target_batch_se: dict = field(default_factory=dict)
    draft_batch_s: dict = field(default_factory=dict)  # name -> {B: {n: seconds}} (a one-call draft: n = 1 only)
    draft_batch_se: dict = field(default_factory=dict)
    overhead_batch_s: dict = field(default_factory=dict)  # {B: {k: seconds}}
    overhead_batch_se: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, obj) -> "CostTable":
        if not isinstance(obj, Mapping):
            raise InvalidType(f"cost table must be a JSON object, got {type(obj).__name__}")
        _unknown(obj, _TOP_KEYS, "")
        version = obj.get("version", 1)
        if type(version) is not int or version not in COST_TABLE_VERSIONS:
            raise InvalidInput(f"cost table: version {version!r} is not supported (expected the integer 1, or 2 "
                               "for a table with a batch axis)")
        if version == 1:
            _batch_fields_need_v2(obj)
        for key in ("target", "drafts", "overhead_s"):
            if key not in obj:
                raise InvalidInput(f"cost table: {key!r} is missing")
        target = obj["target"]
        if not isinstance(target, Mapping) or "forward_s" not in target:
            raise InvalidInput("cost table: target must be an object with forward_s {\"1\": seconds, ...}")
        _unknown(target, _TARGET_KEYS, "target: ")
        tf = _seconds(target["forward_s"], "target.forward_s", first=1)
        if 1 not in tf:
            raise InvalidInput("cost table: target.forward_s needs n = 1 (a plain decoding step)")
        drafts = obj["drafts"]
        if not isinstance(drafts, Mapping):
            raise InvalidInput("cost table: drafts must be an object {name: {forward_s: {...}}}")
        df, dse, one, dbs, dbse = {}, {}, set(), {}, {}
        for name, entry in drafts.items():
            if not isinstance(entry, Mapping) or "forward_s" not in entry:
                raise InvalidInput(f"cost table: drafts[{name!r}] must be an object with forward_s")
            _unknown(entry, _DRAFT_KEYS, f"drafts[{name!r}]: ")
            df[name] = _seconds(entry["forward_s"], f"drafts[{name!r}].forward_s", first=1)
            if 1 not in df[name]:
                raise InvalidInput(f"cost table: drafts[{name!r}].forward_s needs n = 1")
            dse[name] = _optional(entry, "forward_s_se", f"drafts[{name!r}]", 1)
            flag = entry.get("one_call_per_step", False)
            if not isinstance(flag, bool):
                raise InvalidInput(f"cost table: drafts[{name!r}].one_call_per_step must be true or false")
            if flag:
                one.add(name)
            dbs[name], dbse[name] = _batch_pair(entry, "batch_forward_s", f"drafts[{name!r}].", first=1,
                                                only_n1=flag)
        ov = _seconds(obj["overhead_s"], "overhead_s", first=0)
        if 0 not in ov:
            raise InvalidInput("cost table: overhead_s needs k = 0 (a plain decoding step's sampling): every "
                               "speed-up is relative to plain decoding")
        tbs, tbse = _batch_pair(target, "batch_forward_s", "target.", first=1)
        obs, obse = _batch_pair(obj, "batch_overhead_s", "", first=0)
        return cls(tf, df, frozenset(one), ov, _optional(target, "forward_s_se", "target", 1), dse,
                   _optional(obj, "overhead_s_se", "cost table", 0), _info(obj), version, tbs, tbse,
                   {n: v for n, v in dbs.items() if v}, {n: v for n, v in dbse.items() if v}, obs, obse)

    @property
    def batch_sizes(self) -> list[int]:
        """The batch sizes the table's target forwards cover: 1 (the version-1 entries) and every B of
        ``target.batch_forward_s``, sorted.  Pricing a step at B needs more (the overhead and the draft at B;
        :class:`fastspec.costs.step.StepCost` names what is missing)."""
        return sorted({1, *self.target_batch_s})

    @property
    def has_batch_axis(self) -> bool:
        """Whether the table has any version-2 batch field."""
        return bool(self.target_batch_s or self.overhead_batch_s or any(self.draft_batch_s.values()))

    @classmethod
    def from_json(cls, text: str, what: str = "cost table") -> "CostTable":
        if len(text) > MAX_TABLE_BYTES:
            raise InvalidInput(f"{what}: {len(text)} characters; a cost table is a few kilobytes of JSON (at most "
                               f"{MAX_TABLE_BYTES})")
        return cls.from_dict(parse_json(text, what))

    @classmethod
    def from_file(cls, path) -> "CostTable":
        """The table in the JSON file ``path``: a regular file of at most :data:`MAX_TABLE_BYTES` (a FIFO, a
        device or a directory is refused before it is opened)."""
        obj = read_json_file(path, "cost table")
        try:
            return cls.from_dict(obj)
        except (InvalidInput, InvalidType) as exc:  # the file's name with what is wrong inside it
            raise type(exc)(f"{os.fspath(path)}: {exc}") from None

    @classmethod
    def of(cls, costs, what: str = "costs") -> "CostTable":
        """``costs`` as a table: a :class:`CostTable` as it is, a mapping in the JSON schema, or a path to a JSON
        file (:meth:`from_file`)."""
        if isinstance(costs, CostTable):
            return costs
        if isinstance(costs, Mapping):
            return cls.from_dict(costs)
        if isinstance(costs, (str, os.PathLike)):
            return cls.from_file(costs)
        raise InvalidType(f"{what} must be a CostTable, a mapping in its JSON schema or a path to a JSON cost table, "
                          f"got {type(costs).__name__}")

    def plain_step_s(self) -> float:
        """Seconds per token of plain decoding: target(1) + overhead(0) (both required by the schema)."""
        return self.target_forward_s[1] + self.overhead_s[0]

    def missing(self, draft: str, k: int, *, target_n: int | None = None, every_j: bool = False) -> list[str]:
        """The entries a verify step with k drafts of ``draft`` needs and the table lacks, as JSON paths
        (``target.forward_s["5"]``, ``overhead_s["4"]``): target(k + 1) (or ``target_n``) and overhead(k); with
        ``every_j``, those of every j = 1..k (an n-gram step proposes any number up to k)."""
        out = []
        js = range(1, k + 1) if every_j else [k]
        for j in js:
            n = target_n if target_n is not None else j + 1
            if n not in self.target_forward_s:
                out.append(f'target.forward_s["{n}"]')
            if j not in self.overhead_s:
                out.append(f'overhead_s["{j}"]')
        if draft in self.draft_forward_s and 1 not in self.draft_forward_s[draft]:  # pragma: no cover - schema
            out.append(f'drafts["{draft}"].forward_s["1"]')
        return out

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
        def axis(d):
            return {str(b): keyed(v) for b, v in sorted(d.items())}

        for key, src in (("batch_forward_s", self.target_batch_s), ("batch_forward_s_se", self.target_batch_se)):
            if src:
                target[key] = axis(src)
        for name in drafts:
            for key, src in (("batch_forward_s", self.draft_batch_s), ("batch_forward_s_se", self.draft_batch_se)):
                if src.get(name):
                    drafts[name][key] = axis(src[name])
        version = 2 if self.has_batch_axis or self.version == 2 else 1
        out = {"version": version, **self.info, "target": target, "drafts": drafts,
               "overhead_s": keyed(self.overhead_s)}
        if self.overhead_se:
            out["overhead_s_se"] = keyed(self.overhead_se)
        for key, src in (("batch_overhead_s", self.overhead_batch_s), ("batch_overhead_s_se", self.overhead_batch_se)):
            if src:
                out[key] = axis(src)
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=False)

    def save(self, path) -> str:
        """Write the table as JSON (:meth:`to_json`, one trailing newline) to ``path`` atomically: a temporary file
        in the same directory, flushed to disk, then renamed over ``path`` -- a reader (or a crash) never sees a
        half-written table, and a failure leaves ``path`` as it was (the temporary file is removed).  Returns
        ``path`` as a string."""
        from ..io.files import atomic_write_text

        return atomic_write_text(path, self.to_json() + "\n")
