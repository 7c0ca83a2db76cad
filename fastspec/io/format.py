"""The dump format's rules: array names, roles and kinds, dtypes, metadata (in full: ``docs/reference/dump-format.md``).

Array names are ``<role>_<kind>[__<draft name>]``: role ``target`` or ``draft``, kind ``logits`` (dense) or
``topk_ids`` + ``topk_logprobs`` (sparse).  A plain ``draft_*`` array belongs to the draft named ``draft``; the
target takes no suffix; a dump may hold no draft at all (target-only, for n-gram analysis).  Optional arrays:
``tokens``, ``lengths``, ``prompt_tokens`` + ``prompt_lengths``, ``costs`` (a cost table's JSON,
:mod:`fastspec.costs`) and the 0-d metadata :data:`METADATA`.  Sparse dumps may add, per role, the optional
kinds :data:`KNOWN_KINDS` (named like the role arrays: ``target_sampled_logprob``,
``draft_extra_ids__<name>``, ...): the logprob of the recorded token at each position, and the logprobs of ids
outside the top-k known exactly; and the 0-d text arrays :data:`TEXT_METADATA` (``logprobs_mode``,
``provenance``).

This module states the rules and checks single values (a draft name, one metadata value);
:mod:`fastspec.io.structure` applies them to the arrays of a file.
"""
from __future__ import annotations

import re

import numpy as np

from ..errors import DumpFormatError, InvalidInput, InvalidType
from ..params import NAMES as SAMPLING_NAMES
from ..params import SamplingParams

__all__ = ["DRAFT_NAME_PATTERN", "DEFAULT_DRAFT", "ROLES", "DENSE_KINDS", "SPARSE_KINDS", "OPTIONAL_ARRAYS",
           "METADATA", "FLOAT_DTYPES", "check_draft_name", "parse_array_name", "array_name", "kinds_of",
           "format_error", "metadata_value", "flag_value", "KNOWN_KINDS", "TEXT_METADATA", "LOGPROBS_MODES",
           "parse_known_name", "PAD_ID", "MAX_PROVENANCE_CHARS"]

#: a draft name: letters, digits, '_', '.', '-', starting with a letter or digit (no '__', not 'target': see
#: check_draft_name)
DRAFT_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"
#: the draft that plain ``draft_*`` arrays (no ``__name`` suffix) belong to
DEFAULT_DRAFT = "draft"
ROLES = ("target", "draft")
DENSE_KINDS = ("logits",)
SPARSE_KINDS = ("topk_ids", "topk_logprobs")
OPTIONAL_ARRAYS = ("tokens", "lengths", "prompt_tokens", "prompt_lengths", "costs")
#: 0-d metadata arrays: how the trajectory was sampled (fastspec.params' names), the vocabulary size, and whether
#: the trajectories ran past end-of-sequence tokens (``ignore_eos``: 0 or 1)
METADATA = SAMPLING_NAMES + ("vocab_size", "ignore_eos")
FLOAT_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
#: optional per-role kinds of a sparse dump: ``sampled_logprob`` [N, T] (the logprob of ``tokens[n, t]``),
#: ``extra_ids`` + ``extra_logprobs`` [N, T, m] (ids outside the role's top-k whose logprobs are known exactly;
#: unused slots hold id :data:`PAD_ID` with logprob -inf)
KNOWN_KINDS = ("sampled_logprob", "extra_ids", "extra_logprobs")
#: 0-d text metadata: ``logprobs_mode`` (:data:`LOGPROBS_MODES`) and ``provenance`` (a JSON object: where the
#: numbers came from, e.g. the servers' engine, model, version and url per role; information only)
TEXT_METADATA = ("logprobs_mode", "provenance")
LOGPROBS_MODES = ("raw", "processed")
#: the id of an unused ``extra_ids`` slot (its logprob must be -inf)
PAD_ID = -1
MAX_PROVENANCE_CHARS = 1 << 16

_ARRAY_NAME = re.compile(rf"^({'|'.join(ROLES)})_({'|'.join(DENSE_KINDS + SPARSE_KINDS)})(?:__(.+))?$")


