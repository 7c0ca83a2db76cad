"""Prompts as token ids, without a tokenizer: the ``--prompts`` file of ``fastspec dump-server``.

A JSON-lines file, one prompt per line, ``{"prompt_token_ids": [ids]}`` (vLLM's field name) or a bare list of
ids; blank lines are skipped.  Read with the token-file reader of ``audit-output`` (:mod:`fastspec.io.tokens`:
bounded size, a regular file, UTF-8, strict JSON), so every bad file is one InvalidInput naming it.
"""
from __future__ import annotations

import os

from ...errors import InvalidInput
from ..tokens import MAX_IDS_PER_LIST, parse_json_line, read_text_lines

__all__ = ["read_prompt_file"]


def read_prompt_file(path) -> list:
    """The prompts of ``path`` as lists of token ids in [0, 2**31); InvalidInput naming the file (and the line)."""
    path = os.fspath(path)
    lines = read_text_lines(path, what="prompt file", reader="dump-server")
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        obj = parse_json_line(path, n, line)
        ids = obj.get("prompt_token_ids") if isinstance(obj, dict) else obj
        if not isinstance(ids, list) or not ids or len(ids) > MAX_IDS_PER_LIST or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2 ** 31 for t in ids):
            raise InvalidInput(f"{path}:{n}: give {{\"prompt_token_ids\": [token ids]}} (non-empty, at most "
                               f"{MAX_IDS_PER_LIST} integers in [0, 2**31))")
        out.append(ids)
    if not out:
        raise InvalidInput(f"prompt file {path!r} holds no prompts")
    return out
