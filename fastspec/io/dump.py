"""The dump object: a validated logit dump read in bounded chunks of rows.

:func:`load_dump` opens a file or directory (:mod:`fastspec.io.sources`), checks its structure from the headers
and small arrays (:mod:`fastspec.io.structure`) and returns a :class:`Dump`; :meth:`Dump.iter_chunks` reads
rows ``max_bytes`` per array at a time, checking values as it goes (:mod:`fastspec.io.values`) and, unless told
not to (``verify_integrity=False``), the CRC-32 of every stored ``.npz`` member it reads whole.
:meth:`Dump.from_arrays` applies the same checks to arrays in memory.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Iterator, Mapping

import numpy as np

from ..config import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES
from ..errors import InvalidInput, InvalidType, check_int
from .format import kinds_of
from .sources import MemorySource, Source, open_sources
from .structure import check_structure, index_text, role_key
from .known import check_extra_rows
from .values import check_dense, check_sparse

__all__ = ["ArrayInfo", "Chunk", "DumpBase", "Dump", "load_dump", "check_max_bytes"]


def check_max_bytes(max_bytes) -> int:
    """The chunk size ``max_bytes`` (bytes per array) as an int in ``[1, MAX_CHUNK_BYTES]`` (16 GiB), else
    InvalidType / InvalidInput."""
    return check_int("max_bytes", max_bytes, 1, MAX_CHUNK_BYTES)


@dataclass(frozen=True)
class ArrayInfo:
    name: str
    shape: tuple
    dtype: str
    nbytes: int
    storage: str  # "npy", "npz-stored" (both memory-mapped), "npz-deflated" (streamed), "memory", "sharded"


@dataclass
class Chunk:
    """Flat rows ``[start, stop)`` of the dump (row ``r`` is sequence ``r // T``, position ``r % T``).

    ``target`` and each ``drafts[name]`` are ``[rows, V]`` logits (dense) or ``(ids, logprobs)`` pairs of
    ``[rows, k]`` arrays (sparse), in the dump's dtype (memory-mapped views where possible: read-only).
    ``valid[i]`` is False for padding rows (``t >= lengths[n]``), which are never validated.
    ``extras``: for a sparse dump with extra known ids (``<role>_extra_ids`` / ``<role>_extra_logprobs``),
    ``{"target" or draft name: (ids, logprobs)}`` [rows, m] of the roles read that have them.
    """

    start: int
    stop: int
    valid: np.ndarray
    target: object
    drafts: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)


class DumpBase:
    """The dump protocol: what every consumer (the simulator, ``fastspec inspect``, the analyses) may read of
    :class:`Dump`, :class:`fastspec.io.shards.ShardedDump` and :class:`fastspec.io.llamacpp.LlamaCppDump`, and
    what they share (:func:`fastspec.io.open_dump` opens any of them).

    Fields: ``path``, ``kind`` ("dense" or "sparse"), ``drafts`` (names), ``N``, ``T``, ``V``, ``k`` (sparse
    widths), ``lengths`` [N], ``tokens`` [N, T] or None, ``prompt_tokens`` [N, P] / ``prompt_lengths`` [N] or
    None, ``costs`` (a recorded :class:`fastspec.costs.CostTable` or None), ``costs_differ`` (True when parts of
    the dump recorded different tables), ``metadata``, ``arrays`` and ``size_on_disk``.  Methods:
    ``iter_chunks``, :meth:`select_drafts`, ``describe``, ``array_name`` and :meth:`close` (and use as a context
    manager).  Consumers read these directly: a field a kind of dump lacks has its default here (None / False),
    never a probe.  A new kind of dump subclasses this and overrides what differs.  The format computes nothing:
    the analyses read it (alpha of every valid position: :func:`fastspec.acceptance.dump_acceptance`).

    Subclasses set ``path``, ``kind``, ``drafts``, ``T``, ``rank3`` and provide ``arrays`` and ``array_name``.
    """

    rank3 = True
    tokens = None
    prompt_tokens = None
    prompt_lengths = None
    costs = None
    costs_differ = False
    #: sparse dumps: {"target" or draft name: float64 [N, T]} the logprob of the recorded token (0 at padding)
    sampled_logprobs = MappingProxyType({})
    #: the parsed ``provenance`` JSON object (where the numbers came from), or None
    provenance = None

    def select_drafts(self, drafts=None) -> tuple:
        """The draft names to read: all (``None``) or the given ones (a name or a sequence of names), each of which
        the dump must hold, each once."""
        names = self.drafts if drafts is None else (drafts,) if isinstance(drafts, str) else tuple(drafts)
        for i, n in enumerate(names):
            if n not in self.drafts:
                raise InvalidInput(f"{self.path}: no draft named {n!r}; the dump holds {', '.join(self.drafts)}",
                                   argument="drafts")
            if n in names[:i]:
                raise InvalidInput(f"{self.path}: draft {n!r} is selected twice; name each draft once",
                                   argument="drafts")
        return names

    def chunk_rows(self, drafts, max_bytes: int) -> int:
        """Rows per chunk: as many as fit ``max_bytes`` (:func:`check_max_bytes`) in the widest array read (at
        least one)."""
        max_bytes = check_max_bytes(max_bytes)
        arrays = self.arrays
        row_bytes = max(np.dtype(a.dtype).itemsize * a.shape[-1]
                        for a in (arrays[self.array_name(role, kd)] for role in ("target",) + tuple(drafts)
                                  for kd in kinds_of(self.kind)))
        return max(1, max_bytes // max(row_bytes, 1))

    def where(self, row: int) -> str:
        """Human index ``[n, t]`` of flat row ``row`` (``[t]`` for a single-sequence dump)."""
        return index_text(row // self.T, row % self.T, self.rank3)

    def _array_summary(self) -> list[dict]:
        return [{"name": a.name, "shape": list(a.shape), "dtype": a.dtype, "nbytes": a.nbytes, "storage": a.storage}
                for a in sorted(self.arrays.values(), key=lambda a: a.name)]

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Dump(DumpBase):
    """A validated logit dump.  Use :func:`load_dump` (or :meth:`from_arrays`); close it (or use ``with``) to
    release files.

    Attributes: ``path``, ``kind`` ("dense" or "sparse"), ``drafts`` (tuple of names), ``N``, ``T``, ``V``
    (None for a sparse dump without ``vocab_size``), ``k`` (dict role -> k, sparse only; roles are ``"target"``
    and ``"draft:<name>"``), ``lengths`` (int64 [N]), ``tokens`` (int64 [N, T] or None), ``metadata`` (dict),
    ``prompt_tokens`` (int64 [N, P], padded) and ``prompt_lengths`` (int64 [N]) or None, ``costs`` (the recorded
    :class:`fastspec.costs.CostTable` or None), ``arrays`` (name -> ArrayInfo), ``size_on_disk`` (bytes),
    ``verify_integrity`` (whether reads check the CRC-32 of stored ``.npz`` members unless a call says otherwise).
    ``drafts`` is empty for a target-only dump.
    """

    def __init__(self, path: str, sources: Mapping[str, Source], zf=None, verify_integrity: bool = True):
        self.path = str(path)
        self._sources = dict(sources)
        self._zf = zf
        self.verify_integrity = bool(verify_integrity)
        self._format = ".npz" if zf is not None else (
            "memory" if all(isinstance(s, MemorySource) for s in self._sources.values()) else "directory of .npy")
        try:
            layout = check_structure(self.path, self._sources, self.verify_integrity)
        except BaseException:
            self.close()
            raise
        self._roles = layout.roles
        self.kind, self.drafts, self.N, self.T, self.V = layout.kind, layout.drafts, layout.N, layout.T, layout.V
        self.k, self.rank3, self.metadata = layout.k, layout.rank3, layout.metadata
        self.lengths, self.tokens = layout.lengths, layout.tokens
        self.prompt_tokens, self.prompt_lengths, self.costs = layout.prompt_tokens, layout.prompt_lengths, layout.costs
        self._extras = layout.extras or {}
        self.sampled_logprobs = MappingProxyType({("target" if key == "target" else key[len("draft:"):]): a
                                                  for key, a in (layout.sampled or {}).items()})
        self.provenance = layout.provenance

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], path: str = "<arrays>") -> "Dump":
        """A dump of in-memory ``arrays`` (named as in a file), with the structure checks of :func:`load_dump`
        (messages name ``path``); :meth:`validate` checks the values."""
        if not isinstance(arrays, Mapping):
            raise InvalidType(f"arrays must be a mapping name -> array, got {type(arrays).__name__}", argument="arrays")
        sources = {}
        for name, a in arrays.items():
            a = np.asarray(a)
            if a.dtype.hasobject:
                raise InvalidType(f"array {name!r}: object arrays are refused; give numeric arrays", argument="arrays")
            sources[name] = MemorySource(name, a)
        return cls(path, sources)

    # ---- description ----------------------------------------------------------------------------------------
    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        return {n: ArrayInfo(n, tuple(s.shape), str(s.dtype), s.nbytes, s.storage) for n, s in self._sources.items()}

    @property
    def size_on_disk(self) -> int:
        if self._format == ".npz":
            return os.path.getsize(self.path)
        return 0 if self._format == "memory" else sum(os.path.getsize(s.file) for s in self._sources.values())

    def array_name(self, role: str, kind: str) -> str:
        """Name of the array holding ``kind`` for ``role`` ("target" or a draft name)."""
        return self._roles[role_key(None if role == "target" else role)][kind].name

    def has_extras(self, role: str) -> bool:
        """Whether ``role`` ("target" or a draft name) has extra known ids (``extra_ids`` / ``extra_logprobs``)."""
        return role_key(None if role == "target" else role) in self._extras

    def chunk_rows(self, drafts, max_bytes: int) -> int:
        rows = super().chunk_rows(drafts, max_bytes)
        widest = max((np.dtype(s.dtype).itemsize * s.shape[-1] for key, parts in self._extras.items()
                      for s in parts.values()), default=0)
        return rows if not widest else max(1, min(rows, max_bytes // widest))

    def describe(self) -> dict:
        """Plain-data summary: arrays, kind, drafts, N, T, V, k, metadata, size on disk; for a dump that records
        them, ``provenance`` and ``known_beyond_topk`` (role -> the optional arrays it has)."""
        out = self._describe()
        if self.provenance is not None:
            out["provenance"] = self.provenance
        known = {}
        for role in ("target",) + tuple(self.drafts):
            kinds = (["sampled_logprob"] if role in self.sampled_logprobs else []) + \
                (["extra_ids"] if self.has_extras(role) else [])
            if kinds:
                known[role] = kinds
        if known:
            out["known_beyond_topk"] = known
        return out

    def _describe(self) -> dict:
        return {
            "path": self.path, "format": self._format, "kind": self.kind, "drafts": list(self.drafts),
            "N": self.N, "T": self.T, "V": self.V,
            "k": {key.replace("draft:", ""): v for key, v in self.k.items()} if self.kind == "sparse" else None,
            "valid_positions": int(self.lengths.sum()),
            "has_tokens": self.tokens is not None,
            "has_prompt_tokens": self.prompt_tokens is not None,
            "costs": self.costs.as_dict() if self.costs is not None else None,
            "metadata": dict(self.metadata),
            "size_on_disk": self.size_on_disk,
            "arrays": self._array_summary(),
        }

    def __repr__(self):
        return (f"Dump({self.path!r}, kind={self.kind}, drafts={list(self.drafts)}, N={self.N}, T={self.T}, "
                f"V={self.V})")

    # ---- reading --------------------------------------------------------------------------------------------
    def iter_chunks(self, *, drafts=None, max_bytes: int = DEFAULT_CHUNK_BYTES, validate: bool = True,
                    verify_integrity: bool | None = None) -> Iterator[Chunk]:
        """Yield :class:`Chunk` objects covering all N*T rows in order, ``max_bytes`` per array at most.

        ``verify_integrity`` (default: the dump's ``verify_integrity``): compute the CRC-32 of every stored
        ``.npz`` member read (the target's and the selected drafts') as its chunks go by, and raise
        DumpFormatError before yielding its last chunk if it does not match.  A pass that stops early has not
        been checked; arrays it does not read (drafts not selected) are not checked.  Deflated members are
        always checked by the decompressor; ``.npy`` files carry no checksum.
        """
        names = self.select_drafts(drafts)
        rows = self.chunk_rows(names, max_bytes)
        verify = self.verify_integrity if verify_integrity is None else bool(verify_integrity)
        R = self.N * self.T
        for r0 in range(0, R, rows):
            r1 = min(R, r0 + rows)
            r = np.arange(r0, r1)
            valid = r % self.T < self.lengths[r // self.T]
            target = self._read(None, r0, r1, valid, validate, verify)
            ch = Chunk(r0, r1, valid, target, {d: self._read(d, r0, r1, valid, validate, verify) for d in names})
            for d in (None,) + tuple(names):
                if role_key(d) in self._extras:
                    ch.extras["target" if d is None else d] = self._read_extras(
                        d, r0, r1, valid, validate, verify, ch.target if d is None else ch.drafts[d])
            yield ch

    def _read_extras(self, draft, r0, r1, valid, validate, verify, top):
        """Rows [r0, r1) of a role's extra known (ids, logprobs), checked against its top-k rows ``top``."""
        parts = self._extras[role_key(draft)]
        srcs = [parts["extra_ids"], parts["extra_logprobs"]]
        got = [s.read_rows(r0, r1, s.shape[-1], verify) for s in srcs]
        if validate:
            check_extra_rows(self.path, self.where, self.V, tuple(s.name for s in srcs), got[0], got[1], top[0],
                             top[1], valid, r0)
        return tuple(got)

    def _read(self, draft, r0, r1, valid, validate, verify):
        """Rows [r0, r1) of the target (``draft`` None) or a draft: an array (dense) or an (ids, logprobs) pair."""
        parts = self._roles[role_key(draft)]
        srcs = [parts[kd] for kd in kinds_of(self.kind)]
        got = [s.read_rows(r0, r1, s.shape[-1], verify) for s in srcs]
        if validate and self.kind == "dense":
            check_dense(self.path, self.where, srcs[0].name, got[0], valid, r0)
        elif validate:
            check_sparse(self.path, self.where, self.V, tuple(s.name for s in srcs), got[0], got[1], valid, r0)
        return got[0] if self.kind == "dense" else tuple(got)

    def validate(self, *, max_bytes: int = DEFAULT_CHUNK_BYTES) -> "Dump":
        """Check every value of every array (one bounded-memory pass); returns ``self``.

        Every member is also checked against its CRC-32, whatever ``verify_integrity`` says (compressed members
        by the decompressor as they are streamed), so a damaged archive is refused, not analysed.
        """
        check_max_bytes(max_bytes)
        read = {id(s) for parts in list(self._roles.values()) + list(self._extras.values()) for s in parts.values()}
        for src in self._sources.values():
            if id(src) not in read:  # the small arrays; the pass below checks the others
                src.read_all(verify=True)
        for _ in self.iter_chunks(max_bytes=max_bytes, validate=True, verify_integrity=True):
            pass
        return self

    def close(self) -> None:
        for s in self._sources.values():
            s.close()
        if self._zf is not None:
            self._zf.close()
            self._zf = None


def load_dump(path, *, validate: bool = False, max_bytes: int = DEFAULT_CHUNK_BYTES,
              verify_integrity: bool = True) -> Dump:
    """Open the dump at ``path`` (``.npz`` file or directory of ``.npy``) and check its structure.

    Only headers and the small arrays are read.  Values of the large arrays are checked chunk by chunk
    as :meth:`Dump.iter_chunks` reads them; pass ``validate=True`` to check them all now (one pass).
    ``verify_integrity`` (default True): reads check the CRC-32 of stored (uncompressed) ``.npz`` members as
    they go (the small arrays now, the large ones in each pass that reads them whole); False skips that check
    for storage you trust.  Only a regular file or a directory is opened: a FIFO, a device or a dangling link is
    refused before anything is read.
    Raises :class:`fastspec.errors.DumpFormatError` (a ``ValueError`` naming file, array and index) for anything
    malformed, :class:`fastspec.errors.DumpNotFound` (also a ``FileNotFoundError``) when ``path`` does not exist.
    """
    try:
        path = os.fspath(path)
    except TypeError:
        raise InvalidType(f"path must be a str or os.PathLike, got {type(path).__name__}", argument="path") from None
    if validate:
        check_max_bytes(max_bytes)
    sources, zf = open_sources(path)
    dump = Dump(path, sources, zf, verify_integrity)
    if validate:
        try:
            dump.validate(max_bytes=max_bytes)
        except BaseException:
            dump.close()
            raise
    return dump
