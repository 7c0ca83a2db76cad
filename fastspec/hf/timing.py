"""Timing with the very models on this machine: :func:`measure_costs` returns the cost table of the real loop
(:class:`fastspec.costs.CostTable`, written by its one writer :meth:`~fastspec.costs.CostTable.save`).

What is timed, call for call through the loop's own :class:`~fastspec.hf.runner.KVRunner`, from one context of
``context_length`` tokens: ``target.forward_s[n]`` (a forward over n new tokens, the float32 copy of the logits
included; n = 1 and every k + 1); ``drafts[name].forward_s[1]``, ``[2]`` (a model draft over 1 new token and over
2, the catch-up after a step that accepted every draft) or an n-gram proposer's one ``propose`` call
(``one_call_per_step``); ``overhead_s[k]`` (the k draft draws, ``verify_logits`` on real logits, reading its
result, cropping the target's and one draft's caches -- the one-hot step when every draft is an n-gram proposer;
``overhead_s[0]``: one draw).  With ``batches=``, :func:`batch_axis` times the same at each batch size B on B
copies of the context (:class:`~fastspec.hf.runner.BatchKVRunner`; an n-gram proposer: B ``propose`` calls, one
entry for the batch) and :func:`measure_batch_costs` merges it into a version-2 table.

Method: every quantity is timed once per round, in an order shuffled every round (seeded; across all B for the
batch axis), so that drift hits every entry alike; ``warmup`` rounds are discarded; each entry is the median over
``repeats`` rounds, its standard error the distribution-free one of :func:`fastspec.stats.median_se`.

The table's schema: docs/reference/cost-tables.md; the cost model it feeds: docs/design/cost-model.md.
"""
from __future__ import annotations

import dataclasses
import math
import os
import platform
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..costs.table import CostTable, parse_batch_list
from ..config import DEFAULT_WARMUP
from ..runs import CostMeasureConfig, cost_ks
from ..errors import InvalidInput, InvalidType, about, config_or_settings
from ..ngram import NgramProposer
from ..params import SamplingParams
from ..processing import sample_tokens
from ..stats import median_se
from ..verify import verify_logits
from .args import MAX_K, MAX_NEW_TOKENS, as_token_ids, check_max_new_tokens, check_positions, positive_int
from .loop import draw_token, generate, serial_kernels, start_numba_pool
from .teacher import teacher_forced_logits
from .runner import BatchKVRunner, KVRunner

__all__ = ["measure_costs", "check_cost_context", "check_batch_budget", "batch_axis", "measure_batch_costs",
           "machine_name", "DEFAULT_CONTEXT_LENGTH", "DEFAULT_WARMUP", "MAX_BATCH_TOKENS", "MAX_LOGITS_ENTRIES",
           "MAX_CACHED_TOKENS"]

DEFAULT_CONTEXT_LENGTH = 128


def machine_name() -> str:
    """The CPU model name (``/proc/cpuinfo``, else the platform's), with the number of logical CPUs."""
    name = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return f"{name} ({os.cpu_count() or '?'} logical CPUs)"


def _positive_seconds(t: float) -> float:
    return max(t, 1e-9)  # a cost table holds times > 0; perf_counter never reports less than a nanosecond anyway


def _split_drafts(drafts: Mapping | None):
    """({name: model}, {name: NgramProposer}) in the given order."""
    models, ngrams = {}, {}
    for name, d in (drafts or {}).items():
        if isinstance(d, NgramProposer):
            ngrams[name] = d
        elif isinstance(d, torch.nn.Module):
            models[name] = d
        else:
            raise InvalidType(f"draft {name!r}: expected a model (torch module) or a fastspec.ngram.NgramProposer, "
                              f"got {type(d).__name__}")
    return models, ngrams


