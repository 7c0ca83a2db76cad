"""Logit dumps: the on-disk format, a validating loader and a bounded-memory row reader.

Format (full specification in ``data/README.md``)
--------------------------------------------------
An ``.npz`` file, or a directory of ``.npy`` files with the same names (memory-mapped).
Array names are ``<role>_<kind>[__<draft name>]``:

* dense: ``target_logits`` [N, T, V] (or [T, V]) and ``draft_logits[__name]`` of the same shape;
  float16/float32/float64 raw logits, ``-inf`` allowed (masked token), NaN and ``+inf`` refused,
  at least one finite logit per valid position;
* sparse top-k: ``target_topk_ids`` int [N, T, k] with ``target_topk_logprobs`` float [N, T, k]
  (processed log-probabilities, <= 0), and ``draft_topk_ids[__name]`` / ``draft_topk_logprobs[__name]``;
* optional: ``tokens`` int [N, T], ``lengths`` int [N] (valid positions, in [1, T]; default T), and 0-d
  metadata ``temperature``, ``top_k``, ``top_p``, ``min_p`` (how the trajectory was sampled) and
  ``vocab_size`` (sparse dumps: V, for range-checking ids and tokens).

Safety and memory
-----------------
* Nothing is ever unpickled (``allow_pickle=False`` semantics: object and structured dtypes are refused
  from the ``.npy`` header, before any data is read).
* :func:`load_dump` reads only headers and the small arrays (``tokens``, ``lengths``, metadata).  Every
  structural check (names, dtypes, ranks, N/T/V agreement, declared sizes against the bytes really there,
  zip-bomb ratios) happens before any large allocation.
* Large arrays are read in chunks of rows: ``.npy`` files and uncompressed (``np.savez``) zip members are
  memory-mapped in place; compressed (``np.savez_compressed``) members are decompressed as a stream,
  chunk by chunk.  Peak extra memory of :meth:`Dump.iter_chunks` is one chunk per array (``max_bytes``
  each, in the array's own dtype; default 64 MiB) plus, with ``validate=True``, a boolean mask of the
  same number of elements.  No float64 copy of a whole array is ever made.
* Value checks (NaN, ``+inf``, ids out of range or repeated, positive log-probabilities, rows without a
  finite entry) run on every chunk as it is read, on valid positions only (``t < lengths[n]``; padding
  is never looked at).  :meth:`Dump.validate` runs them over the whole dump.

Every failure is a ``ValueError`` naming the file, the array and the offending index.
"""
from __future__ import annotations

import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Iterator, Mapping

import numpy as np

__all__ = ["Dump", "Chunk", "ArrayInfo", "load_dump", "save_dump", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 64 << 20
_MAX_DEFLATE_RATIO = 1000  # declared size / compressed size above this is treated as a zip bomb
_SMALL_BYTES = 1 << 30  # fortran-ordered or small arrays above this are refused instead of loaded whole
_LOGPROB_SUM_TOL = 1e-3  # sum(exp(topk_logprobs)) may exceed 1 by this much (float16/32 rounding)

_NAME_RE = re.compile(r"^(target|draft)_(logits|topk_ids|topk_logprobs)(?:__([A-Za-z0-9][A-Za-z0-9_.\-]*))?$")
_META = ("temperature", "top_k", "top_p", "min_p", "vocab_size")
_FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


DRAFT_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.\-]*"


def check_draft_name(name, what: str = "draft name") -> str:
    """``name`` if it is a valid draft name (letters, digits, '_', '.', '-'; starts with a letter or digit; no
    '__', which separates the role from the name in array names), else InvalidInput."""
    from .errors import InvalidInput

    if not isinstance(name, str) or not re.fullmatch(DRAFT_NAME_PATTERN, name) or "__" in name:
        raise InvalidInput(f"{what} {name!r} is invalid: use letters, digits, '_', '.' and '-' (starting with a "
                           "letter or digit, no '__')")
    return name


def _err(file: str, msg: str) -> ValueError:
    return ValueError(f"{file}: {msg}")


