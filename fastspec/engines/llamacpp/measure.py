"""fastspec against llama.cpp: run ``llama-server``'s own speculative decoding, predict its counters, audit its
output (``fastspec measure --engine llamacpp``).

For one target GGUF, drafts (GGUF files), ks and prompts (:func:`measure_llamacpp`):

1. **llama.cpp without speculation** (one ``llama-server -m TARGET``): every prompt once, ``n_predict`` tokens,
   EOS ignored: the baseline tokens/s (llama.cpp's own ``timings``) and the plain output.  Prompt i is sampled
   with seed ``seed + i``: llama.cpp seeds each request's sampler, so one seed for every prompt would draw the same
   uniforms at the same position of every prompt (the audit's per-position tests would see them all at once).
2. **llama.cpp with speculation**, one server per (draft, k): ``-md DRAFT --spec-type draft-simple
   --spec-draft-n-max k`` (and ``--spec-draft-n-min``, ``--spec-draft-p-min``, ``--spec-draft-sampling``); every
   prompt once, its output tokens and ``timings.draft_n`` / ``timings.draft_n_accepted`` per request.
3. **Teacher forcing, by llama.cpp itself** (so its numerics are the engine's): a plain ``llama-server`` of each
   model answers ``/completion`` with ``n_predict = 1`` and ``n_probs`` on the prompt followed by the record up to
   each position (prompt cache on: one decode per position), which gives the model's best candidates and their
   log-probabilities there (``n_probs`` without ``post_sampling_probs`` is the softmax of the raw logits).
   At T = 0 the draft's own greedy continuation from each visited step start (``n_predict`` = the step's cap)
   gives the drafted tokens and the top probabilities that ``p_min`` reads.
4. **The prediction** (:func:`fastspec.engines.conventions.expected_counters` under
   :data:`~fastspec.engines.llamacpp.conventions.LLAMACPP`): at T = 0 the record is the speculative run's own
   output (the target's greedy choices as that run made them) and the prediction is exact: drafted tokens
   :func:`~fastspec.engines.llamacpp.conventions.draft_length` long, accepted while they equal the record.  At
   T > 0 the record is the speculative run's sampled output and the counters are expectations (the context
   assumed to stay on the record, as in ``fastspec simulate``): a greedy draft x accepted with p(x), a
   probabilistic one with sum min(p, q), q the draft's top 10 at T, p the target's top ``top_k``.
5. **Near-tie flips at T = 0**, counted and reported, never hidden: prompts whose speculative output differs from
   the plain output (llama.cpp's batched verification and its one-token decoding round differently), and
   positions where the teacher-forced target's argmax is not the recorded token.
6. **The audit** (:mod:`fastspec.audit`) of the plain and every speculative output against the teacher-forced
   target: greedy at T = 0; at T > 0 with the target's processed distribution (``top_k`` candidates, which is
   why T > 0 needs ``top_k`` between 1 and 40, ``top_p = 1`` and ``min_p = 0``).

A draft whose vocabulary llama.cpp refuses for the target (its own rule, read from the GGUF headers:
:mod:`~fastspec.engines.llamacpp.gguf_header`) is bad input, refused before any server starts.
Bad input raises :class:`~fastspec.errors.InvalidInput` with ``exc.argument`` (``"target"``, ``"drafts"``,
``"prompts"``, ``"sampling"``, ``"draft_sample_method"``, ``"p_min"``, ``"n_min"``); llama.cpp failing is
:class:`~fastspec.engines.errors.EngineError`.  Nothing here imports torch.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ...errors import InvalidInput
from ...params import SamplingParams
from ...runs import ENGINE_SEED_END, check_request_seeds, check_run
from ..conventions import Counters, expected_counters
from .ngram import DEFAULT_SIZE_N, NgramSimple, NgramSimpleSteps, ngram_simple_counters, ngram_simple_time
from .conventions import DRAFT_SAMPLING, DRAFT_TOP_K, LLAMACPP, draft_cap, draft_length, processed_top, \
    step_accept, top_probability
from ..errors import EngineError
from .gguf_header import read_tokenizer, vocabulary_mismatch
from .runner import Server, find_binary, server_args

__all__ = ["LlamaDraft", "RowResult", "LlamaCppComparison", "TeacherForcing", "check_drafts", "check_vocabularies",
           "read_prompt_lines", "predict_greedy", "ModelDraftSteps", "greedy_steps", "model_draft_time",
           "measure_llamacpp", "NEAR_TIE"]

#: a logit gap (nats) below which two candidates are a near tie
NEAR_TIE = 1e-3
#: the target's candidates read per position (llama.cpp's default top_k is 40)
TARGET_CANDIDATES = 40


def _bad(argument: str, message: str) -> InvalidInput:
    exc = InvalidInput(message)
    exc.argument = argument
    return exc


@dataclass(frozen=True)
class LlamaDraft:
    name: str
    path: str                 # the GGUF draft model; "" for llama.cpp's ngram-simple speculator
    ngram_n: int | None = None  # ngram-simple's --spec-ngram-simple-size-n (its size_m is the k measured)


def _check_gguf(argument: str, what: str, path: str) -> None:
    if not os.path.isfile(path):
        raise _bad(argument, f"{what} {path}: no such file (give a GGUF model file)")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise _bad(argument, f"{what} {path}: not a GGUF file (llama.cpp runs GGUF models; convert with llama.cpp's "
                   "convert_hf_to_gguf.py)")


def check_vocabularies(target: str, drafts: Sequence[LlamaDraft]) -> None:
    """Refuse, before any server starts, a draft whose vocabulary llama.cpp does not speculate with for ``target``
    (:func:`~fastspec.engines.llamacpp.gguf_header.vocabulary_mismatch`, llama.cpp's own rule), and a GGUF whose
    header cannot be read; InvalidInput, ``argument="drafts"`` (or ``"target"``)."""
    try:
        want = read_tokenizer(target)
    except (OSError, ValueError) as exc:
        raise _bad("target", f"target {target}: not a readable GGUF file ({exc})") from None
    for d in drafts:
        if d.ngram_n is not None:  # drafts from the target's own tokens
            continue
        try:
            why = vocabulary_mismatch(want, read_tokenizer(d.path))
        except (OSError, ValueError) as exc:
            raise _bad("drafts", f"draft {d.name}={d.path}: not a readable GGUF file ({exc})") from None
        if why is not None:
            raise _bad("drafts", f"draft {d.name}={d.path}: its vocabulary is not the target's ({why}); llama.cpp "
                       "speculates only with a draft of the target's vocabulary")


def check_drafts(specs: Sequence[str]) -> list:
    """``[NAME=]FILE.gguf`` drafts (NAME defaults to the file's stem) and ``[NAME=]ngram-simple[:N]`` (llama.cpp's
    ngram-simple speculator with lookup n-grams of N tokens, default 12, and drafts of at most k tokens; NAME
    defaults to ``ngram-simple-N``); InvalidInput, ``argument="drafts"``."""
    out, seen = [], set()
    for raw in specs:
        name, _, path = raw.partition("=") if "=" in raw else ("", "", raw)
        if path.startswith("ngram"):
            head, _, n = path.partition(":")
            if head != "ngram-simple" or (n and not (n.isdigit() and 1 <= int(n) <= 1024)):
                raise _bad("drafts", f"draft {raw}: of llama.cpp's n-gram speculators fastspec measures "
                           "ngram-simple: give ngram-simple or ngram-simple:N (N in 1..1024, the lookup n-gram)")
            size_n = int(n) if n else DEFAULT_SIZE_N
            d = LlamaDraft(name or f"ngram-simple-{size_n}", "", size_n)
        else:
            try:
                _check_gguf("drafts", f"draft {raw}:", path)
            except InvalidInput as exc:
                raise _bad("drafts", str(exc).replace(": ", " ", 1)) from None
            d = LlamaDraft(name or os.path.splitext(os.path.basename(path))[0], os.path.abspath(path))
        if d.name in seen:
            raise _bad("drafts", f"draft {raw}: the name {d.name} is given twice")
        seen.add(d.name)
        out.append(d)
    if not out:
        raise _bad("drafts", "drafts: give at least one NAME=DRAFT.gguf")
    return out


def read_prompt_lines(path: str) -> list:
    """The prompts of a text file, one per non-blank line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln.rstrip("\n") for ln in f]
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad("prompts", f"prompts {path}: cannot read it ({exc})") from None
    if path.endswith(".jsonl"):
        raise _bad("prompts", f"prompts {path}: --engine llamacpp reads plain text prompts, one per line")
    return [ln for ln in lines if ln.strip()]