def check_draft_name(name, what: str = "draft name") -> str:
    """``name`` if it is a valid draft name (letters, digits, '_', '.', '-'; starts with a letter or digit; no
    '__', which separates the role from the name in array names; not ``target``, which names the target's role
    wherever a role or a draft is named), else InvalidInput."""
    if not isinstance(name, str) or not re.fullmatch(DRAFT_NAME_PATTERN, name) or "__" in name:
        raise InvalidInput(f"{what} {name!r} is invalid: use letters, digits, '_', '.' and '-' (starting with a "
                           "letter or digit, no '__')")
    if name == "target":
        raise InvalidInput(f"{what} 'target' is reserved (it names the target model); give the draft another name")
    return name


def parse_array_name(name: str):
    """``(role, kind, suffix)`` for a role array name (``suffix`` None when absent), else None.

    The suffix is returned as written: the caller checks it (:func:`check_draft_name`; the target takes none)."""
    m = _ARRAY_NAME.match(name)
    return None if m is None else (m.group(1), m.group(2), m.group(3))


_KNOWN_NAME = re.compile(rf"^({'|'.join(ROLES)})_({'|'.join(KNOWN_KINDS)})(?:__(.+))?$")


def parse_known_name(name: str):
    """``(role, kind, suffix)`` for an optional per-role array name (kinds :data:`KNOWN_KINDS`), else None."""
    m = _KNOWN_NAME.match(name)
    return None if m is None else (m.group(1), m.group(2), m.group(3))


def array_name(role: str, kind: str, draft: str | None = None) -> str:
    """The array name of ``kind`` for the target (``role="target"``) or the draft ``draft`` (``role="draft"``)."""
    suffix = "" if role == "target" or draft in (None, DEFAULT_DRAFT) else f"__{draft}"
    return f"{role}_{kind}{suffix}"


def kinds_of(kind: str) -> tuple:
    """The array kinds one role holds in a dump of ``kind`` ("dense" or "sparse")."""
    return DENSE_KINDS if kind == "dense" else SPARSE_KINDS


def format_error(file: str, msg: str) -> DumpFormatError:
    """The error for a malformed dump: ``"<file>: <msg>"`` (``msg`` names the array and the index)."""
    return DumpFormatError(f"{file}: {msg}")


def metadata_value(file: str, name: str, value: np.ndarray):
    """The Python value (int for ``top_k``/``vocab_size``, float otherwise) of 0-d metadata array ``name``.

    Sampling parameters follow :class:`fastspec.params.SamplingParams`' rules; ``vocab_size`` is an integer
    in ``[1, 2**63)``; ``ignore_eos`` is a bool (stored as bool or as the integer 0 or 1).  Anything else is a
    :class:`DumpFormatError` naming the file and the array."""
    if name == "ignore_eos":
        return flag_value(file, name, value)
    if value.dtype.kind not in "iuf" or not np.isfinite(value):
        raise format_error(file, f"array {name!r}: must be a finite number, got {value!r}")
    v = value.item()
    if name in ("top_k", "vocab_size") and isinstance(v, float):
        if not v.is_integer():
            raise format_error(file, f"array {name!r}: must be an integer, got {v}")
        v = int(v)
    if name == "vocab_size":
        if not 1 <= v < 2 ** 63:
            raise format_error(file, f"array 'vocab_size': value {v} out of range; use an integer in [1, 2**63)")
        return int(v)
    try:
        return getattr(SamplingParams(**{name: v}), name)
    except (InvalidInput, InvalidType) as exc:
        raise format_error(file, f"array {name!r}: {exc}") from None


def flag_value(file: str, name: str, value: np.ndarray) -> bool:
    """A 0-d yes/no metadata array (bool, or the integer 0 or 1) as a Python bool."""
    if value.dtype.kind == "b":
        return bool(value)
    if value.dtype.kind in "iu" and value.item() in (0, 1):
        return bool(value.item())
    raise format_error(file, f"array {name!r}: must be a bool (or the integer 0 or 1), got {value!r}")
