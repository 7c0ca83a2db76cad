"""The one dump opener: :func:`open_dump`, for every kind of dump fastspec reads.

It decides what ``source`` is from its content (never its name alone) and hands it to the format's own loader:

* a directory of shards (:func:`fastspec.io.shards.is_sharded`) or a sequence of dump paths ->
  :class:`~fastspec.io.shards.ShardedDump`;
* a llama.cpp ``--kl-divergence-base`` file or a JSON manifest of such files
  (:func:`~fastspec.io.llamacpp.llamacpp_kind`) -> :class:`~fastspec.io.llamacpp.LlamaCppDump` (read on this
  machine: refused with a ``client``);
* an ``.npz`` file or a directory of ``.npy`` files -> :class:`~fastspec.io.dump.Dump`; with a ``client``, a
  one-shard :class:`~fastspec.io.shards.ShardedDump`, so that its alpha pass runs on the cluster as well.

The object returned is a context manager (``with open_dump(path) as d:``) that closes its files on exit.
"""
from __future__ import annotations

import os

from ..errors import InvalidInput, InvalidType
from .dump import DumpBase, load_dump
from .llamacpp import llamacpp_kind, load_llamacpp
from .shards import ShardedDump, is_sharded

__all__ = ["open_dump"]


def open_dump(source, *, client=None, verify_integrity: bool = True) -> DumpBase:
    """Open the dump at ``source`` (module docstring: an ``.npz`` file, a directory of ``.npy`` files, a directory
    of shards or a sequence of shard paths, a llama.cpp base file or manifest) and check its structure.

    ``client``: a ``dask.distributed.Client`` on which the alpha pass of the dump
    (:func:`fastspec.acceptance.dump_acceptance`) runs, one task per shard (dask is never imported here).
    ``verify_integrity`` (default True): reads check the CRC-32 of stored ``.npz`` members
    (:func:`fastspec.io.load_dump`).  Use it as a context manager, or call ``close()``.  Raises
    :class:`~fastspec.errors.DumpNotFound` for a missing path, :class:`~fastspec.errors.DumpFormatError` (naming the
    file, the array and the index) for a malformed one, :class:`~fastspec.errors.InvalidType` when ``source`` is not
    a path."""
    if isinstance(source, (list, tuple)):
        return ShardedDump(source, client=client, verify_integrity=verify_integrity)
    if not isinstance(source, (str, bytes, os.PathLike)):
        raise InvalidType(f"source must be a dump path (str or os.PathLike) or a list of shard paths, got "
                          f"{type(source).__name__}", argument="source")
    path = os.fsdecode(source)
    if is_sharded(path):
        return ShardedDump(path, client=client, verify_integrity=verify_integrity)
    if llamacpp_kind(path) is not None:
        if client is not None:
            raise InvalidInput(f"{path}: llama.cpp base files are read on this machine; run without a scheduler",
                               argument="client")
        return load_llamacpp(path)
    if client is not None:
        return ShardedDump([path], client=client, verify_integrity=verify_integrity)
    return load_dump(path, verify_integrity=verify_integrity)
