"""Token files: what an engine emitted, one JSON object per prompt (vLLM's field names ``prompt_token_ids`` and
``token_ids``), read with bounds and checked against a vocabulary -- the input of ``fastspec audit-output``."""
from __future__ import annotations

import json
import os
import stat
from typing import NamedTuple, Sequence

from ..errors import InvalidInput, shown

__all__ = ["TokenRecord", "read_token_file", "read_text_lines", "parse_json_line", "check_token_ids",
           "MAX_TOKEN_FILE_BYTES", "MAX_IDS_PER_LIST"]

# ------------------------------------------------------------------------------------------------- token files
#: a token file larger than this is refused before it is read (256 MiB: ~30 million ids)
MAX_TOKEN_FILE_BYTES = 256 * 2 ** 20
#: at most this many ids in one list of a token file (fastspec.config's MAX_NEW_TOKENS)
MAX_IDS_PER_LIST = 1 << 20


class TokenRecord(NamedTuple):
    """One line of a token file: its 1-based line number, the prompt's ids, the emitted ids, the prompt text."""

    line: int
    prompt_token_ids: tuple
    token_ids: tuple
    prompt: str | None


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _id_list(path: str, line_no: int, obj: dict, field: str) -> tuple:
    if field not in obj:
        raise InvalidInput(f"{path}:{line_no}: missing field {field!r} (each line: {{\"prompt_token_ids\": [...], "
                           "\"token_ids\": [...]}})")
    ids = obj[field]
    if not isinstance(ids, list):
        raise InvalidInput(f"{path}:{line_no}: {field} must be a list of integer token ids, got "
                           f"{type(ids).__name__}")
    if len(ids) > MAX_IDS_PER_LIST:
        raise InvalidInput(f"{path}:{line_no}: {field} holds {len(ids)} ids, more than {MAX_IDS_PER_LIST}")
    for j, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, int):
            raise InvalidInput(f"{path}:{line_no}: {field}[{j}] = {shown(t)} is not an integer token id")
        if t < 0:
            raise InvalidInput(f"{path}:{line_no}: {field}[{j}] = {t} is negative: token ids lie in [0, V)")
    return tuple(ids)


def read_text_lines(path, *, max_bytes: int | None = None, what: str = "token file",
                    reader: str = "an audit") -> list[str]:
    """The lines of a UTF-8 text file (without the last empty one), read with bounds: InvalidInput naming the
    file (called ``what``) when it is missing, not a regular file (a directory, a FIFO), larger than
    ``max_bytes`` (default :data:`MAX_TOKEN_FILE_BYTES`; messages say ``reader`` reads that much), not UTF-8, or
    empty."""
    path = os.fspath(path)
    if max_bytes is None:
        max_bytes = MAX_TOKEN_FILE_BYTES
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InvalidInput(f"{what} {path!r}: no such file") from None
    except (OSError, ValueError) as exc:   # ValueError: a NUL byte in the path
        raise InvalidInput(f"{what} {path!r}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InvalidInput(f"{what} {path!r} is not a regular file")
    if st.st_size > max_bytes:
        raise InvalidInput(f"{what} {path!r} is {st.st_size} bytes, more than the {max_bytes} bytes {reader} reads; "
                           "split it")
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise InvalidInput(f"{what} {path!r}: cannot be read ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise InvalidInput(f"{what} {path!r} is more than the {max_bytes} bytes {reader} reads; split it")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} {path!r} is not UTF-8 text (byte {exc.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise InvalidInput(f"{what} {path!r} is empty: write one JSON object per prompt")
    return lines


def parse_json_line(path: str, line_no: int, line: str):
    """One line of a JSON-lines file as a JSON value (NaN and Infinity are not JSON; nesting too deep for the
    parser is refused): InvalidInput naming ``path:line_no`` otherwise."""
    try:
        return json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else " ".join(str(exc).split())[:80]
        raise InvalidInput(f"{path}:{line_no}: not valid JSON ({msg})") from None


def read_token_file(path, *, max_bytes: int | None = None) -> list[TokenRecord]:
    """The records of a token file: JSONL, one object per prompt, ``{"prompt_token_ids": [ints], "token_ids":
    [ints], "prompt": "text" (optional)}`` (vLLM's field names; other fields are ignored).

    Refused with InvalidInput naming the file, the line and the index: not a regular file, larger than
    ``max_bytes``, not UTF-8, an empty line, a line that is not a JSON object (NaN and Infinity are not JSON), a
    missing field, a non-integer or negative id, an empty ``prompt_token_ids`` or ``token_ids``, no lines at all.
    Ids at or above the vocabulary size are checked by :func:`check_token_ids` once V is known.  ``max_bytes``
    defaults to :data:`MAX_TOKEN_FILE_BYTES`."""
    path = os.fspath(path)
    lines = read_text_lines(path, max_bytes=max_bytes)
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            raise InvalidInput(f"{path}:{i}: empty line (one JSON object per prompt, no blank lines)")
        obj = parse_json_line(path, i, line)
        if not isinstance(obj, dict):
            raise InvalidInput(f"{path}:{i}: expected a JSON object with prompt_token_ids and token_ids, got "
                               f"{type(obj).__name__}")
        prompt_ids = _id_list(path, i, obj, "prompt_token_ids")
        token_ids = _id_list(path, i, obj, "token_ids")
        if not prompt_ids:
            raise InvalidInput(f"{path}:{i}: prompt_token_ids is empty (the first emitted token needs a context)")
        if not token_ids:
            raise InvalidInput(f"{path}:{i}: token_ids is empty (nothing was emitted for this prompt)")
        prompt = obj.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise InvalidInput(f"{path}:{i}: prompt must be a string, got {type(prompt).__name__}")
        out.append(TokenRecord(i, prompt_ids, token_ids, prompt))
    return out


def check_token_ids(records: Sequence[TokenRecord], vocab_size: int, name: str = "token file") -> None:
    """Every id of every record lies in [0, vocab_size): else InvalidInput naming the line, the field and the
    index."""
    for r in records:
        for field in ("prompt_token_ids", "token_ids"):
            ids = getattr(r, field)
            if not ids:
                continue
            if min(ids) < 0 or max(ids) >= vocab_size:
                j = next(j for j, t in enumerate(ids) if not 0 <= t < vocab_size)
                raise InvalidInput(f"{name} line {r.line}: {field}[{j}] = {shown(ids[j])} is outside the target's "
                                   f"vocabulary [0, {vocab_size})")