class TeacherForcing:
    """A plain llama-server of one model, asked position by position (module docstring, step 3); answers are
    cached by context."""

    def __init__(self, server: Server):
        self.server = server
        self._cache: dict = {}
        self.eos_divergences = 0

    def _complete(self, context, n_predict: int, n_probs: int, **sampling):
        body = {"prompt": list(map(int, context)), "n_predict": int(n_predict), "n_probs": int(n_probs),
                "cache_prompt": True, "return_tokens": True, "ignore_eos": True, **sampling}
        ans = self.server.complete(body)
        return [int(t) for t in ans["tokens"]], ans.get("completion_probabilities") or []

    def _row(self, context: Sequence[int], n_probs: int, biased: bool):
        """(ids, values) of the model's ``n_probs`` best candidates after ``context``: raw log-probabilities, or
        (``biased``) the log of the probabilities after llama.cpp's sampler chain (ignore_eos's logit bias, then
        top-k).  llama-server drops the probabilities of a generated token that ends inside a UTF-8 character, so
        the one token generated here is sampled, and sampled again with another seed until it is whole."""
        key = (tuple(context), n_probs, biased)
        if key not in self._cache:
            for seed in range(64):
                _toks, probs = self._complete(context, 1, n_probs, temperature=1.0, top_k=int(n_probs),
                                              samplers=["top_k"], post_sampling_probs=bool(biased), seed=seed)
                if probs:
                    break
            else:
                raise EngineError(f"llamacpp {self.server.name}: /completion gave no token probabilities")
            field_, vals_ = ("top_probs", "prob") if biased else ("top_logprobs", "logprob")
            ids = np.array([c["id"] for c in probs[0][field_]], np.int64)
            vals = np.array([c[vals_] for c in probs[0][field_]], np.float64)
            if biased:
                with np.errstate(divide="ignore"):
                    vals = np.log(vals)
            self._cache[key] = (ids, vals)
        return self._cache[key]

    def along(self, prompt: Sequence[int], record: Sequence[int], n_probs: int, *, biased: bool = False):
        """(ids [T, n], logprobs [T, n]): the model's best candidates before each token of ``record`` (``biased``:
        the target's, after ignore_eos's logit bias, renormalized over the ``n_probs`` best)."""
        rows = [self._row(list(prompt) + list(record[:t]), n_probs, biased) for t in range(len(record))]
        n = min(len(r[0]) for r in rows)
        return np.stack([r[0][:n] for r in rows]), np.stack([r[1][:n] for r in rows])

    def rollout(self, context: Sequence[int], n: int):
        """The model's greedy continuation of ``context`` (``n`` tokens) as llama.cpp's draft makes it, and its
        top-10 probability before each token.  The server bans EOS (``ignore_eos``) while the draft's sampler
        does not: where the raw argmax is an end-of-generation token the continuation takes it and goes on after
        it, as the draft does (counted in :attr:`eos_divergences`)."""
        key = ("rollout", tuple(context), n)
        if key not in self._cache:
            toks, rows, diverged = [], [], False
            while len(toks) < n:
                ctx = list(context) + toks
                got, probs = self._complete(ctx, n - len(toks), DRAFT_TOP_K, temperature=0.0)
                got = got[:n - len(toks)]
                if len(probs) >= len(got):
                    new = [(np.array([c["id"] for c in p["top_logprobs"]], np.int64),
                            np.array([c["logprob"] for c in p["top_logprobs"]], np.float64))
                           for p in probs[:len(got)]]
                else:  # a token inside a UTF-8 character lost its probabilities: ask position by position
                    new = [self._row(ctx + got[:j], DRAFT_TOP_K, False) for j in range(len(got))]
                for (ids, lps), t in zip(new, got, strict=True):
                    rows.append((ids, lps))
                    if int(ids[0]) != t:  # the draft's argmax is banned here: the draft takes it
                        toks.append(int(ids[0]))
                        diverged = True
                        break
                    toks.append(t)
                if not got:
                    raise EngineError(f"llamacpp {self.server.name}: /completion generated nothing")
            tops = np.array([top_probability(r[1][None, :])[0] for r in rows])
            self._cache[key] = (toks, tops, diverged)
        toks, tops, diverged = self._cache[key]
        self.eos_divergences += int(diverged)
        return toks, tops


