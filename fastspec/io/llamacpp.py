"""llama.cpp's KL-divergence base files (``llama-perplexity --kl-divergence-base FILE``) read as dense dumps.

The format (as written by ``perplexity()`` / ``process_logits(std::ostream&, ...)`` / ``log_softmax(..., uint16_t *
log_prob, ...)`` and read back by ``kl_divergence()`` in ggml-org/llama.cpp ``tools/perplexity/perplexity.cpp``,
commit 050fc7f32de16858ac667d775b43a51ed8976e6f; older trees: ``examples/perplexity/perplexity.cpp``, same code).
Checked against a real ``llama-perplexity`` (ggerganov/llama.cpp c392e5094deaf2d1a7c18683214f007fad3fe42b,
``examples/perplexity/perplexity.cpp``, SmolLM2-135M, ``-c 128``): the base PPL, mean KLD and "same top" that
``--kl-divergence`` prints are recomputed from files read here (``tail="keep"``; KLD within the quantization step).
All fields are the writing machine's native byte order: little-endian on every platform llama.cpp builds for, and
read as little-endian here.

=========  ==========================  =============================================================================
offset     field                       meaning
=========  ==========================  =============================================================================
0          ``char[8]``                 magic ``_logits_``
8          ``int32 n_ctx``             context per chunk (llama.cpp reads it back as ``uint32``)
12         ``int32 n_vocab``           vocabulary size V
16         ``int32 n_chunk``           chunks N (each one independent sequence of ``n_ctx`` tokens)
20         ``int32 tokens[N*n_ctx]``   the evaluated text, chunk after chunk (the original tokens: llama.cpp
                                       replaces the first token of each chunk by BOS while evaluating when the
                                       vocabulary adds BOS, but writes the tokens as tokenized)
20+4N n_ctx  per chunk, per scored     ``nv = 2*((n_vocab + 1)/2) + 4`` uint16: ``float32 scale``,
           position: ``uint16[nv]``    ``float32 min_log_prob`` (the first 4 uint16), then ``n_vocab`` uint16
                                       ``u[i]``, then one padding uint16 when ``n_vocab`` is odd
=========  ==========================  =============================================================================

Scored positions: ``first = n_ctx/2`` (integer division); positions ``j = first .. n_ctx-2`` of a chunk, i.e.
``T = n_ctx - 1 - first`` rows per chunk.  Row ``j - first`` holds the model's distribution at position ``j``,
which predicts token ``tokens[chunk*n_ctx + j + 1]``; the logits at the chunk's last position are not stored.  The
file size is therefore exactly ``20 + 4*N*n_ctx + 2*N*T*nv`` bytes.

Encoding of one row (logits ``x``, float32): ``M = max x``, ``m = max(min x, M - 16)``, ``lse = log sum exp(x - M)``,
``scale = (M - m)/65535``, ``min_log_prob = m - M - lse``, ``u[i] = nearest_int((x[i] - m)/scale)`` for
``x[i] > m`` and 0 otherwise (all 0 when ``scale == 0``).  Decoding (llama.cpp's own, in float32):
``log p[i] = scale*u[i] + min_log_prob``.  So every stored value is a log-probability quantized with a step of
``scale = (M - m)/65535 <= 16/65535 ~ 2.4e-4`` nats (error <= scale/2 per entry), and entries more than 16 nats below
the row's maximum are clamped to ``u = 0``.

How they are read here
----------------------
* Rows are decoded to float32 log-probabilities, which are valid logits: the sampling settings (temperature, top-k,
  top-p, min-p) apply to them as to any dense dump.  The quantization error of a log-probability is at most
  ``scale/2`` (``scale/(2 temperature)`` after a temperature), so per position
  ``|alpha - alpha_exact| <= (e^(2 d_p) - 1)/2 + (e^(2 d_q) - 1)/2`` with ``d = scale/(2 temperature)``.
* The floor (``tail``): in a row whose range was clamped (``65535*scale`` = 16), ``u = 0`` means "16 nats or more
  below the maximum", not a value: by default (``tail="drop"``) those entries decode to ``-inf`` (masked), because
  keeping them at the floor gives every such token ``exp(min_log_prob)`` of mass (about ``V e^-16 p_max``: 1.7% of
  ``p_max`` for V = 150k), far more than the real tail; llama.cpp's own KLD skips log-probabilities below -16 too.
  ``tail="keep"`` decodes them literally, at the floor.  Either way
  the error in alpha from the tail is at most ``n0 exp(min_log_prob + scale/2)`` per side (``n0``: entries at the
  floor).  Rows whose range is below 16 nats are exact up to the quantization step.  The text's own token can lie
  at the floor (the corpus is not sampled from the model): with ``"drop"`` its probability is then 0.
* The dump protocol (:class:`fastspec.io.DumpBase`): ``kind = "dense"``, ``N = n_chunk`` sequences, ``T = n_ctx - 1 -
  n_ctx/2`` positions (``lengths`` all T), ``V = n_vocab``; ``tokens[n, t]`` = the token the row predicts;
  ``prompt_tokens[n]`` = the chunk's first ``n_ctx/2 + 1`` tokens (the context before the first scored token,
  ``prompt_lengths`` all equal), so n-gram drafts replay over the chunk's text as written.  No sampling metadata
  (the text is a fixed corpus, not a target sample) and no cost table.
* Memory: only the 20-byte headers and the token arrays are read when opening; every check of sizes and agreement
  between files happens before anything large is touched.  :meth:`LlamaCppDump.iter_chunks` maps ``max_bytes`` of
  decoded rows per file at a time (the uint16 rows mapped, then decoded into one float32 array per role: peak extra
  memory O(chunk), never a float64 copy).  Row headers (``scale``, ``min_log_prob``) are checked on every chunk
  (finite, ``scale >= 0``, log-probabilities <= 0).

Naming the files
----------------
A base file alone (first bytes ``_logits_``) is a target-only dump (n-gram drafts only).  Target and drafts are
named by a small JSON manifest (first non-blank byte ``{``), paths relative to the manifest's directory::

    {"target": "f16.kld", "drafts": {"q4": "q4_0.kld", "small": "1b.kld"}}

Each draft file must be ``llama-perplexity --kl-divergence-base`` of the draft model over the same text with the same
``-c`` (same ``n_ctx``, ``n_chunk``, ``n_vocab`` and tokens, checked).  :func:`fastspec.open_dump` routes both
to :func:`load_llamacpp`.
The page that explains it: ``docs/guide/dumps.md``.
"""
from __future__ import annotations

