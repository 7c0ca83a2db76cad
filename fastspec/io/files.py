"""What the loader may open, and how it maps bytes.

* :func:`entry_kind` -- what a path is, from ``os.stat`` alone (nothing is opened): only regular files and
  directories are ever read.  A FIFO would block ``open()`` forever and a device (``/dev/zero``) never ends, so
  they, sockets and dangling symbolic links are refused by name before any read.
* :func:`open_regular` -- opens what :func:`entry_kind` passed, without blocking (``O_NONBLOCK``), and refuses it
  if it is no longer a regular file (the path changed in between);
* :func:`map_bytes` -- a read-only view of a byte range of a regular file, memory-mapped for as long as the view
  (or an array made from it) is alive, so only the chunks in use stay mapped: a dump larger than the address
  space is processed chunk by chunk.
"""
from __future__ import annotations

import errno
import mmap
import os
import stat

import numpy as np

from .format import format_error

__all__ = ["REGULAR", "DIRECTORY", "MISSING", "entry_kind", "open_regular", "map_bytes", "atomic_write_text"]

REGULAR, DIRECTORY, MISSING = "a regular file", "a directory", "missing"
_OTHER = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
#: opening never blocks, whatever the path has become since it was checked (a regular file ignores the flag)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def entry_kind(path: str) -> str:
    """What ``path`` is, following symbolic links: :data:`REGULAR`, :data:`DIRECTORY`, :data:`MISSING`, or a
    description of anything else ("a FIFO (named pipe)", "a dangling symbolic link", ...).  Opens nothing."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symbolic link" if os.path.islink(path) else MISSING
    except OSError as exc:  # a link loop, a name too long, no permission on a parent directory
        return f"not readable ({exc.strerror})"
    except ValueError:  # a NUL byte: no file system takes the name
        return "not a valid path (it holds a NUL byte)"
    if stat.S_ISREG(mode):
        return REGULAR
    if stat.S_ISDIR(mode):
        return DIRECTORY
    return next((what for test, what in _OTHER if test(mode)), "not a regular file")


def _open_regular(file: str, name: str) -> int:
    """A read-only descriptor of ``file``, opened without blocking and refused unless it is still a regular file
    (the path was checked with :func:`entry_kind`; this closes the window in which it could have changed)."""
    fd = os.open(file, os.O_RDONLY | _NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise format_error(file, f"array {name!r}: no longer a regular file; the dump changed while it was read")
    return fd


def open_regular(file: str, name: str):
    """A binary file object of regular file ``file`` (array ``name``, for messages); never blocks."""
    return os.fdopen(_open_regular(file, name), "rb")


def map_bytes(file: str, start: int, n: int, name: str) -> np.ndarray:
    """A read-only uint8 view of bytes ``[start, start + n)`` of regular file ``file`` (array ``name``, for
    messages), mapped until the last array made from it is gone."""
    if n == 0:
        return np.empty(0, np.uint8)
    fd = _open_regular(file, name)
    try:
        size = os.fstat(fd).st_size
        if start + n > size:
            raise format_error(file, f"array {name!r}: truncated: bytes up to {start + n} are needed, the file now "
                                     f"holds {size}; the dump changed while it was read")
        base = start - start % mmap.ALLOCATIONGRANULARITY
        try:
            mm = mmap.mmap(fd, start + n - base, access=mmap.ACCESS_READ, offset=base)
        except OSError as exc:
            if exc.errno == errno.ENOMEM:
                raise MemoryError(f"{file}: array {name!r}: cannot map {n} bytes ({exc.strerror}); the address "
                                  "space left is smaller than one chunk of rows") from None
            raise
    finally:
        os.close(fd)
    return np.frombuffer(mm, np.uint8, n, start - base)


def atomic_write_text(path, text: str) -> str:
    """Write ``text`` (UTF-8) to ``path`` atomically: a temporary file in the same directory, flushed to disk,
    then renamed over ``path`` -- a reader (or a crash) never sees a half-written file, and a failure leaves
    ``path`` as it was (the temporary file is removed).  Returns ``path`` as a string."""
    import tempfile

    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make the file private
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # the rename itself survives a power cut once the directory is synced (POSIX; not on Windows)
        dfd = os.open(parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
    return path