def predict_greedy(prompt: Sequence[int], record: Sequence[int], budget: int, k: int, rollout: Callable, *,
                   p_min: float = 0.0, n_min: int = 0) -> Counters:
    """T = 0: llama.cpp's exact counters along the greedy ``record`` (``budget`` tokens): ``rollout(context, n)``
    gives the draft's greedy tokens and top-10 probabilities from a step's context (only the steps the record
    visits are asked)."""
    def accept(s: int):
        cap = draft_cap(s, budget, k)
        if cap == 0:
            return []
        toks, tops = rollout(list(prompt) + list(record[:s]), cap)
        d = draft_length(tops, cap, p_min=p_min, n_min=n_min)
        return step_accept(toks[:d], record, s)
    return expected_counters(accept, budget, k, first_step=LLAMACPP.first_step)


@dataclass(frozen=True)
class ModelDraftSteps(NgramSimpleSteps):
    """The verify steps of one request with a model draft: ``steps[i] = (drafted, accepted)`` as for the n-gram
    speculator, and ``draft_forwards[i]``, the draft's single-token forwards in ``draft()`` at that step."""

    draft_forwards: tuple[int, ...] = ()


def greedy_steps(prompt: Sequence[int], record: Sequence[int], budget: int, k: int, rollout: Callable, *,
                 p_min: float = 0.0, n_min: int = 0) -> ModelDraftSteps:
    """T = 0: llama.cpp's steps along the greedy ``record`` (``budget`` tokens; ``rollout`` as for
    :func:`predict_greedy`, whose counters these steps sum to).  A step starting at ``s`` drafts ``g`` tokens
    (``draft_length`` without ``n_min``) up to ``draft_cap(s, budget, k)``; ``n_min`` drops a short draft after it
    was made.  ``common_speculative_impl_draft_simple::draft`` (``common/speculative.cpp``) decodes the last
    sampled token, then each drafted token but the one that reaches the cap: ``g`` forwards when the draft stops
    at the cap, ``g + 1`` when ``p_min`` stops it; none when the cap is 0 (``get_n_draft_max``: no draft)."""
    steps, forwards = [], []
    s = LLAMACPP.first_step
    while s < budget:
        cap = draft_cap(s, budget, k)
        if cap == 0:
            steps.append((0, 0))
            forwards.append(0)
            s += 1
            continue
        toks, tops = rollout(list(prompt) + list(record[:s]), cap)
        g = draft_length(tops, cap, p_min=p_min)
        d = g if g >= n_min else 0
        ok = step_accept(toks[:d], record, s)
        a = int(np.argmin(ok)) if d and not ok.all() else d
        steps.append((d, a))
        forwards.append(g if g == cap else g + 1)
        s += a + 1
    return ModelDraftSteps(tuple(steps), tuple(forwards))


