"""Structural checks of a dump, from its headers and small arrays only (before any large allocation).

:func:`check_structure` applies the rules of :mod:`fastspec.io.format` to the arrays of one file, in steps:
names -> roles, one kind (dense or sparse) per dump, shapes and dtypes (N, T, V, k; absurd sizes refused),
metadata, vocabulary, ``lengths`` and ``tokens`` (range-checked in their own dtype, so no value wraps around),
then the prompts (``prompt_tokens`` / ``prompt_lengths``), the recorded cost table (``costs``) and what a sparse
dump knows beyond its top-k lists plus the text metadata (:mod:`fastspec.io.known`).
Every failure is a :class:`fastspec.errors.DumpFormatError` naming the file, the
array and the offending index.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import math

from ..config import MAX_POSITIONS, MAX_TABLE_BYTES, MAX_WHOLE_ARRAY_BYTES, MAX_WIDTH
from ..errors import InvalidInput, InvalidType
from .format import (DEFAULT_DRAFT, FLOAT_DTYPES, METADATA, OPTIONAL_ARRAYS, SPARSE_KINDS, TEXT_METADATA,
                     check_draft_name, format_error, metadata_value, parse_array_name, parse_known_name)
from .known import check_known, text_metadata
from .sources import Source
from .values import ID_LIMIT

__all__ = ["Layout", "check_structure", "role_key", "index_text"]

_MAX_COSTS_BYTES = 4 * MAX_TABLE_BYTES  # a NumPy string array stores 4 bytes per character


def role_key(draft: str | None) -> str:
    """Key of a role in :attr:`Layout.roles`: ``"target"`` (``draft`` None) or ``"draft:<name>"``."""
    return "target" if draft is None else f"draft:{draft}"


@dataclass
class Layout:
    """What the structure checks established about one dump (see :class:`fastspec.io.Dump` for the fields)."""

    roles: dict  # role key -> {kind: Source}
    kind: str
    drafts: tuple
    N: int
    T: int
    V: int | None
    k: dict  # role key -> top-k width (sparse only)
    rank3: bool  # arrays are [N, T, ...] (else one sequence, [T, ...])
    metadata: dict
    lengths: np.ndarray
    tokens: np.ndarray | None
    prompt_tokens: np.ndarray | None = None  # int64 [N, P], padded after prompt_lengths[n]
    prompt_lengths: np.ndarray | None = None  # int64 [N]
    costs: object = None  # fastspec.costs.CostTable
    sampled: dict | None = None  # role key -> float64 [N, T]: the recorded token's logprob (sparse, optional)
    extras: dict | None = None  # role key -> {"extra_ids": Source, "extra_logprobs": Source} (sparse, optional)
    provenance: dict | None = None  # the parsed 'provenance' JSON object


def check_structure(file: str, sources: dict[str, Source], verify: bool = False) -> Layout:
    """The :class:`Layout` of the dump made of ``sources`` (messages name ``file``); reads only small arrays
    (``verify``: checking their CRC-32 where the archive stores one)."""
    roles, extras, known = _group(file, sources)
    kind, drafts = _kind_and_drafts(file, roles)
    lead, V, k = _shapes(file, roles, kind)
    rank3 = len(lead) == 2
    N, T = (lead[0], lead[1]) if rank3 else (1, lead[0])
    metadata = {name: metadata_value(file, name, _scalar(file, extras[name], verify)) for name in METADATA
                if name in extras}
    V = _vocabulary(file, kind, metadata, V, k)
    lengths = _lengths(file, extras.get("lengths"), N, T, verify)
    tokens = _tokens(file, extras.get("tokens"), N, T, rank3, lengths, V, verify)
    prompt_tokens, prompt_lengths = _prompts(file, extras.get("prompt_tokens"), extras.get("prompt_lengths"), N, V,
                                             verify)
    costs = _costs(file, extras.get("costs"), verify)
    sampled, extra_arrays = check_known(file, known, roles, kind, lead, rank3, lengths, tokens, verify)
    mode, provenance = text_metadata(file, extras, verify)
    if mode is not None:
        metadata["logprobs_mode"] = mode
    return Layout(roles, kind, drafts, N, T, V, k, rank3, metadata, lengths, tokens, prompt_tokens, prompt_lengths,
                  costs, sampled, extra_arrays, provenance)


def index_text(n: int, t: int, rank3: bool) -> str:
    """``[n, t]`` (or ``[t]`` for a single-sequence dump) as messages write an index."""
    return f"[{n}, {t}]" if rank3 else f"[{t}]"


# ---- steps -----------------------------------------------------------------------------------------------------
def _group(file, sources):
    """Role arrays by role key and kind; the optional arrays by name; the optional per-role arrays
    (:data:`~fastspec.io.format.KNOWN_KINDS`) by role key and kind.  Unknown names and empty arrays are refused."""
    roles: dict[str, dict[str, Source]] = {}
    extras: dict[str, Source] = {}
    known: dict[str, dict[str, Source]] = {}
    for name, src in sources.items():
        parsed = parse_array_name(name)
        aux = parse_known_name(name) if parsed is None else None
        if aux is not None:
            role, kind, suffix = aux
            if role == "target" and suffix is not None:
                raise format_error(file, f"array {name!r}: the target takes no __name suffix; call it target_{kind}")
            draft = None if role == "target" else (DEFAULT_DRAFT if suffix is None else _draft_name(file, name, suffix))
            parts = known.setdefault(role_key(draft), {})
            if kind in parts:
                raise format_error(file, f"arrays {parts[kind].name!r} and {name!r} both hold {kind} of the draft "
                                         f"named {draft!r}; keep one")
            parts[kind] = src
        elif parsed is not None:
            role, kind, suffix = parsed
            if role == "target" and suffix is not None:
                raise format_error(file, f"array {name!r}: the target takes no __name suffix; call it target_{kind}")
            draft = None if role == "target" else (DEFAULT_DRAFT if suffix is None else _draft_name(file, name, suffix))
            parts = roles.setdefault(role_key(draft), {})
            if kind in parts:
                raise format_error(file, f"arrays {parts[kind].name!r} and {name!r} both hold {kind} of the draft "
                                         f"named {draft!r}; keep one")
            parts[kind] = src
        elif name in OPTIONAL_ARRAYS or name in METADATA or name in TEXT_METADATA:
            extras[name] = src
        else:
            raise format_error(file, f"array {name!r}: unknown name; expected target_logits, draft_logits[__name], "
                                     "target_topk_ids/target_topk_logprobs, draft_topk_ids[__name]/draft_topk_logprobs"
                                     "[__name], <role>_sampled_logprob / <role>_extra_ids / <role>_extra_logprobs"
                                     f"[__name], {', '.join(OPTIONAL_ARRAYS)} or metadata "
                                     f"{', '.join(METADATA + TEXT_METADATA)}")
        if any(s == 0 for s in src.shape):
            raise format_error(file, f"array {name!r}: empty array (shape {list(src.shape)})")
    return roles, extras, known


def _draft_name(file, name, suffix):
    try:
        return check_draft_name(suffix)
    except InvalidInput as exc:
        raise format_error(file, f"array {name!r}: {exc}") from None


def _kind_and_drafts(file, roles):
    """The dump's kind ("dense" or "sparse", the same for every role) and its sorted draft names (none: a
    target-only dump)."""
    if "target" not in roles:
        raise format_error(file, "missing the target: expected target_logits or target_topk_ids + target_topk_logprobs")
    drafts = tuple(sorted(key[len("draft:"):] for key in roles if key != "target"))
    kinds = set()
    for key, parts in roles.items():
        if "logits" in parts:
            if len(parts) > 1:
                raise format_error(file, f"{key}: has both dense logits and sparse top-k arrays; keep one kind per "
                                         "dump")
            kinds.add("dense")
            continue
        for need in SPARSE_KINDS:
            if need not in parts:
                other = next(iter(parts.values())).name
                base = other.replace("topk_ids", need).replace("topk_logprobs", need)
                raise format_error(file, f"array {base!r} is missing (it goes with {other!r})")
        kinds.add("sparse")
    if len(kinds) > 1:
        raise format_error(file, "mixes dense logits and sparse top-k arrays across roles; use one kind for all roles")
    return kinds.pop(), drafts


def _check_array(file, kind, src):
    """Rank, dtype and memory order of one role array."""
    if not src.shape:
        raise format_error(file, f"array {src.name!r}: is a scalar; expected [N, T, V] or [T, V]")
    if len(src.shape) not in (2, 3):
        raise format_error(file, f"array {src.name!r}: rank {len(src.shape)} (shape {list(src.shape)}); "
                                 "expected [N, T, V] or [T, V]")
    if kind in ("logits", "topk_logprobs") and src.dtype not in FLOAT_DTYPES:
        raise format_error(file, f"array {src.name!r}: dtype {src.dtype}; expected float16, float32 or float64")
    if kind == "topk_ids" and src.dtype.kind not in "iu":
        raise format_error(file, f"array {src.name!r}: dtype {src.dtype}; expected an integer dtype")
    if src.fortran and src.nbytes > MAX_WHOLE_ARRAY_BYTES:
        raise format_error(file, f"array {src.name!r}: Fortran-ordered and large; re-save it C-contiguous")
    positions, width = math.prod(src.shape[:-1]), src.shape[-1]  # Python integers: no wrap-around
    if positions > MAX_POSITIONS:
        raise format_error(file, f"array {src.name!r}: shape {list(src.shape)}: {positions} positions, more than "
                                 f"the {MAX_POSITIONS} (2**32) one file may hold; split it into shards")
    if width > MAX_WIDTH:
        raise format_error(file, f"array {src.name!r}: shape {list(src.shape)}: last dimension {width} is more than "
                                 f"{MAX_WIDTH} (2**24) entries per position; not a vocabulary")


def _shapes(file, roles, kind):
    """(leading dims shared by every role array, V of the dense logits or None, {role key: k} when sparse)."""
    lead, lead_name, V, k = None, None, None, {}
    for key, parts in roles.items():
        for part, src in parts.items():
            _check_array(file, part, src)
            if lead is None:
                lead, lead_name = src.shape[:-1], src.name
            elif src.shape[:-1] != lead:
                raise format_error(file, f"array {src.name!r}: shape {list(src.shape)} disagrees with {lead_name!r} "
                                         f"on the leading [N, T] dims {list(lead)}")
        if kind == "dense":
            logits = parts["logits"]
            if V is None:
                V = logits.shape[-1]
            elif logits.shape[-1] != V:
                raise format_error(file, f"array {logits.name!r}: vocabulary {logits.shape[-1]} differs from the "
                                         f"target's {V}")
        else:
            ids, lp = parts["topk_ids"], parts["topk_logprobs"]
            if ids.shape != lp.shape:
                raise format_error(file, f"arrays {ids.name!r} {list(ids.shape)} and {lp.name!r} {list(lp.shape)} "
                                         "differ in shape")
            k[key] = ids.shape[-1]
    return lead, V, k


def _scalar(file, src, verify):
    if src.shape not in ((), (1,)):
        raise format_error(file, f"array {src.name!r}: metadata must be a scalar, got shape {list(src.shape)}")
    return src.read_all(verify).reshape(())


def _vocabulary(file, kind, metadata, V, k):
    """V: the logits' width (``vocab_size``, if recorded, must agree), or ``vocab_size`` (>= every k) if sparse."""
    if kind == "dense":
        if "vocab_size" in metadata and metadata["vocab_size"] != V:
            raise format_error(file, f"array 'vocab_size': {metadata['vocab_size']} but the logits have V = {V}")
        return V
    V = metadata.get("vocab_size")
    if V is not None:
        for key, kk in k.items():
            if kk > V:
                raise format_error(file, f"{key}: k = {kk} exceeds vocab_size {V}")
    return V


