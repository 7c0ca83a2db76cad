"""The batch axis of a cost table (version 2, :mod:`fastspec.costs`), measured with the Hugging Face models.

:func:`measure_batch_costs` times, for each batch size B, what a batched speculative loop does per step over B
sequences whose KV caches each hold the same context of C tokens (B copies of it: with dense attention the
cost depends on the lengths, not on the token values):

* ``target.batch_forward_s[B][n]``: one forward of the batch over n new tokens per sequence (ids [B, n], the cache
  at C positions per sequence; the float32 numpy copy of the last n logits rows included, as
  :class:`~fastspec.hf.runner.KVRunner` does at B = 1), for n = 1 and every k + 1;
* ``drafts[name].batch_forward_s[B]["1"]``, ``["2"]``: a model draft's forward at B over 1 and 2 new tokens; an
  n-gram proposer: ``propose`` on each of the B contexts (one call for the batch, ``{"1": s}``);
* ``batch_overhead_s[B][k]``: the batch's per-step work besides the forwards -- the B k draft draws
  (``sample_tokens`` on [B, k, V] draft rows), ``verify_logits`` on [B, k + 1, V] target and [B, k, V] draft
  logits, reading its result and cropping the target's cache (and, with a model draft, the draft's cache: timed
  after the draft's forwards and added) back to C; with only n-gram drafts the one-hot step (no draws, no draft
  logits); ``batch_overhead_s[B]["0"]``: B draws from the plain step's rows.

Method as :func:`fastspec.hf.measure_costs`: every (B, quantity) is timed once per round, the order shuffled every
round (seeded) across all batch sizes, ``warmup`` rounds discarded, medians over ``repeats`` rounds with the
distribution-free standard error of the median (:func:`fastspec.hf.costs.median_se`).  fastspec's kernels run on
the calling thread, as in the decoding loops (``_serial_kernels``: a parallel region per step competes with
torch's threads on a small machine).
"""
from __future__ import annotations

import math
import time
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..costs import CostTable
from ..costs_batch import parse_batch_list
from ..errors import InvalidInput
from ..params import SamplingParams
from ..processing import sample_tokens
from ..verify import verify_logits
from .costs import _Timer
from .loop import _serial_kernels, teacher_forced_logits
from .runner import _cache_kw, _crop, _new_cache

__all__ = ["measure_batch_costs", "batch_axis"]

#: the most tokens (B x (largest k + 1)) one timed batch forward may feed, and the most logits entries
#: (B x (k + 1) x V) it may return, so that a measurement stays small on a laptop-class machine
MAX_BATCH_TOKENS = 1 << 14
MAX_LOGITS_ENTRIES = 1 << 26
#: the most positions all batched KV caches hold together (every B's cache lives through the interleaved rounds)
MAX_CACHED_TOKENS = 1 << 17


class _BatchRunner:
    """One model with a batched KV cache of B copies of one context."""

    def __init__(self, model, ctx: Sequence[int], batch: int):
        import inspect

        self.model, self.batch, self.C = model, batch, len(ctx)
        self.kw = _cache_kw(model)
        self.keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        self.cache = _new_cache(model)
        ids = torch.tensor([list(ctx)] * batch, dtype=torch.long)
        model(ids, **{self.kw: self.cache, "use_cache": True})

    def logits(self, new: Sequence[int]) -> np.ndarray:
        """float32 [B, n, V] of a forward over ``new`` (n tokens, the same for every sequence)."""
        n = len(new)
        ids = torch.tensor([list(new)] * self.batch, dtype=torch.long)
        kwargs = {self.kw: self.cache, "use_cache": True}
        if self.keep:
            kwargs["logits_to_keep"] = n
        out = self.model(ids, **kwargs)
        return out.logits[:, -n:].to(torch.float32).numpy()

    def rollback(self) -> None:
        _crop(self.cache, self.C)
        got = self.cache.get_seq_length()
        if got != self.C:
            raise RuntimeError(f"internal: batched cache holds {got} positions, expected {self.C}")


def _check_size(batches, K: int, V: int, C: int | None = None, models: int = 1) -> None:
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
@_serial_kernels
def batch_axis(target, models: Mapping, ngrams: Mapping, *, toks: Sequence[int], C: int, batches: Sequence[int],
               ks: Sequence[int], params: SamplingParams, repeats: int, warmup: int, seed: int,
               progress: Callable[[int], None] | None = None, V: int) -> dict:
    """The version-2 batch fields (a dict to merge into a table's JSON) measured on the context ``toks[:C]`` (the
    tokens after it are the ones the timed forwards feed).  ``models``: {name: model draft}; ``ngrams``: {name:
    NgramProposer}; called by :func:`fastspec.hf.measure_costs` with ``batches``."""
    bs = parse_batch_list(list(batches), "batches")
    K = max(ks)
    _check_size(bs, K, V)
    sp = params.as_dict()
    rng = np.random.default_rng(seed + 1)
    ctx, new = list(toks[:C]), list(toks[C:C + K + 1])
    truns = {b: _BatchRunner(target, ctx, b) for b in bs}
    druns = {(name, b): _BatchRunner(m, ctx, b) for name, m in models.items() for b in bs}
    crop_name = next(iter(models), None)
    # real draft rows for the draws: the draft's logits over the fed tokens, [K, V]
    qrows = teacher_forced_logits(models[crop_name], ctx, new[:K]) if crop_name is not None else None
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
