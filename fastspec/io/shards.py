"""Sharded dumps: many dump files analysed as one.

A full-vocabulary dump outgrows one file (and one machine) quickly.  A *sharded dump* is a directory
whose entries are dumps (``.npz`` files, or subdirectories of ``.npy`` files), all with the same drafts,
vocabulary, positions T, kind, array dtypes and metadata.  :class:`ShardedDump` presents them as one dump
of ``N = sum(N_i)`` sequences: sequence ``n`` of shard ``i`` is global row ``offsets[i] + n``, so every
result (α arrays, simulate's counter-based random numbers) is the same however the data is split.

Layout rule (decided by content, never by name)
------------------------------------------------
For a directory ``D``:

* ``D`` directly holds ``.npy`` files -> ``D`` is ONE dump (the directory-of-``.npy`` layout of
  ``docs/reference/dump-format.md``); nothing else in it is looked at;
* otherwise, its shards are the ``.npz`` files in ``D`` and the subdirectories of ``D`` that hold at least
  one ``.npy`` entry (symbolic links followed); names starting with ``.`` are ignored, and so are other regular
  files and directories without ``.npy`` entries.  Any other entry -- a FIFO, a socket, a device, a dangling
  symbolic link -- is refused by name (``DumpFormatError``): it could be a shard, and an answer without it would
  be partial.  No shard -> ``DumpFormatError``.  Nothing is opened to decide (``os.stat`` only).

Shards are ordered by *natural* name order (``shard-2`` before ``shard-10``; zero-padded names sort the
same either way).  That order defines the global row ids.

The heavy pass
--------------
This module is the format only.  The α pass over a shard set (per shard, bitwise the numbers of the merged dump;
one task per shard on a Dask cluster when the set was opened with a ``client``) is an analysis:
:func:`fastspec.acceptance.dump_acceptance` dispatches to it (:mod:`fastspec.distributed` runs the tasks).

Token-mode simulation reads the logits on the client, shard after shard (:meth:`ShardedDump.iter_chunks`), with
global row ids, so its output equals the single-machine run too; only the α pass is distributed.
"""
from __future__ import annotations

import os
import re
from typing import Iterator

import numpy as np

from ..config import DEFAULT_CHUNK_BYTES
from ..errors import DumpFormatError, DumpNotFound, FastspecError, InvalidInput, check_int
from .dump import ArrayInfo, Chunk, Dump, DumpBase, load_dump
from .files import DIRECTORY, REGULAR, entry_kind
from .format import kinds_of

__all__ = ["ShardedDump", "is_sharded", "list_shards"]


def _natural_key(name: str):
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def _entries(path: str) -> list[str]:
    """The names in directory ``path`` that do not start with '.'."""
    try:
        return [f for f in os.listdir(path) if not f.startswith(".")]
    except OSError as exc:
        raise DumpFormatError(f"{path}: cannot list the directory ({exc.strerror})") from None


def _has_npy(path: str) -> bool:
    """Whether directory ``path`` holds a ``.npy`` entry of any kind (the loader refuses those that are not
    regular files, so none is silently skipped)."""
    return any(f.endswith(".npy") for f in _entries(path))


def _scan(path: str) -> tuple[list[str], list[str]]:
    """(shard names, "NAME is WHAT" for each entry that is neither a regular file nor a directory) of ``path``."""
    shards, refused = [], []
    for f in _entries(path):
        full = os.path.join(path, f)
        kind = entry_kind(full)
        if kind == REGULAR or kind == DIRECTORY:
            if (f.endswith(".npz") and kind == REGULAR) or (kind == DIRECTORY and _has_npy(full)):
                shards.append(f)
        else:
            refused.append(f"{f} is {kind}")
    return shards, refused


def is_sharded(path) -> bool:
    """True when ``path`` is a directory of shards (see the layout rule in the module docstring), including one
    whose entries :func:`list_shards` refuses."""
    path = os.fspath(path)
    if not os.path.isdir(path) or _has_npy(path):
        return False
    shards, refused = _scan(path)
    return bool(shards or refused)