def model_draft_time(steps: ModelDraftSteps, target_s: Callable[[int], float], draft_s: Callable[[int], float],
                     overhead_s: Callable[[int], float] | float = 0.0) -> float:
    """Seconds of the generation after the first token with a model draft, from forward times over n new tokens
    (``target_s(n)``, ``draft_s(n)``).  A step that drafted ``d`` tokens costs ``draft_forwards`` single-token
    draft forwards (:func:`greedy_steps`), the target's forward over ``d + 1`` tokens, and the draft's forward over
    the same ``d + 1`` tokens: ``tools/server/server-context.cpp`` (``update_slots``) removes the drafted positions
    from the draft's cache (``llama_memory_seq_rm`` from ``ckpt.pos_max + 1``) and, after the target's decode,
    ``common_speculative_process`` re-evaluates the target's batch on the draft
    (``common_speculative_impl_draft_simple::process``; "TAG_SPEC_AVOID_DRAFT_REEVAL").  A step without a draft is
    one token on both models.  Plus ``overhead_s(d)`` (callable) or ``overhead_s`` per step."""
    return ngram_simple_time(steps, lambda n: target_s(n) + draft_s(n), overhead_s) + \
        draft_s(1) * sum(steps.draft_forwards)


@dataclass
class RowResult:
    draft: str
    k: int
    draft_sampling: str
    measured: list          # per prompt [draft_n, draft_n_accepted]
    predicted: list         # per prompt [drafted, accepted] (expectations at T > 0)
    exact: bool             # T = 0: the prediction claims equality per prompt
    matches: int            # prompts whose counters equal the prediction (T = 0)
    flips: list             # T = 0: prompts whose output differs from the plain output
    near_ties: int          # T = 0: recorded positions where the target's argmax is not the token (or a tie)
    eos_divergences: int    # T = 0: visited steps where the draft drafts EOS (banned in the target's output)
    tokens_per_s: float
    speedup: float
    audit: dict | None = None
    verdict: str = ""


