"""The tokenizer metadata of a GGUF file, read from its header with the standard library (no weights read), and
llama.cpp's rule for a draft's vocabulary (``common_speculative_are_compatible`` in common/speculative.cpp).

:func:`read_tokenizer` returns the ``tokenizer.ggml.*`` keys a draft is checked by (the tokenizer model, the token
texts, the BOS / EOS ids and whether they are added); :func:`vocabulary_mismatch` says in words why llama.cpp
refuses a draft for a target, or returns None.  A file that is not a readable GGUF header raises
:class:`ValueError` with one line.
"""
from __future__ import annotations

import struct

__all__ = ["read_tokenizer", "vocabulary_mismatch", "VOCAB_MAX_SIZE_DIFFERENCE", "VOCAB_CHECK_START_TOKEN_ID"]

#: llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE and SPEC_VOCAB_CHECK_START_TOKEN_ID (common/speculative.cpp)
VOCAB_MAX_SIZE_DIFFERENCE = 128
VOCAB_CHECK_START_TOKEN_ID = 5

# GGUF value types (gguf.h): 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64,
# 11 i64, 12 f64
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
#: tokenizer models llama.cpp loads as one vocabulary type (llama_vocab::impl::load): the rest are their own type
_KIND = {"gpt2": "BPE", "hybriddna": "BPE", "whitespace": "BPE", "no_vocab": "NONE", "none": "NONE"}
_WANTED = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id",
           "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token")


class _Header:
    def __init__(self, f):
        self.f = f

    def take(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("the GGUF header ends early (a truncated file?)")
        return b

    def scalar(self, t: int):
        fmt = _SCALAR[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self, keep: bool = True):
        (n,) = struct.unpack("<Q", self.take(8))
        if n > 1 << 30:
            raise ValueError("the GGUF header holds an impossible string length")
        if not keep:
            self.f.seek(n, 1)
            return None
        return self.take(n).decode("utf-8", "replace")

    def value(self, t: int, keep: bool):
        if t in _SCALAR:
            v = self.scalar(t)
            return v if keep else None
        if t == 8:
            return self.string(keep)
        if t == 9:
            (et,) = struct.unpack("<I", self.take(4))
            (n,) = struct.unpack("<Q", self.take(8))
            if et in _SCALAR and not keep:
                self.f.seek(n * struct.calcsize(_SCALAR[et]), 1)
                return None
            if n > 1 << 28:
                raise ValueError("the GGUF header holds an impossible array length")
            items = [self.value(et, keep) for _ in range(n)]
            return items if keep else None
        raise ValueError(f"the GGUF header holds an unknown value type {t}")


def read_tokenizer(path: str) -> dict:
    """The ``tokenizer.ggml.*`` keys of :data:`_WANTED` present in the GGUF file ``path`` (short names:
    ``model``, ``tokens``, ``bos_token_id``, ...).  ValueError (one line) when the header is not readable."""
    out = {}
    with open(path, "rb") as f:
        h = _Header(f)
        if h.take(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        version, _n_tensors, n_kv = struct.unpack("<IQQ", h.take(20))
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not one llama.cpp reads (2 or 3)")
        for _ in range(n_kv):
            key = h.string()
            (t,) = struct.unpack("<I", h.take(4))
            keep = key in _WANTED
            v = h.value(t, keep)
            if keep:
                out[key.rsplit(".", 1)[-1]] = v
    return out


def vocabulary_mismatch(target: dict, draft: dict) -> str | None:
    """Why llama.cpp refuses a draft of tokenizer ``draft`` for a target of tokenizer ``target`` (both from
    :func:`read_tokenizer`), in words; None when it speculates with it."""
    if _KIND.get(target.get("model"), target.get("model")) != _KIND.get(draft.get("model"), draft.get("model")):
        return f"its tokenizer is {draft.get('model')!r}, the target's {target.get('model')!r}"
    for end in ("bos", "eos"):  # compared only where both files state them (llama.cpp's defaults are per tokenizer)
        add_t, add_d = target.get(f"add_{end}_token"), draft.get(f"add_{end}_token")
        if add_t is not None and add_d is not None and add_t != add_d:
            return f"add_{end}_token is {add_d}, the target's {add_t}"
        id_t, id_d = target.get(f"{end}_token_id"), draft.get(f"{end}_token_id")
        if add_t and id_t is not None and id_d is not None and id_t != id_d:
            return f"its {end.upper()} token is {id_d}, the target's {id_t}"
    tt, td = target.get("tokens") or [], draft.get("tokens") or []
    if abs(len(tt) - len(td)) > VOCAB_MAX_SIZE_DIFFERENCE:
        return (f"it has {len(td)} tokens, the target {len(tt)}: more than llama.cpp's {VOCAB_MAX_SIZE_DIFFERENCE} "
                "apart")
    for i in range(VOCAB_CHECK_START_TOKEN_ID, min(len(tt), len(td))):
        if tt[i] != td[i]:
            return f"its token {i} is {td[i]!r}, the target's {tt[i]!r}"
    return None
