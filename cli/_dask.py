"""``--scheduler`` for the dump commands: a Dask client for the α pass (``fastspec[dask]``)."""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Iterator

from fastspec.errors import ClusterError

from ._options import FlagError

CONNECT_TIMEOUT_S = 5


def _cores() -> int:
    from fastspec.machine import available_cpus

    return available_cpus()


@contextmanager
def open_scheduler(spec: str | None) -> Iterator[object]:
    """Yield a ``distributed.Client`` for ``spec`` (None -> None); close it (and a local cluster) after.

    A spec that is not understood, or dask missing: :class:`FlagError` (exit 2); a local cluster that does not start
    or a scheduler that does not answer: :class:`fastspec.errors.ClusterError` (exit 1), one line each."""
    if spec is None:
        yield None
        return
    text = spec.strip()
    m = re.fullmatch(r"local(?::(\d+))?", text)
    tcp = re.fullmatch(r"tcp://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(\d{1,5})", text)
    if not m and not tcp:
        raise FlagError(f"--scheduler {spec!r} is not understood; use local, local:N or tcp://HOST:PORT")
    if m and m.group(1) is not None and not 1 <= int(m.group(1)) <= 1024:
        raise FlagError(f"--scheduler {spec!r}: the number of local workers must be in [1, 1024]")
    if tcp and not 1 <= int(tcp.group(2)) <= 65535:
        raise FlagError(f"--scheduler {spec!r}: the port must be in [1, 65535]")
    try:
        import logging
        import warnings

        from distributed import Client, LocalCluster
    except ImportError:
        raise FlagError("--scheduler needs dask: pip install 'fastspec[dask]' (or pip install "
                        "'dask[distributed]')") from None
    cluster = None
    if m:
        n = int(m.group(1)) if m.group(1) is not None else _cores()
        try:
            with warnings.catch_warnings():  # e.g. "port 8787 in use" for the scheduler's HTTP endpoint
                warnings.simplefilter("ignore")
                cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=logging.ERROR)
            client = Client(cluster, set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - reported as one line
            if cluster is not None:
                cluster.close()
            raise ClusterError(f"--scheduler {spec}: cannot start a local Dask cluster ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())})") from exc
    else:
        try:
            client = Client(text, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except Exception as exc:  # noqa: BLE001 - OSError / TimeoutError from the comm layer
            raise ClusterError(f"cannot reach the Dask scheduler at {text} within {CONNECT_TIMEOUT_S} s "
                               f"({type(exc).__name__}: {' '.join(str(exc).split())})") from exc
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
