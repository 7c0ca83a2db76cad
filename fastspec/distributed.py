"""Dask execution of the α pass of a shard set (:class:`fastspec.io.shards.ShardedDump`), for
:func:`fastspec.acceptance.dump_acceptance`.

Each shard is one task (:func:`alpha_task`) that runs the analysis's per-dump pass (``compute``, given by the caller:
this module imports no analysis) on it -- the same Numba kernels, on the same rows, hence bitwise the same numbers as
one machine -- and sends back only the ``[n_i, T]`` float64 results.  The client is duck-typed (``map``, ``run``,
``cancel``); dask itself is imported only inside :func:`run_on_cluster`, so importing fastspec never imports dask.

* Code identity: each task reports fastspec's version and :func:`fastspec._numba.jit.library_fingerprint` (a
  hash of every fastspec source file); a mismatch with this process is a :class:`~fastspec.errors.ClusterError`.
  Bitwise equality also assumes the same CPU family; ``last_run["cpus"]`` lists the workers' CPU names.
* Numba threads per task: ``threads_per_worker`` if given, else ``usable cores of the worker's host // worker
  processes on that host`` (at least 1); a process-wide lock keeps one kernel per worker process running at a
  time, so Dask threads never multiply Numba threads.
* A worker that dies mid-task is replaced and its task rerun by Dask (scheduler ``allowed-failures``); other
  task exceptions (e.g. a transient I/O error) are retried ``retries`` times.
* Bad data in a shard (any ``ValueError`` from the loader or the kernels: deterministic, so never retried) comes
  back as a value and stops the run: the remaining tasks are cancelled and ``ValueError("shard i of S: <the
  loader's message>")`` is raised.  A task that fails otherwise, or a cluster that cannot be reached, raises
  :class:`~fastspec.errors.ClusterError`.  No partial result is ever returned.
"""
from __future__ import annotations

import contextlib
import threading
import uuid

from ._numba.jit import library_fingerprint
from ._version import __version__
from .errors import ClusterError, DumpFormatError, DumpNotFound
from .io.dump import load_dump

__all__ = ["TASK_PREFIX", "alpha_task", "check_part", "run_on_cluster"]

TASK_PREFIX = "fastspec-alpha"  # Dask keys of the α tasks: f"{TASK_PREFIX}-{shard index}-{run id}"

_KERNEL_LOCK = threading.Lock()  # one α kernel per worker process at a time (Numba threads do the rest)


def _cpu_name() -> str:
    try:
        import llvmlite.binding as llvm

        return str(llvm.get_host_cpu_name())
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def _probe_worker():
    """(host name, usable cores) of the worker process this runs in."""
    import socket

    from .machine import available_cpus

    return socket.gethostname(), available_cpus()


def _threads_per_host(client) -> dict:
    """{host: Numba threads per task}: the host's usable cores shared by its worker processes."""
    try:
        probe = client.run(_probe_worker)
    except Exception as exc:  # noqa: BLE001 - a cluster problem, reported as such
        raise ClusterError(f"cannot reach the Dask workers: {type(exc).__name__}: {exc}") from None
    if not probe:
        raise ClusterError("the Dask cluster has no workers")
    per_host: dict[str, list] = {}
    for host, cpus in probe.values():
        per_host.setdefault(host, []).append(cpus)
    return {h: max(1, min(c) // len(c)) for h, c in per_host.items()}


def _task_threads(threads, host):
    """Numba threads for this task (None: leave the process's setting) and the worker's name."""
    import numba

    if threads is None:
        return None, host
    fixed, per_host = threads
    n = fixed if fixed is not None else (per_host or {}).get(host, 1)
    worker = host
    try:
        from distributed import get_worker

        worker = get_worker().address
    except (ImportError, ValueError):
        pass
    return max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)), worker


