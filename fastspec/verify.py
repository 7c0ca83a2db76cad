"""Batched speculative-decoding verification: validate, call the kernels, return a :class:`VerifyResult`.

For each row b and drafted position i < num_draft[b] with drafted token x:

* accept while ``u_i * q_i(x) <= p_i(x)`` with ``u_i`` uniform in (0, 1] (never a division; ``u_i > 0`` so a
  token with ``p_i(x) = 0`` is never accepted);
* at the first rejection emit a *recovered token* sampled from ``max(p_i - q_i, 0) / sum``; if that sum
  underflows to 0 (p ~= q) sample from ``p_i`` instead and count it in ``residual_underflows``;
* if every draft is accepted emit a *bonus token* sampled from ``p_n`` (target position ``n = num_draft[b]``).

``draft_logits=None`` / ``draft_probs=None`` means a deterministic proposer (n-gram, prompt lookup, argmax
draft): q is one-hot on the drafted token, the acceptance probability is p(x) and the recovered distribution
is p with x removed, renormalized.  Greedy rows (temperature 0) accept while the draft equals the target
argmax; the first mismatch emits the target argmax.  ``method="block"`` is block verification (same inputs,
outputs, determinism and errors; :mod:`fastspec._kernels.block`).

Randomness: counter-based streams keyed by the row's own seed and the position
(:mod:`fastspec._numba.rng`): the same per-row seed gives the same tokens whatever the batch composition, row
order or thread count, and whether the kernel was compiled in this process or loaded from the cache -- "same
text under a fixed seed", a different claim from "same distribution" (which holds for every seed, and is what
the exact and goodness-of-fit tests check).  Sampling is the one two-level inverse CDF of
:mod:`fastspec._kernels.sample`: never a token >= V nor a token of probability 0.

Validation: every drafted token within ``num_draft`` must have draft probability > 0 under the processed
draft distribution, whatever the random path of its row (``InvalidInput`` names the row and position);
logits must be finite or -inf with a finite value in every row (checked while the kernels read them).
``validate="visited"`` (the latency mode) narrows both checks to the rows and positions the decision reads.
The page that explains it: ``docs/design/lossless-verification.md``.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import numba
import numpy as np

from ._kernels import block as block_kernels
from ._kernels import token as token_kernels
from ._kernels.codes import PAD
from .config import BLOCK
from .errors import InvalidInput, InvalidType
from .methods import check_method
from .params import per_row
from ._numba.rng import row_seeds, seed_bits
from .processing import kernel_view, logits_array, raise_bad_values, read_only

__all__ = ["VerifyResult", "verify_logits", "verify_probs"]


@dataclass(frozen=True)
class VerifyResult:
    """Result of one batched verify step.

    tokens: int64 [B, K+1] -- accepted drafts, then the recovered or bonus token, then -1.
    num_accepted: int64 [B] -- accepted drafted tokens per row.
    num_emitted: int64 [B] -- tokens emitted per row (num_accepted + 1).
    residual_underflows: int64 [B] -- 1 where the residual max(p - q, 0) summed to 0 in floating point
        (p ~= q) and the recovered token was sampled from p instead.
    num_draft: int64 [B] -- drafts each row had (the num_draft argument, default K).
    """

    tokens: np.ndarray
    num_accepted: np.ndarray
    num_emitted: np.ndarray
    residual_underflows: np.ndarray
    num_draft: np.ndarray | None = None

    @property
    def bonus(self) -> np.ndarray:
        """bool [B]: True where every draft was accepted and the last token is a bonus token."""
        nd = self.num_draft if self.num_draft is not None else np.full(len(self.num_accepted), self.tokens.shape[1] - 1)
        return self.num_accepted == nd


# --------------------------------------------------------------------------------------------- validation
def _validate_tokens(draft_tokens, B, K, V, num_draft):
    """(tokens int64 [B, K] with padding beyond num_draft replaced by 0, num_draft int64 [B])."""
    if (num_draft is None and type(draft_tokens) is np.ndarray and draft_tokens.dtype == np.int64
            and draft_tokens.shape == (B, K) and draft_tokens.flags.c_contiguous
            and (K == 0 or B == 0 or (draft_tokens.min() >= 0 and draft_tokens.max() < V))):
        return draft_tokens, np.full(B, K, dtype=np.int64)  # common case, same result as below
    toks = np.asarray(draft_tokens)
    if toks.dtype == bool or not np.issubdtype(toks.dtype, np.integer):
        if toks.size == 0 and toks.dtype == np.float64:
            toks = toks.astype(np.int64)
        else:
            raise InvalidType(f"draft_tokens must be an integer array of shape [{B}, {K}], got dtype {toks.dtype}")
    if toks.shape != (B, K):
        raise InvalidInput(f"draft_tokens must have shape [B, K] = [{B}, {K}] to match the logits, "
                           f"got shape {list(toks.shape)}")
    if num_draft is None:
        nd = np.full(B, K, dtype=np.int64)
    else:
        nd = np.asarray(num_draft)
        if nd.dtype == bool or not np.issubdtype(nd.dtype, np.integer):
            raise InvalidType(f"num_draft must be an integer array of shape [{B}], got dtype {nd.dtype}")
        if nd.ndim == 0:
            nd = np.full(B, int(nd), dtype=np.int64)
        if nd.shape != (B,):
            raise InvalidInput(f"num_draft must have shape [{B}] (one count per row), got shape {list(nd.shape)}")
        bad = (nd < 0) | (nd > K)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise InvalidInput(f"num_draft[{b}] = {int(nd[b])} is outside [0, {K}]: use the number of drafted "
                               f"tokens in row {b}")
        nd = np.ascontiguousarray(nd, dtype=np.int64)
    inside = np.arange(K)[None, :] < nd[:, None]
    bad = inside & ((toks < 0) | (toks >= V))
    if bad.any():
        b, i = (int(t) for t in np.argwhere(bad)[0])
        t = int(toks[b, i])
        what = "-1 padding" if t == PAD else f"token id {t}"
        raise InvalidInput(f"draft_tokens[{b}, {i}] = {t} ({what}) is invalid: ids must lie in [0, {V}) "
                           f"within num_draft[{b}] = {int(nd[b])}; pass num_draft for ragged rows")
    toks = np.ascontiguousarray(np.where(inside, toks, 0), dtype=np.int64)  # padding is never read: a safe id
    return toks, nd


def _check_draft_shape(name, d, B, K, V):
    if d.shape != (B, K, V):
        raise InvalidInput(f"{name} must have shape [B, K, V] = [{B}, {K}, {V}] (K = target positions - 1), "
                           f"got shape {list(d.shape)}")


def _bad_draft_error(b, i, tok, what, logit=None):
    if logit == -np.inf:
        return InvalidInput(f"draft_tokens[{b}, {i}] = {tok} has draft logit -inf (q = 0): a drafted token must "
                            "have been sampled from the draft distribution")
    return InvalidInput(f"draft_tokens[{b}, {i}] = {tok} has draft probability q = 0 under the processed {what}: "
                        "a drafted token must have been sampled from the draft distribution (pass draft_logits=None "
                        "for deterministic proposers)")


def _finish(out, stats, nd, toks, names, arrays, what):
    """Raise the first error the kernels flagged (worded from the inputs), else build the result."""
    S = token_kernels
    if stats[:, S.BAD_DRAFT:].any():  # one reduction when all is well
        if stats[:, S.BAD_VALUES].any():
            raise_bad_values(names[0], arrays[0])  # the target first, as a reader would check
            if arrays[1] is not None:
                raise_bad_values(names[1], arrays[1])
            raise InvalidInput("logits must be finite or -inf (masked), with a finite value in every row")
        b = int(np.flatnonzero(stats[:, S.BAD_DRAFT])[0])
        i = int(stats[b, S.BAD_DRAFT]) - 1
        logit = None
        if arrays[1] is not None and what == "draft logits":
            logit = float(arrays[1][b, i, toks[b, i]])
        raise _bad_draft_error(b, i, int(toks[b, i]), what, logit)
    acc = stats[:, S.ACCEPTED].copy()
    return VerifyResult(tokens=out, num_accepted=acc, num_emitted=acc + 1,
                        residual_underflows=stats[:, S.UNDERFLOWS].copy(), num_draft=nd.copy())


# --------------------------------------------------------------------------------------------- work buffers
_thread_buffers = threading.local()


def _row_buffer_size(V):
    """float64 elements of one kernel thread's work buffer (block count in Python: no kernel dispatch)."""
    return token_kernels.buffer_size(V, (V + BLOCK - 1) // BLOCK)


def _thread_flat(size):
    """This Python thread's flat work buffer, at least ``size`` float64 elements."""
    flat = getattr(_thread_buffers, "flat", None)
    if flat is None or flat.shape[0] < size:
        flat = _thread_buffers.flat = np.empty(size)
    return flat


def _buffers(n, size):
    """Work buffers of n kernel threads: float64 [n, size] (``size``: the kernel's buffer_size).

    Kept between calls (per Python thread, so concurrent calls from several threads never share them): fresh
    multi-MiB allocations are page-faulted in on every call once the allocator has returned memory to the OS
    (measured: +0.15 ms per call at V = 32000)."""
    return _thread_flat(n * size)[:n * size].reshape(n, size)


def _run_token(xt, xd, has_draft, check_all, toks, nd, params, seeds, out, stats):
    B, _, V = xt.shape
    seeds, derive = seeds
    nth = numba.get_num_threads() if B >= 2 else 1
    if nth > 1:
        token_kernels.verify_logits_rows(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats,
                                         _buffers(min(nth, B), _row_buffer_size(V)))
    else:  # one row (or one thread): no parallel region, lowest latency
        token_kernels.verify_logits_serial(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats,
                                           _buffers(1, _row_buffer_size(V)))


def _run_block(xt, xd, has_draft, check_all, toks, nd, params, seeds, out, stats):
    B, K1, V = xt.shape
    seeds, derive = seeds
    size = block_kernels.buffer_size(K1, V, (V + BLOCK - 1) // BLOCK)
    nth = numba.get_num_threads() if B >= 2 else 1
    if nth > 1:
        block_kernels.block_logits_rows(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats,
                                        _buffers(min(nth, B), size))
    else:  # one row (or one thread): no parallel region
        block_kernels.block_logits_serial(xt, xd, has_draft, check_all, toks, nd, params, seeds, derive, out, stats,
                                          _buffers(1, size))


def _seeds(seed, B):
    """(int64 seeds, derive): one scalar seed is derived per row inside the kernels (:func:`fastspec.row_seeds`'s
    rule, without a separate call); per-row seeds are used as given."""
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, (bool, np.bool_)):
        return np.array([seed_bits(seed)], dtype=np.int64), True
    return row_seeds(seed, B), False


@functools.lru_cache(maxsize=64)
def _scalar_params(B, temperature, top_k, top_p, min_p):
    return per_row(B, temperature, top_k, top_p, min_p)


def _params(B, temperature, top_k, top_p, min_p):
    """Per-row sampling arrays; repeated scalar configurations (a serving loop) reuse their validated arrays
    (internal: the kernels never write them)."""
    if all(type(v) in (int, float) for v in (temperature, top_k, top_p, min_p)):
        return _scalar_params(B, temperature, top_k, top_p, min_p)
    return per_row(B, temperature, top_k, top_p, min_p)


VALIDATE_MODES = {
    "all": "every row of the input is read and checked (NaN/+inf/no finite logit) and every drafted token within "
           "num_draft must have draft probability > 0, whatever the random path: the same errors for every seed",
    "visited": "only the rows the decision reads are read and checked (fewer bytes: the latency mode for a service "
               "whose logits come from its own models); a bad value or an invalid draft in a position the row never "
               "reaches is not reported.  The tokens are the same as with 'all' whenever 'all' raises nothing",
}


def _check_all(validate) -> bool:
    if type(validate) is str and validate in VALIDATE_MODES:
        return validate == "all"
    raise InvalidInput(f"validate {validate!r} is unknown: use 'all' (every row and drafted position checked, the "
                       "default) or 'visited' (only what the decision reads: the latency mode)")


# --------------------------------------------------------------------------------------------- latency path
_ONE_ROW_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
_scalar_configs: dict = {}  # (temperature, top_k, top_p, min_p) as given -> validated (float, int, float, float)


def _scalar_config(temperature, top_k, top_p, min_p):
    """The validated scalars of a configuration, or None (not plain scalars, or invalid: the general path
    raises, in its order)."""
    if type(top_k) is not int or type(temperature) not in (int, float) or type(top_p) not in (int, float) \
            or type(min_p) not in (int, float):  # exact types first: True == 1 as a key
        return None
    key = (temperature, top_k, top_p, min_p)
    got = _scalar_configs.get(key)
    if got is not None:
        return got
    try:
        per_row(1, temperature, top_k, top_p, min_p)
    except (ValueError, TypeError):
        return None
    if len(_scalar_configs) >= 256:  # a service with many configurations: keep the table small
        _scalar_configs.clear()
    got = _scalar_configs[key] = (float(temperature), top_k, float(top_p), float(min_p))
    return got


def _one_row(xt, xd, toks, temperature, top_k, top_p, min_p, seed, check_all):
    """verify_logits for the case a service calls most: one row, C-contiguous float logits, int64 tokens, every
    draft used, scalar parameters, an integer seed -- checked here with a handful of attribute reads, then one
    kernel dispatch that allocates the outputs (:func:`fastspec._kernels.token.verify_one_row`).  Returns None
    whenever anything differs or the kernel found a problem: the general path then runs (and words the error),
    so both paths give the same tokens and the same errors (test)."""
    if type(xt) is not np.ndarray or type(toks) is not np.ndarray or type(seed) is not int:
        return None
    shape = xt.shape
    if len(shape) != 3 or shape[0] != 1 or shape[1] < 1 or shape[2] < 1 or not xt.flags.c_contiguous:
        return None
    dt = xt.dtype
    if dt not in _ONE_ROW_DTYPES or toks.dtype != np.int64 or toks.shape != (1, shape[1] - 1) \
            or not toks.flags.c_contiguous:
        return None
    if xd is not None and (type(xd) is not np.ndarray or xd.dtype != dt or xd.shape != (1, shape[1] - 1, shape[2])
                           or not xd.flags.c_contiguous):
        return None
    if not -2 ** 63 <= seed < 2 ** 64:
        return None
    config = _scalar_config(temperature, top_k, top_p, min_p)
    if config is None:
        return None
    if dt == _ONE_ROW_DTYPES[0]:  # float16 as its bits, as kernel_view does
        xt = xt.view(np.uint16)
        xd = None if xd is None else xd.view(np.uint16)
    xt = read_only(xt)  # as kernel_view does: one compiled kernel for read-only and writable logits
    xd = None if xd is None else read_only(xd)
    buf = _thread_flat(_row_buffer_size(shape[2]))
    tokens, summary, ok = token_kernels.verify_one_row(xt, xt if xd is None else xd, xd is not None, check_all, toks,
                                                       config, seed - 2 ** 64 if seed >= 2 ** 63 else seed, buf)
    if not ok:
        return None
    return VerifyResult(tokens=tokens, num_accepted=summary[0], num_emitted=summary[1],
                        residual_underflows=summary[2], num_draft=summary[3])


# --------------------------------------------------------------------------------------------- public API
def verify_logits(target_logits, draft_logits, draft_tokens, *, num_draft=None, temperature=1.0, top_k=0,
                  top_p=1.0, min_p=0.0, seed=0, method="token", validate="all") -> VerifyResult:
    """Verify a batch of drafted tokens from raw logits.

    target_logits: [B, K+1, V] float16/32/64 (any layout, read-only/memory-mapped fine; float16 is read as it
    is, never widened into a copy); draft_logits: [B, K, V] or None (deterministic proposer: q one-hot on the
    draft); draft_tokens: int [B, K]; num_draft: int [B] for ragged rows (row b uses its first num_draft[b]
    drafts and target position num_draft[b] for its bonus token).  temperature/top_k/top_p/min_p: scalars or
    one per row, applied to both the target and the draft logits (:func:`fastspec.probabilities`); seed: an
    integer in [-2**63, 2**64) or one per row.  method: "token" or "block" (:mod:`fastspec.methods`).
    validate: "all" (default) or "visited" (:data:`VALIDATE_MODES`): "visited" reads only the rows the decision
    uses, for latency; it gives the same tokens but does not report problems in positions a row never reaches.
    """
    if num_draft is None and type(method) is str and method == "token":
        fast = _one_row(target_logits, draft_logits, draft_tokens, temperature, top_k, top_p, min_p, seed,
                        _check_all(validate))
        if fast is not None:
            return fast
    method = check_method(method)
    check_all = _check_all(validate)
    xt = logits_array("target_logits", target_logits, ndim=3)
    B, K1, V = xt.shape
    if K1 < 1:
        raise InvalidInput(f"target_logits must have K+1 >= 1 positions, got shape {list(xt.shape)}")
    K = K1 - 1
    has_draft = draft_logits is not None
    xd = None
    if has_draft:
        xd = logits_array("draft_logits", draft_logits, ndim=3)
        _check_draft_shape("draft_logits", xd, B, K, V)
    toks, nd = _validate_tokens(draft_tokens, B, K, V, num_draft)
    params = _params(B, temperature, top_k, top_p, min_p)
    seeds = _seeds(seed, B)
    kt = kernel_view(xt)
    kd = kernel_view(xd) if has_draft else kt[:, :0]  # one-hot: an empty draft array of the target's type
    out = np.full((B, K + 1), PAD, dtype=np.int64)
    stats = np.zeros((B, token_kernels.N_STATS), dtype=np.int64)
    if B:
        (_run_token if method == "token" else _run_block)(kt, kd, has_draft, check_all, toks, nd, params, seeds, out,
                                                          stats)
    return _finish(out, stats, nd, toks, ("target_logits", "draft_logits"), (xt, xd), "draft logits")


def validate_probs(name: str, a, ndim: int) -> np.ndarray:
    """Probabilities as contiguous float64: finite, non-negative, every row summing to 1 within 1e-6."""
    a = np.asarray(a)
    if a.dtype == bool or not (np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)):
        raise InvalidType(f"{name} must be a float array of probabilities, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise InvalidInput(f"{name} must have {ndim} dimensions, got shape {list(a.shape)}")
    a = np.ascontiguousarray(a, dtype=np.float64)
    if a.shape[-1] < 1:
        raise InvalidInput(f"{name} must have a non-empty vocabulary axis, got shape {list(a.shape)}")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidInput(f"{name}{list(idx)} = {float(a[idx])!r}: probabilities must be finite and non-negative")
    s = a.sum(axis=-1)
    bad = np.abs(s - 1.0) > 1e-6
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidInput(f"{name}{list(idx)} sums to {float(s[idx])!r}, not 1 within 1e-6: pass normalized "
                           "probabilities (or use verify_logits with raw logits)")
    return a


def verify_probs(target_probs, draft_probs, draft_tokens, *, num_draft=None, seed=0, method="token") -> VerifyResult:
    """Verify drafted tokens from already-processed probabilities.

    target_probs: [B, K+1, V], draft_probs: [B, K, V] or None (one-hot drafts); both validated: non-negative,
    finite, each row sums to 1 within 1e-6.  method: "token" or "block".
    """
    method = check_method(method)
    pt = validate_probs("target_probs", target_probs, 3)
    B, K1, V = pt.shape
    if K1 < 1:
        raise InvalidInput(f"target_probs must have K+1 >= 1 positions, got shape {list(pt.shape)}")
    K = K1 - 1
    has_draft = draft_probs is not None
    pd = pt[:, :0]
    if has_draft:
        pd = validate_probs("draft_probs", draft_probs, 3)
        _check_draft_shape("draft_probs", pd, B, K, V)
    toks, nd = _validate_tokens(draft_tokens, B, K, V, num_draft)
    seeds, derive = _seeds(seed, B)
    if has_draft and K > 0:
        qx = np.take_along_axis(pd, toks[:, :, None], axis=2)[:, :, 0]
        bad = (np.arange(K)[None, :] < nd[:, None]) & (qx == 0)
        if bad.any():
            b, i = (int(v) for v in np.argwhere(bad)[0])
            raise InvalidInput(f"draft_tokens[{b}, {i}] = {int(toks[b, i])} has draft probability q = 0: a drafted "
                               "token must have been sampled from the draft distribution")
    out = np.full((B, K + 1), PAD, dtype=np.int64)
    stats = np.zeros((B, token_kernels.N_STATS), dtype=np.int64)
    if B:
        if method == "block":
            block_kernels.block_probs_rows(pt, pd, has_draft, toks, nd, seeds, derive, out, stats)
        else:
            token_kernels.verify_probs_rows(pt, pd, has_draft, toks, nd, seeds, derive, out, stats)
    return _finish(out, stats, nd, toks, ("target_probs", "draft_probs"), (pt, None), "draft probabilities")
