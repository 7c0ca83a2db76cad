"""CRC-32 (zlib's) of large buffers on several cores.

``zlib.crc32`` runs at a few GB/s on one core and releases the GIL, so a large buffer is cut into blocks whose
CRCs are computed by a thread pool (one thread per core, at most :data:`MAX_THREADS`) and joined with zlib's
``crc32_combine`` rule: appending ``n`` bytes to a message multiplies its CRC register by a fixed GF(2) matrix
(the operator of ``n`` zero bytes, built from the one-bit operator by repeated squaring, cached per length),
then XORs the CRC of the appended bytes.  The result is bit for bit ``zlib.crc32`` of the whole buffer.
"""
from __future__ import annotations

import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

__all__ = ["crc32", "BLOCK"]

#: bytes per block handed to a thread (large enough that joining costs nothing next to computing)
BLOCK = 8 << 20
#: at most this many threads: beyond it memory bandwidth, not the CPU, bounds a CRC, and every thread reserves
#: address space (a stack, a malloc arena)
MAX_THREADS = 8
_POLY = 0xEDB88320  # CRC-32's reflected polynomial
_IDENTITY = tuple(1 << i for i in range(32))
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _cores() -> int:
    from ..machine import available_cpus

    return available_cpus()


def _threads() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=min(_cores(), MAX_THREADS), thread_name_prefix="fastspec-crc32")
        return _pool


def _forget_pool() -> None:
    """In a forked child the pool's threads do not exist: start a new pool (and lock) there when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _times(mat, vec: int) -> int:
    """``mat`` (the images of the 32 unit vectors) applied to ``vec``, over GF(2)."""
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _after(a, b) -> tuple:
    """The operator ``a`` applied after ``b``."""
    return tuple(_times(a, col) for col in b)


@lru_cache(maxsize=64)
def _zeros(nbytes: int) -> tuple:
    """The operator that appends ``nbytes`` zero bytes to a CRC-32."""
    op = (_POLY,) + _IDENTITY[:31]  # one zero bit
    for _ in range(3):
        op = _after(op, op)  # one zero byte
    out = _IDENTITY
    while nbytes:
        if nbytes & 1:
            out = _after(op, out)
        nbytes >>= 1
        if nbytes:
            op = _after(op, op)
    return out


def crc32(data, crc: int = 0) -> int:
    """``zlib.crc32(data, crc)`` for a C-contiguous buffer ``data`` (e.g. a uint8 array), on all cores when it is
    large."""
    n = memoryview(data).nbytes
    if n <= 2 * BLOCK or _cores() == 1:
        return zlib.crc32(data, crc)
    view = memoryview(data).cast("B")
    blocks = [view[i:i + BLOCK] for i in range(0, n, BLOCK)]
    for block, part in zip(blocks, _threads().map(zlib.crc32, blocks), strict=True):
        crc = _times(_zeros(len(block)), crc) ^ part
    return crc