def alpha_task(compute, path: str, params: dict, threads, expect) -> dict:
    """One shard's α (runs on a worker, or in this process with ``threads`` None).

    ``compute(dump, **params)``: the α pass of one open dump (``{draft: result with .alpha or .lower/.upper}``; a
    module-level function, so that workers import it by name); ``params``: its keyword arguments; ``threads``: ``(fixed
    or None, {host: threads} or None)``; ``expect``: the shard's (N, T) when the set was opened.  Returns a plain dict:
    ``error`` (the message of a data error, else None), ``not_found`` (the file was missing), ``arrays`` ({draft:
    (alpha,) or (lower, upper)}), and the code identity and placement (``version``, ``code``, ``worker``, ``threads``,
    ``cpu``)."""
    import socket

    import numba

    n_threads, worker = _task_threads(threads, socket.gethostname())
    out = {"error": None, "not_found": False, "arrays": None, "version": __version__,
           "code": library_fingerprint(), "worker": worker, "threads": n_threads or numba.get_num_threads(),
           "cpu": _cpu_name()}
    with _KERNEL_LOCK if threads is not None else contextlib.nullcontext():
        old = numba.get_num_threads()
        if n_threads is not None:
            numba.set_num_threads(n_threads)
        try:
            with load_dump(path, verify_integrity=params.get("verify_integrity", True)) as d:
                if (d.N, d.T) != tuple(expect):
                    raise DumpFormatError(f"{path}: holds N={d.N}, T={d.T} but N={expect[0]}, T={expect[1]} when "
                                          "the shard set was opened; the shard changed (or a worker sees another file)")
                res = compute(d, **params)
        except FileNotFoundError as exc:
            out["error"] = f"{path}: not found on worker {worker} (every worker must see the shard paths): {exc}"
            out["not_found"] = True
            return out
        except ValueError as exc:
            out["error"] = str(exc)
            return out
        finally:
            numba.set_num_threads(old)
    out["arrays"] = {n: (r.alpha,) if r.alpha is not None else (r.lower, r.upper) for n, r in res.items()}
    return out


def check_part(part: dict, i: int, S: int) -> None:
    """Raise for shard ``i`` of ``S``: its data error (DumpFormatError, or DumpNotFound when the worker does not
    see the file), or code that differs from this process' (ClusterError)."""
    if part["error"] is not None:
        raise (DumpNotFound if part.get("not_found") else DumpFormatError)(f"shard {i} of {S}: {part['error']}")
    if part["version"] != __version__ or part["code"] != library_fingerprint():
        raise ClusterError(f"shard {i} of {S}: worker {part['worker']} runs fastspec {part['version']} (sources "
                           f"{part['code']}), this process {__version__} ({library_fingerprint()}); install "
                           "the same fastspec everywhere (and restart workers after upgrading)")


def run_on_cluster(client, compute, shards: list, params: dict, expect: list, *, threads_per_worker=None,
                   retries=2):
    """One :func:`alpha_task` (of ``compute``) per shard on ``client``; ``(parts in shard order, last_run summary)``.

    The first failing shard cancels the rest and raises (module docstring); never a partial result."""
    from distributed import as_completed  # lazy: only with a client

    S = len(shards)
    host_threads = _threads_per_host(client) if threads_per_worker is None else None
    run_id = uuid.uuid4().hex[:12]
    keys = [f"{TASK_PREFIX}-{i}-{run_id}" for i in range(S)]
    futures = client.map(alpha_task, [compute] * S, shards, [params] * S, [(threads_per_worker, host_threads)] * S,
                         expect, key=keys, retries=retries, pure=False)
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
                raise ClusterError(f"shard {i} of {S}: {shards[i]}: the task failed on the cluster "
                                   f"({type(exc).__name__}: {exc}); no result is reported") from None
            part = fut.result()
            check_part(part, i, S)
            parts[i] = part
            fut.release()
    except BaseException:
        client.cancel(futures)
        raise
    missing = [i for i, p in enumerate(parts) if p is None]
    if missing:  # never a partial answer
        raise ClusterError(f"shard {missing[0]} of {S}: {shards[missing[0]]}: no result came back")
    last_run = {"scheduler": getattr(getattr(client, "scheduler", None), "address", None), "tasks": S,
                "workers": sorted({p["worker"] for p in parts}), "numba_threads": sorted({p["threads"] for p in parts}),
                "cpus": sorted({p["cpu"] for p in parts})}
    return parts, last_run