@dataclass
class LlamaCppComparison:
    engine: str
    target: str
    sampling: dict
    max_new_tokens: int
    prompts: int
    threads: int
    p_min: float
    n_min: int
    plain_tokens_per_s: float
    rows: list
    plain_audit: dict | None = None
    warnings: list = field(default_factory=list)
    verdict: str = ""

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["rows"] = [dict(r.__dict__) for r in self.rows]
        return d


def _check_sampling(sampling: SamplingParams) -> None:
    if sampling.temperature > 0 and (not 1 <= sampling.top_k <= TARGET_CANDIDATES or sampling.top_p != 1.0
                                     or sampling.min_p != 0.0):
        raise _bad("sampling", f"--engine llamacpp at T > 0 needs --top-k between 1 and {TARGET_CANDIDATES} (the "
                   "target's distribution is read as its top-k candidates), --top-p 1 and --min-p 0")


def _request(ids, budget, sampling: SamplingParams, seed: int) -> dict:
    body = {"prompt": list(map(int, ids)), "n_predict": int(budget), "ignore_eos": True, "return_tokens": True,
            "cache_prompt": False, "seed": int(seed), "temperature": float(sampling.temperature),
            "top_p": 1.0, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}
    if sampling.temperature > 0:
        body["top_k"] = int(sampling.top_k)
        body["samplers"] = ["top_k", "temperature"]
    return body


def _audit(sampling: SamplingParams, seed: int, tf: TeacherForcing, prompts, outputs, vocab: int) -> dict:
    from ...audit import OutputAudit

    if sampling.temperature == 0:
        aud = OutputAudit(temperature=0.0, seed=seed)
        for i, (p, out) in enumerate(zip(prompts, outputs, strict=True)):
            ids, lps = tf.along(p, out, TARGET_CANDIDATES, biased=True)
            rows = np.full((len(out), vocab), float(lps.min()) - 50.0, np.float64)
            np.put_along_axis(rows, ids, lps, axis=1)
            aud.add_logits(i, np.arange(len(out)), rows, np.asarray(out, np.int64))
    else:
        aud = OutputAudit(temperature=sampling.temperature, top_k=sampling.top_k, seed=seed)
        for i, (p, out) in enumerate(zip(prompts, outputs, strict=True)):
            ids, lps = tf.along(p, out, TARGET_CANDIDATES, biased=True)
            probs = processed_top(ids, lps, temperature=sampling.temperature, top_k=sampling.top_k, vocab=vocab)
            aud.add_probs(i, np.arange(len(out)), probs, np.asarray(out, np.int64))
    return aud.result().as_dict()


def _vocab(server: Server) -> int:
    """The model's vocabulary size from ``/v1/models`` (``data[0].meta.n_vocab``); EngineError without it."""
    from ..errors import EngineError

    try:
        status, models = server._request("GET", "/v1/models", None, timeout=30.0)
        return int(models["data"][0]["meta"]["n_vocab"])
    except (OSError, KeyError, IndexError, TypeError, ValueError):
        raise EngineError(f"llamacpp {server.name}: /v1/models does not give the vocabulary size") from None


