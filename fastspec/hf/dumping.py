"""Logit dumps from real models: what :func:`fastspec.simulate` and the acceptance analysis read.

For each prompt a continuation is sampled from the target; then every model is run teacher-forced over
prompt + continuation and, for each generated position t, the logits that predict token t are recorded (dense
float16) or the top-K processed log-probabilities (sparse), in the dump format of ``data/README.md``, written
with :func:`fastspec.io.save_dump` (so validation is shared with the loader).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import InvalidInput
from ..io import check_draft_name, save_dump
from ..params import SamplingParams
from ..processing import probabilities
from .args import check_max_new_tokens, positive_int
from .loop import derive_seed, generate, teacher_forced_logits
from .models import check_vocab_size

__all__ = ["dump_logits", "check_dump_path"]


def check_dump_path(out) -> str:
    """``out`` as a path a new dump can be written to, else InvalidInput: an ``.npz`` file (overwritten if it
    exists), or a directory that does not exist yet or is empty; its parent directory must exist."""
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise InvalidInput(f"out {out!r}: directory {parent} does not exist")
    if os.path.isdir(out):
        if out.endswith(".npz"):
            raise InvalidInput(f"out {out!r} is a directory; an .npz dump is a file")
        if os.listdir(out):
            raise InvalidInput(f"out {out!r} is a directory that is not empty; remove it or choose a new path "
                               "(a dump directory holds only its own .npy arrays)")
    elif os.path.exists(out) and not out.endswith(".npz"):
        raise InvalidInput(f"out {out!r} exists and is not a directory; a dump is an .npz file or a directory")
    return out


def _topk(logits: np.ndarray, kk: int, params: SamplingParams):
    """(ids int32 [T, kk], logprobs float32 [T, kk]) of the processed distribution, largest first."""
    p = probabilities(logits, **params.as_dict())
    kk = min(kk, p.shape[-1])
    idx = np.argpartition(-p, kk - 1, axis=-1)[:, :kk]
    pv = np.take_along_axis(p, idx, axis=-1)
    order = np.argsort(-pv, axis=-1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=-1)
    pv = np.take_along_axis(pv, order, axis=-1)
    with np.errstate(divide="ignore"):
        lp = np.log(pv)
    return idx.astype(np.int32), np.minimum(lp, 0.0).astype(np.float32)


def _assemble(tmp: str, roles: int, lengths: list[int], suffix: str, shape_tail: tuple, dtype) -> list[np.ndarray]:
    """One memory-mapped padded array [N, T, *shape_tail] per role from the per-prompt ``.npy`` parts."""
    N, T = len(lengths), max(lengths)
    arrs = []
    for r in range(roles):
        a = np.lib.format.open_memmap(os.path.join(tmp, f"all_{r}{suffix}.npy"), mode="w+", dtype=dtype,
                                      shape=(N, T) + shape_tail)
        for i in range(N):
            part = np.load(os.path.join(tmp, f"{i}_{r}{suffix}.npy"), mmap_mode="r")
            a[i, :len(part)] = part
            a[i, len(part):] = part[-1]  # padding: never read, but keep it valid-looking
        a.flush()
        arrs.append(a)
    return arrs


def dump_logits(out, target, drafts: Mapping, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 128,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                top_k_save: int | None = None, seed: int = 0, eos_token_id=None, compressed: bool | None = None,
                progress: Callable[[int], None] | None = None, workdir=None) -> str:
    """Write a logit dump of ``target`` and ``drafts`` ({name: model}) over ``prompts`` (lists of token ids).

    For prompt i a continuation is sampled from the target (:func:`fastspec.hf.generate` under the sampling
    parameters, seed :func:`fastspec.hf.loop.derive_seed` (seed, i)); then every model is run teacher-forced
    over prompt + continuation.  Dense (default): raw float16 logits [N, T, V].  ``top_k_save=K``: sparse top-K
    (ids int32, processed log-probabilities float32 under the sampling parameters).  Also written: ``tokens``
    [N, T], ``lengths`` [N], temperature/top_k/top_p/min_p and vocab_size.  Memory: each prompt's arrays go to
    ``.npy`` files in a temporary directory (under ``workdir``, default the system's) as soon as they are
    computed; at the end they are copied into memory-mapped padded arrays and written by
    :func:`fastspec.io.save_dump` (streams from the memory maps), so peak memory is one prompt's logits plus
    the writer's buffers, not the dump.  ``compressed`` (npz only) defaults to True for sparse dumps.
    ``progress(1)`` is called after each prompt.  Returns the path written."""
    params = SamplingParams(temperature, top_k, top_p, min_p)
    n_new = check_max_new_tokens(max_new_tokens)
    if not drafts:
        raise InvalidInput("drafts: give at least one draft model")
    for name in drafts:
        check_draft_name(name)
    top_k_save = None if top_k_save is None else positive_int("top_k_save", top_k_save)
    if not prompts:
        raise InvalidInput("prompts: give at least one prompt")
    out = check_dump_path(out)
    for name, m in drafts.items():
        check_vocab_size(target, m, name)
    sparse = top_k_save is not None
    roles = [target, *drafts.values()]
    tmp = tempfile.mkdtemp(prefix="fastspec-dump-", dir=workdir)
    try:
        lengths, V = [], None
        for i, prompt in enumerate(prompts):
            cont = generate(target, prompt, **params.as_dict(), seed=derive_seed(seed, i), max_new_tokens=n_new,
                            eos_token_id=eos_token_id)
            np.save(os.path.join(tmp, f"{i}_tokens.npy"), cont)
            lengths.append(len(cont))
            for r, m in enumerate(roles):
                lg = teacher_forced_logits(m, prompt, cont)
                V = lg.shape[-1]
                if sparse:
                    ids, lp = _topk(lg, top_k_save, params)
                    np.save(os.path.join(tmp, f"{i}_{r}_ids.npy"), ids)
                    np.save(os.path.join(tmp, f"{i}_{r}_lp.npy"), lp)
                else:
                    np.save(os.path.join(tmp, f"{i}_{r}_logits.npy"), lg.astype(np.float16))
                del lg
            if progress is not None:
                progress(1)
        if sparse:
            kk = min(top_k_save, V)
            ids = _assemble(tmp, len(roles), lengths, "_ids", (kk,), np.int32)
            lps = _assemble(tmp, len(roles), lengths, "_lp", (kk,), np.float32)
            values = list(zip(ids, lps, strict=True))
        else:
            values = _assemble(tmp, len(roles), lengths, "_logits", (V,), np.float16)
        tokens = np.zeros((len(prompts), max(lengths)), np.int64)
        for i in range(len(prompts)):
            c = np.load(os.path.join(tmp, f"{i}_tokens.npy"))
            tokens[i, :len(c)] = c
        if compressed is None:
            compressed = sparse
        save_dump(out, values[0], dict(zip(drafts, values[1:], strict=True)), tokens=tokens,
                  lengths=np.asarray(lengths, np.int64),
                  **params.as_dict(), vocab_size=V, compressed=bool(compressed) and out.endswith(".npz"))
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