def _integers(file, src, want, verify, note=""):
    """The array in its own integer dtype (range checks compare exactly; converting first would wrap uint64)."""
    if src.dtype.kind not in "iu":
        raise format_error(file, f"array {src.name!r}: dtype {src.dtype}; expected integers")
    if src.shape != want:
        raise format_error(file, f"array {src.name!r}: shape {list(src.shape)}; expected {list(want)}{note}")
    return src.read_all(verify)


def _lengths(file, src, N, T, verify):
    """Valid positions per sequence, in [1, T] (default T)."""
    if src is None:
        return np.full(N, T, dtype=np.int64)
    lengths = _integers(file, src, (N,), verify, " (one per sequence)")
    bad = np.flatnonzero((lengths < 1) | (lengths > T))
    if bad.size:
        raise format_error(file, f"array 'lengths': index {bad[0]} is {lengths[bad[0]]}; lengths must be in [1, {T}]")
    return lengths.astype(np.int64)


def _tokens(file, src, N, T, rank3, lengths, V, verify):
    """Token ids [N, T], in [0, V) at valid positions (padding is never read; [0, 2**63) when V is unknown)."""
    if src is None:
        return None
    tok = _integers(file, src, (N, T) if rank3 else (T,), verify).reshape(N, T)
    _check_ids(file, "tokens", tok, lengths, V, rank3)
    return tok.astype(np.int64)


