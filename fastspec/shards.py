"""Sharded dumps: many dump files analysed as one, serially or on a Dask cluster.

A full-vocabulary dump outgrows one file (and one machine) quickly.  A *sharded dump* is a directory
whose entries are dumps (``.npz`` files, or subdirectories of ``.npy`` files), all with the same drafts,
vocabulary, positions T, kind, array dtypes and metadata.  :class:`ShardedDump` presents them as one dump
of ``N = sum(N_i)`` sequences: sequence ``n`` of shard ``i`` is global row ``offsets[i] + n``, so every
result (α arrays, simulate's counter-based random numbers) is the same however the data is split.

Layout rule (decided by content, never by name)
------------------------------------------------
For a directory ``D``:

* ``D`` directly holds ``.npy`` files -> ``D`` is ONE dump (the directory-of-``.npy`` layout of
  ``data/README.md``); nothing else in it is looked at;
* otherwise, its shards are the ``.npz`` files in ``D`` and the subdirectories of ``D`` that hold at least
  one ``.npy`` file; other entries (and names starting with ``.``) are ignored.  No shard -> ``ValueError``.

Shards are ordered by *natural* name order (``shard-2`` before ``shard-10``; zero-padded names sort the
same either way).  That order defines the global row ids.

Heavy pass on a cluster
-----------------------
:meth:`ShardedDump.acceptance` computes the per-position α (dense) or α interval (sparse) for every draft
of every shard with :func:`fastspec.acceptance.dump_acceptance` -- the same Numba kernels, on the same
rows, hence bitwise the same numbers as one machine.  Without a client it loops over the shards here;
with a ``dask.distributed.Client`` (duck-typed: ``map``, ``run``, ``cancel``; dask itself is imported
lazily and only when a client is used) each shard is one task, and only the ``[n_i, T]`` float64 results
travel back.  Workers must see the shard paths (shared storage) and run the same fastspec code: each
task reports a hash of the kernel sources it runs, and a mismatch with this process is an error.  Bitwise
equality also assumes the same CPU family (the row sums are vectorized, and the vector width decides
the summation order); ``last_run["cpus"]`` lists the workers' CPU names.

* Numba threads per task: ``threads_per_worker`` if given, else ``usable cores of the worker's host //
  worker processes on that host`` (at least 1); a process-wide lock keeps one kernel per worker process
  running at a time, so Dask threads never multiply Numba threads.
* A worker that dies mid-task is replaced and its task rerun by Dask (scheduler ``allowed-failures``);
  other task exceptions (e.g. a transient I/O error) are retried ``retries`` times.
* A shard with bad data (any ``ValueError`` from the loader or the kernels: those are deterministic, so
  never retried) stops the run: the remaining tasks are cancelled and ``ValueError("shard i of S: <the
  loader's message, which names the file, array and index>")`` is raised.  No partial result is returned.

Token-mode simulation reads the logits on the client, shard after shard (``iter_chunks``), with global row
ids, so its output equals the single-machine run too; only the α pass is distributed.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
import uuid
from typing import Iterator

import numpy as np

from .io import DEFAULT_CHUNK_BYTES, ArrayInfo, Chunk, Dump, load_dump

__all__ = ["ShardedDump", "load_any", "is_sharded", "list_shards", "TASK_PREFIX"]

TASK_PREFIX = "fastspec-alpha"  # Dask keys of the α tasks: f"{TASK_PREFIX}-{shard index}-{run id}"

_KERNEL_LOCK = threading.Lock()  # one α kernel per worker process at a time (Numba threads do the rest)
_KERNEL_FILES = ("acceptance.py", "_fastexp.py", "_process.py", "_jit.py", "io.py")


def _fingerprint() -> str:
    """Hash of the sources the α pass runs (taken when this module is imported, like the code in memory)."""
    import hashlib

    h = hashlib.sha256()
    here = os.path.dirname(os.path.abspath(__file__))
    for f in _KERNEL_FILES:
        try:
            with open(os.path.join(here, f), "rb") as fh:
                h.update(fh.read())
        except OSError:
            h.update(b"?")
    return h.hexdigest()[:16]


CODE_FINGERPRINT = _fingerprint()


def _natural_key(name: str):
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", name)]


def _has_npy(path: str) -> bool:
    try:
        return any(f.endswith(".npy") and not f.startswith(".") and os.path.isfile(os.path.join(path, f))
                   for f in os.listdir(path))
    except OSError:
        return False


def is_sharded(path) -> bool:
    """True when ``path`` is a directory of shards (see the layout rule in the module docstring)."""
    path = os.fspath(path)
    if not os.path.isdir(path) or _has_npy(path):
        return False
    return bool(list_shards(path, strict=False))


def list_shards(path, *, strict: bool = True) -> list[str]:
    """The shard paths of directory ``path`` in shard order (natural name order)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a directory of shards")
    if _has_npy(path):
        raise ValueError(f"{path}: holds .npy files, so it is one dump (directory of .npy), not a directory of shards")
    out = []
    for f in os.listdir(path):
        if f.startswith("."):
            continue
        full = os.path.join(path, f)
        if (f.endswith(".npz") and os.path.isfile(full)) or (os.path.isdir(full) and _has_npy(full)):
            out.append(f)
    if strict and not out:
        raise ValueError(f"{path}: no shards found; expected .npz files or subdirectories of .npy files "
                         "(or .npy files, for a single dump)")
    return [os.path.join(path, f) for f in sorted(out, key=_natural_key)]


