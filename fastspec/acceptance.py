"""Acceptance rates: dense alpha, sparse alpha bounds, and both over whole dumps with bounded memory.

For a position with target distribution p and draft distribution q (both after the same temperature / top-k /
top-p / min-p processing), the probability that token-level speculative sampling accepts the draft token is
``alpha = sum_v min(p(v), q(v)) = 1 - TV(p, q)``.  Temperature 0 is greedy: alpha = 1 if the two argmaxes
(lowest index on ties) agree, else 0.  What the alphas predict (tokens per verify step, speed-up) is in
:mod:`fastspec.analysis`, re-exported here.

Sparse top-k dumps
------------------
When only the top-k (ids, log-probabilities) of each distribution are known, alpha is not determined.  With
S_p, S_q the listed sets, A = S_p & S_q, B = S_p - S_q, C = S_q - S_p, r_p = 1 - sum_{S_p} p and
r_q = 1 - sum_{S_q} q the unlisted masses, and p_min = min_{S_p} p, q_min = min_{S_q} q (every unlisted
token has at most the smallest listed probability, because the lists are the top k):

* lower = sum_A min(p, q)  (the unlisted mass may be spread over tokens the other model gives 0);
* upper = sum_A min(p, q) + min(min(b, r_q) + r_p, min(c, r_p) + r_q, b + c + min(r_p, r_q),
  1 - sum_A min(p,q) - 1/2 [sum_A |p - q| + sum_B (p - q_min)^+ + sum_C (q - p_min)^+])
  with b = sum_B min(p, q_min) and c = sum_C min(q, p_min) (each term bounds the unknown part of the sum).

Both are exact when k covers the whole support.  Sampling settings that need the full vocabulary are refused.

Known beyond the top-k.  A dump may also know some probabilities outside a side's top-k list exactly: extra ids
(``<role>_extra_ids`` / ``_extra_logprobs``, e.g. the other side's top-k ids scored by a server that returns
the logprobs of given ids) and the recorded token's own logprob (``<role>_sampled_logprob``).  Let K_p be
everything known of p (top-k plus extras plus the recorded token).  The derivation above holds with S_p, S_q
replaced by K_p, K_q, with r_p = 1 - sum_{K_p} p, and with p_min, q_min still the smallest *top-k* probabilities:
it only uses that every id outside K_p has p <= p_min (true: it is outside the top-k) and that those ids carry
the mass r_p.  (Taking p_min over K_p instead would be wrong: an extra id may lie far below the top-k, while an
unknown id can sit just under the k-th.)  Each such interval contains alpha; the one reported is its
intersection with the plain top-k interval, so it is never wider (:func:`fastspec._kernels.known`).  Greedy
analysis (temperature 0) compares the top-1 ids as before.
The page that explains it: ``docs/guide/dumps.md``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable, ContextManager, Iterator, Sequence

import numba
import numpy as np

from ._kernels.alpha import DRAFT_STATUS, alpha_rows, bounds_rows
from ._kernels.codes import PAD
from ._kernels.known import known_bounds_rows
from .analysis import (SpecStats, alpha_summary, check_k, expected_speedup, expected_tokens_closed_form,
                       expected_tokens_per_step, optimal_k)
from . import distributed
from .config import DEFAULT_CHUNK_BYTES
from .errors import DumpFormatError, InvalidInput, InvalidType, about, config_or_settings, shown
from .io.dump import DumpBase, check_max_bytes
from .io.opener import open_dump
from .io.shards import ShardedDump
from .params import SamplingParams, SamplingSettings, per_row
from .processing import kernel_view, logits_array, read_only

__all__ = ["acceptance_rates", "acceptance_bounds", "dump_acceptance", "DraftAcceptance", "resolve_sampling",
           "inspect_dump", "InspectConfig", "DumpInspection", "DraftFigures", "ALPHA_PASS",
           # re-exported from fastspec.analysis
           "expected_tokens_per_step", "SpecStats", "expected_tokens_closed_form", "expected_speedup", "optimal_k",
           "alpha_summary"]

_WHAT = {1: "contains NaN", 2: "contains +inf", 3: "has no finite logit (all -inf)"}


def _row_status(s: int) -> int:
    """The row's own status of an alpha status: a target row's (1-3) as it is, a draft row's less DRAFT_STATUS."""
    return s if s <= DRAFT_STATUS else s - DRAFT_STATUS