def list_shards(path, *, strict: bool = True) -> list[str]:
    """The shard paths of directory ``path`` in shard order (natural name order).

    An entry that is neither a regular file nor a directory is refused (DumpFormatError naming it); with
    ``strict``, so is a directory without shards."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise DumpNotFound(f"{path}: no such file or directory")
        raise InvalidInput(f"{path}: not a directory of shards", argument="path")
    if _has_npy(path):
        raise InvalidInput(f"{path}: holds .npy files, so it is one dump (directory of .npy), not a directory of "
                           "shards", argument="path")
    out, refused = _scan(path)
    if refused:
        raise DumpFormatError(f"{path}: entry {refused[0]}; a shard set holds .npz files and directories of .npy "
                              "files (names starting with '.' are ignored): remove or replace it")
    if strict and not out:
        raise DumpFormatError(f"{path}: no shards found; expected .npz files or subdirectories of .npy files "
                              "(or .npy files, for a single dump)")
    return [os.path.join(path, f) for f in sorted(out, key=_natural_key)]


def _in_shard(i: int, S: int, path: str | None, exc: Exception) -> Exception:
    """``exc`` (same fastspec type; DumpFormatError for a plain ValueError) prefixed ``shard i of S: [path: ]``."""
    cls = type(exc) if isinstance(exc, FastspecError) else DumpFormatError
    return cls(f"shard {i} of {S}: {path + ': ' if path else ''}{exc}")


class _ShardInfo:
    __slots__ = ("path", "N", "lengths", "tokens", "arrays", "size", "prompt_tokens", "prompt_lengths", "costs")

    def __init__(self, d: Dump):
        self.path, self.N, self.lengths, self.tokens = d.path, d.N, d.lengths, d.tokens
        self.arrays, self.size = d.arrays, d.size_on_disk
        self.prompt_tokens, self.prompt_lengths, self.costs = d.prompt_tokens, d.prompt_lengths, d.costs


def _signature(d: Dump) -> dict:
    """What every shard must share with the first one."""
    return {"kind": d.kind, "drafts": tuple(d.drafts), "T": d.T, "V": d.V,
            "k": dict(d.k) if d.kind == "sparse" else None, "metadata": dict(d.metadata),
            "dtypes": {n: a.dtype for n, a in d.arrays.items()
                       if len(a.shape) >= 2 and n not in ("tokens", "prompt_tokens")},
            "tokens": d.tokens is not None, "prompt_tokens": d.prompt_tokens is not None}


_SIG_WORDS = {"kind": "kind", "drafts": "drafts", "T": "positions T", "V": "vocabulary V", "k": "top-k widths",
              "metadata": "metadata", "dtypes": "arrays/dtypes", "tokens": "presence of 'tokens'",
              "prompt_tokens": "presence of 'prompt_tokens'"}


def _compare(sig, sig0, first):
    """The first difference between a shard's signature and the first shard's, as a message (or None)."""
    for key in sig0:
        if sig[key] == sig0[key]:
            continue
        if key == "dtypes" and sig[key].keys() == sig0[key].keys():
            a = next(a for a in sig[key] if sig[key][a] != sig0[key][a])
            return (f"dtypes differ: array {a!r} is {sig[key][a]}, {sig0[key][a]} in the first shard ({first}); every "
                    "shard needs the same dtypes (re-save it)")
        return (f"{_SIG_WORDS[key]} {sig[key]!r} differ from the first shard's ({first}: {sig0[key]!r}); every shard "
                "needs the same drafts, vocabulary, T, kind, dtypes and metadata")
    return None


class ShardedDump(DumpBase):
    """Several dumps with the same layout, seen as one (module docstring).

    ``source``: a directory of shards, or a sequence of dump paths (taken in the given order).
    ``client``: optional ``dask.distributed.Client`` the α pass runs on (:func:`fastspec.acceptance.dump_acceptance`;
    this module only keeps it); ``threads_per_worker``: Numba threads per task on the cluster (default: the host's
    cores shared by its workers); ``retries``: reruns of a task that raised (:mod:`fastspec.distributed`);
    ``verify_integrity``: whether reads check the CRC-32 of stored ``.npz`` members (as in
    :func:`fastspec.io.load_dump`; a call's own argument wins).

    Attributes like :class:`fastspec.io.Dump`: ``path``, ``kind``, ``drafts``, ``N`` (total), ``T``, ``V``,
    ``k``, ``lengths`` (concatenated), ``tokens`` (concatenated or None), ``prompt_tokens`` / ``prompt_lengths``
    (concatenated, padded to the widest shard, or None), ``costs`` (the first recorded cost table or None;
    ``costs_differ`` when another shard recorded a different one or none), ``metadata``, ``arrays`` (shapes
    with the total N), ``size_on_disk``; plus ``shards`` (paths), ``offsets`` (first global sequence of each
    shard, and N at the end) and ``last_run`` (how the last α pass over the set ran; the analysis sets it).  Only
    headers and the small arrays are read when opening; no shard stays open.
    """

    def __init__(self, source, *, client=None, threads_per_worker: int | None = None, retries: int = 2,
                 verify_integrity: bool = True):
        if isinstance(source, (str, os.PathLike)):
            self.path = os.fspath(source)
            paths = list_shards(self.path)
        else:
            paths = [os.fspath(p) for p in source]
            if not paths:
                raise InvalidInput("ShardedDump: give at least one shard", argument="source")
            self.path = os.path.dirname(paths[0]) if len(paths) > 1 else paths[0]
        self.client = client
        self.threads_per_worker = None if threads_per_worker is None else check_int("threads_per_worker",
                                                                                     threads_per_worker, 1)
        self.retries = check_int("retries", retries, 0)
        self.verify_integrity = bool(verify_integrity)
        self.shards = paths
        self._info = [self._open_shard(i, p) for i, p in enumerate(paths)]
        self.offsets = np.concatenate([[0], np.cumsum([s.N for s in self._info])]).astype(np.int64)
        self.N = int(self.offsets[-1])
        self.lengths = np.concatenate([s.lengths for s in self._info]).astype(np.int64)
        self.tokens = np.concatenate([s.tokens for s in self._info]) if self._info[0].tokens is not None else None
        self.prompt_tokens, self.prompt_lengths = self._prompts()
        # the first recorded cost table, whichever shard holds it; ``costs_differ`` (simulate says so) when another
        # shard recorded a different one or none: the set's order must not decide whether it is priced
        tables = [s.costs.as_dict() if s.costs is not None else None for s in self._info]
        self.costs = next((s.costs for s in self._info if s.costs is not None), None)
        self.costs_differ = any(t != tables[0] for t in tables[1:])
        self.last_run: dict | None = None

    def _prompts(self):
        """(prompt_tokens [N, P] padded with 0 to the widest shard's P, prompt_lengths [N]) or (None, None)."""
        if self._info[0].prompt_tokens is None:
            return None, None
        P = max(s.prompt_tokens.shape[1] for s in self._info)
        toks = np.zeros((self.N, P), np.int64)
        for i, s in enumerate(self._info):
            toks[self.offsets[i]:self.offsets[i + 1], :s.prompt_tokens.shape[1]] = s.prompt_tokens
        return toks, np.concatenate([s.prompt_lengths for s in self._info]).astype(np.int64)

    def _open_shard(self, i: int, path: str) -> _ShardInfo:
        """Read shard ``i``'s structure; the first shard sets the layout, the others must match it."""
        S = len(self.shards)
        try:
            d = load_dump(path, verify_integrity=self.verify_integrity)
        except FileNotFoundError:
            raise
        except ValueError as exc:
            raise _in_shard(i, S, None, exc) from None
        with d:
            sig = _signature(d)
            if i == 0:
                self._sig, self._first = sig, d.describe()
                self.kind, self.drafts, self.T, self.V = d.kind, d.drafts, d.T, d.V
                self.k, self.metadata = dict(d.k), dict(d.metadata)
                self._names = {(r, kd): d.array_name(r, kd) for r in ("target",) + d.drafts for kd in kinds_of(d.kind)}
            else:
                diff = _compare(sig, self._sig, self.shards[0])
                if diff:
                    raise DumpFormatError(f"shard {i} of {S}: {path}: {diff}")
            return _ShardInfo(d)

    # ---- Dump-like surface -----------------------------------------------------------------------------
    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        """The first shard's arrays, with the total N in their shapes and bytes summed over shards."""
        out = {}
        for name, a in self._info[0].arrays.items():
            if name in ("lengths", "prompt_lengths"):
                shape = (self.N,)
            elif name == "prompt_tokens":
                shape = (self.N, self.prompt_tokens.shape[1])
            elif len(a.shape) == 2:  # tokens, *_sampled_logprob: [N, T]
                shape = (self.N, self.T)
            elif len(a.shape) >= 3:
                shape = (self.N, self.T, a.shape[-1])
            else:  # 0-d metadata
                out[name] = a
                continue
            nbytes = sum(s.arrays[name].nbytes if name in s.arrays else 0 for s in self._info)
            out[name] = ArrayInfo(name, shape, a.dtype, nbytes, "sharded")
        return out

    @property
    def size_on_disk(self) -> int:
        return int(sum(s.size for s in self._info))

    def array_name(self, role: str, kind: str) -> str:
        return self._names[(role, kind)]

    def shard_of(self, n: int) -> tuple[int, int]:
        """(shard index, sequence within the shard) of global sequence ``n``."""
        if not 0 <= n < self.N:
            raise IndexError(f"sequence {n} is outside [0, {self.N})")
        i = int(np.searchsorted(self.offsets, n, side="right") - 1)
        return i, int(n - self.offsets[i])

    def iter_chunks(self, *, drafts=None, max_bytes: int = DEFAULT_CHUNK_BYTES, validate: bool = True,
                    verify_integrity: bool | None = None) -> Iterator[Chunk]:
        """Chunks with global flat row numbers, cut exactly where one merged dump would cut them.

        ``max_bytes`` gives the same rows per chunk as :meth:`fastspec.io.Dump.iter_chunks` on the merged
        data; a chunk spanning two shards is assembled (copied, O(chunk) memory), others are views.  So any
        computation that depends on the chunking (e.g. token-mode replay) sees what a single dump gives.
        Values, and the CRC-32 of stored members (``verify_integrity``; default: the set's setting), are checked
        by each shard's loader (messages name the shard file).
        """
        names = self.select_drafts(drafts)
        rows = self.chunk_rows(names, max_bytes)
        verify = self.verify_integrity if verify_integrity is None else bool(verify_integrity)
        pending: list[Chunk] = []
        for i, p in enumerate(self.shards):
            base = int(self.offsets[i]) * self.T
            with load_dump(p, verify_integrity=verify) as d:
                if d.N != self._info[i].N:
                    raise DumpFormatError(f"shard {i} of {len(self.shards)}: {p}: holds {d.N} sequences, "
                                          f"{self._info[i].N} when it was opened; the shard changed during the run")
                for ch in d.iter_chunks(drafts=names, max_bytes=max_bytes, validate=validate, verify_integrity=verify):
                    pos, stop = ch.start + base, ch.stop + base
                    while pos < stop:  # cut at the merged dump's chunk boundaries (multiples of rows)
                        cut = min(stop, (pos // rows + 1) * rows)
                        pending.append(_slice(ch, pos - base - ch.start, cut - base - ch.start, pos))
                        pos = cut
                        if cut % rows == 0:
                            yield _merge(pending)
                            pending = []
        if pending:
            yield _merge(pending)

    def validate(self, *, max_bytes: int = DEFAULT_CHUNK_BYTES) -> "ShardedDump":
        """Check every value of every shard (one pass; errors name the shard)."""
        for i, p in enumerate(self.shards):
            try:
                with load_dump(p) as d:
                    d.validate(max_bytes=max_bytes)
            except ValueError as exc:
                raise _in_shard(i, len(self.shards), None, exc) from None
        return self

    def describe(self) -> dict:
        """Like :meth:`fastspec.io.Dump.describe`, for the whole set, plus a ``shards`` list."""
        info = dict(self._first)
        S = len(self.shards)
        info.update({
            "path": self.path, "format": f"sharded ({S} shard{'s' if S != 1 else ''})", "N": self.N,
            "valid_positions": int(self.lengths.sum()), "size_on_disk": self.size_on_disk,
            "arrays": self._array_summary(),
            "shards": [{"path": s.path, "first_sequence": int(o), "N": s.N, "size_on_disk": s.size}
                       for s, o in zip(self._info, self.offsets[:-1], strict=True)],
        })
        return info

    def __repr__(self):
        return (f"ShardedDump({self.path!r}, shards={len(self.shards)}, kind={self.kind}, drafts={list(self.drafts)}, "
                f"N={self.N}, T={self.T}, V={self.V})")


def _rows(x, a, b):
    """Rows [a, b) of a role's chunk data (an array, or an (ids, logprobs) pair)."""
    return tuple(y[a:b] for y in x) if isinstance(x, tuple) else x[a:b]


def _slice(ch: Chunk, a: int, b: int, start: int) -> Chunk:
    """Rows [a, b) of chunk ``ch``, renumbered to start at global row ``start``."""
    return Chunk(start, start + b - a, ch.valid[a:b], _rows(ch.target, a, b),
                 {n: _rows(v, a, b) for n, v in ch.drafts.items()})


def _cat(parts):
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate([p[j] for p in parts]) for j in range(len(parts[0])))
    return np.concatenate(parts)


def _merge(pending: list[Chunk]) -> Chunk:
    """One chunk of consecutive pieces (the piece itself when there is one: no copy)."""
    if len(pending) == 1:
        return pending[0]
    return Chunk(pending[0].start, pending[-1].stop, np.concatenate([c.valid for c in pending]),
                 _cat([c.target for c in pending]),
                 {n: _cat([c.drafts[n] for c in pending]) for n in pending[0].drafts})
