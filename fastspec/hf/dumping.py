"""Logit dumps from real models: what :func:`fastspec.simulate` and the acceptance analysis read.

For each prompt a continuation is sampled from the target (:func:`fastspec.hf.generate`, KV cache); the target's
rows are the logits that sampling drew each token from.  An early-exit draft ``exitL`` of the target gets its rows
from the same forwards (the hidden state after decoder layer L, then the final norm and LM head, all positions in
one product), so it costs no forward of its own; any other draft model is run teacher-forced over prompt +
continuation (one forward per prompt).  Rows are stored as dense raw logits (float16 or float32) or the top-K
processed log-probabilities (sparse), in the dump format of ``docs/reference/dump-format.md``, written with
:func:`fastspec.io.save_dump` (so validation is shared with the loader), with the prompts, whether EOS was
ignored, and by default the cost table of the real loop measured on this machine
(:func:`fastspec.hf.timing.measure_costs`).

The dump is staged in a dot-named temporary directory next to the output (``.fastspec-dump-XXXX``: names
starting with ``.`` are never read as shards) and renamed into place at the end; the staging directory is
removed on failure and on interrupt.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from typing import Callable, Mapping, Sequence

import numpy as np
import torch

from ..config import MAX_POSITIONS
from ..errors import InvalidInput, InvalidType, config_or_settings
from ..io import check_dump_path, check_draft_name, save_dump
from ..ngram import NgramProposer
from ..params import SamplingParams
from ..runs import DEFAULT_COST_K, DUMP_DTYPES, DumpConfig
from ..processing import probabilities
from .args import as_token_ids, check_generation_positions, check_k, check_max_new_tokens, check_positions, eos_set
from .loop import derive_seed, generate, start_numba_pool
from .models import check_vocab_size
from .teacher import teacher_forced_logits

__all__ = ["dump_logits", "check_dump_positions", "DUMP_DTYPES", "STAGING_PREFIX",
           "DEFAULT_COST_K"]

STAGING_PREFIX = ".fastspec-dump-"
#: model types whose causal-LM head is exactly lm_head(norm(hidden)) (no soft-capping or scaling of the logits),
#: so an early exit's rows can be taken from the target's own forwards
_PLAIN_HEAD_TYPES = {"llama", "mistral", "qwen2", "qwen3"}


def check_dump_positions(target, drafts: Mapping | None, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                         cost_k: Sequence[int] | None = None) -> None:
    """The position checks :func:`dump_logits` makes before it generates anything, InvalidInput otherwise: each
    prompt's continuation of ``max_new_tokens`` tokens fits the target and every model draft
    (:func:`fastspec.hf.args.check_generation_positions`; n-gram drafts have no limit); with ``cost_k`` (costs
    measured after the rows) the cost context -- at most the longest prompt + max(1, max_new_tokens // 2) tokens
    -- plus the largest k + 1 fits too (the message names ``cost_k``)."""
    models = {"the target": target, **{f"draft {name}": m for name, m in (drafts or {}).items()}}
    prompts = [as_token_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    if not prompts:
        raise InvalidInput("prompts: give at least one prompt")
    n = check_max_new_tokens(max_new_tokens)
    if len(prompts) * n > MAX_POSITIONS:
        raise InvalidInput(f"max_new_tokens = {n}: {len(prompts)} prompts x {n} positions exceed the {MAX_POSITIONS} "
                           "(2**32) one dump holds; split the prompts into several dumps (shards)")
    check_generation_positions(models, prompts, n)
    if cost_k:
        K = max(check_k(k) for k in cost_k)
        P, half = max(len(p) for p in prompts), max(1, n // 2)
        check_positions(models, P + half + K + 1, "cost_k", K, f"the cost measurement after the rows (a context of "
                        f"up to the longest prompt's {P} tokens + {half} generated ones, then the largest k {K} + 1 "
                        "fed tokens)", lambda L: L - P - half - 1)


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


def _exit_depth(target, draft) -> int | None:
    """L when ``draft`` is :func:`fastspec.hf.early_exit` (target, L) -- the target's own modules -- and the
    target's head is plain (lm_head(norm(h))); else None (the draft is run on its own)."""
    L = getattr(draft, "fastspec_exit_layers", None)
    if L is None or getattr(getattr(target, "config", None), "model_type", None) not in _PLAIN_HEAD_TYPES:
        return None
    try:
        t, d = target.model, draft.model
        shared = (draft.lm_head is target.lm_head and d.norm is t.norm and d.embed_tokens is t.embed_tokens
                  and len(d.layers) == L and all(d.layers[i] is t.layers[i] for i in range(L)))
    except AttributeError:
        return None
    return L if shared else None


class _ExitCapture:
    """Forward hooks on the target's decoder layers L-1: the last position's hidden state of every forward."""

    def __init__(self, target, depths):
        self.layers = {L: target.model.layers[L - 1] for L in depths}
        self.states: dict[int, list] = {L: [] for L in depths}
        self.handles = []

    def __enter__(self):
        for L, layer in self.layers.items():
            self.handles.append(layer.register_forward_hook(self._hook(L)))
        return self

    def _hook(self, L):
        def hook(_module, _inputs, output):
            h = output[0] if isinstance(output, (tuple, list)) else output
            self.states[L].append(h[0, -1].detach().clone())
        return hook

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        self.handles = []

    def reset(self):
        for v in self.states.values():
            v.clear()

    @torch.inference_mode()
    def logits(self, draft, L: int, n: int) -> np.ndarray:
        """float32 [n, V]: the exit draft's logits for the n captured forwards (final norm, LM head)."""
        if len(self.states[L]) != n:
            raise RuntimeError(f"internal: {len(self.states[L])} hidden states captured for {n} tokens")
        h = torch.stack(self.states[L])[None]
        return draft.lm_head(draft.model.norm(h))[0].to(torch.float32).numpy()


def _stage(out: str) -> str:
    """A dot-named staging directory next to ``out`` (same file system: the final rename is atomic)."""
    return tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=os.path.dirname(os.path.normpath(out)) or ".")


