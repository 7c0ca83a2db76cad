"""Writing a dump: :func:`save_dump` validates the arrays with the loader's own checks, then writes them."""
from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np

from ..errors import InvalidInput, InvalidType
from ..params import NAMES, sampling_overrides
from .dump import Dump
from .format import SPARSE_KINDS, array_name, check_draft_name

__all__ = ["save_dump", "check_dump_path"]

_LAYOUTS = ("auto", "npz", "dir")


def _role_arrays(out: dict, role: str, draft: str | None, value, argname: str) -> None:
    if isinstance(value, tuple):
        if len(value) != 2:
            raise InvalidInput(f"{argname}: a sparse role is a pair (topk_ids, topk_logprobs)", argument=argname)
        for kind, part in zip(SPARSE_KINDS, value, strict=True):
            out[array_name(role, kind, draft)] = np.asarray(part)
    else:
        out[array_name(role, "logits", draft)] = np.asarray(value)


def _dump_arrays(target, drafts, tokens, lengths, meta) -> dict[str, np.ndarray]:
    """The dump's arrays, named as in a file."""
    out: dict[str, np.ndarray] = {}
    _role_arrays(out, "target", None, target, "target")
    if drafts is None:
        pass  # a target-only dump
    elif isinstance(drafts, Mapping):
        for name, value in drafts.items():
            check_draft_name(name, "drafts: name")
            _role_arrays(out, "draft", name, value, f"drafts[{name!r}]")
    else:
        _role_arrays(out, "draft", None, drafts, "drafts")
    for name, value in (("tokens", tokens), ("lengths", lengths), *meta.items()):
        if value is not None:
            out[name] = np.asarray(value)
    return out


def _costs_array(costs) -> np.ndarray:
    """The 0-d string array ``costs`` from a :class:`fastspec.costs.CostTable`, a dict or JSON text (validated)."""
    from ..costs.table import CostTable

    if isinstance(costs, CostTable):
        table = costs
    elif isinstance(costs, str):
        table = CostTable.from_json(costs)
    elif isinstance(costs, Mapping):
        table = CostTable.from_dict(costs)
    else:
        raise InvalidType(f"costs must be a fastspec.costs.CostTable, a dict or JSON text, got {type(costs).__name__}",
                          argument="costs")
    return np.asarray(table.to_json())


def _known_arrays(out: dict, sampled_logprobs, extras) -> None:
    """``<role>_sampled_logprob`` and ``<role>_extra_ids`` / ``_extra_logprobs`` from {"target" or draft: ...}."""
    for argname, given in (("sampled_logprobs", sampled_logprobs), ("extras", extras)):
        if given is None:
            continue
        if not isinstance(given, Mapping):
            raise InvalidType(f"{argname} must be a mapping 'target' or draft name -> array(s), got "
                              f"{type(given).__name__}", argument=argname)
        for who, value in given.items():
            if who != "target":
                check_draft_name(who, f"{argname}: name")
            role, draft = ("target", None) if who == "target" else ("draft", who)
            if argname == "sampled_logprobs":
                out[array_name(role, "sampled_logprob", draft)] = np.asarray(value)
                continue
            if not isinstance(value, tuple) or len(value) != 2:
                raise InvalidInput(f"extras[{who!r}]: a pair (extra_ids, extra_logprobs)", argument="extras")
            out[array_name(role, "extra_ids", draft)] = np.asarray(value[0])
            out[array_name(role, "extra_logprobs", draft)] = np.asarray(value[1])


def _provenance_array(provenance) -> np.ndarray:
    if isinstance(provenance, str):
        text = provenance
    elif isinstance(provenance, Mapping):
        try:
            text = json.dumps(provenance, allow_nan=False, sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"provenance: not JSON-serializable ({exc})", argument="provenance") from None
    else:
        raise InvalidType(f"provenance must be a dict or JSON text, got {type(provenance).__name__}",
                          argument="provenance")
    return np.asarray(text)