def measure_llamacpp(target: str, drafts: Sequence[str], prompts: str, ks: Sequence[int], *,
                     sampling: SamplingParams, max_new_tokens: int, seed: int, max_prompts: int | None = None,
                     draft_sample_method: str | None = None, binary: str | None = None, threads: int = 1,
                     p_min: float = 0.0, n_min: int = 0, audit: bool = True,
                     progress: Callable[[str], None] | None = None, **_ignored) -> LlamaCppComparison:
    """llama.cpp's own speculative decoding of ``target`` with GGUF ``drafts`` against fastspec's prediction
    (module docstring).  Every argument is checked, and the binary found, before any server starts."""
    say = progress or (lambda _m: None)
    run = check_run(ks=ks, max_new_tokens=max_new_tokens, seed=seed, max_prompts=max_prompts, seed_end=ENGINE_SEED_END)
    ks, max_new_tokens, seed, max_prompts = run["ks"], run["max_new_tokens"], run["seed"], run["max_prompts"]
    method = draft_sample_method or DRAFT_SAMPLING[0]
    if method not in DRAFT_SAMPLING:
        raise _bad("draft_sample_method", f"draft_sample_method {method} is unknown; choose one of: "
                   f"{', '.join(DRAFT_SAMPLING)} (llama.cpp's --spec-draft-sampling)")
    if not (isinstance(p_min, (int, float)) and 0.0 <= p_min <= 1.0):
        raise _bad("p_min", f"p_min {p_min} must lie in [0, 1] (llama.cpp's --spec-draft-p-min)")
    if not (isinstance(n_min, int) and 0 <= n_min):
        raise _bad("n_min", f"n_min {n_min} must be a count >= 0 (llama.cpp's --spec-draft-n-min)")
    _check_gguf("target", "target", target)
    parsed = check_drafts(drafts)
    _check_sampling(sampling)
    lines = read_prompt_lines(prompts)[:max_prompts]
    if not lines:
        raise _bad("prompts", f"prompts {prompts}: no prompt in it")
    check_request_seeds(seed, len(lines))
    check_vocabularies(target, parsed)
    exe = find_binary(binary)
    budget = int(max_new_tokens)
    if budget < 2:
        raise _bad("max_new_tokens", "max_new_tokens must be at least 2 (the first token comes from the prompt)")
    greedy = sampling.temperature == 0
    warnings = []
    ctx = 4096

    say("llamacpp: plain decoding (the record and the baseline)")
    with Server(exe, server_args(target, threads=threads, ctx=ctx), name="plain") as plain_srv:
        ids = []
        for ln in lines:
            status, tok = plain_srv._request("POST", "/tokenize", {"content": ln, "add_special": True}, timeout=60)
            ids.append([int(t) for t in tok["tokens"]])
        vocab = _vocab(plain_srv)
        plain = [plain_srv.complete(_request(p, budget, sampling, seed + i)) for i, p in enumerate(ids)]
    plain_out = [[int(t) for t in a["tokens"]] for a in plain]
    if any(len(o) != budget for o in plain_out):
        raise _bad("max_new_tokens", f"llama.cpp produced fewer than {budget} tokens for a prompt (context full?)")
    plain_tps = _tps(plain)

    runs = {}
    for d in parsed:
        for k in ks:
            if d.ngram_n is not None:
                say(f"llamacpp: {d.name} k = {k}")
                args = server_args(target, threads=threads, ctx=ctx,
                                   extra=NgramSimple(d.ngram_n, k).server_args())
            else:
                say(f"llamacpp: {d.name} k = {k} ({method} drafts)")
                args = server_args(target, draft=d.path, k=k, n_min=n_min, p_min=float(p_min),
                                   draft_sampling=method, threads=threads, ctx=ctx)
            with Server(exe, args, name=f"{d.name} k={k}") as srv:
                runs[(d.name, k)] = [srv.complete(_request(p, budget, sampling, seed + i)) for i, p in enumerate(ids)]

    say("fastspec: teacher-forcing the target and the drafts with llama.cpp")
    rows = []
    with Server(exe, server_args(target, threads=threads, ctx=ctx), name="teacher target") as tsrv:
        tf_target = TeacherForcing(tsrv)
        plain_audit = _audit(sampling, seed, tf_target, ids, plain_out, vocab) if audit else None
        for d in parsed:
            if d.ngram_n is not None:
                rows += [_ngram_row(d, k, runs[(d.name, k)], ids, plain_out, budget, ctx, greedy, plain_tps,
                                    lambda outs: _audit(sampling, seed, tf_target, ids, outs, vocab) if audit
                                    else None) for k in ks]
                continue
            with Server(exe, server_args(d.path, threads=threads, ctx=ctx), name=f"teacher {d.name}") as dsrv:
                tf_draft = TeacherForcing(dsrv)
                for k in ks:
                    answers = runs[(d.name, k)]
                    outs, measured = _tokens_and_counters(answers)
                    predicted, flips, ties = [], [], 0
                    eos_before = tf_draft.eos_divergences
                    for i, (p, out) in enumerate(zip(ids, outs, strict=True)):
                        if greedy:
                            if out != plain_out[i]:
                                flips.append(i)
                            t_ids, t_lps = tf_target.along(p, out, 2, biased=True)
                            ties += int(np.sum((t_ids[:, 0] != np.asarray(out)) |
                                               (t_lps[:, 0] - t_lps[:, 1] < NEAR_TIE)))
                            c = predict_greedy(p, out, budget, k, tf_draft.rollout, p_min=p_min, n_min=n_min)
                        else:
                            c = _predict_sampled(p, out, budget, k, tf_target, tf_draft, sampling, method, p_min,
                                                 n_min, vocab)
                        predicted.append([c.num_draft_tokens, c.num_accepted_tokens])
                    matches = sum(1 for m, q in zip(measured, predicted, strict=True)
                                  if greedy and m[0] == round(q[0]) and m[1] == round(q[1]))
                    row = RowResult(d.name, k, method, measured, predicted, greedy, matches, flips, ties,
                                    tf_draft.eos_divergences - eos_before,
                                    _tps(answers), _tps(answers) / plain_tps if plain_tps > 0 else float("nan"))
                    row.audit = _audit(sampling, seed, tf_target, ids, outs, vocab) if audit else None
                    row.verdict = _row_verdict(row, len(ids))
                    rows.append(row)
    bad = [r for r in rows if r.exact and r.matches < len(ids)]
    failed = [r for r in rows if r.audit is not None and not r.audit.get("passed", True)]
    if plain_audit is not None and not plain_audit.get("passed", True):
        warnings.append("llama.cpp's plain output itself fails the audit against its own teacher forcing")
    parts = []
    if bad:
        parts.append("counters differ from the exact prediction for " + ", ".join(f"{r.draft} k = {r.k}" for r in bad))
    if failed:
        parts.append("the output of " + ", ".join(f"{r.draft} k = {r.k}" for r in failed) + " fails the audit")
    verdict = "; ".join(parts) + "." if parts else (
        ("llama.cpp's counters equal fastspec's exact prediction on every prompt" if all(r.exact for r in rows) else
         "llama.cpp's counters are compared with fastspec's expectation") +
        (" and every output passes the audit." if audit else "."))
    return LlamaCppComparison("llamacpp", os.path.abspath(target), sampling.as_dict(), budget, len(ids), threads,
                              float(p_min), int(n_min), plain_tps, rows, plain_audit, warnings, verdict)


