"""Where the bytes of one array live, and how rows of it are read.

* :class:`MemorySource` -- an array already in memory (:meth:`fastspec.io.Dump.from_arrays`, ``save_dump``);
* :class:`MapSource` -- uncompressed bytes at an offset of a file (a ``.npy`` file, or a stored member of an
  ``np.savez`` archive): each chunk of rows is memory-mapped on its own (:func:`fastspec.io.files.map_bytes`) and
  unmapped when its last view is dropped; a stored member's CRC-32 is computed as its chunks are read in order
  and checked at its last byte (``verify=True``);
* :class:`StreamSource` -- a deflated member of an ``np.savez_compressed`` archive: decompressed as a stream,
  one chunk of rows at a time (reading backwards reopens the stream).

:func:`open_sources` builds them for every array at a path after checking, from the headers alone, that each
declared size matches the bytes present (and refusing likely zip bombs), before any large allocation.  Only
regular files (and directories of them) are opened (:func:`fastspec.io.files.entry_kind`).
Nothing is ever unpickled: object and structured dtypes are refused from the ``.npy`` header.
"""
from __future__ import annotations

import math
import os
import struct
import zipfile
import zlib

import numpy as np

from ..config import MAX_DEFLATE_RATIO
from ..errors import DumpFormatError, DumpNotFound
from .crc import crc32
from .files import DIRECTORY, MISSING, REGULAR, entry_kind, map_bytes, open_regular
from .format import format_error
from .zipdir import check_directory

__all__ = ["Source", "MemorySource", "MapSource", "StreamSource", "parse_npy_header", "open_sources"]

#: what zipfile/zlib raise on a damaged archive (ValueError: e.g. a member name that is not UTF-8 as flagged);
#: reading a member also raises OSError for damaged data
_ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, struct.error, NotImplementedError, ValueError)
_READ_ERRORS = _ZIP_ERRORS + (OSError,)


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * dtype.itemsize  # Python integers: no int64 wrap-around