def load_any(path, *, client=None, threads_per_worker: int | None = None, retries: int = 2):
    """Open ``path`` as a :class:`fastspec.io.Dump` or, for a directory of shards, a :class:`ShardedDump`.

    With a ``client``, a single dump is opened as a one-shard :class:`ShardedDump` so that its α pass
    runs on the cluster as well.
    """
    path = os.fspath(path)
    if is_sharded(path):
        return ShardedDump(path, client=client, threads_per_worker=threads_per_worker, retries=retries)
    if client is not None:
        return ShardedDump([path], client=client, threads_per_worker=threads_per_worker, retries=retries)
    return load_dump(path)


class _ShardInfo:
    __slots__ = ("path", "N", "lengths", "tokens", "arrays", "size")

    def __init__(self, d: Dump):
        self.path = d.path
        self.N = d.N
        self.lengths = d.lengths
        self.tokens = d.tokens
        self.arrays = d.arrays
        self.size = d.size_on_disk


def _signature(d: Dump) -> dict:
    return {"kind": d.kind, "drafts": tuple(d.drafts), "T": d.T, "V": d.V,
            "k": dict(d.k) if d.kind == "sparse" else None, "metadata": dict(d.metadata),
            "dtypes": {n: a.dtype for n, a in d.arrays.items() if len(a.shape) >= 2 and n != "tokens"},
            "tokens": d.tokens is not None}


_SIG_WORDS = {"kind": "kind", "drafts": "drafts", "T": "positions T", "V": "vocabulary V", "k": "top-k widths",
              "metadata": "metadata", "dtypes": "arrays/dtypes", "tokens": "presence of 'tokens'"}