def _vocab(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _plan(target, models: Mapping, *, context, context_length, prompts, max_new_tokens, extra: int):
    """(C, given tokens, median prompt or None) of :func:`_context`, every bound checked first: the cost context
    and the ``extra`` tokens the timed forwards feed must fit the position limit of the target and of every
    model draft (``models``), told before any token is generated or allocated."""
    models = {"the target": target, **{f"draft {name}": m for name, m in models.items()}}
    fed = f"the {extra} tokens the timed forwards feed (largest k + 1)"

    def fits(C: int) -> int:  # a context of C tokens given by context_length (or by the context itself)
        check_positions(models, C + extra, "context_length", C, f"a context of {C} tokens + {fed}",
                        lambda L: L - extra)
        return C

    if context is not None:
        toks = as_token_ids(context, "context")
        C = len(toks) if context_length is None else _context_length(context_length)
        if C > len(toks):
            raise InvalidInput(f"context_length = {C} exceeds the {len(toks)} tokens of context")
        return fits(C), toks, None
    if prompts:
        ps = sorted((as_token_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)), key=len)
        p = ps[(len(ps) - 1) // 2]  # the median-length prompt
        if context_length is not None:
            return fits(_context_length(context_length)), [], p
        n = check_max_new_tokens(max_new_tokens)
        C = len(p) + n // 2
        check_positions(models, C + extra, "max_new_tokens", n, f"the cost context (the median-length prompt's "
                        f"{len(p)} tokens + {n} // 2) + {fed}", lambda L: 2 * (L - extra - len(p)) + 1)
        return C, [], p
    return fits(DEFAULT_CONTEXT_LENGTH if context_length is None else _context_length(context_length)), None, None


def _context_length(value) -> int:
    return positive_int("context_length", value, MAX_NEW_TOKENS)


def check_cost_context(target, drafts: Mapping | None = None, *, kmax: int = 4, ks: Sequence[int] | None = None,
                       context: Sequence[int] | None = None, context_length: int | None = None,
                       prompts: Sequence[Sequence[int]] | None = None, max_new_tokens: int = 64) -> int:
    """The context length :func:`measure_costs` would use with these arguments, after the checks it makes before
    any forward: ``context_length`` in [1, :data:`~fastspec.hf.args.MAX_NEW_TOKENS`] (so is ``max_new_tokens``),
    and the context + the largest k + 1 tokens within the position limit (``max_position_embeddings``) of the
    target and every model draft; else InvalidInput naming the argument (``context_length``, or
    ``max_new_tokens`` when the context comes from ``prompts``)."""
    K = max(cost_ks(kmax, ks))
    models, _ = _split_drafts(drafts)
    return _plan(target, models, context=context, context_length=context_length, prompts=prompts,
                 max_new_tokens=max_new_tokens, extra=K + 1)[0]


def _context(target, models, *, context, context_length, prompts, max_new_tokens, extra: int,
             seed: int) -> tuple[list, int]:
    """(tokens, C): the first C tokens are the context the caches hold; the ``extra`` tokens after them are fed by
    the timed forwards (taken from ``context`` when it has them, else repeated from its end)."""
    C, toks, p = _plan(target, models, context=context, context_length=context_length, prompts=prompts,
                       max_new_tokens=max_new_tokens, extra=extra)
    if p is not None:
        want = C + extra - len(p)
        cont = [] if want <= 0 else generate(target, p, temperature=0.0, max_new_tokens=want).tolist()
        toks = (p + cont)[:C + extra]
    elif toks is None:
        rng = np.random.default_rng(seed)
        toks = rng.integers(0, _vocab(target), size=C + extra).tolist()
    while len(toks) < C + extra:  # new tokens beyond the given ones: repeat the end (their values cost nothing)
        toks = toks + toks[max(0, C - extra):C]
    return toks[:C + extra], C


class _Timer:
    """Samples per key: ``add(key, seconds)``; ``warm`` samples are discarded."""

    def __init__(self):
        self.samples: dict = {}
        self.record = False

    def add(self, key, seconds: float) -> None:
        if self.record:
            self.samples.setdefault(key, []).append(seconds)

    def rounds(self, units, rng, warmup: int, repeats: int, progress=None) -> None:
        """``warmup + repeats`` rounds, each calling every ``(fn, args)`` of ``units`` once in an order shuffled by
        ``rng`` (interleaved, so load drift hits every entry alike); only the last ``repeats`` rounds are kept.
        torch's thread count is restored after each call (Numba's pool, started by the first verify_logits, may
        reset it); ``progress(1)`` after each round."""
        threads = torch.get_num_threads()
        for r in range(warmup + repeats):
            self.record = r >= warmup
            for i in rng.permutation(len(units)):
                fn, args = units[int(i)]
                fn(*args)
                if torch.get_num_threads() != threads:
                    torch.set_num_threads(threads)
            if progress is not None:
                progress(1)

    def table(self, key_of: Callable) -> tuple[dict, dict]:
        """({entry: median}, {entry: se}) for keys mapped by ``key_of(key) -> entry`` (None: skip)."""
        med, se = {}, {}
        for key, v in self.samples.items():
            entry = key_of(key)
            if entry is None:
                continue
            m, s = median_se(v)
            med[entry], se[entry] = _positive_seconds(m), s
        return med, se


@torch.inference_mode()
def measure_costs(target, drafts: Mapping | None = None, *, kmax: int = 4, ks: Sequence[int] | None = None,
                  context: Sequence[int] | None = None, context_length: int | None = None,
                  prompts: Sequence[Sequence[int]] | None = None, max_new_tokens: int = 64, repeats: int = 20,
                  warmup: int = DEFAULT_WARMUP, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  min_p: float = 0.0, seed: int = 0, progress: Callable[[int], None] | None = None,
                  batches: Sequence[int] | None = None, sampling: SamplingParams | None = None,
                  config: CostMeasureConfig | None = None) -> CostTable:
    """Measure the cost table of the real loop for ``target`` and ``drafts`` on this machine (module docstring).

    ``drafts``: {name: model or :class:`fastspec.ngram.NgramProposer`} (none: the target's entries and the plain
    step only).  Draft lengths: ``ks`` (the k's to cover) or 1..``kmax``; target forwards are timed for n = 1 and
    every k + 1, the overhead for 0 and every k (with an n-gram draft, every k up to the largest: its steps verify
    as many tokens as the lookup found).  The context the caches hold (``context_length`` tokens): the
    first ``context_length`` tokens of ``context`` (token ids; default all of them, the tokens after it are the ones
    the timed forwards feed); else the median-length prompt of ``prompts`` continued greedily by the target to its
    length + ``max_new_tokens // 2`` tokens (the middle of a dump's rows); else ``context_length`` (default
    :data:`DEFAULT_CONTEXT_LENGTH`) random token ids.  The sampling parameters are those of the draws and of
    ``verify_logits`` in the overhead.  ``repeats`` rounds are kept after ``warmup`` discarded ones; ``progress(1)``
    is called after each round.  Returns a validated :class:`fastspec.costs.CostTable` that records the machine,
    torch's thread count, the context length, the repeats and a note on the method.  ``batches`` (batch sizes in
    [1, 4096]): also the version-2 batch axis at those B on the same context, in a second interleaved run of
    ``warmup`` + ``repeats`` rounds (:func:`batch_axis`; ``progress`` is then called twice as often).
    The settings are a :class:`fastspec.runs.CostMeasureConfig` (``config``: its bounds) or its fields as
    arguments, not both; they are checked first (``context``, ``prompts`` and ``progress`` are not settings)."""
    c = config_or_settings(CostMeasureConfig, config, dict(
        ks=ks, kmax=kmax, context_length=context_length, max_new_tokens=max_new_tokens, repeats=repeats,
        warmup=warmup, sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
        batches=batches))
    params = c.params
    sp = params.as_dict()
    ks, context_length, max_new_tokens, repeats, warmup, seed, batches = (
        c.ks, c.context_length, c.max_new_tokens, c.repeats, c.warmup, c.seed, c.batches)
    start_numba_pool()  # before any timing: the verify_logits of the first round would start it otherwise
    models, ngrams = _split_drafts(drafts)
    V = _vocab(target)
    for name, m in models.items():
        if _vocab(m) != V:
            raise InvalidInput(f"draft {name}: its LM head has {_vocab(m)} outputs but the target's has {V}")
    if batches is not None:
        with about("batches"):
            check_batch_budget(batches, max(ks), V)
    K = max(ks)
    toks, C = _context(target, models, context=context, context_length=context_length, prompts=prompts,
                       max_new_tokens=max_new_tokens, extra=K + 1, seed=seed)
    if batches is not None:  # the batched caches fit, before any timing
        with about("batches"):
            check_batch_budget(batches, K, V, C, 1 + len(models))
    ctx = toks[:C]
    rng = np.random.default_rng(seed)

    trun = KVRunner(target)
    trun.logits(ctx, 1)
    druns = {}
    for name, m in models.items():
        druns[name] = KVRunner(m)
        druns[name].logits(ctx, 1)
    crop_name = next(iter(models), None)  # the draft whose cache the overhead crops (model flavour)
    qrows = (teacher_forced_logits(models[crop_name], ctx, toks[C:C + K], cached=False) if crop_name is not None
             else None)
    proposers = {name: dataclasses.replace(p, k=min(K, MAX_K)) for name, p in ngrams.items()}
    timer = _Timer()

    def target_step(k: int) -> None:
        seq = toks[:C + k + 1]
        c0 = time.perf_counter()
        tl = trun.logits(seq, k + 1)
        c1 = time.perf_counter()
        if k == 0:  # plain decoding: one draw from the row
            draw_token(tl[0], rng, params)
            c2 = time.perf_counter()
            trun.rollback(C)
        elif crop_name is not None:  # a model draft's step: draws, verify, the target's cache cropped (the
            props = [draw_token(qrows[j], rng, params) for j in range(k)]  # draft's crop is timed in draft_step)
            q = np.stack([qrows[j] for j in range(k)])
            res = verify_logits(tl[None], q[None], np.asarray([props], np.int64), **sp,
                                seed=int(rng.integers(0, 2 ** 62)))
            n_acc = int(res.num_accepted[0])
            _ = [int(v) for v in res.tokens[0, :n_acc + 1]]
            trun.rollback(C)
            c2 = time.perf_counter()
        else:  # only n-gram drafts: a one-hot step (no draws, no draft cache)
            props = toks[C + 1:C + k + 1]
            res = verify_logits(tl[None], None, np.asarray([props], np.int64), **sp,
                                seed=int(rng.integers(0, 2 ** 62)))
            n_acc = int(res.num_accepted[0])
            _ = [int(v) for v in res.tokens[0, :n_acc + 1]]
            trun.rollback(C)
            c2 = time.perf_counter()
        timer.add(("target", k + 1), c1 - c0)
        timer.add(("overhead", k), c2 - c1)

    def draft_step(name: str, n: int) -> None:
        run = druns[name]
        c0 = time.perf_counter()
        run.logits(toks[:C + n], 1)
        c1 = time.perf_counter()
        run.rollback(C)
        c2 = time.perf_counter()
        timer.add(("draft", name, n), c1 - c0)
        if name == crop_name:
            timer.add(("draft crop",), c2 - c1)

    def ngram_step(name: str) -> None:
        c0 = time.perf_counter()
        proposers[name].propose(ctx)
        timer.add(("ngram", name), time.perf_counter() - c0)

    threads = torch.get_num_threads()  # recorded in the table (Timer.rounds keeps it through Numba's pool start)
    # an n-gram step verifies however many tokens the lookup found (d <= k): every d up to the largest k is priced
    steps = list(range(1, K + 1)) if ngrams else ks
    units = [(target_step, (k,)) for k in [0, *steps]]
    units += [(draft_step, (name, n)) for name in models for n in (1, 2)]
    units += [(ngram_step, (name,)) for name in ngrams]
    timer.rounds(units, rng, warmup, repeats, progress)

    tf, tse = timer.table(lambda key: key[1] if key[0] == "target" else None)
    ov, ose = timer.table(lambda key: key[1] if key[0] == "overhead" else None)
    if crop_name is not None:  # a model draft's step also crops the draft's cache
        dc, dcse = timer.table(lambda key: 0 if key == ("draft crop",) else None)
        for k in steps:
            ov[k] += dc[0]
            ose[k] = math.hypot(ose[k], dcse[0])
    out_drafts = {}
    for name in (drafts or {}):
        if name in models:
            f, s = timer.table(lambda key, name=name: key[2] if key[0] == "draft" and key[1] == name else None)
            out_drafts[name] = {"forward_s": _keyed(f), "forward_s_se": _keyed(s)}
        else:
            f, s = timer.table(lambda key, name=name: 1 if key == ("ngram", name) else None)
            out_drafts[name] = {"forward_s": _keyed(f), "forward_s_se": _keyed(s), "one_call_per_step": True}
    flavour = (f"a step of draft {crop_name!r} (k draws, verify_logits with its logits, both caches cropped; the "
               "draft's crop timed after its forwards and added)"
               if crop_name is not None else "a one-hot n-gram step (verify_logits without draft logits, the "
               "target's cache cropped)")
    import transformers

    note = (f"fastspec.hf.measure_costs: medians of {repeats} interleaved rounds (order shuffled per round) after "
            f"{warmup} warm-up rounds, every forward from one context of {C} tokens; *_se: distribution-free "
            f"standard error of the median (order-statistic 95% interval / 3.92); overhead_s[k>0]: {flavour}; "
            f"overhead_s[0]: one draw; sampling {params.describe() if params.filtered else f'T={temperature:g}'}; "
            f"V={V}; torch {torch.__version__}, transformers {transformers.__version__}")
    table = CostTable.from_dict({
        "version": 1, "machine": machine_name(), "threads": int(threads),
        "context_length": C, "repeats": repeats, "note": note,
        "target": {"forward_s": _keyed(tf), "forward_s_se": _keyed(tse)},
        "drafts": out_drafts, "overhead_s": _keyed(ov), "overhead_s_se": _keyed(ose)})
    if batches is None:
        return table
    fields = batch_axis(target, models, ngrams, toks=toks, C=C, batches=batches, ks=ks, params=params,
                        repeats=repeats, warmup=warmup, seed=seed, progress=progress, V=V)
    return measure_batch_costs(table, fields, batches)


def _keyed(d: dict) -> dict:
    return {str(k): float(v) for k, v in sorted(d.items())}


#: the most tokens (B x (largest k + 1)) one timed batch forward may feed, and the most logits entries
#: (B x (k + 1) x V) it may return, so that a measurement stays small on a laptop-class machine
MAX_BATCH_TOKENS = 1 << 14
MAX_LOGITS_ENTRIES = 1 << 26
#: the most positions all batched KV caches hold together (every B's cache lives through the interleaved rounds)
MAX_CACHED_TOKENS = 1 << 17


def check_batch_budget(batches, K: int, V: int, C: int | None = None, models: int = 1) -> None:
    """The largest timed forward (tokens fed, logits returned) and, with the context length C, the positions all
    batched caches hold (``models``: the target and each model draft) within bounds, else InvalidInput."""
    big = max(batches)
    if big * (K + 1) > MAX_BATCH_TOKENS or big * (K + 1) * V > MAX_LOGITS_ENTRIES:
        raise InvalidInput(f"batches: B = {big} with k up to {K} feeds {big * (K + 1)} tokens and returns "
                           f"{big * (K + 1) * V} logits per timed forward; at most {MAX_BATCH_TOKENS} tokens and "
                           f"{MAX_LOGITS_ENTRIES} logits (give smaller batch sizes or fewer k)")
    if C is not None and sum(batches) * (C + K + 1) * models > MAX_CACHED_TOKENS:
        raise InvalidInput(f"batches: the batched KV caches of B = {','.join(map(str, batches))} at a context of {C} "
                           f"tokens ({models} model(s)) would hold {sum(batches) * (C + K + 1) * models} positions; "
                           f"at most {MAX_CACHED_TOKENS} (give smaller batch sizes or a shorter context_length)")


@torch.inference_mode()
@serial_kernels
def batch_axis(target, models: Mapping, ngrams: Mapping, *, toks: Sequence[int], C: int, batches: Sequence[int],
               ks: Sequence[int], params: SamplingParams, repeats: int, warmup: int, seed: int,
               progress: Callable[[int], None] | None = None, V: int) -> dict:
    """The version-2 batch fields (a dict to merge into a table's JSON) measured on the context ``toks[:C]`` (the
    tokens after it are the ones the timed forwards feed).  ``models``: {name: model draft}; ``ngrams``: {name:
    NgramProposer}; called by :func:`fastspec.hf.measure_costs` with ``batches``."""
    bs = parse_batch_list(list(batches), "batches")
    K = max(ks)
    check_batch_budget(bs, K, V)
    sp = params.as_dict()
    rng = np.random.default_rng(seed + 1)
    ctx, new = list(toks[:C]), list(toks[C:C + K + 1])
    truns = {b: BatchKVRunner(target, ctx, b) for b in bs}
    druns = {(name, b): BatchKVRunner(m, ctx, b) for name, m in models.items() for b in bs}
    crop_name = next(iter(models), None)
    # real draft rows for the draws: the draft's logits over the fed tokens, [K, V]
    qrows = teacher_forced_logits(models[crop_name], ctx, new[:K], cached=False) if crop_name is not None else None
    steps = list(range(1, K + 1)) if ngrams else list(ks)
    timer = _Timer()

    def target_step(b: int, k: int) -> None:
        run = truns[b]
        c0 = time.perf_counter()
        tl = run.logits(new[:k + 1])
        c1 = time.perf_counter()
        if k == 0:
            sample_tokens(tl[:, 0], 1.0 - rng.random(b), **sp)
        elif crop_name is not None:
            q = np.ascontiguousarray(np.broadcast_to(qrows[None, :k], (b, k, qrows.shape[-1])))
            props = sample_tokens(q, 1.0 - rng.random((b, k)), **sp)
            res = verify_logits(tl, q, props, **sp, seed=int(rng.integers(0, 2 ** 62)))
            _ = res.tokens.tolist(), res.num_accepted.tolist()
        else:
            props = np.asarray([new[1:k + 1]] * b, np.int64)
            res = verify_logits(tl, None, props, **sp, seed=int(rng.integers(0, 2 ** 62)))
            _ = res.tokens.tolist(), res.num_accepted.tolist()
        run.rollback()
        c2 = time.perf_counter()
        timer.add(("target", b, k + 1), c1 - c0)
        timer.add(("overhead", b, k), c2 - c1)

    def draft_step(name: str, b: int, n: int) -> None:
        run = druns[(name, b)]
        c0 = time.perf_counter()
        run.logits(new[:n])
        c1 = time.perf_counter()
        run.rollback()
        c2 = time.perf_counter()
        timer.add(("draft", name, b, n), c1 - c0)
        if name == crop_name:
            timer.add(("draft crop", b), c2 - c1)

    def ngram_step(name: str, b: int) -> None:
        contexts = [list(ctx) for _ in range(b)]  # the loop holds one list per sequence
        c0 = time.perf_counter()
        for c in contexts:
            ngrams[name].propose(c)
        timer.add(("ngram", name, b), time.perf_counter() - c0)

    units = [(target_step, (b, k)) for b in bs for k in [0, *steps]]
    units += [(draft_step, (name, b, n)) for name in models for b in bs for n in (1, 2)]
    units += [(ngram_step, (name, b)) for name in ngrams for b in bs]
    timer.rounds(units, rng, warmup, repeats, progress)

    def nested(flat: dict) -> dict:  # {(B, n): s} -> {"B": {"n": s}}, both levels in numeric order
        out: dict = {}
        for (b, n), v in sorted(flat.items()):
            out.setdefault(str(b), {})[str(n)] = float(v)
        return out

    def axis(select) -> tuple[dict, dict]:
        med, se = timer.table(select)
        return nested(med), nested(se)

    tf, tse = axis(lambda key: key[1:] if key[0] == "target" else None)
    ov, ose = axis(lambda key: key[1:] if key[0] == "overhead" else None)
    if crop_name is not None:
        dc, dcse = axis(lambda key: (key[1], 0) if key[0] == "draft crop" else None)
        for b in ov:
            for k in ov[b]:
                if k != "0":
                    ov[b][k] += dc[b]["0"]
                    ose[b][k] = math.hypot(ose[b][k], dcse[b]["0"])
    drafts = {}
    for name in models:
        f, s = axis(lambda key, name=name: key[2:] if key[0] == "draft" and key[1] == name else None)
        drafts[name] = {"batch_forward_s": f, "batch_forward_s_se": s}
    for name in ngrams:
        f, s = axis(lambda key, name=name: (key[2], 1) if key[0] == "ngram" and key[1] == name else None)
        drafts[name] = {"batch_forward_s": f, "batch_forward_s_se": s}
    return {"target": {"batch_forward_s": tf, "batch_forward_s_se": tse}, "drafts": drafts,
            "batch_overhead_s": ov, "batch_overhead_s_se": ose}


def measure_batch_costs(table: CostTable, fields: dict, batches: Sequence[int]) -> CostTable:
    """``table`` (the version-1 entries) with the batch ``fields`` of :func:`batch_axis` merged in: a version-2
    :class:`~fastspec.costs.CostTable`."""
    obj = table.as_dict()
    obj["version"] = 2
    obj["target"].update(fields["target"])
    for name, entry in fields["drafts"].items():
        obj["drafts"][name].update(entry)
    obj["batch_overhead_s"] = fields["batch_overhead_s"]
    obj["batch_overhead_s_se"] = fields["batch_overhead_s_se"]
    obj["note"] = (obj.get("note", "") + f"; batch axis B = {','.join(map(str, batches))}: B copies of the same "
                   "context in one batched KV cache, every (B, quantity) timed once per interleaved round (order "
                   "shuffled across all B), medians and standard errors as above")
    return CostTable.from_dict(obj)