class Source:
    """One array: ``name``, ``shape``, ``dtype``, ``fortran`` (column-major), ``storage`` (for ArrayInfo)."""

    name: str
    shape: tuple
    dtype: np.dtype
    fortran: bool = False
    storage: str

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)

    def read_all(self, verify: bool = False) -> np.ndarray:
        """The whole array (a copy); ``verify`` checks the member's CRC-32 where the archive stores one."""
        raise NotImplementedError

    def read_rows(self, r0: int, r1: int, width: int, verify: bool = False) -> np.ndarray:
        """Rows [r0, r1) of the array viewed as [rows, width] (C order).  With ``verify``, a pass that reads every
        row in order checks the member's CRC-32 before it returns the last rows."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class MemorySource(Source):
    storage = "memory"

    def __init__(self, name: str, arr: np.ndarray):
        self.name, self.arr = name, np.ascontiguousarray(arr)
        self.shape, self.dtype = self.arr.shape, self.arr.dtype

    def read_all(self, verify=False):  # noqa: ARG002 - nothing to verify in memory
        return self.arr

    def read_rows(self, r0, r1, width, verify=False):  # noqa: ARG002 - nothing to verify in memory
        return self.arr.reshape(-1, width)[r0:r1]


class _WholeOnce(Source):
    """A column-major array cannot be cut into C-order rows: it is read whole once (its size is capped by the
    structure checks) and every chunk is a slice of that copy."""

    _c_order = None

    def _rows_of_whole(self, r0, r1, width, verify):
        if self._c_order is None:
            self._c_order = np.ascontiguousarray(self.read_all(verify)).reshape(-1, width)
        return self._c_order[r0:r1]

    def close(self):
        self._c_order = None


class MapSource(_WholeOnce):
    """An array stored uncompressed at ``offset`` in ``file`` (a .npy file or a stored zip member).

    ``crc``: ``(member start, CRC-32)`` of a stored zip member (its .npy header starts at ``member start``), else
    None.  The CRC runs over the header, then each chunk's bytes as they are mapped, and is compared when the
    last byte has been read; a pass that skips or rereads rows is not checked (:meth:`Dump.iter_chunks` never
    does either).
    """

    def __init__(self, name, file, offset, shape, dtype, fortran, storage, crc=None):
        self.name, self.file, self.offset = name, file, offset
        self.shape, self.dtype, self.fortran, self.storage = shape, dtype, fortran, storage
        self.crc = crc
        self._running = None  # (next data byte, CRC-32 so far) while a pass reads the member in order

    def _bytes(self, start, n):
        return map_bytes(self.file, self.offset + start, n, self.name)

    def _feed(self, start, raw):
        """Fold data bytes ``[start, start + raw.size)`` into the running CRC-32; compare after the last byte."""
        if start == 0:
            head = self.crc[0]
            self._running = (0, zlib.crc32(map_bytes(self.file, head, self.offset - head, self.name)))
        if self._running is None or self._running[0] != start:
            self._running = None  # not read in order: this pass cannot check the member
            return
        end, got = start + raw.size, crc32(raw, self._running[1])
        self._running = None if end == self.nbytes else (end, got)
        if end == self.nbytes and got != self.crc[1]:
            raise format_error(self.file, f"array {self.name!r}: CRC-32 mismatch (the archive records "
                                          f"{self.crc[1]:08x}, the bytes give {got:08x}): the archive is damaged")

    def read_all(self, verify=False):
        raw = self._bytes(0, self.nbytes)
        if verify and self.crc is not None:
            self._feed(0, raw)
        return np.array(raw.view(self.dtype).reshape(self.shape, order="F" if self.fortran else "C"), order="C")

    def read_rows(self, r0, r1, width, verify=False):
        if self.fortran:
            return self._rows_of_whole(r0, r1, width, verify)
        row = width * self.dtype.itemsize
        raw = self._bytes(r0 * row, (r1 - r0) * row)
        if verify and self.crc is not None:
            self._feed(r0 * row, raw)
        return raw.view(self.dtype).reshape(r1 - r0, width)

    def close(self):
        super().close()
        self._running = None


class StreamSource(_WholeOnce):
    """A deflated zip member: decompressed sequentially, one chunk of rows at a time."""

    storage = "npz-deflated"

    def __init__(self, name, file, zf, member, shape, dtype, fortran, header_len):
        self.name, self.file, self.zf, self.member = name, file, zf, member
        self.shape, self.dtype, self.fortran = shape, dtype, fortran
        self.header_len = header_len
        self._fh = None
        self._pos = 0  # next row

    def _read(self, nbytes):
        try:
            buf = self._fh.read(nbytes)
        except _READ_ERRORS as exc:
            raise format_error(self.file, f"array {self.name!r}: corrupt compressed data ({exc})") from None
        if len(buf) != nbytes:
            raise format_error(self.file, f"array {self.name!r}: truncated, {len(buf)} of {nbytes} bytes present")
        return buf

    def _open(self):
        self._close_stream()
        try:
            self._fh = self.zf.open(self.member)
        except _READ_ERRORS as exc:
            raise format_error(self.file, f"array {self.name!r}: corrupt archive ({exc})") from None
        self._read(self.header_len)
        self._pos = 0

    def _close_stream(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def read_all(self, verify=False):  # noqa: ARG002 - zipfile checks the CRC-32 of all it decompresses
        self._open()
        buf = self._read(self.nbytes)
        self._close_stream()
        return np.frombuffer(buf, dtype=self.dtype).reshape(self.shape, order="F" if self.fortran else "C").copy()

    def read_rows(self, r0, r1, width, verify=False):
        if self.fortran:
            return self._rows_of_whole(r0, r1, width, verify)
        if self._fh is None or r0 < self._pos:
            self._open()
        row_bytes = width * self.dtype.itemsize
        if r0 > self._pos:  # skip forward
            self._read((r0 - self._pos) * row_bytes)
        buf = self._read((r1 - r0) * row_bytes)
        self._pos = r1
        return np.frombuffer(buf, dtype=self.dtype).reshape(r1 - r0, width)

    def close(self):
        super().close()
        self._close_stream()


def parse_npy_header(fh, file: str, name: str):
    """(shape, dtype, fortran, header_len) from an open binary stream positioned at a .npy start."""
    try:
        start = fh.tell()
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        header_len = fh.tell() - start
    except Exception as exc:  # noqa: BLE001 - untrusted header text: every parser failure is a format error
        raise format_error(file, f"array {name!r}: not a valid .npy header ({' '.join(str(exc).split())})") from None
    dtype = np.dtype(dtype)
    if dtype.itemsize == 0:
        raise format_error(file, f"array {name!r}: dtype {dtype} has no size; save plain numbers")
    if dtype.hasobject:
        raise format_error(file, f"array {name!r}: object arrays are refused (they need pickle); save plain numbers")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise format_error(file, f"array {name!r}: structured dtype {dtype} is not supported; save plain numbers")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise format_error(file, f"array {name!r}: negative dimension in shape {list(shape)}")
    return shape, dtype, bool(fortran), header_len


def _check_declared(file, name, need, have):
    if need != have:
        raise format_error(file, f"array {name!r}: header declares {need} bytes but the member holds {have}")


def _open_directory(path: str) -> dict[str, Source]:
    """Every ``*.npy`` entry (names starting with '.' are ignored) is an array and must be a regular file."""
    names = sorted(f for f in os.listdir(path) if f.endswith(".npy") and not f.startswith("."))
    if not names:
        raise format_error(path, "directory holds no .npy arrays; expected target_logits.npy, draft_logits.npy, ...")
    sources: dict[str, Source] = {}
    for f in names:
        full, name = os.path.join(path, f), f[:-4]
        kind = entry_kind(full)
        if kind != REGULAR:
            raise format_error(path, f"array {name!r}: {f} is {kind}, not a regular file")
        with open_regular(full, name) as fh:
            shape, dtype, fortran, hlen = parse_npy_header(fh, path, name)
        size, need = os.path.getsize(full), hlen + _nbytes(shape, dtype)
        if size < need:
            raise format_error(path, f"array {name!r}: file {f} is truncated ({size} bytes, header declares {need})")
        sources[name] = MapSource(name, full, hlen, shape, dtype, fortran, "npy")
    return sources


def _stored_member(path, raw, info, name, data_off) -> MapSource:
    """An uncompressed member whose data start at ``data_off`` (after its local header, checked by
    :func:`fastspec.io.zipdir.check_directory`); mapped in place."""
    if info.compress_size != info.file_size:
        raise format_error(path, f"array {name!r}: stored member sizes disagree (corrupt archive)")
    raw.seek(data_off)
    shape, dtype, fortran, hlen = parse_npy_header(raw, path, name)
    need = hlen + _nbytes(shape, dtype)
    _check_declared(path, name, need, info.file_size)
    return MapSource(name, path, data_off + hlen, shape, dtype, fortran, "npz-stored", crc=(data_off, info.CRC))


def _deflated_member(path, zf, info, name, file_size) -> StreamSource:
    """A compressed member: refused when its declared size is implausible (zip bomb); streamed."""
    slack = 1 << 20
    if info.file_size > MAX_DEFLATE_RATIO * max(info.compress_size, 1) + slack or \
            info.file_size > MAX_DEFLATE_RATIO * file_size + slack:
        raise format_error(path, f"array {name!r}: declares {info.file_size} bytes from {info.compress_size} "
                                 f"compressed (ratio above {MAX_DEFLATE_RATIO}); refusing a likely zip bomb")
    with zf.open(info) as fh:
        shape, dtype, fortran, hlen = parse_npy_header(fh, path, name)
    _check_declared(path, name, hlen + _nbytes(shape, dtype), info.file_size)
    return StreamSource(name, path, zf, info, shape, dtype, fortran, hlen)


def _open_zip(path: str, zf: zipfile.ZipFile) -> dict[str, Source]:
    sources: dict[str, Source] = {}
    file_size = os.path.getsize(path)
    with open(path, "rb") as raw:
        data_offsets = check_directory(path, zf, raw, file_size)
        for info, data_off in zip(zf.infolist(), data_offsets, strict=True):
            fname = info.filename
            if not fname.endswith(".npy") or "/" in fname:
                raise format_error(path, f"member {fname!r} is not a top-level .npy array; an .npz dump holds only "
                                         "arrays")
            name = fname[:-4]
            if name in sources:
                raise format_error(path, f"array {name!r} appears twice in the archive")
            if info.flag_bits & 0x1:
                raise format_error(path, f"array {name!r}: encrypted members are not supported")
            if info.compress_type == zipfile.ZIP_STORED:
                sources[name] = _stored_member(path, raw, info, name, data_off)
            elif info.compress_type == zipfile.ZIP_DEFLATED:
                sources[name] = _deflated_member(path, zf, info, name, file_size)
            else:
                raise format_error(path, f"array {name!r}: unsupported zip compression {info.compress_type}; "
                                         "use np.savez or np.savez_compressed")
    if not sources:
        raise format_error(path, "archive holds no arrays")
    return sources


def open_sources(path: str):
    """``(sources, zipfile or None)`` for every array of the dump at ``path`` (checks on sizes only).

    ``path`` must be a regular file (an .npz) or a directory; anything else is refused before it is opened."""
    kind = entry_kind(path)
    if kind == DIRECTORY:
        return _open_directory(path), None
    if kind == MISSING:
        raise DumpNotFound(f"{path}: no such file or directory")
    if kind == "a dangling symbolic link":
        raise DumpNotFound(f"{path}: a dangling symbolic link (its target does not exist)")
    if kind != REGULAR:
        raise format_error(path, f"is {kind}, not a regular file or a directory; a dump is an .npz file or a "
                                 "directory of .npy files")
    try:
        is_zip = zipfile.is_zipfile(path)
    except _READ_ERRORS as exc:  # a damaged zip64 locator raises from the test itself
        raise format_error(path, f"corrupt or truncated .npz archive ({exc})") from None
    if not is_zip:
        raise format_error(path, "not an .npz (zip) archive nor a directory of .npy files (truncated or corrupt?)")
    try:
        zf = zipfile.ZipFile(path)
    except _READ_ERRORS as exc:
        raise format_error(path, f"corrupt or truncated .npz archive ({exc})") from None
    try:
        return _open_zip(path, zf), zf
    except BaseException as exc:
        zf.close()
        if isinstance(exc, _ZIP_ERRORS) and not isinstance(exc, DumpFormatError):
            raise format_error(path, f"corrupt or truncated .npz archive ({exc})") from None
        raise