class ShardedDump:
    """Several dumps with the same layout, seen as one (module docstring).

    ``source``: a directory of shards, or a sequence of dump paths (taken in the given order).
    ``client``: optional ``dask.distributed.Client`` used by :meth:`acceptance`.

    Attributes like :class:`fastspec.io.Dump`: ``path``, ``kind``, ``drafts``, ``N`` (total), ``T``, ``V``,
    ``k``, ``lengths`` (concatenated), ``tokens`` (concatenated or None), ``metadata``, ``arrays`` (shapes
    with the total N), ``size_on_disk``; plus ``shards`` (paths), ``offsets`` (first global sequence of each
    shard, and N at the end) and ``row_offset`` (0: row ids are already global).
    Only headers and the small arrays are read when opening; no shard stays open.
    """

    row_offset = 0

    def __init__(self, source, *, client=None, threads_per_worker: int | None = None, retries: int = 2):
        if isinstance(source, (str, os.PathLike)):
            self.path = os.fspath(source)
            paths = list_shards(self.path)
        else:
            paths = [os.fspath(p) for p in source]
            if not paths:
                raise ValueError("ShardedDump: give at least one shard")
            self.path = os.path.dirname(paths[0]) if len(paths) > 1 else paths[0]
        if threads_per_worker is not None and (isinstance(threads_per_worker, bool) or int(threads_per_worker) < 1):
            raise ValueError(f"threads_per_worker = {threads_per_worker!r} must be an integer >= 1")
        if isinstance(retries, bool) or not isinstance(retries, (int, np.integer)) or retries < 0:
            raise ValueError(f"retries = {retries!r} must be an integer >= 0")
        self.client = client
        self.threads_per_worker = None if threads_per_worker is None else int(threads_per_worker)
        self.retries = int(retries)
        self.shards = paths
        self._info: list[_ShardInfo] = []
        sig0 = None
        for i, p in enumerate(paths):
            try:
                d = load_dump(p)
            except FileNotFoundError:
                raise
            except ValueError as exc:
                raise ValueError(f"shard {i} of {len(paths)}: {exc}") from None
            try:
                sig = _signature(d)
                if sig0 is None:
                    sig0, self._first = sig, d.describe()
                    self.kind, self.drafts, self.T, self.V = d.kind, d.drafts, d.T, d.V
                    self.k = dict(d.k)
                    self.metadata = dict(d.metadata)
                    self._names = {(r, kd): d.array_name(r, kd) for r in ("target",) + d.drafts
                                   for kd in (("logits",) if d.kind == "dense" else ("topk_ids", "topk_logprobs"))}
                else:
                    for key in sig0:
                        if key == "dtypes" and sig[key] != sig0[key] and sig[key].keys() == sig0[key].keys():
                            a = next(a for a in sig[key] if sig[key][a] != sig0[key][a])
                            raise ValueError(f"shard {i} of {len(paths)}: {p}: dtypes differ: array {a!r} is "
                                             f"{sig[key][a]}, {sig0[key][a]} in the first shard ({paths[0]}); every "
                                             "shard needs the same dtypes (re-save it)")
                        if sig[key] != sig0[key]:
                            raise ValueError(f"shard {i} of {len(paths)}: {p}: {_SIG_WORDS[key]} {sig[key]!r} differ "
                                             f"from the first shard's ({paths[0]}: {sig0[key]!r}); every shard needs "
                                             "the same drafts, vocabulary, T, kind, dtypes and metadata")
                self._info.append(_ShardInfo(d))
            finally:
                d.close()
        counts = np.array([s.N for s in self._info], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.N = int(self.offsets[-1])
        self.lengths = np.concatenate([s.lengths for s in self._info]).astype(np.int64)
        self.tokens = (np.concatenate([s.tokens for s in self._info]) if self._info[0].tokens is not None else None)
        self.last_run: dict | None = None

    # ---- Dump-like surface -----------------------------------------------------------------------------
    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        """The first shard's arrays, with the total N in their shapes and bytes summed over shards."""
        out = {}
        for name, a in self._info[0].arrays.items():
            if name == "lengths":
                shape = (self.N,)
            elif name == "tokens":
                shape = (self.N, self.T)
            elif len(a.shape) >= 2:
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

    def where(self, row: int) -> str:
        """Global index ``[n, t]`` of flat row ``row``."""
        return f"[{row // self.T}, {row % self.T}]"

    def shard_of(self, n: int) -> tuple[int, int]:
        """(shard index, sequence within the shard) of global sequence ``n``."""
        if not 0 <= n < self.N:
            raise IndexError(f"sequence {n} is outside [0, {self.N})")
        i = int(np.searchsorted(self.offsets, n, side="right") - 1)
        return i, int(n - self.offsets[i])

    def _row_bytes(self, names) -> int:
        info = self._info[0].arrays
        kinds = ("logits",) if self.kind == "dense" else ("topk_ids", "topk_logprobs")
        return max(np.dtype(info[self._names[(r, kd)]].dtype).itemsize * info[self._names[(r, kd)]].shape[-1]
                   for r in ("target",) + tuple(names) for kd in kinds)

    def iter_chunks(self, *, drafts=None, max_bytes: int = DEFAULT_CHUNK_BYTES, validate: bool = True
                    ) -> Iterator[Chunk]:
        """Chunks with global flat row numbers, cut exactly where one merged dump would cut them.

        ``max_bytes`` gives the same rows per chunk as :meth:`fastspec.io.Dump.iter_chunks` on the merged
        data; a chunk spanning two shards is assembled (copied, O(chunk) memory), others are views.  So any
        computation that depends on the chunking (e.g. token-mode replay) sees what a single dump gives.
        Values are validated by each shard's loader (messages name the shard file).
        """
        names = self.drafts if drafts is None else tuple(drafts)
        for n in names:
            if n not in self.drafts:
                raise ValueError(f"{self.path}: no draft named {n!r}; the dump holds {', '.join(self.drafts)}")
        rows = max(1, int(max_bytes) // max(self._row_bytes(names), 1))
        pending: list[Chunk] = []
        for i, p in enumerate(self.shards):
            base = int(self.offsets[i]) * self.T
            with load_dump(p) as d:
                if d.N != self._info[i].N:
                    raise ValueError(f"shard {i} of {len(self.shards)}: {p}: holds {d.N} sequences, {self._info[i].N} "
                                     "when it was opened; the shard changed during the run")
                for ch in d.iter_chunks(drafts=names, max_bytes=max_bytes, validate=validate):
                    pos, stop = ch.start + base, ch.stop + base
                    while pos < stop:
                        cut = min(stop, (pos // rows + 1) * rows)
                        a, b = pos - base - ch.start, cut - base - ch.start
                        pending.append(Chunk(pos, cut, ch.valid[a:b], _take(ch.target, a, b),
                                             {n: _take(v, a, b) for n, v in ch.drafts.items()}))
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
                raise ValueError(f"shard {i} of {len(self.shards)}: {exc}") from None
        return self

    def describe(self) -> dict:
        """Like :meth:`fastspec.io.Dump.describe`, for the whole set, plus a ``shards`` list."""
        info = dict(self._first)
        info.update({
            "path": self.path, "format": f"sharded ({len(self.shards)} shard{'s' if len(self.shards) != 1 else ''})", "N": self.N,
            "valid_positions": int(self.lengths.sum()), "size_on_disk": self.size_on_disk,
            "arrays": [{"name": a.name, "shape": list(a.shape), "dtype": a.dtype, "nbytes": a.nbytes,
                        "storage": a.storage} for a in sorted(self.arrays.values(), key=lambda a: a.name)],
            "shards": [{"path": s.path, "first_sequence": int(o), "N": s.N, "size_on_disk": s.size}
                       for s, o in zip(self._info, self.offsets[:-1])],
        })
        return info

    def close(self) -> None:
        """Nothing stays open between passes; kept for symmetry with :class:`fastspec.io.Dump`."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"ShardedDump({self.path!r}, shards={len(self.shards)}, kind={self.kind}, drafts={list(self.drafts)}, "
                f"N={self.N}, T={self.T}, V={self.V})")

    # ---- the heavy pass --------------------------------------------------------------------------------
    def acceptance(self, *, temperature=None, top_k=None, top_p=None, min_p=None, drafts=None, max_bytes=None,
                   client=None) -> dict:
        """:func:`fastspec.acceptance.dump_acceptance` over every shard, assembled in shard order.

        Same arguments and result (``{draft: DraftAcceptance}`` with [N, T] arrays) as ``dump_acceptance``;
        bitwise the same numbers.  ``client`` (default: the one given when opening) runs one task per
        shard on a Dask cluster; without one, the shards are processed here, one after another.
        """
        from .acceptance import DraftAcceptance, resolve_sampling as _resolve_params

        names = self.drafts if drafts is None else tuple(drafts)
        for n in names:
            if n not in self.drafts:
                raise ValueError(f"{self.path}: no draft named {n!r}; the dump holds {', '.join(self.drafts)}")
        _resolve_params(self, temperature, top_k, top_p, min_p)  # bad flags fail here, before any task
        params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=names,
                      max_bytes=max_bytes)
        client = client if client is not None else self.client
        S = len(self.shards)
        expect = [(s.N, self.T) for s in self._info]
        if client is None:
            parts = [_alpha_task(p, params, None, expect[i]) for i, p in enumerate(self.shards)]
            for i, part in enumerate(parts):
                _check_part(part, i, S)
            self.last_run = {"scheduler": None, "tasks": S}
        else:
            parts = self._run_on_cluster(client, params, expect)
        valid = np.arange(self.T)[None, :] < self.lengths[:, None]
        res = {}
        for n in names:
            if self.kind == "dense":
                res[n] = DraftAcceptance(n, valid, alpha=np.concatenate([p["arrays"][n][0] for p in parts], axis=0))
            else:
                res[n] = DraftAcceptance(n, valid, lower=np.concatenate([p["arrays"][n][0] for p in parts], axis=0),
                                         upper=np.concatenate([p["arrays"][n][1] for p in parts], axis=0))
        return res

    def _run_on_cluster(self, client, params, expect):
        from distributed import as_completed  # lazy: only with a client

        S = len(self.shards)
        threads = self.threads_per_worker
        host_threads = None
        if threads is None:
            try:
                probe = client.run(_probe_worker)
            except Exception as exc:  # noqa: BLE001 - a cluster problem, reported as such
                raise RuntimeError(f"cannot reach the Dask workers: {type(exc).__name__}: {exc}") from None
            if not probe:
                raise RuntimeError("the Dask cluster has no workers")
            per_host: dict[str, list] = {}
            for host, cpus in probe.values():
                per_host.setdefault(host, []).append(cpus)
            host_threads = {h: max(1, min(c) // len(c)) for h, c in per_host.items()}
        run_id = uuid.uuid4().hex[:12]
        keys = [f"{TASK_PREFIX}-{i}-{run_id}" for i in range(S)]
        futures = client.map(_alpha_task, self.shards, [params] * S, [(threads, host_threads)] * S, expect,
                             key=keys, retries=self.retries, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        parts: list = [None] * S
        try:
            for fut in as_completed(futures, loop=getattr(client, "loop", None)):
                i = index[fut.key]
                if fut.status != "finished":
                    try:
                        exc = fut.exception()
                    except Exception as e2:  # noqa: BLE001 - cancelled or lost
                        exc = e2
                    raise RuntimeError(f"shard {i} of {S}: {self.shards[i]}: the task failed on the cluster "
                                       f"({type(exc).__name__}: {exc}); no result is reported") from None
                part = fut.result()
                _check_part(part, i, S)
                parts[i] = part
                fut.release()
        except BaseException:
            client.cancel(futures)
            raise
        missing = [i for i, p in enumerate(parts) if p is None]
        if missing:  # never a partial answer
            raise RuntimeError(f"shard {missing[0]} of {S}: {self.shards[missing[0]]}: no result came back")
        self.last_run = {"scheduler": getattr(getattr(client, "scheduler", None), "address", None), "tasks": S,
                         "workers": sorted({p["worker"] for p in parts}), "numba_threads":
                         sorted({p["threads"] for p in parts}), "cpus": sorted({p["cpu"] for p in parts})}
        return parts


def _take(x, a, b):
    return tuple(y[a:b] for y in x) if isinstance(x, tuple) else x[a:b]


def _cat(parts):
    if isinstance(parts[0], tuple):
        return tuple(np.concatenate([p[j] for p in parts]) for j in range(len(parts[0])))
    return np.concatenate(parts)


def _merge(pending: list[Chunk]) -> Chunk:
    if len(pending) == 1:
        return pending[0]
    return Chunk(pending[0].start, pending[-1].stop, np.concatenate([c.valid for c in pending]),
                 _cat([c.target for c in pending]),
                 {n: _cat([c.drafts[n] for c in pending]) for n in pending[0].drafts})


def _check_part(part, i, S):
    if part["error"] is not None:
        raise ValueError(f"shard {i} of {S}: {part['error']}")
    import fastspec

    if part["version"] != fastspec.__version__ or part["code"] != CODE_FINGERPRINT:
        raise RuntimeError(f"shard {i} of {S}: worker {part['worker']} runs fastspec {part['version']} (kernel "
                           f"sources {part['code']}), this process {fastspec.__version__} ({CODE_FINGERPRINT}); "
                           "install the same fastspec everywhere (and restart workers after upgrading)")


def _cpu_name() -> str:
    try:
        import llvmlite.binding as llvm

        return str(llvm.get_host_cpu_name())
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def _probe_worker():
    import socket

    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return socket.gethostname(), cpus


def _alpha_task(path, params, threads, expect):
    """One shard's α (runs on a worker, or here).  Data errors come back as values, never retried."""
    import socket

    import numba

    import fastspec
    from .acceptance import dump_acceptance

    host = socket.gethostname()
    worker = host
    n_threads = None
    if threads is not None:
        fixed, per_host = threads
        n_threads = fixed if fixed is not None else (per_host or {}).get(host, 1)
        n_threads = max(1, min(int(n_threads), numba.config.NUMBA_NUM_THREADS))
        try:
            from distributed import get_worker

            worker = get_worker().address
        except (ImportError, ValueError):
            pass
    out = {"error": None, "arrays": None, "version": fastspec.__version__, "code": CODE_FINGERPRINT, "worker": worker,
           "threads": n_threads or numba.get_num_threads(), "cpu": _cpu_name()}
    with _KERNEL_LOCK if threads is not None else contextlib.nullcontext():
        old = numba.get_num_threads()
        if n_threads is not None:
            numba.set_num_threads(n_threads)
        try:
            with load_dump(path) as d:
                if (d.N, d.T) != tuple(expect):
                    raise ValueError(f"{path}: holds N={d.N}, T={d.T} but N={expect[0]}, T={expect[1]} when the "
                                     "shard set was opened; the shard changed (or a worker sees another file)")
                res = dump_acceptance(d, **params)
        except FileNotFoundError as exc:
            out["error"] = f"{path}: not found on worker {worker} (every worker must see the shard paths): {exc}"
            return out
        except ValueError as exc:
            out["error"] = str(exc)
            return out
        finally:
            numba.set_num_threads(old)
    out["arrays"] = {n: (r.alpha,) if r.alpha is not None else (r.lower, r.upper) for n, r in res.items()}
    return out