def dump_logits(out, target, drafts: Mapping | None, prompts: Sequence[Sequence[int]], *, max_new_tokens: int = 128,
                temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                top_k_save: int | None = None, seed: int = 0, eos_token_id=None, ignore_eos: bool = False,
                dtype="float16", compressed: bool | None = None, costs=True, cost_k: Sequence[int] = DEFAULT_COST_K,
                cost_repeats: int = 10, progress: Callable[[int], None] | None = None,
                cost_progress: Callable[[int], None] | None = None, sampling: SamplingParams | None = None,
                config: DumpConfig | None = None) -> str:
    """Write a logit dump of ``target`` and ``drafts`` ({name: model or NgramProposer}) over ``prompts`` (lists of
    token ids); returns the path written.

    For prompt i a continuation of at most ``max_new_tokens`` tokens is sampled from the target (the sampling
    parameters, seed :func:`fastspec.hf.loop.derive_seed` (seed, i)), stopping after an EOS token of
    ``eos_token_id`` unless ``ignore_eos`` (then every row has ``max_new_tokens`` positions, like vLLM's
    ``ignore_eos``).  Rows (module docstring): dense raw logits in ``dtype`` (``"float16"`` or ``"float32"``)
    [N, T, V], or with ``top_k_save=K`` sparse top-K (ids int32, processed log-probabilities float32 under the
    sampling parameters).  T is always ``max_new_tokens`` (rows are padded; ``lengths`` records the real ones), so
    identical calls give shards that load together.  An n-gram draft (:class:`fastspec.ngram.NgramProposer`) has no
    logits: it is recorded in the cost table only; with no model draft the dump is target-only.

    Also written: ``tokens`` [N, T], ``lengths`` [N], ``prompt_tokens`` [N, P] (padded with 0) and
    ``prompt_lengths`` [N], metadata temperature/top_k/top_p/min_p, vocab_size and ``ignore_eos`` (True when EOS did
    not stop the rows, also when no EOS id was given), and ``costs``: with ``costs=True`` the cost table
    :func:`fastspec.hf.timing.measure_costs` measures after the rows (``cost_k``: the draft lengths it covers,
    ``cost_repeats`` rounds, context: the prompt and first half of the median-length row), or a given
    :class:`fastspec.costs.CostTable` (dict, JSON), or none (``costs=False``).

    Memory: rows go straight into memory-mapped arrays in the staging directory; :func:`fastspec.io.save_dump`
    validates and writes them from there, so peak memory is one prompt's float32 rows per model, not the dump.
    ``compressed`` (npz only) defaults to True for sparse dumps.  ``progress(1)`` is called after each prompt,
    ``cost_progress(1)`` after each cost-measurement round.  The settings are a :class:`fastspec.runs.DumpConfig`
    (``config``: its bounds) or its fields as arguments, not both; they are checked first."""
    c = config_or_settings(DumpConfig, config, dict(
        max_new_tokens=max_new_tokens, sampling=sampling, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, top_k_save=top_k_save, seed=seed, ignore_eos=ignore_eos, dtype=dtype, compressed=compressed,
        costs=costs, cost_k=cost_k, cost_repeats=cost_repeats))
    params, n_new, top_k_save, seed, ignore_eos = c.params, c.max_new_tokens, c.top_k_save, c.seed, c.ignore_eos
    store, compressed, costs, cost_k = np.dtype(c.dtype), c.compressed, c.costs, c.cost_k
    cost_config = c.cost_config  # the cost measurement's settings, checked before any generation
    start_numba_pool()  # before torch's first forward here (the kernels would start it mid-run otherwise)
    drafts = dict(drafts or {})
    for name in drafts:
        check_draft_name(name)
    if not prompts:
        raise InvalidInput("prompts: give at least one prompt")
    prompts = [as_token_ids(p, f"prompts[{i}]") for i, p in enumerate(prompts)]
    out = check_dump_path(out)
    models = {}
    for name, m in drafts.items():
        if isinstance(m, NgramProposer):
            continue
        if not isinstance(m, torch.nn.Module):
            raise InvalidType(f"draft {name!r}: expected a model or a fastspec.ngram.NgramProposer, got "
                              f"{type(m).__name__}")
        check_vocab_size(target, m, name)
        models[name] = m
    check_dump_positions(target, models, prompts, n_new, cost_k if costs is True else None)
    eos = None if ignore_eos else eos_token_id
    sparse = top_k_save is not None
    V = int(target.get_output_embeddings().weight.shape[0])
    kk = min(top_k_save, V) if sparse else None
    N, P = len(prompts), max(len(p) for p in prompts)
    exits = {name: _exit_depth(target, m) for name, m in models.items()}
    exits = {name: L for name, L in exits.items() if L is not None}
    roles = ["target", *models]

    staging = _stage(out)
    try:
        def array(name, shape, dt):
            return np.lib.format.open_memmap(os.path.join(staging, f"part-{name}.npy"), mode="w+", dtype=dt,
                                             shape=shape)

        if sparse:
            values = {r: (array(f"{i}-ids", (N, n_new, kk), np.int32), array(f"{i}-lp", (N, n_new, kk), np.float32))
                      for i, r in enumerate(roles)}
        else:
            values = {r: array(f"{i}-logits", (N, n_new, V), store) for i, r in enumerate(roles)}
        tokens = np.zeros((N, n_new), np.int64)
        lengths = np.zeros(N, np.int64)
        prompt_tokens = np.zeros((N, P), np.int64)
        prompt_lengths = np.asarray([len(p) for p in prompts], np.int64)
        rows = np.empty((n_new, V), np.float32)

        def keep(i, row):
            rows[i] = row

        def put(role, i, lg):
            L = lg.shape[0]
            if sparse:
                ids, lp = _topk(lg, kk, params)
                for a, part in zip(values[role], (ids, lp), strict=True):
                    a[i, :L] = part
                    a[i, L:] = part[-1]  # padding: never read, but keep it valid-looking
            else:
                a = values[role]
                a[i, :L] = lg
                a[i, L:] = a[i, L - 1]

        with _ExitCapture(target, sorted(set(exits.values()))) as cap:
            for i, prompt in enumerate(prompts):
                cap.reset()
                cont = generate(target, prompt, **params.as_dict(), seed=derive_seed(seed, i), max_new_tokens=n_new,
                                eos_token_id=eos, on_logits=keep)
                L = len(cont)
                tokens[i, :L] = cont
                lengths[i] = L
                prompt_tokens[i, :len(prompt)] = prompt
                put("target", i, rows[:L])
                for name, m in models.items():
                    if name in exits:
                        lg = cap.logits(m, exits[name], L)
                    else:
                        lg = teacher_forced_logits(m, prompt, cont, cached=False)
                    put(name, i, lg)
                    del lg
                if progress is not None:
                    progress(1)

        table = None
        if costs is True:
            from .timing import measure_costs

            mid = int(np.argsort(prompt_lengths + lengths, kind="stable")[(N - 1) // 2])
            seq = prompts[mid] + tokens[mid, :lengths[mid]].tolist()
            length = len(prompts[mid]) + max(1, int(lengths[mid]) // 2)
            table = measure_costs(target, drafts, context=seq, progress=cost_progress,
                                  config=dataclasses.replace(cost_config, context_length=length))
        elif costs:
            table = costs
        if compressed is None:
            compressed = sparse
        final = os.path.join(staging, os.path.basename(os.path.normpath(out)))
        save_dump(final, values["target"], {name: values[name] for name in models}, tokens=tokens, lengths=lengths,
                  **params.as_dict(), vocab_size=V, compressed=bool(compressed) and out.endswith(".npz"),
                  layout="npz" if out.endswith(".npz") else "dir", prompt_tokens=prompt_tokens,
                  prompt_lengths=prompt_lengths, ignore_eos=bool(ignore_eos or not eos_set(eos_token_id)), costs=table)
        os.replace(final, out)
        return out
    finally:
        shutil.rmtree(staging, ignore_errors=True)
