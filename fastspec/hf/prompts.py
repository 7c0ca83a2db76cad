"""Prompt files: plain text (one prompt per line) or ``.jsonl`` (chat messages), tokenized for a model."""
from __future__ import annotations

import json
import os

from ..errors import InvalidInput

__all__ = ["read_prompts"]


def _jsonl_item(path: str, line_no: int, line: str):
    """One ``.jsonl`` line as chat messages (a list of {"role", "content"}) or a text prompt (str)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{path}:{line_no}: not valid JSON ({exc.msg}); a .jsonl file holds one JSON value "
                           "per line") from None
    if isinstance(obj, dict) and "messages" in obj:
        obj = obj["messages"]
    elif isinstance(obj, dict) and "prompt" in obj:
        obj = obj["prompt"]
    if isinstance(obj, list):
        if not obj or not all(isinstance(m, dict) and "role" in m and "content" in m for m in obj):
            raise InvalidInput(f"{path}:{line_no}: chat messages must be a non-empty list of "
                               "{\"role\": ..., \"content\": ...} objects")
    elif not isinstance(obj, str):
        raise InvalidInput(f"{path}:{line_no}: expected chat messages, {{\"messages\": [...]}}, "
                           "{\"prompt\": \"...\"} or a string")
    return obj


def _token_ids(tokenizer, obj) -> list[int]:
    """Token ids of one prompt (text or chat messages); the chat template, when there is one, is applied with
    the generation prompt (a text prompt is one user message)."""
    if getattr(tokenizer, "chat_template", None):
        msgs = obj if isinstance(obj, list) else [{"role": "user", "content": obj}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        text = obj if isinstance(obj, str) else "\n".join(f"{m['role']}: {m['content']}" for m in obj)
        ids = tokenizer(text)["input_ids"]
    return [int(t) for t in ids]


def read_prompts(path, tokenizer) -> list[list[int]]:
    """Token ids of each prompt in ``path``.

    A ``.jsonl`` file holds one JSON value per line: a list of chat messages ``[{"role", "content"}, ...]``,
    an object ``{"messages": [...]}`` or ``{"prompt": "text"}``, or a string.  Any other file is plain text, one
    prompt per non-blank line.  When the tokenizer has a chat template, each prompt becomes a conversation
    (a text prompt is one user message) and the template is applied with the generation prompt."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise InvalidInput(f"prompts file {path!r}: no such file")
    with open(path, encoding="utf-8") as fh:
        lines = [(i + 1, ln.rstrip("\n")) for i, ln in enumerate(fh)]
    lines = [(i, ln) for i, ln in lines if ln.strip()]
    if not lines:
        raise InvalidInput(f"prompts file {path!r} holds no prompts; write one prompt per line")
    jsonl = path.endswith(".jsonl")
    items = [(i, _jsonl_item(path, i, ln) if jsonl else ln) for i, ln in lines]
    out = []
    for i, obj in items:
        ids = _token_ids(tokenizer, obj)
        if not ids:
            raise InvalidInput(f"{path}:{i}: the prompt tokenizes to nothing")
        out.append(ids)
    return out