def _check_ids(file, name, ids, lengths, V, rank3=True):
    """Token ids [N, P] must lie in [0, V) (in [0, 2**63) when V is unknown) at positions before each length."""
    valid = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    bad = np.argwhere(valid & ((ids < 0) | (ids >= (V if V is not None else ID_LIMIT))))
    if bad.size:
        n, t = bad[0]
        raise format_error(file, f"array {name!r}: index {index_text(n, t, rank3)} is {ids[n, t]}; token ids must be "
                                 f"in [0, {V if V is not None else '2**63'})")


def _prompts(file, tok_src, len_src, N, V, verify):
    """Prompt token ids [N, P] (padded) and their lengths [N], in [1, P]; the two arrays come together."""
    if tok_src is None and len_src is None:
        return None, None
    if tok_src is None or len_src is None:
        have, miss = ("prompt_tokens", "prompt_lengths") if len_src is None else ("prompt_lengths", "prompt_tokens")
        raise format_error(file, f"array {have!r} needs {miss!r} (prompt tokens [N, P] padded, and their lengths [N])")
    if len(tok_src.shape) != 2:
        raise format_error(file, f"array 'prompt_tokens': shape {list(tok_src.shape)}; expected [N, P] with N = {N}")
    P = tok_src.shape[1]
    if P > MAX_POSITIONS:
        raise format_error(file, f"array 'prompt_tokens': {P} positions per prompt; not a prompt")
    plen = _integers(file, len_src, (N,), verify, " (one per sequence)")
    bad = np.flatnonzero((plen < 1) | (plen > P))
    if bad.size:
        raise format_error(file, f"array 'prompt_lengths': index {bad[0]} is {plen[bad[0]]}; prompt lengths must be in "
                                 f"[1, {P}] (the width of 'prompt_tokens')")
    plen = plen.astype(np.int64)
    ptok = _integers(file, tok_src, (N, P), verify)
    _check_ids(file, "prompt_tokens", ptok, plen, V)
    return ptok.astype(np.int64), plen


def _costs(file, src, verify):
    """The recorded cost table (:class:`fastspec.costs.CostTable`) from the 0-d string array ``costs``."""
    if src is None:
        return None
    from ..costs.table import CostTable

    if src.shape not in ((), (1,)) or src.dtype.kind != "U":
        raise format_error(file, f"array 'costs': must be a 0-d string array holding the cost table's JSON, got "
                                 f"dtype {src.dtype} shape {list(src.shape)}")
    if src.nbytes > _MAX_COSTS_BYTES:
        raise format_error(file, f"array 'costs': {src.nbytes} bytes; a cost table is a few kilobytes of JSON")
    try:
        return CostTable.from_json(str(src.read_all(verify).reshape(())))
    except (InvalidInput, InvalidType) as exc:
        raise format_error(file, f"array 'costs': {exc}") from None