def save_dump(path, target, drafts, *, tokens=None, lengths=None, temperature=None, top_k=None, top_p=None,
              min_p=None, vocab_size=None, layout: str = "auto", compressed: bool = False, prompt_tokens=None,
              prompt_lengths=None, ignore_eos=None, costs=None, sampled_logprobs=None, extras=None,
              logprobs_mode=None, provenance=None, sampling=None) -> str:
    """Validate and write a dump; returns the path written.

    ``target``: dense logits [N, T, V] / [T, V], or a sparse pair ``(topk_ids, topk_logprobs)``.
    ``drafts``: one such value (saved as the draft named ``draft``), a mapping ``name -> value``, or None / an
    empty mapping (a target-only dump).  Optional: ``prompt_tokens`` int [N, P] (padded) with ``prompt_lengths``
    int [N]; ``ignore_eos`` (bool metadata: the trajectories ran past EOS tokens); ``costs``: a
    :class:`fastspec.costs.CostTable` (or its dict / JSON), stored as the 0-d string array ``costs``.
    Sparse dumps, optional (:mod:`fastspec.io.known`): ``sampled_logprobs`` {"target" or draft name: float
    [N, T]} (the logprob of ``tokens`` at each position), ``extras`` {"target" or draft name: (ids [N, T, m],
    logprobs [N, T, m])} (ids outside the top-k with known logprobs; id -1 / logprob -inf in unused slots),
    ``logprobs_mode`` ("raw" or "processed") and ``provenance`` (a dict or JSON text of an object).  The sampling
    the trajectories were drawn with is recorded from ``sampling`` (a :class:`fastspec.SamplingParams`, all four
    settings) or ``temperature`` / ``top_k`` / ``top_p`` / ``min_p`` (None: not recorded), not both.
    ``layout``: "npz" (one zip; ``compressed=True`` deflates it), "dir" (a directory of ``.npy``, which
    can be memory-mapped) or "auto" (a path ending in ``.npz`` is a zip, otherwise a directory).
    The arrays go through exactly the checks :func:`fastspec.io.load_dump` applies, before anything is written.
    """
    try:
        path = os.fspath(path)
    except TypeError:
        raise InvalidType(f"path must be a str or os.PathLike, got {type(path).__name__}", argument="path") from None
    if layout not in _LAYOUTS:
        raise InvalidInput(f"layout must be 'auto', 'npz' or 'dir', got {layout!r}", argument="layout")
    if layout == "auto":
        layout = "npz" if path.endswith(".npz") else "dir"
    if layout == "npz" and not path.endswith(".npz"):
        raise InvalidInput(f"path {path!r}: an npz layout needs a name ending in .npz", argument="path")
    if sampling is not None:
        given = sampling_overrides(sampling, dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p))
        temperature, top_k, top_p, min_p = (given[name] for name in NAMES)
    meta = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, vocab_size=vocab_size,
                prompt_tokens=prompt_tokens, prompt_lengths=prompt_lengths,
                ignore_eos=None if ignore_eos is None else bool(ignore_eos))
    arrays = _dump_arrays(target, drafts, tokens, lengths, meta)
    if costs is not None:
        arrays["costs"] = _costs_array(costs)
    _known_arrays(arrays, sampled_logprobs, extras)
    if logprobs_mode is not None:
        arrays["logprobs_mode"] = np.asarray(str(logprobs_mode))
    if provenance is not None:
        arrays["provenance"] = _provenance_array(provenance)
    Dump.from_arrays(arrays, path).validate()
    if layout == "npz":
        (np.savez_compressed if compressed else np.savez)(path, **arrays)
    else:
        os.makedirs(path, exist_ok=True)
        for name, a in arrays.items():
            np.save(os.path.join(path, name + ".npy"), a, allow_pickle=False)
    return path


def check_dump_path(out) -> str:
    """``out`` as a path a new dump can be written to, else InvalidInput: an ``.npz`` file (overwritten if it
    exists), or a directory that does not exist yet or is empty; its parent directory must exist."""
    out = os.fspath(out)
    parent = os.path.dirname(os.path.normpath(out))  # as typed: relative stays relative
    if not os.path.isdir(parent or "."):
        raise InvalidInput(f"out {out!r}: directory {parent} does not exist")
    if os.path.basename(os.path.normpath(out)).startswith("."):
        raise InvalidInput(f"out {out!r}: a name starting with '.' is never read as a shard and is reserved for "
                           "temporary files; choose another name")
    if os.path.isdir(out):
        if out.endswith(".npz"):
            raise InvalidInput(f"out {out!r} is a directory; an .npz dump is a file")
        if os.listdir(out):
            raise InvalidInput(f"out {out!r} is a directory that is not empty; remove it or choose a new path "
                               "(a dump directory holds only its own .npy arrays)")
    elif os.path.exists(out) and not out.endswith(".npz"):
        raise InvalidInput(f"out {out!r} exists and is not a directory; a dump is an .npz file or a directory")
    return out