def _tokens_and_counters(answers) -> tuple[list, list]:
    """Per answer of a speculative server: its generated token ids, and [draft_n, draft_n_accepted]."""
    return ([[int(t) for t in a["tokens"]] for a in answers],
            [[int(a["timings"].get("draft_n", 0)), int(a["timings"].get("draft_n_accepted", 0))] for a in answers])


def _ngram_row(d: LlamaDraft, k: int, answers, ids, plain_out, budget: int, ctx: int, greedy: bool,
               plain_tps: float, audit: Callable) -> RowResult:
    """The row of llama.cpp's ngram-simple speculator (size_n ``d.ngram_n``, size_m ``k``).  Its draft is a function
    of the tokens so far, and a drafted token is accepted when it is the token generated: its counters are replayed
    exactly (:func:`~fastspec.engines.llamacpp.ngram.ngram_simple_counters`), at T = 0 from the plain record (a
    prediction; a prompt whose speculative text differs, a near-tie flip, is counted), at T > 0 along the run's own
    output (no draft model, so no expectation to take: equality is claimed there too).  ``ignore_eos`` bans EOS
    from the output, so a drafted EOS is never accepted either way."""
    spec = NgramSimple(d.ngram_n, k)
    outs, measured = _tokens_and_counters(answers)
    flips = [i for i, out in enumerate(outs) if greedy and out != plain_out[i]]
    predicted = []
    for p, own, rec in zip(ids, outs, plain_out, strict=True):
        steps = ngram_simple_counters(p, rec if greedy else own, spec, n_predict=budget, n_ctx=ctx)
        predicted.append([steps.draft_n, steps.draft_n_accepted])
    matches = sum(1 for m, q in zip(measured, predicted, strict=True) if m == q)
    tps = _tps(answers)
    row = RowResult(d.name, k, "ngram-simple", measured, predicted, True, matches, flips, 0, 0, tps,
                    tps / plain_tps if plain_tps > 0 else float("nan"))
    row.audit = audit(outs)
    row.verdict = _row_verdict(row, len(ids))
    return row


