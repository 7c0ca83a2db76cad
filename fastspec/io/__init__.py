"""Logit dumps: the on-disk format, a validating loader and a bounded-memory row reader.

Format (full specification in ``docs/reference/dump-format.md``)
----------------------------------------------------------------
An ``.npz`` file, or a directory of ``.npy`` files with the same names (memory-mapped).
Array names are ``<role>_<kind>[__<draft name>]``:

* dense: ``target_logits`` [N, T, V] (or [T, V]) and ``draft_logits[__name]`` of the same shape;
  float16/float32/float64 raw logits, ``-inf`` allowed (masked token), NaN and ``+inf`` refused,
  at least one finite logit per valid position;
* sparse top-k: ``target_topk_ids`` int [N, T, k] with ``target_topk_logprobs`` float [N, T, k]
  (processed log-probabilities, <= 0), and ``draft_topk_ids[__name]`` / ``draft_topk_logprobs[__name]``;
* optional: ``tokens`` int [N, T], ``lengths`` int [N] (valid positions, in [1, T]; default T), and 0-d
  metadata ``temperature``, ``top_k``, ``top_p``, ``min_p`` (how the trajectory was sampled; the ranges of
  :class:`fastspec.params.SamplingParams`) and ``vocab_size`` (sparse dumps: V, for range-checking ids and tokens);
* optional, sparse dumps: ``<role>_sampled_logprob`` [N, T] (the recorded token's logprob) and
  ``<role>_extra_ids`` / ``<role>_extra_logprobs`` [N, T, m] (ids outside the top-k known exactly), which tighten
  the α bounds; 0-d text ``logprobs_mode`` and ``provenance`` (:mod:`~fastspec.io.known`).

Safety and memory
-----------------
* Nothing is ever unpickled (``allow_pickle=False`` semantics: object and structured dtypes are refused
  from the ``.npy`` header, before any data is read).  Only regular files and directories are opened: a FIFO,
  a device or a dangling link is refused from ``os.stat`` before any read (:mod:`~fastspec.io.files`).
* :func:`load_dump` reads only headers and the small arrays (``tokens``, ``lengths``, metadata).  Every
  structural check (names, dtypes, ranks, N/T/V agreement, declared sizes against the bytes really there,
  zip-bomb ratios, absurd shapes) happens before any large allocation.
* Large arrays are read in chunks of rows: ``.npy`` files and uncompressed (``np.savez``) zip members are
  memory-mapped in place one chunk at a time (each chunk's mapping is released with its last view, so what is
  mapped is bounded by the chunks in use, not by the dump); compressed (``np.savez_compressed``) members are
  decompressed as a stream, chunk by chunk.  Peak extra memory of :meth:`Dump.iter_chunks` is one chunk per
  array (``max_bytes`` each, in the array's own dtype; default :data:`DEFAULT_CHUNK_BYTES`) plus, with
  ``validate=True``, a boolean mask of the same number of elements.  No float64 copy of a whole array is ever
  made.
* Zip structure: an ``.npz`` whose central directory disagrees with its end record (the number of members, where
  the directory lies), with its members' local headers (offset, name) or with the file (overlapping members,
  bytes no entry lists, bytes after the end record) is refused before any member is used
  (:mod:`~fastspec.io.zipdir`): zipfile would silently list fewer members.
* Integrity: the CRC-32 of every uncompressed zip member is checked as it is read (``verify_integrity=True``,
  the default of :func:`load_dump` and :meth:`Dump.iter_chunks`; :mod:`~fastspec.io.crc` computes it on all
  cores); deflated members are checked by the decompressor.
* Value checks (NaN, ``+inf``, ids out of range or repeated, positive log-probabilities, rows without a
  finite entry) run on every chunk as it is read, on valid positions only (``t < lengths[n]``; padding
  is never looked at).  :meth:`Dump.validate` runs them over the whole dump.

Every failure is a :class:`fastspec.errors.DumpFormatError` (a ``ValueError``) naming the file, the array and
the offending index; a missing path is :class:`fastspec.errors.DumpNotFound` (also a ``FileNotFoundError``).

Modules: :mod:`~fastspec.io.format` (names and rules), :mod:`~fastspec.io.sources` (where an array's bytes
live), :mod:`~fastspec.io.zipdir` (an ``.npz``'s zip directory checked against its end records and local
headers), :mod:`~fastspec.io.files` (what may be opened; chunk mappings), :mod:`~fastspec.io.crc` (CRC-32 on all
cores), :mod:`~fastspec.io.structure`, :mod:`~fastspec.io.values` and :mod:`~fastspec.io.known` (the checks),
:mod:`~fastspec.io.dump` (:class:`Dump`, :func:`load_dump`), :mod:`~fastspec.io.save` (:func:`save_dump`),
:mod:`~fastspec.io.shards` (a directory of dumps seen as one), :mod:`~fastspec.io.llamacpp` (llama.cpp's
``--kl-divergence-base`` files) and :mod:`~fastspec.io.opener` (:func:`open_dump`, the one opener of all of them:
use it unless you need a format's own loader, e.g. :func:`load_dump`'s ``validate=``).  The package is formats
only: it never imports an analysis (what a dump's numbers mean lives in :mod:`fastspec.acceptance` and above).
"""
from __future__ import annotations

from ..config import DEFAULT_CHUNK_BYTES
from .dump import ArrayInfo, Chunk, Dump, DumpBase, load_dump
from .format import DRAFT_NAME_PATTERN, check_draft_name
from .opener import open_dump
from .save import check_dump_path, save_dump
from .shards import ShardedDump

__all__ = ["open_dump", "check_dump_path", "Dump", "DumpBase", "ShardedDump", "Chunk", "ArrayInfo", "load_dump",
           "save_dump", "DEFAULT_CHUNK_BYTES", "DRAFT_NAME_PATTERN", "check_draft_name"]