def _rows(name, a):
    """[rows, V] kernel view of ``[..., V]`` logits (float16 as bits, contiguous last axis; no copy of floats)."""
    a = logits_array(name, a)
    return kernel_view(a).reshape(-1, a.shape[-1])


def _alpha(P, Q, params, valid):
    """(alpha, status) per row of the [R, V] kernel views; status as in :func:`fastspec._kernels.alpha.alpha_row`."""
    R = P.shape[0]
    out = np.empty(R)
    status = np.zeros(R, dtype=np.int8)
    if R:
        alpha_rows(P, Q, params, valid, numba.get_num_threads(), P.dtype == np.uint16 and Q.dtype == np.uint16, out,
                   status)
    return out, status


def acceptance_rates(target_logits, draft_logits, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """alpha_t = sum_v min(p_t(v), q_t(v)) for every leading index of ``[..., V]`` logits (float64 result).

    Target and draft raw logits (float16/32/64, ``-inf`` = masked) go through the same processing
    (:func:`fastspec.probabilities`); temperature 0 is greedy (alpha = 1 iff the argmaxes agree).  Parameters are
    scalars or arrays of the leading shape.  One row-parallel pass; float64 sums in a fixed order (the same
    bits wherever it runs); no probability array is materialized and float16 is never widened into a copy.
    """
    ts, ds = np.shape(target_logits), np.shape(draft_logits)
    P = _rows("target_logits", target_logits)
    Q = _rows("draft_logits", draft_logits)
    if ts != ds:
        raise InvalidInput(f"target_logits {list(ts)} and draft_logits {list(ds)} must have the same shape")
    lead = ts[:-1]
    rows = P.shape[0]
    params = per_row(rows, temperature, top_k, top_p, min_p, lead=lead)
    out, status = _alpha(P, Q, params, np.ones(rows, dtype=np.bool_))
    bad = np.flatnonzero(status)
    if bad.size:
        i, s = int(bad[0]), int(status[bad[0]])
        name = "target_logits" if s <= DRAFT_STATUS else "draft_logits"
        idx = [int(j) for j in np.unravel_index(i, lead)] if lead else []
        raise InvalidInput(f"{name} row {idx} {_WHAT[_row_status(s)]}; logits must be finite or -inf "
                           "(masked), with at least one finite value per row")
    return out.reshape(lead)


def _bounds(ti, tl, di, dl, valid, greedy):
    ti = read_only(np.ascontiguousarray(ti, dtype=np.int64))  # read-only: one compiled kernel (read_only)
    di = read_only(np.ascontiguousarray(di, dtype=np.int64))
    lo = np.empty(ti.shape[0])
    hi = np.empty(ti.shape[0])
    if ti.shape[0]:
        bounds_rows(ti, read_only(np.ascontiguousarray(tl, dtype=np.float64)), np.argsort(ti, axis=1, kind="stable"),
                    di, read_only(np.ascontiguousarray(dl, dtype=np.float64)), np.argsort(di, axis=1, kind="stable"),
                    valid, bool(greedy), lo, hi)
    return lo, hi


def _known_rows(top, extra, tok, sampled):
    """(ids int64, logprobs float64, cap) of one side's rows: its top-k, its extra known entries and the recorded
    token ``tok`` with its logprob ``sampled`` where neither lists it; unused slots (-1, -inf).  ``cap``: the
    smallest top-k probability of each row, the bound on every unknown id."""
    ids = [np.asarray(top[0], dtype=np.int64)]
    lps = [np.asarray(top[1], dtype=np.float64)]
    if extra is not None:
        ids.append(np.asarray(extra[0], dtype=np.int64))
        lps.append(np.asarray(extra[1], dtype=np.float64))
    if sampled is not None:
        tok = np.asarray(tok, dtype=np.int64)
        listed = (np.concatenate(ids, axis=1) == tok[:, None]).any(axis=1)
        ids.append(np.where(listed, PAD, tok)[:, None])
        lps.append(np.where(listed, -np.inf, np.asarray(sampled, dtype=np.float64))[:, None])
    cap = np.exp(lps[0].min(axis=1))
    return np.ascontiguousarray(np.concatenate(ids, axis=1)), np.ascontiguousarray(np.concatenate(lps, axis=1)), cap


def _tighter(lo, hi, target, draft, valid):
    """The top-k interval [lo, hi] intersected with the known-set interval of ``target`` / ``draft``
    (:func:`_known_rows` triples)."""
    (ti, tl, tc), (di, dl, dc) = target, draft
    lo2 = np.empty(ti.shape[0])
    hi2 = np.empty(ti.shape[0])
    if ti.shape[0]:
        known_bounds_rows(ti, tl, np.argsort(ti, axis=1, kind="stable"), tc, di, dl,
                          np.argsort(di, axis=1, kind="stable"), dc, valid, lo2, hi2)
    lo = np.maximum(lo, lo2)
    return lo, np.maximum(np.minimum(hi, hi2), lo)  # equal ends only where rounding made them cross


def acceptance_bounds(target_ids, target_logprobs, draft_ids, draft_logprobs, *, greedy=False, vocab_size=None,
                      target_extra=None, draft_extra=None):
    """Interval [lower, upper] that provably contains alpha from sparse top-k data, per leading index.

    ``*_ids`` int [..., k] and ``*_logprobs`` float [..., k] (log-probabilities under the full processed
    distribution; the lists must be the top k, so every unlisted token has at most the smallest listed
    probability).  The target and draft may list different k.  ``greedy=True`` compares the top-1 ids
    (exact: lower == upper).  ``target_extra`` / ``draft_extra``: optional pairs (ids [..., m], logprobs
    [..., m]) of ids outside that side's top-k whose logprobs are known exactly (unused slots: id -1, logprob
    -inf); the interval then also uses them (never wider; module docstring).  The arrays are validated like a
    sparse dump.  Returns ``(lower, upper)``.
    """
    from .io import Dump

    arrs = {}
    for name, a, kind in (("target_ids", target_ids, "i"), ("target_logprobs", target_logprobs, "f"),
                          ("draft_ids", draft_ids, "i"), ("draft_logprobs", draft_logprobs, "f")):
        a = np.asarray(a)
        if kind == "i" and (a.dtype.kind not in "iu"):
            raise InvalidType(f"{name} must be an integer array, got dtype {a.dtype}")
        if kind == "f" and a.dtype not in (np.float16, np.float32, np.float64):
            raise InvalidType(f"{name} must be a float16/float32/float64 array, got dtype {a.dtype}")
        if a.ndim < 1 or a.shape[-1] < 1:
            raise InvalidInput(f"{name} must have shape [..., k] with k >= 1, got {list(a.shape)}")
        arrs[name] = a
    if arrs["target_ids"].shape != arrs["target_logprobs"].shape:
        raise InvalidInput("target_ids and target_logprobs must have the same shape")
    if arrs["draft_ids"].shape != arrs["draft_logprobs"].shape:
        raise InvalidInput("draft_ids and draft_logprobs must have the same shape")
    lead = arrs["target_ids"].shape[:-1]
    if arrs["draft_ids"].shape[:-1] != lead:
        raise InvalidInput(f"target {list(arrs['target_ids'].shape)} and draft {list(arrs['draft_ids'].shape)} "
                           "must agree on the leading dimensions")
    rows = int(np.prod(lead)) if lead else 1
    names = {"target_topk_ids": "target_ids", "target_topk_logprobs": "target_logprobs",
             "draft_topk_ids": "draft_ids", "draft_topk_logprobs": "draft_logprobs"}
    flat = {k: arrs[v].reshape(1, rows, arrs[v].shape[-1]) for k, v in names.items()}
    for role, given in (("target", target_extra), ("draft", draft_extra)):
        if given is None:
            continue
        if not isinstance(given, (tuple, list)) or len(given) != 2:
            raise InvalidInput(f"{role}_extra must be a pair (ids, logprobs) of arrays [..., m]")
        for kind, a in zip(("extra_ids", "extra_logprobs"), given, strict=True):
            a = np.asarray(a)
            if a.ndim < 1 or a.shape[:-1] != lead:
                raise InvalidInput(f"{role}_extra: {kind.replace('extra_', '')} shape {list(a.shape)} must be "
                                   f"{list(lead) + ['m']}")
            flat[f"{role}_{kind}"] = a.reshape(1, rows, a.shape[-1])
    if vocab_size is not None:
        flat["vocab_size"] = np.asarray(vocab_size)
    try:
        Dump.from_arrays(flat).validate()  # the loader's checks: ids in range and distinct, logprobs <= 0, ...
    except DumpFormatError as exc:
        raise InvalidInput(str(exc).replace("<arrays>: ", "", 1)) from None
    valid = np.ones(rows, dtype=np.bool_)
    top = {"target": (flat["target_topk_ids"][0], flat["target_topk_logprobs"][0]),
           "draft": (flat["draft_topk_ids"][0], flat["draft_topk_logprobs"][0])}
    lo, hi = _bounds(*top["target"], *top["draft"], valid, greedy)
    if not greedy and (target_extra is not None or draft_extra is not None):
        known = {role: _known_rows(top[role], (flat[f"{role}_extra_ids"][0], flat[f"{role}_extra_logprobs"][0])
                                   if f"{role}_extra_ids" in flat else None, None, None) for role in top}
        lo, hi = _tighter(lo, hi, known["target"], known["draft"], valid)
    return lo.reshape(lead), hi.reshape(lead)


# --------------------------------------------------------------------------------------------- whole dumps
@dataclass
class DraftAcceptance:
    """Per-position alpha of one draft over a dump: ``alpha`` [N, T] (dense; 0 at padding), or the sparse
    interval ``lower``/``upper`` (``alpha`` is then None); ``valid`` [N, T] marks real positions."""

    name: str
    valid: np.ndarray
    alpha: np.ndarray | None = None
    lower: np.ndarray | None = None
    upper: np.ndarray | None = None

    @property
    def exact(self) -> bool:
        return self.alpha is not None


def resolve_sampling(dump, temperature=None, top_k=None, top_p=None, min_p=None) -> SamplingParams:
    """The sampling configuration an analysis of ``dump`` uses: explicit values, else the dump's recorded
    metadata, else temperature 1 without filters.  A sparse dump (log-probabilities recorded under one
    configuration) refuses settings that would need the full vocabulary (InvalidInput); greedy is exact."""
    md = dump.metadata
    sp = SamplingParams.from_metadata(md, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    if dump.kind == "sparse":
        rec = SamplingParams.from_metadata(md)
        flags = [d for d in sp.differences(rec) if not (sp.greedy and d.startswith("temperature"))]
        if flags:
            raise InvalidInput(f"{dump.path}: sparse top-k dump: cannot apply {', '.join(flags)}; that needs the "
                               "full vocabulary. Sparse log-probabilities are analysed as recorded (or greedy with "
                               "temperature 0); save dense logits for other settings")
    return sp


def _given_or_resolved(dump, sampling, temperature, top_k, top_p, min_p) -> SamplingParams:
    """``sampling`` (resolved already: no loose setting may come with it) or :func:`resolve_sampling`."""
    if sampling is None:
        return resolve_sampling(dump, temperature, top_k, top_p, min_p)
    if not isinstance(sampling, SamplingParams):
        raise InvalidType(f"sampling must be a SamplingParams or None, got {type(sampling).__name__}",
                          argument="sampling")
    if any(v is not None for v in (temperature, top_k, top_p, min_p)):
        raise InvalidInput("give the sampling settings either as sampling= or one by one, not both",
                           argument="sampling")
    return sampling


def dump_acceptance(dump, *, temperature=None, top_k=None, top_p=None, min_p=None, drafts=None,
                    max_bytes=None, verify_integrity: bool | None = None,
                    progress: Callable[[int], None] | None = None,
                    sampling: SamplingParams | None = None, beyond_topk: bool = True,
                    client=None) -> dict[str, DraftAcceptance]:
    """alpha at every valid position of a dump, per draft, reading ``max_bytes`` per array at a time.

    ``dump``: an open dump (:func:`fastspec.open_dump`: a :class:`fastspec.io.Dump`, a shard set, a llama.cpp file)
    or a path (opened with :func:`fastspec.open_dump` and closed here).  Sampling settings default to the dump's
    recorded metadata (:func:`resolve_sampling`); ``sampling``: a configuration already resolved for this dump (by
    :func:`resolve_sampling`) instead of the settings one by one.  Dense dumps give exact alpha; sparse dumps give
    the [lower, upper] interval, using what the dump knows beyond the top-k lists (extra known ids, the recorded
    token's logprob: module docstring) unless ``beyond_topk=False`` (the plain top-k interval).
    ``verify_integrity``: check the CRC-32 of the stored ``.npz`` members the pass reads (the target's and the
    selected drafts'), as they are read; default: the dump's setting (True for a path).
    ``progress(n)``: called after each chunk with the n positions (rows of the N x T grid) it covered; they add
    up to N T.  Extra memory: one chunk per array plus O(N T) float64 outputs per draft.

    A shard set (:class:`fastspec.io.shards.ShardedDump`) is processed shard by shard, each shard's numbers bitwise
    those of the merged dump, assembled in shard order; with a Dask ``client`` (default: the one the set was opened
    with) each shard is one task on the cluster (:mod:`fastspec.distributed`), and ``progress`` is called once, when
    the run is done.  How the pass ran is left in the set's ``last_run``.
    """
    if not isinstance(dump, DumpBase):
        with open_dump(dump, client=client, verify_integrity=True if verify_integrity is None else verify_integrity
                       ) as d:
            return dump_acceptance(d, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=drafts,
                                   max_bytes=max_bytes, verify_integrity=verify_integrity, progress=progress,
                                   sampling=sampling, beyond_topk=beyond_topk)
    if isinstance(dump, ShardedDump):
        return _shard_set_acceptance(dump, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                     drafts=drafts, max_bytes=max_bytes, verify_integrity=verify_integrity,
                                     progress=progress, sampling=sampling, beyond_topk=beyond_topk, client=client)
    if client is not None:
        raise InvalidInput(f"{dump.path}: client= runs the pass of a shard set; open the dump with "
                           "fastspec.open_dump(path, client=...) to run it on the cluster", argument="client")
    return _chunk_acceptance(dump, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, drafts=drafts,
                             max_bytes=max_bytes, verify_integrity=verify_integrity, progress=progress,
                             sampling=sampling, beyond_topk=beyond_topk)


def _shard_set_acceptance(d: ShardedDump, *, temperature, top_k, top_p, min_p, drafts, max_bytes, verify_integrity,
                          progress, sampling, beyond_topk, client) -> dict[str, DraftAcceptance]:
    """:func:`_chunk_acceptance` of every shard of ``d`` (here, or one task per shard on a Dask client),
    assembled in shard order: bitwise the numbers of the merged dump."""
    names = d.select_drafts(drafts)
    # bad settings fail here, before any task; every shard has the same metadata, so the same resolution
    sp = _given_or_resolved(d, sampling, temperature, top_k, top_p, min_p)
    verify = d.verify_integrity if verify_integrity is None else bool(verify_integrity)
    params = dict(sampling=sp, drafts=names, max_bytes=None if max_bytes is None else check_max_bytes(max_bytes),
                  verify_integrity=verify, beyond_topk=beyond_topk)
    client = client if client is not None else d.client
    S = len(d.shards)
    expect = [(int(d.offsets[i + 1] - d.offsets[i]), d.T) for i in range(S)]
    if client is None:
        parts = []
        for i, p in enumerate(d.shards):
            parts.append(distributed.alpha_task(_chunk_acceptance, p, params, None, expect[i]))
            distributed.check_part(parts[-1], i, S)
            if progress is not None:
                progress(expect[i][0] * d.T)
        d.last_run = {"scheduler": None, "tasks": S}
    else:
        parts, d.last_run = distributed.run_on_cluster(client, _chunk_acceptance, d.shards, params, expect,
                                                       threads_per_worker=d.threads_per_worker, retries=d.retries)
        if progress is not None:
            progress(d.N * d.T)
    valid = np.arange(d.T)[None, :] < d.lengths[:, None]

    def joined(n, j):
        return np.concatenate([p["arrays"][n][j] for p in parts], axis=0)

    if d.kind == "dense":
        return {n: DraftAcceptance(n, valid, alpha=joined(n, 0)) for n in names}
    return {n: DraftAcceptance(n, valid, lower=joined(n, 0), upper=joined(n, 1)) for n in names}


def _chunk_acceptance(d, *, temperature=None, top_k=None, top_p=None, min_p=None, drafts=None, max_bytes=None,
                      verify_integrity: bool | None = None, progress=None, sampling=None,
                      beyond_topk: bool = True) -> dict[str, DraftAcceptance]:
    """:func:`dump_acceptance` of an open dump, read chunk after chunk on this machine (any kind of dump; a
    shard set's chunks come shard after shard).  Module-level: the Dask workers run it by name."""
    max_bytes = DEFAULT_CHUNK_BYTES if max_bytes is None else check_max_bytes(max_bytes)
    sp = _given_or_resolved(d, sampling, temperature, top_k, top_p, min_p)
    names = d.select_drafts(drafts)
    N, T = d.N, d.T
    valid2 = np.arange(T)[None, :] < d.lengths[:, None]
    dense = d.kind == "dense"
    res = {n: (DraftAcceptance(n, valid2, alpha=np.zeros((N, T))) if dense else
               DraftAcceptance(n, valid2, lower=np.zeros((N, T)), upper=np.zeros((N, T)))) for n in names}
    for ch in d.iter_chunks(drafts=names, max_bytes=max_bytes, validate=not dense,
                            verify_integrity=verify_integrity):
        valid = np.ascontiguousarray(ch.valid)
        params = sp.rows(ch.stop - ch.start)
        for n in names:
            if dense:
                out, status = _alpha(kernel_view(ch.target), kernel_view(ch.drafts[n]), params, valid)
                if status.any():
                    i = int(np.flatnonzero(status)[0])
                    s = int(status[i])
                    arr = d.array_name("target", "logits") if s <= DRAFT_STATUS else d.array_name(n, "logits")
                    raise DumpFormatError(f"{d.path}: array {arr!r}: row {d.where(ch.start + i)} "
                                          f"{_WHAT[_row_status(s)]}; logits must be finite or -inf")
                res[n].alpha.reshape(-1)[ch.start:ch.stop] = out
            else:
                lo, hi = _bounds(ch.target[0], ch.target[1], ch.drafts[n][0], ch.drafts[n][1], valid,
                                 sp.temperature == 0.0)
                if beyond_topk and sp.temperature != 0.0 and any(
                        r in ch.extras or r in d.sampled_logprobs for r in ("target", n)):
                    tok = None if d.tokens is None else d.tokens.reshape(-1)[ch.start:ch.stop]
                    known = [_known_rows(top, ch.extras.get(r), tok,
                                         d.sampled_logprobs[r].reshape(-1)[ch.start:ch.stop]
                                         if r in d.sampled_logprobs else None)
                             for r, top in (("target", ch.target), (n, ch.drafts[n]))]
                    lo, hi = _tighter(lo, hi, known[0], known[1], valid)
                res[n].lower.reshape(-1)[ch.start:ch.stop] = lo
                res[n].upper.reshape(-1)[ch.start:ch.stop] = hi
        if progress is not None:
            progress(ch.stop - ch.start)
    return res


# --------------------------------------------------------------------------------------------- inspection
#: The stage :func:`inspect_dump` reports to its ``progress``: the alpha pass, counted in positions (rows of N x T).
ALPHA_PASS = "alpha pass (positions)"


@dataclass(frozen=True)
class DraftFigures:
    """What ``fastspec inspect`` shows of one draft: the alpha summary (:func:`alpha_summary`) and the trajectory
    DP (:func:`expected_tokens_per_step`) for each draft length of ``ks``.

    Dense dumps (``exact``): ``alpha`` and ``expected_by_k``.  Sparse dumps: the two ends of the interval,
    ``alpha_lower`` / ``alpha_upper`` and ``expected_at_lower_by_k`` / ``expected_at_upper_by_k`` (the mean
    acceptance length is non-decreasing in every alpha_t, so its values at the ends bound the true one; the draft
    acceptance rate at the ends is not a bound).  :meth:`as_dict` adds ``expected`` (or ``expected_at_lower`` /
    ``expected_at_upper``): the figures at the first k."""

    name: str
    ks: tuple[int, ...]
    alpha: dict | None = None
    expected_by_k: dict[int, SpecStats] | None = None
    alpha_lower: dict | None = None
    alpha_upper: dict | None = None
    expected_at_lower_by_k: dict[int, SpecStats] | None = None
    expected_at_upper_by_k: dict[int, SpecStats] | None = None

    @property
    def exact(self) -> bool:
        return self.alpha is not None

    def as_dict(self) -> dict:
        """The JSON entry of ``fastspec inspect --json``'s ``acceptance`` (k keys are ints; JSON makes them strings)."""
        k0 = self.ks[0]
        if self.exact:
            by_k = {k: s.as_dict() for k, s in self.expected_by_k.items()}
            return {"exact": True, "alpha": self.alpha, "expected": by_k[k0], "expected_by_k": by_k}
        lo = {k: s.as_dict() for k, s in self.expected_at_lower_by_k.items()}
        hi = {k: s.as_dict() for k, s in self.expected_at_upper_by_k.items()}
        return {"exact": False, "alpha_lower": self.alpha_lower, "alpha_upper": self.alpha_upper,
                "expected_at_lower": lo[k0], "expected_at_upper": hi[k0],
                "expected_at_lower_by_k": lo, "expected_at_upper_by_k": hi}


@dataclass(frozen=True)
class DumpInspection:
    """What :func:`inspect_dump` found: ``info`` (the dump's ``describe()``: path, kind, shapes, arrays, ...),
    the ``sampling`` the alphas were computed under, the draft lengths ``ks`` and the figures per draft."""

    info: dict
    sampling: SamplingParams
    ks: tuple[int, ...]
    drafts: dict[str, DraftFigures]

    def as_dict(self) -> dict:
        """``fastspec inspect --json``: ``info`` plus ``settings`` and ``acceptance`` (draft -> figures)."""
        return {**self.info, "settings": self.sampling.as_dict(),
                "acceptance": {n: f.as_dict() for n, f in self.drafts.items()}}


@contextlib.contextmanager
def _no_progress(_stage: str, _total: int, _every: int) -> Iterator[Callable[..., None]]:
    yield lambda _n=1: None


def _check_ks(ks) -> tuple[int, ...]:
    """Draft lengths: one k or a non-empty sequence of distinct ones, each checked by :func:`check_k`."""
    ks_given = ks
    if isinstance(ks, (int, np.integer)) and not isinstance(ks, (bool, np.bool_)):
        ks = (ks,)
    try:
        ks = () if isinstance(ks, (str, bytes)) else tuple(ks)
    except TypeError:
        ks = ()
    if not ks:
        raise InvalidInput(f"ks must be a draft length or a non-empty sequence of them, got {shown(ks_given)}",
                           argument="ks")
    out = tuple(check_k(k, "ks") for k in ks)
    if len(set(out)) != len(out):
        raise InvalidInput(f"ks must not repeat a draft length, got {list(out)}", argument="ks")
    return out


@dataclass(frozen=True, kw_only=True)
class InspectConfig(SamplingSettings):
    """What :func:`inspect_dump` computes, as the caller gave it; validated on construction, before any dump is read
    (typed errors tagged with the argument at fault, ``exc.arguments``: :func:`fastspec.errors.about`).  ``ks``: a
    draft length or a sequence of distinct ones (in order: the first is the one ``expected`` reports); the sampling
    settings as :func:`inspect_dump` takes them; ``drafts`` as :func:`dump_acceptance` takes them (checked against
    the dump).  The validated forms are :attr:`checked`."""

    ks: Any = (4,)
    drafts: Any = None

    @cached_property
    def checked(self) -> tuple[tuple[int, ...], dict]:
        """(the draft lengths, the explicit sampling settings {name: value}), in the command line's order."""
        with about("ks"):
            ks = _check_ks(self.ks)
        return ks, self.overrides()


def inspect_dump(dump, ks: int | Sequence[int] = (4,), *, sampling: SamplingParams | None = None,
                 temperature=None, top_k=None, top_p=None, min_p=None, drafts=None,
                 verify_integrity: bool | None = None,
                 progress: Callable[[str, int, int], ContextManager[Callable[..., None]]] | None = None,
                 config: InspectConfig | None = None) -> DumpInspection:
    """What a dump holds and each draft's acceptance figures: what ``fastspec inspect`` shows.

    ``dump``: an open dump (:func:`fastspec.open_dump`; a shard set's own settings, e.g. a Dask client, the alpha pass
    uses) or a path (a dump, a directory of shards, a llama.cpp file: opened and closed here).
    ``ks``: the draft lengths of the trajectory DP (the first is the one ``expected`` reports).  Sampling: as in
    :func:`dump_acceptance` (the dump's recorded settings by default; a sparse dump refuses settings that need the
    full vocabulary), resolved once, before the pass.
    The settings are an :class:`InspectConfig` (``config``) or its fields as arguments, not both; each is checked
    before the dump is read.  ``verify_integrity``: as in :func:`dump_acceptance`.
    ``progress(stage, total, every)``: a context manager around the alpha pass (stage :data:`ALPHA_PASS`, ``total``
    = N T positions, ``every`` a tenth of them) that yields ``advance(n)``, as for
    :func:`fastspec.hf.measure_and_predict`.  Bad arguments raise InvalidInput / InvalidType.
    """
    config = config_or_settings(InspectConfig, config, dict(ks=ks, sampling=sampling, temperature=temperature,
                                                            top_k=top_k, top_p=top_p, min_p=min_p, drafts=drafts))
    ks, overrides = config.checked
    progress = _no_progress if progress is None else progress
    own = not isinstance(dump, DumpBase)
    d = open_dump(dump, verify_integrity=True if verify_integrity is None else verify_integrity) if own else dump
    try:
        sp = config.sampling if config.sampling is not None else resolve_sampling(d, **overrides)
        info = d.describe()
        total = d.N * d.T
        with progress(ALPHA_PASS, total, max(1, total // 10)) as advance:
            res = dump_acceptance(d, sampling=sp, drafts=config.drafts, verify_integrity=verify_integrity,
                                  progress=advance)
        lengths = d.lengths
    finally:
        if own:
            d.close()

    def dp(alpha):
        return {k: expected_tokens_per_step(alpha, k, lengths=lengths) for k in ks}

    figures = {}
    for name, r in res.items():
        if r.exact:
            figures[name] = DraftFigures(name, ks, alpha=alpha_summary(r.alpha, r.valid), expected_by_k=dp(r.alpha))
        else:
            figures[name] = DraftFigures(name, ks, alpha_lower=alpha_summary(r.lower, r.valid),
                                         alpha_upper=alpha_summary(r.upper, r.valid),
                                         expected_at_lower_by_k=dp(r.lower), expected_at_upper_by_k=dp(r.upper))
    return DumpInspection(info=info, sampling=sp, ks=ks, drafts=figures)