def _tps(answers) -> float:
    n = sum(a["timings"].get("predicted_n", 0) for a in answers)
    ms = sum(a["timings"].get("predicted_ms", 0.0) for a in answers)
    return 1000.0 * n / ms if ms > 0 else float("nan")


def _predict_sampled(prompt, record, budget, k, tf_target, tf_draft, sampling, method, p_min, n_min, vocab):
    t_ids, t_lps = tf_target.along(prompt, record, TARGET_CANDIDATES, biased=True)
    p = processed_top(t_ids, t_lps, temperature=sampling.temperature, top_k=sampling.top_k, vocab=vocab)
    d_ids, d_lps = tf_draft.along(prompt, record, DRAFT_TOP_K)
    if method == "greedy":
        x = d_ids[:, 0]
        a = p[np.arange(len(record)), x]
        tops = top_probability(d_lps)
    else:
        q = processed_top(d_ids, d_lps, temperature=sampling.temperature, top_k=DRAFT_TOP_K, vocab=vocab)
        a = np.minimum(np.minimum(p, q).sum(axis=1), 1.0)
        tops = q.max(axis=1)

    def accept(s):
        cap = draft_cap(s, budget, k)
        d = draft_length(tops[s:s + cap], cap, p_min=p_min, n_min=n_min)
        return a[s:s + d]
    return expected_counters(accept, budget, k, first_step=LLAMACPP.first_step)


def _row_verdict(row: RowResult, n: int) -> str:
    md = sum(m[0] for m in row.measured)
    ma = sum(m[1] for m in row.measured)
    pd_ = sum(q[0] for q in row.predicted)
    pa = sum(q[1] for q in row.predicted)
    what = f"{row.draft} k = {row.k}: llama.cpp drafted {md}, accepted {ma}; predicted {pd_:.1f}, {pa:.1f}"
    if row.exact:
        s = f"{what} -- {row.matches}/{n} prompts exactly predicted"
        if row.flips:
            s += f"; near-tie flips: {len(row.flips)} prompts' output differs from plain decoding"
        if row.near_ties:
            s += f"; {row.near_ties} near-tie positions of the target"
        if row.eos_divergences:
            s += f"; {row.eos_divergences} steps drafted EOS (never accepted: --ignore-eos bans it)"
    else:
        s = f"{what} (expectations at T > 0; acceptance {ma / md if md else math.nan:.3f} measured, " \
            f"{pa / pd_ if pd_ else math.nan:.3f} predicted)"
    if row.audit is not None and not row.audit.get("passed", True):
        s += "; its output FAILS the audit"
    return s