# --------------------------------------------------------------------------------------------------
# Array sources: where the bytes of one array live.
# --------------------------------------------------------------------------------------------------
class _Source:
    name: str
    shape: tuple
    dtype: np.dtype
    fortran: bool
    storage: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def read_all(self) -> np.ndarray:
        raise NotImplementedError

    def read_rows(self, r0: int, r1: int, width: int) -> np.ndarray:
        """Rows [r0, r1) of the array viewed as [rows, width] (C order)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class _MemorySource(_Source):
    def __init__(self, name, arr):
        self.name, self.arr = name, np.ascontiguousarray(arr)
        self.shape, self.dtype, self.fortran, self.storage = self.arr.shape, self.arr.dtype, False, "memory"

    def read_all(self):
        return self.arr

    def read_rows(self, r0, r1, width):
        return self.arr.reshape(-1, width)[r0:r1]


class _MapSource(_Source):
    """An array stored uncompressed at ``offset`` in ``file`` (a .npy file or a stored zip member)."""

    def __init__(self, name, file, offset, shape, dtype, fortran, storage):
        self.name, self.file, self.offset = name, file, offset
        self.shape, self.dtype, self.fortran, self.storage = shape, dtype, fortran, storage
        self._mm = None

    def _map(self):
        if self._mm is None:
            self._mm = np.memmap(self.file, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape,
                                 order="F" if self.fortran else "C")
        return self._mm

    def read_all(self):
        return np.ascontiguousarray(self._map())

    def read_rows(self, r0, r1, width):
        if self.fortran:  # column-major: one C-order copy (<= 1 GiB, checked), reused for every chunk
            if getattr(self, "_c_order", None) is None:
                self._c_order = np.ascontiguousarray(self._map()).reshape(-1, width)
            return self._c_order[r0:r1]
        return np.asarray(self._map()).reshape(-1, width)[r0:r1]

    def close(self):
        self._mm = None
        self._c_order = None


class _StreamSource(_Source):
    """A deflated zip member: decompressed sequentially, one chunk of rows at a time."""

    def __init__(self, name, file, zf, member, shape, dtype, fortran, header_len):
        self.name, self.file, self.zf, self.member = name, file, zf, member
        self.shape, self.dtype, self.fortran, self.storage = shape, dtype, fortran, "npz-deflated"
        self.header_len = header_len
        self._fh = None
        self._pos = 0  # next row

    def _read(self, fh, nbytes):
        try:
            buf = fh.read(nbytes)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            raise _err(self.file, f"array {self.name!r}: corrupt compressed data ({exc})") from None
        if len(buf) != nbytes:
            raise _err(self.file, f"array {self.name!r}: truncated, {len(buf)} of {nbytes} bytes present")
        return buf

    def _open(self):
        if self._fh is not None:
            self._fh.close()
        self._fh = self.zf.open(self.member)
        self._read(self._fh, self.header_len)
        self._pos = 0

    def read_all(self):
        self._open()
        buf = self._read(self._fh, self.nbytes)
        self._fh.close()
        self._fh = None
        return np.frombuffer(buf, dtype=self.dtype).reshape(self.shape, order="F" if self.fortran else "C").copy()

    def read_rows(self, r0, r1, width):
        if self.fortran:  # a column-major stream cannot be cut into rows: read it whole once (<= 1 GiB, checked)
            if getattr(self, "_c_order", None) is None:
                self._c_order = np.ascontiguousarray(self.read_all()).reshape(-1, width)
            return self._c_order[r0:r1]
        if self._fh is None or r0 < self._pos:
            self._open()
        if r0 > self._pos:  # skip forward
            self._read(self._fh, (r0 - self._pos) * width * self.dtype.itemsize)
        buf = self._read(self._fh, (r1 - r0) * width * self.dtype.itemsize)
        self._pos = r1
        return np.frombuffer(buf, dtype=self.dtype).reshape(r1 - r0, width)

    def close(self):
        self._c_order = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _parse_npy_header(fh, file, name):
    """(shape, dtype, fortran, header_len) from an open binary stream positioned at a .npy start."""
    try:
        start = fh.tell() if hasattr(fh, "tell") else 0
        version = np.lib.format.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
        else:
            raise ValueError(f"unsupported .npy version {version}")
        header_len = fh.tell() - start
    except (ValueError, EOFError, OSError, zipfile.BadZipFile, zlib.error, SyntaxError, TypeError) as exc:
        raise _err(file, f"array {name!r}: not a valid .npy header ({' '.join(str(exc).split())})") from None
    dtype = np.dtype(dtype)
    if dtype.hasobject:
        raise _err(file, f"array {name!r}: object arrays are refused (they need pickle); save plain numbers")
    if dtype.fields is not None or dtype.subdtype is not None:
        raise _err(file, f"array {name!r}: structured dtype {dtype} is not supported; save plain numbers")
    return tuple(int(s) for s in shape), dtype, bool(fortran), header_len


def _open_sources(path: str):
    """Sources for every array of the dump at ``path``; structural checks on sizes only."""
    sources: dict[str, _Source] = {}
    if os.path.isdir(path):
        names = sorted(f for f in os.listdir(path) if f.endswith(".npy"))
        if not names:
            raise _err(path, "directory holds no .npy arrays; expected target_logits.npy, draft_logits.npy, ...")
        for f in names:
            full = os.path.join(path, f)
            name = f[:-4]
            with open(full, "rb") as fh:
                shape, dtype, fortran, hlen = _parse_npy_header(fh, path, name)
            size = os.path.getsize(full)
            need = hlen + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if size < need:
                raise _err(path, f"array {name!r}: file {f} is truncated ({size} bytes, header declares {need})")
            sources[name] = _MapSource(name, full, hlen, shape, dtype, fortran, "npy")
        return sources, None
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such file or directory")
    if not zipfile.is_zipfile(path):
        raise _err(path, "not an .npz (zip) archive nor a directory of .npy files (truncated or corrupt?)")
    try:
        zf = zipfile.ZipFile(path)
        infos = zf.infolist()
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, NotImplementedError) as exc:
        raise _err(path, f"corrupt or truncated .npz archive ({exc})") from None
    file_size = os.path.getsize(path)
    try:
        with open(path, "rb") as raw:
            for info in infos:
                fname = info.filename
                if not fname.endswith(".npy") or "/" in fname:
                    raise _err(path, f"member {fname!r} is not a top-level .npy array; an .npz dump holds only arrays")
                name = fname[:-4]
                if name in sources:
                    raise _err(path, f"array {name!r} appears twice in the archive")
                if info.flag_bits & 0x1:
                    raise _err(path, f"array {name!r}: encrypted members are not supported")
                if info.compress_type == zipfile.ZIP_STORED:
                    if info.compress_size != info.file_size:
                        raise _err(path, f"array {name!r}: stored member sizes disagree (corrupt archive)")
                    raw.seek(info.header_offset)
                    local = raw.read(30)
                    if len(local) < 30 or local[:4] != b"PK\x03\x04":
                        raise _err(path, f"array {name!r}: bad local header (corrupt or truncated archive)")
                    nlen, elen = struct.unpack("<HH", local[26:30])
                    data_off = info.header_offset + 30 + nlen + elen
                    raw.seek(data_off)
                    shape, dtype, fortran, hlen = _parse_npy_header(raw, path, name)
                    need = hlen + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                    if need != info.file_size:
                        raise _err(path, f"array {name!r}: header declares {need} bytes but the member holds "
                                         f"{info.file_size}")
                    if data_off + need > file_size:
                        raise _err(path, f"array {name!r}: truncated (member ends past the end of the file)")
                    src = _MapSource(name, path, data_off + hlen, shape, dtype, fortran, "npz-stored")
                    src.crc = (data_off, info.file_size, info.CRC)
                    sources[name] = src
                elif info.compress_type == zipfile.ZIP_DEFLATED:
                    if info.file_size > _MAX_DEFLATE_RATIO * max(info.compress_size, 1) + (1 << 20) or \
                            info.file_size > _MAX_DEFLATE_RATIO * file_size + (1 << 20):
                        raise _err(path, f"array {name!r}: declares {info.file_size} bytes from {info.compress_size} "
                                         f"compressed (ratio above {_MAX_DEFLATE_RATIO}); refusing a likely zip bomb")
                    with zf.open(info) as fh:
                        shape, dtype, fortran, hlen = _parse_npy_header(fh, path, name)
                    need = hlen + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                    if need != info.file_size:
                        raise _err(path, f"array {name!r}: header declares {need} bytes but the member holds "
                                         f"{info.file_size}")
                    sources[name] = _StreamSource(name, path, zf, info, shape, dtype, fortran, hlen)
                else:
                    raise _err(path, f"array {name!r}: unsupported zip compression {info.compress_type}; "
                                     "use np.savez or np.savez_compressed")
    except (zipfile.BadZipFile, zlib.error, EOFError, struct.error) as exc:
        raise _err(path, f"corrupt or truncated .npz archive ({exc})") from None
    if not sources:
        raise _err(path, "archive holds no arrays")
    return sources, zf


# --------------------------------------------------------------------------------------------------
# The dump object
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ArrayInfo:
    name: str
    shape: tuple
    dtype: str
    nbytes: int
    storage: str  # "npy" (memory-mapped), "npz-stored" (memory-mapped), "npz-deflated" (streamed), "memory"


@dataclass
class Chunk:
    """Flat rows ``[start, stop)`` of the dump (row ``r`` is sequence ``r // T``, position ``r % T``).

    ``target`` and each ``drafts[name]`` are ``[rows, V]`` logits (dense) or ``(ids, logprobs)`` pairs of
    ``[rows, k]`` arrays (sparse), in the dump's dtype (memory-mapped views where possible: read-only).
    ``valid[i]`` is False for padding rows (``t >= lengths[n]``), which are never validated.
    """

    start: int
    stop: int
    valid: np.ndarray
    target: object
    drafts: dict = field(default_factory=dict)


def _role_key(role: str, draft: str | None) -> str:
    return "target" if role == "target" else f"draft:{draft}"


class Dump:
    """A validated logit dump.  Use :func:`load_dump`; close it (or use ``with``) to release files.

    Attributes: ``path``, ``kind`` ("dense" or "sparse"), ``drafts`` (tuple of names), ``N``, ``T``, ``V``
    (None for a sparse dump without ``vocab_size``), ``k`` (dict role -> k, sparse only), ``lengths``
    (int64 [N]), ``tokens`` (int64 [N, T] or None), ``metadata`` (dict), ``arrays`` (name -> ArrayInfo),
    ``size_on_disk`` (bytes).
    """

    def __init__(self, path: str, sources: Mapping[str, _Source], zf=None):
        self.path = str(path)
        self._sources = dict(sources)
        self._zf = zf
        self._roles: dict[str, dict[str, _Source]] = {}
        try:
            self._check_structure()
        except Exception:
            self.close()
            raise

    # ---- structure ---------------------------------------------------------------------------
    def _check_structure(self) -> None:
        f = self.path
        roles: dict[str, dict[str, _Source]] = {}
        extras: dict[str, _Source] = {}
        for name, src in self._sources.items():
            m = _NAME_RE.match(name)
            if m:
                role, kind, draft = m.group(1), m.group(2), m.group(3)
                if role == "target" and draft is not None:
                    raise _err(f, f"array {name!r}: the target takes no __name suffix; call it target_{kind}")
                roles.setdefault(_role_key(role, draft or "draft"), {})[kind] = src
            elif name in ("tokens", "lengths") or name in _META:
                extras[name] = src
            else:
                raise _err(f, f"array {name!r}: unknown name; expected target_logits, draft_logits[__name], "
                              "target_topk_ids/target_topk_logprobs, draft_topk_ids[__name]/draft_topk_logprobs"
                              f"[__name], tokens, lengths or metadata {', '.join(_META)}")
            if any(s == 0 for s in src.shape):
                raise _err(f, f"array {name!r}: empty array (shape {list(src.shape)})")
        if "target" not in roles:
            raise _err(f, "missing the target: expected target_logits or target_topk_ids + target_topk_logprobs")
        drafts = sorted(k[6:] for k in roles if k.startswith("draft:"))
        if not drafts:
            raise _err(f, "no draft arrays: expected draft_logits[__name] or draft_topk_ids/logprobs[__name]")
        kinds = {}
        for key, parts in roles.items():
            if "logits" in parts:
                if len(parts) > 1:
                    raise _err(f, f"{key}: has both dense logits and sparse top-k arrays; keep one kind per dump")
                kinds[key] = "dense"
            else:
                for need in ("topk_ids", "topk_logprobs"):
                    if need not in parts:
                        other = next(iter(parts.values())).name
                        base = other.replace("topk_ids", need).replace("topk_logprobs", need)
                        raise _err(f, f"array {base!r} is missing (it goes with {other!r})")
                kinds[key] = "sparse"
        if len(set(kinds.values())) > 1:
            raise _err(f, "mixes dense logits and sparse top-k arrays across roles; use one kind for all roles")
        self.kind = kinds["target"]
        self.drafts = tuple(drafts)

        # ranks, dtypes, shapes
        lead = None
        self.k: dict[str, int] = {}
        V = None
        for key, parts in roles.items():
            for kind, src in parts.items():
                if src.shape and len(src.shape) not in (2, 3):
                    raise _err(f, f"array {src.name!r}: rank {len(src.shape)} (shape {list(src.shape)}); "
                                  "expected [N, T, V] or [T, V]")
                if not src.shape:
                    raise _err(f, f"array {src.name!r}: is a scalar; expected [N, T, V] or [T, V]")
                if kind in ("logits", "topk_logprobs") and src.dtype not in _FLOATS:
                    raise _err(f, f"array {src.name!r}: dtype {src.dtype}; expected float16, float32 or float64")
                if kind == "topk_ids" and src.dtype.kind not in "iu":
                    raise _err(f, f"array {src.name!r}: dtype {src.dtype}; expected an integer dtype")
                if src.fortran and src.nbytes > _SMALL_BYTES:
                    raise _err(f, f"array {src.name!r}: Fortran-ordered and large; re-save it C-contiguous")
                if lead is None:
                    lead = src.shape[:-1]
                    lead_name = src.name
                elif src.shape[:-1] != lead:
                    raise _err(f, f"array {src.name!r}: shape {list(src.shape)} disagrees with {lead_name!r} "
                                  f"on the leading [N, T] dims {list(lead)}")
            if self.kind == "dense":
                v = parts["logits"].shape[-1]
                if V is None:
                    V = v
                elif v != V:
                    raise _err(f, f"array {parts['logits'].name!r}: vocabulary {v} differs from the target's {V}")
            else:
                if parts["topk_ids"].shape != parts["topk_logprobs"].shape:
                    raise _err(f, f"arrays {parts['topk_ids'].name!r} {list(parts['topk_ids'].shape)} and "
                                  f"{parts['topk_logprobs'].name!r} {list(parts['topk_logprobs'].shape)} differ in shape")
                self.k[key] = parts["topk_ids"].shape[-1]
        self.rank3 = len(lead) == 2
        self.N, self.T = (lead[0], lead[1]) if self.rank3 else (1, lead[0])
        self._roles = roles

        # metadata
        meta: dict[str, object] = {}
        for name in _META:
            if name not in extras:
                continue
            src = extras[name]
            if src.shape not in ((), (1,)):
                raise _err(f, f"array {name!r}: metadata must be a scalar, got shape {list(src.shape)}")
            val = src.read_all().reshape(())
            if val.dtype.kind not in "iuf" or not np.isfinite(val):
                raise _err(f, f"array {name!r}: must be a finite number, got {val!r}")
            if name in ("top_k", "vocab_size"):
                if val.dtype.kind == "f" and val != np.floor(val):
                    raise _err(f, f"array {name!r}: must be an integer, got {val}")
                val = int(val)
            else:
                val = float(val)
            ok = {"temperature": val >= 0, "top_k": 0 <= val < 2 ** 63, "top_p": 0 < val <= 1, "min_p": 0 <= val < 1,
                  "vocab_size": 1 <= val < 2 ** 63}[name]
            if not ok:
                raise _err(f, f"array {name!r}: value {val} out of range")
            meta[name] = val
        self.metadata = meta
        if self.kind == "dense":
            if "vocab_size" in meta and meta["vocab_size"] != V:
                raise _err(f, f"array 'vocab_size': {meta['vocab_size']} but the logits have V = {V}")
            self.V = V
        else:
            self.V = meta.get("vocab_size")
            if self.V is not None:
                for key, kk in self.k.items():
                    if kk > self.V:
                        raise _err(f, f"{key}: k = {kk} exceeds vocab_size {self.V}")

        # lengths and tokens
        N, T = self.N, self.T
        if "lengths" in extras:
            src = extras["lengths"]
            if src.dtype.kind not in "iu":
                raise _err(f, f"array 'lengths': dtype {src.dtype}; expected integers")
            if src.shape != (N,):
                raise _err(f, f"array 'lengths': shape {list(src.shape)}; expected [{N}] (one per sequence)")
            lengths = src.read_all().astype(np.int64)
            bad = np.flatnonzero((lengths < 1) | (lengths > T))
            if bad.size:
                raise _err(f, f"array 'lengths': index {bad[0]} is {lengths[bad[0]]}; lengths must be in [1, {T}]")
        else:
            lengths = np.full(N, T, dtype=np.int64)
        self.lengths = lengths
        self.tokens = None
        if "tokens" in extras:
            src = extras["tokens"]
            want = (N, T) if self.rank3 else (T,)
            if src.dtype.kind not in "iu":
                raise _err(f, f"array 'tokens': dtype {src.dtype}; expected integers")
            if src.shape != want:
                raise _err(f, f"array 'tokens': shape {list(src.shape)}; expected {list(want)}")
            tok = src.read_all().astype(np.int64).reshape(N, T)
            valid = np.arange(T)[None, :] < lengths[:, None]
            hi = self.V if self.V is not None else np.iinfo(np.int64).max
            bad = np.argwhere(valid & ((tok < 0) | (tok >= hi)))
            if bad.size:
                n, t = bad[0]
                raise _err(f, f"array 'tokens': index {self._idx(n, t)} is {tok[n, t]}; token ids must be in "
                              f"[0, {self.V if self.V is not None else 'V'})")
            self.tokens = tok

    def _idx(self, n, t):
        return f"[{n}, {t}]" if self.rank3 else f"[{t}]"

    # ---- public ------------------------------------------------------------------------------
    @classmethod
    def from_arrays(cls, arrays, path: str = "<arrays>") -> "Dump":
        """A dump of in-memory arrays (structure checked like a file's)."""
        return cls(path, {k: _MemorySource(k, np.asarray(a)) for k, a in arrays.items()})

    @property
    def arrays(self) -> dict[str, ArrayInfo]:
        return {n: ArrayInfo(n, tuple(s.shape), str(s.dtype), s.nbytes, s.storage) for n, s in self._sources.items()}

    @property
    def size_on_disk(self) -> int:
        if os.path.isdir(self.path):
            return sum(os.path.getsize(os.path.join(self.path, f)) for f in os.listdir(self.path)
                       if f.endswith(".npy"))
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def array_name(self, role: str, kind: str) -> str:
        """Name of the array holding ``kind`` for ``role`` ("target" or a draft name)."""
        key = "target" if role == "target" else f"draft:{role}"
        return self._roles[key][kind].name

    def _parts(self, key):
        return self._roles[key]

    def row_width(self) -> int:
        """Elements per row of the widest large array (V for dense, max k for sparse)."""
        return self.V if self.kind == "dense" else max(self.k.values())

    def iter_chunks(self, *, drafts=None, max_bytes: int = DEFAULT_CHUNK_BYTES, validate: bool = True
                    ) -> Iterator[Chunk]:
        """Yield :class:`Chunk` objects covering all N*T rows in order, ``max_bytes`` per array at most."""
        names = self.drafts if drafts is None else tuple(drafts)
        for d in names:
            if f"draft:{d}" not in self._roles:
                raise ValueError(f"{self.path}: no draft named {d!r}; the dump holds {', '.join(self.drafts)}")
        keys = ["target"] + [f"draft:{d}" for d in names]
        srcs = [s for key in keys for s in self._roles[key].values()]
        row_bytes = max(s.nbytes // (self.N * self.T) for s in srcs)
        rows = max(1, int(max_bytes) // max(row_bytes, 1))
        R = self.N * self.T
        t_idx = np.arange(R) % self.T
        n_idx = np.arange(R) // self.T
        for r0 in range(0, R, rows):
            r1 = min(R, r0 + rows)
            valid = t_idx[r0:r1] < self.lengths[n_idx[r0:r1]]
            got = {}
            for key in keys:
                parts = self._roles[key]
                if self.kind == "dense":
                    src = parts["logits"]
                    a = src.read_rows(r0, r1, src.shape[-1])
                    if validate:
                        self._check_dense(src.name, a, valid, r0)
                    got[key] = a
                else:
                    si, sl = parts["topk_ids"], parts["topk_logprobs"]
                    ids = si.read_rows(r0, r1, si.shape[-1])
                    lp = sl.read_rows(r0, r1, sl.shape[-1])
                    if validate:
                        self._check_sparse(si.name, sl.name, ids, lp, valid, r0)
                    got[key] = (ids, lp)
            yield Chunk(r0, r1, valid, got["target"], {d: got[f"draft:{d}"] for d in names})

    def where(self, row: int) -> str:
        """Human index ``[n, t]`` of flat row ``row``."""
        return self._idx(row // self.T, row % self.T)

    def _check_dense(self, name, a, valid, r0):
        f = self.path
        bad = np.isnan(a)
        bad &= valid[:, None]
        if bad.any():
            i, v = np.argwhere(bad)[0]
            raise _err(f, f"array {name!r}: NaN at index {self.where(r0 + i)[:-1]}, {v}]; logits must not be NaN")
        bad = np.isposinf(a)
        bad &= valid[:, None]
        if bad.any():
            i, v = np.argwhere(bad)[0]
            raise _err(f, f"array {name!r}: +inf at index {self.where(r0 + i)[:-1]}, {v}]; logits must be finite "
                          "or -inf (masked)")
        empty = ~np.isfinite(a).any(axis=1) & valid
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            raise _err(f, f"array {name!r}: row {self.where(r0 + i)} has no finite logit (all tokens masked)")

    def _check_sparse(self, iname, lname, ids, lp, valid, r0):
        f = self.path
        hi = self.V
        bad = (ids < 0) if hi is None else ((ids < 0) | (ids >= hi))
        bad &= valid[:, None]
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise _err(f, f"array {iname!r}: id {ids[i, j]} at index {self.where(r0 + i)[:-1]}, {j}] is outside "
                          f"[0, {hi if hi is not None else 'V'})")
        if ids.shape[1] > 1:
            s = np.sort(ids, axis=1)
            dup = (s[:, 1:] == s[:, :-1]).any(axis=1) & valid
            if dup.any():
                i = int(np.flatnonzero(dup)[0])
                raise _err(f, f"array {iname!r}: row {self.where(r0 + i)} lists an id twice; top-k ids must be distinct")
        bad = (np.isnan(lp) | (lp > 0)) & valid[:, None]
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise _err(f, f"array {lname!r}: value {lp[i, j]} at index {self.where(r0 + i)[:-1]}, {j}]; "
                          "log-probabilities must be <= 0 and not NaN")
        empty = ~np.isfinite(lp).any(axis=1) & valid
        if empty.any():
            i = int(np.flatnonzero(empty)[0])
            raise _err(f, f"array {lname!r}: row {self.where(r0 + i)} has no finite log-probability")
        tot = np.exp(lp.astype(np.float64)).sum(axis=1)
        over = (tot > 1.0 + _LOGPROB_SUM_TOL) & valid
        if over.any():
            i = int(np.flatnonzero(over)[0])
            raise _err(f, f"array {lname!r}: row {self.where(r0 + i)} has probabilities summing to {tot[i]:.6g} > 1; "
                          "expected log-probabilities under the full-vocabulary distribution")

    def validate(self, *, max_bytes: int = DEFAULT_CHUNK_BYTES) -> "Dump":
        """Check every value of every array (one bounded-memory pass); returns ``self``.

        Uncompressed zip members are also checked against their CRC-32 (compressed members are checked
        by the decompressor as they are streamed), so a damaged archive is refused, not analysed.
        """
        for src in self._sources.values():
            crc = getattr(src, "crc", None)
            if crc is None:
                continue
            off, size, want = crc
            got = 0
            with open(src.file, "rb") as fh:
                fh.seek(off)
                left = size
                while left:
                    buf = fh.read(min(left, 16 << 20))
                    if not buf:
                        raise _err(self.path, f"array {src.name!r}: truncated")
                    got = zlib.crc32(buf, got)
                    left -= len(buf)
            if got != want:
                raise _err(self.path, f"array {src.name!r}: CRC-32 mismatch; the archive is damaged")
        for _ in self.iter_chunks(max_bytes=max_bytes, validate=True):
            pass
        return self

    def describe(self) -> dict:
        """Plain-data summary: arrays, kind, drafts, N, T, V, k, metadata, size on disk."""
        return {
            "path": self.path,
            "format": "directory of .npy" if os.path.isdir(self.path) else (
                "memory" if not os.path.exists(self.path) else ".npz"),
            "kind": self.kind,
            "drafts": list(self.drafts),
            "N": self.N, "T": self.T, "V": self.V,
            "k": {key.replace("draft:", ""): v for key, v in self.k.items()} if self.kind == "sparse" else None,
            "valid_positions": int(self.lengths.sum()),
            "has_tokens": self.tokens is not None,
            "metadata": dict(self.metadata),
            "size_on_disk": self.size_on_disk,
            "arrays": [{"name": a.name, "shape": list(a.shape), "dtype": a.dtype, "nbytes": a.nbytes,
                        "storage": a.storage} for a in sorted(self.arrays.values(), key=lambda a: a.name)],
        }

    def close(self) -> None:
        for s in self._sources.values():
            s.close()
        if self._zf is not None:
            self._zf.close()
            self._zf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (f"Dump({self.path!r}, kind={self.kind}, drafts={list(self.drafts)}, N={self.N}, T={self.T}, "
                f"V={self.V})")


def load_dump(path, *, validate: bool = False, max_bytes: int = DEFAULT_CHUNK_BYTES) -> Dump:
    """Open the dump at ``path`` (``.npz`` file or directory of ``.npy``) and check its structure.

    Only headers and the small arrays are read.  Values of the large arrays are checked chunk by chunk
    as :meth:`Dump.iter_chunks` reads them; pass ``validate=True`` to check them all now (one pass).
    Raises ``ValueError`` (naming file, array and index) for anything malformed, ``FileNotFoundError``
    when ``path`` does not exist.
    """
    path = os.fspath(path)
    sources, zf = _open_sources(path)
    try:
        dump = Dump(path, sources, zf)
    except Exception:
        if zf is not None:
            zf.close()
        raise
    if validate:
        try:
            dump.validate(max_bytes=max_bytes)
        except Exception:
            dump.close()
            raise
    return dump


def _dump_arrays(target, drafts, tokens, lengths, meta) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}

    def put(role, draft, value, argname):
        suffix = "" if draft in (None, "draft") else f"__{draft}"
        if isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"{argname}: a sparse role is a pair (topk_ids, topk_logprobs)")
            out[f"{role}_topk_ids{suffix}"] = np.asarray(value[0])
            out[f"{role}_topk_logprobs{suffix}"] = np.asarray(value[1])
        else:
            out[f"{role}_logits{suffix}"] = np.asarray(value)

    put("target", None, target, "target")
    if isinstance(drafts, Mapping):
        if not drafts:
            raise ValueError("drafts: give at least one draft")
        for name, value in drafts.items():
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", name) or "__" in name:
                raise ValueError(f"drafts: name {name!r} must be letters, digits, '_', '.', '-' (no '__')")
            put("draft", name, value, f"drafts[{name!r}]")
    else:
        put("draft", None, drafts, "drafts")
    if tokens is not None:
        out["tokens"] = np.asarray(tokens)
    if lengths is not None:
        out["lengths"] = np.asarray(lengths)
    for k, v in meta.items():
        if v is not None:
            out[k] = np.asarray(v)
    for k, a in out.items():
        if a.dtype.hasobject:
            raise TypeError(f"array {k!r}: object arrays cannot be saved; give numeric arrays")
    return out


def save_dump(path, target, drafts, *, tokens=None, lengths=None, temperature=None, top_k=None, top_p=None,
              min_p=None, vocab_size=None, layout: str = "auto", compressed: bool = False) -> str:
    """Validate and write a dump; returns the path written.

    ``target``: dense logits [N, T, V] / [T, V], or a sparse pair ``(topk_ids, topk_logprobs)``.
    ``drafts``: one such value (saved as the draft named ``draft``) or a mapping ``name -> value``.
    ``layout``: "npz" (one zip; ``compressed=True`` deflates it), "dir" (a directory of ``.npy``, which
    can be memory-mapped) or "auto" (a path ending in ``.npz`` is a zip, otherwise a directory).
    The arrays go through exactly the checks :func:`load_dump` applies, before anything is written.
    """
    path = os.fspath(path)
    meta = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, vocab_size=vocab_size)
    arrays = _dump_arrays(target, drafts, tokens, lengths, meta)
    Dump(path, {k: _MemorySource(k, a) for k, a in arrays.items()}).validate()
    if layout == "auto":
        layout = "npz" if path.endswith(".npz") else "dir"
    if layout == "npz":
        if not path.endswith(".npz"):
            raise ValueError(f"path {path!r}: an npz layout needs a name ending in .npz")
        (np.savez_compressed if compressed else np.savez)(path, **arrays)
    elif layout == "dir":
        os.makedirs(path, exist_ok=True)
        for k, a in arrays.items():
            np.save(os.path.join(path, k + ".npy"), a, allow_pickle=False)
    else:
        raise ValueError(f"layout must be 'auto', 'npz' or 'dir', got {layout!r}")
    return path