import json
import os
from typing import Iterator, Mapping

import numpy as np

from ..config import DEFAULT_CHUNK_BYTES, MAX_POSITIONS, MAX_WIDTH
from ..errors import DumpNotFound, InvalidInput, shown
from .dump import ArrayInfo, Chunk, DumpBase, check_max_bytes
from .files import MISSING, REGULAR, entry_kind, map_bytes, open_regular
from .format import array_name, check_draft_name, format_error

__all__ = ["MAGIC", "HEADER_BYTES", "LlamaCppDump", "load_llamacpp", "llamacpp_kind", "row_width", "decode_rows",
           "TAILS"]

MAGIC = b"_logits_"
HEADER_BYTES = 20
#: ``tail`` choices: entries at the clamped floor decode to -inf ("drop") or to the floor value ("keep")
TAILS = ("drop", "keep")
#: a row whose range 65535*scale is this close to 16 was clamped by llama.cpp (float32 rounding of max - 16)
_CLAMP = 16.0 - 1e-3
#: log-probabilities may exceed 0 by this much (float32 rounding of the encoder)
_LOGPROB_TOL = 1e-3
_MANIFEST_MAX_BYTES = 1 << 16
_TOKEN_BLOCK = 1 << 20  # tokens compared per step between files


def row_width(n_vocab: int) -> int:
    """uint16 per stored position: ``2*((n_vocab + 1)/2) + 4`` (two float32 and the values, padded to even)."""
    return 2 * ((n_vocab + 1) // 2) + 4


def llamacpp_kind(path) -> str | None:
    """``"file"`` (a base file: starts with ``_logits_``), ``"manifest"`` (a regular file whose first non-blank byte
    is ``{``) or None (anything else, a directory or a missing path: not ours).  Reads at most 64 bytes."""
    try:
        path = os.fspath(path)
    except TypeError:
        return None
    if entry_kind(path) != REGULAR:
        return None
    try:
        with open_regular(path, "header") as fh:
            head = fh.read(64)
    except (OSError, ValueError):
        return None
    if head.startswith(MAGIC):
        return "file"
    if head.lstrip(b" \t\r\n").startswith(b"{"):
        return "manifest"
    return None


def decode_rows(raw: np.ndarray, n_vocab: int, tail: str = "drop", out: np.ndarray | None = None):
    """Decode stored rows ``raw`` (uint16 [rows, nv]) to float32 log-probabilities [rows, n_vocab].

    Returns ``(logprobs, scale, min_log_prob)`` (float32 [rows] each); the caller checks the row headers."""
    hdr = np.ascontiguousarray(raw[:, :4]).view("<f4")
    scale, lo = hdr[:, 0].astype(np.float32), hdr[:, 1].astype(np.float32)
    u = raw[:, 4:4 + n_vocab]
    if out is None:
        out = np.empty(u.shape, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        np.multiply(u, scale[:, None], out=out, dtype=np.float32)
        out += lo[:, None]
    if tail == "drop":
        clamped = scale.astype(np.float64) * 65535.0 > _CLAMP
        if clamped.any():
            np.putmask(out, (u == 0) & clamped[:, None], -np.inf)
    return out, scale, lo


def _header_error(file, role, where, r0, scale, lo):
    """The first row whose header is not a valid encoding, as a DumpFormatError (or None)."""
    with np.errstate(invalid="ignore", over="ignore"):
        top = scale.astype(np.float64) * 65535.0 + lo.astype(np.float64)
        checks = ((~np.isfinite(scale), "scale is not finite"),
                  (~np.isfinite(lo), "min_log_prob is not finite"),
                  (scale < 0, "scale is negative"),
                  (lo > _LOGPROB_TOL, "min_log_prob is positive (log-probabilities are <= 0)"),
                  (top > _LOGPROB_TOL, "scale*65535 + min_log_prob is positive (log-probabilities are <= 0)"))
    for bad, what in checks:
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            return format_error(file, f"{role}: position {where(r0 + i)}: {what} (scale={float(scale[i])!r}, "
                                      f"min_log_prob={float(lo[i])!r}); not a llama.cpp log-probability row")
    return None


class _File:
    """One base file: its header, checked against its size before anything else is read."""

    def __init__(self, file: str, role: str):
        self.file, self.role = file, role
        kind = entry_kind(file)
        if kind == MISSING:
            raise DumpNotFound(f"{file}: no such file ({role})")
        if kind != REGULAR:
            raise format_error(file, f"{role}: is {kind}; a llama.cpp base file must be a regular file")
        with open_regular(file, role) as fh:
            head = fh.read(HEADER_BYTES)
            size = os.fstat(fh.fileno()).st_size
        if len(head) < 8 or head[:8] != MAGIC:
            raise format_error(file, f"{role}: magic is {head[:8]!r}, expected {MAGIC!r}; not a llama-perplexity "
                                     "--kl-divergence-base file")
        if len(head) < HEADER_BYTES:
            raise format_error(file, f"{role}: truncated header: {len(head)} bytes, the header takes {HEADER_BYTES} "
                                     "(magic, n_ctx, n_vocab, n_chunk)")
        n_ctx, n_vocab, n_chunk = (int(x) for x in np.frombuffer(head, "<i4", 3, 8))
        if not 3 <= n_ctx <= MAX_POSITIONS:
            raise format_error(file, f"{role}: n_ctx {n_ctx} is out of range [3, {MAX_POSITIONS}] (a chunk scores "
                                     "n_ctx - 1 - n_ctx/2 positions, at least one)")
        if not 1 <= n_vocab <= MAX_WIDTH:
            raise format_error(file, f"{role}: n_vocab {n_vocab} is out of range [1, {MAX_WIDTH}]")
        if n_chunk < 1:
            raise format_error(file, f"{role}: n_chunk {n_chunk} must be >= 1")
        self.n_ctx, self.V, self.N = n_ctx, n_vocab, n_chunk
        self.first = n_ctx // 2
        self.T = n_ctx - 1 - self.first
        if self.N * self.T > MAX_POSITIONS:
            raise format_error(file, f"{role}: n_chunk {n_chunk} x {self.T} scored positions exceeds {MAX_POSITIONS}")
        self.nv = row_width(n_vocab)
        self.data_offset = HEADER_BYTES + 4 * n_chunk * n_ctx
        self.data_bytes = 2 * self.N * self.T * self.nv
        need = self.data_offset + self.data_bytes
        if size != need:
            what = "truncated" if size < need else "has trailing bytes"
            raise format_error(file, f"{role}: {what}: n_ctx={n_ctx}, n_vocab={n_vocab}, n_chunk={n_chunk} "
                                     f"declare {need} bytes (header, tokens, log-probabilities), the file holds {size}")
        self.size = size

    def tokens_view(self, c0: int, c1: int) -> np.ndarray:
        """The tokens of chunks [c0, c1) (int32 [c1 - c0, n_ctx], a mapped view)."""
        n = (c1 - c0) * self.n_ctx
        raw = map_bytes(self.file, HEADER_BYTES + 4 * c0 * self.n_ctx, 4 * n, "tokens")
        return raw.view("<i4").reshape(c1 - c0, self.n_ctx)

    def rows(self, r0: int, r1: int) -> np.ndarray:
        """Stored rows [r0, r1) (uint16 [rows, nv], a mapped view)."""
        raw = map_bytes(self.file, self.data_offset + 2 * r0 * self.nv, 2 * (r1 - r0) * self.nv, self.role)
        return raw.view("<u2").reshape(r1 - r0, self.nv)


def _read_manifest(path: str) -> tuple[str, dict]:
    """(target file, {draft name: file}) of a JSON manifest, paths resolved against its directory."""
    with open_regular(path, "manifest") as fh:
        text = fh.read(_MANIFEST_MAX_BYTES + 1)
    if len(text) > _MANIFEST_MAX_BYTES:
        raise format_error(path, f"llama.cpp manifest: larger than {_MANIFEST_MAX_BYTES} bytes; a manifest names "
                                 "a few files")
    try:
        doc = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise format_error(path, f"llama.cpp manifest: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise format_error(path, "llama.cpp manifest: must be a JSON object "
                                 "{\"target\": FILE, \"drafts\": {NAME: FILE}}")
    extra = sorted(set(doc) - {"target", "drafts"})
    if extra:
        raise format_error(path, f"llama.cpp manifest: unknown key {extra[0]!r}; the keys are 'target' and "
                                 "'drafts'")
    base = os.path.dirname(os.path.abspath(path))
    target = doc.get("target")
    if not isinstance(target, str) or not target:
        raise format_error(path, "llama.cpp manifest: 'target' must be the path of the target's base file")
    drafts = doc.get("drafts", {})
    if not isinstance(drafts, dict) or not all(isinstance(v, str) and v for v in drafts.values()):
        raise format_error(path, "llama.cpp manifest: 'drafts' must be an object {NAME: FILE}")
    out = {}
    for name, f in drafts.items():
        try:
            check_draft_name(name, "llama.cpp manifest: draft name")
        except InvalidInput as exc:
            raise format_error(path, str(exc)) from None
        out[name] = os.path.join(base, f)
    for where, f in (("'target'", target), *((f"'drafts'[{n!r}]", f) for n, f in drafts.items())):
        if "\x00" in f:  # no file system takes it; os.stat would raise an untyped ValueError
            raise format_error(path, f"llama.cpp manifest: {where} = {shown(f)} holds a NUL byte; give the path of "
                                     "a base file")
    return os.path.join(base, target), out


class LlamaCppDump(DumpBase):
    """llama.cpp base files (one per model, same text) as a dense dump (module docstring).

    ``target``: the target's base file; ``drafts``: {name: base file}; ``path``: what messages and ``describe`` name
    (the manifest, or the target file); ``tail``: :data:`TAILS`.  Attributes as :class:`fastspec.io.Dump`, plus
    ``files`` ({role: path}), ``n_ctx``.
    """

    kind = "dense"
    rank3 = True

    def __init__(self, target, drafts: Mapping[str, str] | None = None, *, path=None, tail: str = "drop"):
        if tail not in TAILS:
            raise InvalidInput(f"tail must be one of {', '.join(TAILS)}, got {tail!r}", argument="tail")
        self.tail = tail
        target = os.fspath(target)
        drafts = {check_draft_name(n): os.fspath(f) for n, f in (drafts or {}).items()}
        self.path = os.fspath(path) if path is not None else target
        self.drafts = tuple(sorted(drafts))
        self._files = {"target": _File(target, "target")}
        t = self._files["target"]
        for name in self.drafts:
            f = _File(drafts[name], f"draft {name!r}")
            for field, a, b in (("n_vocab", f.V, t.V), ("n_ctx", f.n_ctx, t.n_ctx), ("n_chunk", f.N, t.N)):
                if a != b:
                    raise format_error(f.file, f"draft {name!r}: {field} {a} differs from the target's "
                                               f"({t.file}: {b}); every file must score the same text with the same "
                                               "model vocabulary and -c")
            self._files[name] = f
        self.N, self.T, self.V, self.n_ctx = t.N, t.T, t.V, t.n_ctx
        self.k = {}
        self.metadata = {}
        self.files = {r: f.file for r, f in self._files.items()}
        self.lengths = np.full(self.N, self.T, np.int64)
        self._read_tokens()

    def _read_tokens(self):
        """tokens / prompt_tokens from the target file (range-checked), compared with every draft's, block by block."""
        t = self._files["target"]
        first = t.first
        self.tokens = np.empty((self.N, self.T), np.int64)
        self.prompt_tokens = np.empty((self.N, first + 1), np.int64)
        self.prompt_lengths = np.full(self.N, first + 1, np.int64)
        step = max(1, _TOKEN_BLOCK // self.n_ctx)
        for c0 in range(0, self.N, step):
            c1 = min(self.N, c0 + step)
            tok = t.tokens_view(c0, c1)
            bad = (tok < 0) | (tok >= self.V)
            if bad.any():
                n, j = (int(x) for x in np.argwhere(bad)[0])
                raise format_error(t.file, f"target: tokens[{c0 + n}, {j}] = {int(tok[n, j])} is outside the "
                                           f"vocabulary [0, {self.V})")
            for name in self.drafts:
                f = self._files[name]
                other = f.tokens_view(c0, c1)
                diff = other != tok
                if diff.any():
                    n, j = (int(x) for x in np.argwhere(diff)[0])
                    raise format_error(f.file, f"draft {name!r}: tokens[{c0 + n}, {j}] = {int(other[n, j])}, the "
                                               f"target's ({t.file}) is {int(tok[n, j])}; every file must score the "
                                               "same text")
            self.tokens[c0:c1] = tok[:, first + 1:]
            self.prompt_tokens[c0:c1] = tok[:, :first + 1]

    # ---- description ----------------------------------------------------------------------------------------
    def array_name(self, role: str, kind: str) -> str:
        if kind != "logits":
            raise KeyError(kind)
        if role == "target":
            return "target_logits"
        return array_name("draft", "logits", role)

    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        out = {}
        for role, f in self._files.items():
            name = self.array_name(role, "logits")
            out[name] = ArrayInfo(name, (self.N, self.T, self.V), "float32", f.data_bytes, "llama.cpp uint16")
        out["tokens"] = ArrayInfo("tokens", (self.N, self.T), "int64", self.tokens.nbytes, "memory")
        out["lengths"] = ArrayInfo("lengths", (self.N,), "int64", self.lengths.nbytes, "memory")
        out["prompt_tokens"] = ArrayInfo("prompt_tokens", self.prompt_tokens.shape, "int64",
                                         self.prompt_tokens.nbytes, "memory")
        out["prompt_lengths"] = ArrayInfo("prompt_lengths", (self.N,), "int64", self.prompt_lengths.nbytes, "memory")
        return out

    @property
    def size_on_disk(self) -> int:
        return int(sum(f.size for f in self._files.values()))

    def describe(self) -> dict:
        return {
            "path": self.path, "format": "llama.cpp kl-divergence-base", "kind": "dense", "drafts": list(self.drafts),
            "N": self.N, "T": self.T, "V": self.V, "k": None, "valid_positions": int(self.lengths.sum()),
            "has_tokens": True, "has_prompt_tokens": True, "costs": None, "metadata": {},
            "size_on_disk": self.size_on_disk, "arrays": self._array_summary(),
            "files": dict(self.files), "n_ctx": self.n_ctx, "tail": self.tail,
        }

    def __repr__(self):
        return (f"LlamaCppDump({self.path!r}, drafts={list(self.drafts)}, N={self.N}, T={self.T}, V={self.V}, "
                f"n_ctx={self.n_ctx})")

    # ---- reading --------------------------------------------------------------------------------------------
    def iter_chunks(self, *, drafts=None, max_bytes: int = DEFAULT_CHUNK_BYTES, validate: bool = True,
                    verify_integrity: bool | None = None) -> Iterator[Chunk]:
        """:class:`fastspec.io.Chunk` objects of decoded float32 log-probabilities, ``max_bytes`` of them per role
        (at least one row).  Row headers are checked on every chunk whatever ``validate`` says (they are what makes
        the values finite); the files carry no checksum (``verify_integrity`` is accepted and ignored)."""
        del validate, verify_integrity
        names = self.select_drafts(drafts)
        rows = self.chunk_rows(names, max_bytes)
        R = self.N * self.T
        for r0 in range(0, R, rows):
            r1 = min(R, r0 + rows)
            valid = np.ones(r1 - r0, bool)
            target = self._decode("target", r0, r1)
            yield Chunk(r0, r1, valid, target, {d: self._decode(d, r0, r1) for d in names})

    def _decode(self, role: str, r0: int, r1: int) -> np.ndarray:
        f = self._files[role]
        out, scale, lo = decode_rows(f.rows(r0, r1), self.V, self.tail)
        err = _header_error(f.file, f.role, self.where, r0, scale, lo)
        if err is not None:
            raise err
        return out

    def validate(self, *, max_bytes: int = DEFAULT_CHUNK_BYTES) -> "LlamaCppDump":
        """Decode and check every row of every file (one bounded-memory pass); returns ``self``."""
        check_max_bytes(max_bytes)
        for _ in self.iter_chunks(max_bytes=max_bytes):
            pass
        return self


def load_llamacpp(path=None, *, target=None, drafts: Mapping[str, str] | None = None, tail: str = "drop",
                  validate: bool = False, max_bytes: int = DEFAULT_CHUNK_BYTES) -> LlamaCppDump:
    """Open llama.cpp base files as a :class:`LlamaCppDump`: ``path`` (a base file: target only; or a JSON manifest
    ``{"target": FILE, "drafts": {NAME: FILE}}``), or ``target=`` and ``drafts=`` directly.  ``validate``: decode and
    check every row now.  Raises DumpFormatError (naming the file and field) / DumpNotFound."""
    if path is not None:
        if target is not None or drafts:
            raise InvalidInput("give either a path (base file or manifest) or target= and drafts=, not both",
                               argument="path")
        path = os.fspath(path)
        kind = llamacpp_kind(path)
        if kind is None:
            if not os.path.exists(path):
                raise DumpNotFound(f"{path}: no such file or directory")
            raise format_error(path, "not a llama.cpp base file (magic '_logits_') nor a JSON manifest")
        if kind == "manifest":
            target, drafts = _read_manifest(path)
        else:
            target, drafts = path, {}
    elif target is None:
        raise InvalidInput("give a path, or target= (and drafts=)", argument="path")
    d = LlamaCppDump(target, drafts, path=path, tail=tail)
    if validate:
        d.validate(max_bytes=max_bytes)
    return d
