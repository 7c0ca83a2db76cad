"""Decoding with real models: plain sampling and the speculative loop (teacher-forced scoring:
:func:`fastspec.hf.teacher.teacher_forced_logits`).

* :func:`generate` / :func:`timed_generate` -- plain autoregressive sampling (the reference the speculative
  loop is compared with, and the baseline of every measured speed-up).
* :func:`speculative_generate` -- standard speculative sampling.  The draft is a model that proposes tokens
  autoregressively with its own KV cache, or a prompt-lookup proposer (:class:`fastspec.ngram.NgramProposer`,
  or a specification such as ``"ngram"`` / ``"ngram1-3"``) that proposes up to k tokens copied from the
  prompt and the generated text; the target scores them in one forward pass; :func:`fastspec.verify_logits`
  decides (it receives the raw float32 logits and applies the sampling parameters itself, identically to p
  and q; an n-gram proposal is one-hot, ``draft_logits=None``); the KV caches are rolled back to the accepted
  prefix.

Tokens are drawn with :func:`fastspec.processing.sample_tokens` (inverse CDF in token order over the processed
distribution, greedy = argmax), one uniform of ``np.random.default_rng(seed)`` per token.  Conventions match
:mod:`fastspec.simulate`: a step drafts ``min(k, max_new_tokens - generated - 1)`` tokens (with a draft-length
policy, :mod:`fastspec.policies`: ``min(budget, max_new_tokens - generated - 1)`` at most, fewer when the policy
stops drafting early); a step that drafts
nothing (nothing left to draft, or an n-gram proposer that finds no match) is a plain target step and is not
counted as a verify step; mean acceptance length = tokens emitted per verify step (bonus / recovered token
included).

Clock: every loop first feeds the prompt without its last token into each KV cache (the *prefill*, timed
apart), so that every later forward is a decoding step: ``decode_s = total_s - prefill_s`` is the time the
cost model (:mod:`fastspec.costs`) describes, and tokens / ``decode_s`` is the decoding throughput.  No EOS
(``eos_token_id=None``) runs every sequence to exactly ``max_new_tokens`` (vLLM's ``ignore_eos``).
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
import torch

from ..verify import verify_logits
from ..errors import InvalidInput, shown
from ..ngram import NgramProposer, propose
from ..params import SamplingParams, given_sampling
from ..processing import probabilities, sample_tokens
from .args import as_token_ids, check_k, check_max_new_tokens, eos_set
from .runner import KVRunner

__all__ = ["generate", "timed_generate", "hf_generate", "GenerateResult", "speculative_generate", "SpecResult",
           "derive_seed", "as_ngram", "as_policy"]

# rng.random() lies in [0, 1), sample_tokens takes (0, 1]: an exact 0 (probability 2**-53) becomes the smallest
# positive double, which, like 0 in an inverse CDF, selects the first token of positive probability.
_TINY = float(np.nextafter(0.0, 1.0))


def _loop_inputs(input_ids, max_new_tokens, eos_token_id, seed):
    """(prompt ids, token budget, EOS ids, generator): the arguments every loop checks before it loads anything
    (the generator gives one uniform per draw, in order)."""
    return (as_token_ids(input_ids), check_max_new_tokens(max_new_tokens), eos_set(eos_token_id),
            np.random.default_rng(seed))


@functools.lru_cache(maxsize=None)
def start_numba_pool() -> None:
    """Start Numba's thread pool (once per process, at the first loop, dump or cost measurement -- not at import)
    and keep torch's thread count.  Starting it inside a kernel (Numba's own lazy start, at the first parallel
    kernel) after torch has used OpenMP resets OpenMP's thread count to Numba's: torch would then run every
    later forward with ``NUMBA_NUM_THREADS`` threads whatever ``torch.set_num_threads`` said -- the runner and
    Hugging Face ``generate`` would no longer run on the same threads."""
    import numba

    n = torch.get_num_threads()
    numba.get_num_threads()  # starts the pool (once per process)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def serial_kernels(fn):
    """Run ``fn`` with fastspec's Numba kernels on the calling thread (``numba.set_num_threads(1)``, restored
    afterwards; the setting is per thread) and torch's thread count unchanged.  A decoding loop calls the
    kernels on one row at a time (a token draw, one verify step): a parallel region per call buys nothing, and
    its worker threads compete with torch's for the cores -- on a busy 2-core machine, milliseconds per call,
    as much as a forward of the 135M model -- so plain decoding (one draw per token) would pay it more often
    than speculative decoding (one verify per step), flattering every speed-up."""
    import numba

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start_numba_pool()
        n = torch.get_num_threads()
        before = numba.get_num_threads()
        numba.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            numba.set_num_threads(before)
            if torch.get_num_threads() != n:
                torch.set_num_threads(n)

    return wrapper



def derive_seed(seed: int, *keys: int) -> int:
    """An independent seed for the run identified by ``keys`` (e.g. prompt index), derived from ``seed``."""
    return int(np.random.SeedSequence([int(seed) & ((1 << 63) - 1), *keys]).generate_state(1, np.uint64)[0] >> 2)


def draw_token(logits_row: np.ndarray, rng: np.random.Generator, params: SamplingParams) -> int:
    """A token from the processed distribution of one raw logits row, with the next uniform of ``rng``."""
    u = float(rng.random())
    return int(sample_tokens(logits_row, u if u > 0.0 else _TINY, **params.as_dict()))


@dataclass
class GenerateResult:
    """What one :func:`timed_generate` run produced: the tokens, the prefill time (the prompt before its last
    token fed into the KV cache) and the whole call's time, in seconds."""

    tokens: np.ndarray
    prefill_s: float
    total_s: float
    first_token_in_prefill: bool = False  # Hugging Face generate: its prefill forward also emits token 0

    @property
    def decode_s(self) -> float:
        """Seconds spent decoding (the call less its prefill)."""
        return self.total_s - self.prefill_s

    @property
    def decode_tokens(self) -> int:
        """Tokens produced by decoding forwards (all of them, or all but the first for ``generate``)."""
        return max(len(self.tokens) - int(self.first_token_in_prefill), 0)

    def as_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "decode_tokens": self.decode_tokens,
                "time_s": {"prefill": self.prefill_s, "decode": self.decode_s, "total": self.total_s}}


def generate(model, input_ids, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128,
             eos_token_id=None, use_cache=True, on_logits=None, sampling: SamplingParams | None = None) -> np.ndarray:
    """Plain autoregressive sampling from ``model`` (the reference the speculative loop is compared with).

    Token i is drawn from the processed distribution of the model's logits (:func:`fastspec.probabilities`) by
    inverse CDF with the i-th uniform of ``np.random.default_rng(seed)``; temperature 0 is greedy.  Stops after
    ``max_new_tokens`` or an EOS token (included; ``eos_token_id=None``: never).  ``on_logits(i, row)``, when
    given, receives the raw float32 logits row [V] token i is drawn from (before it is drawn).  Returns int64
    [n] generated tokens.  One forward per token, the first over the whole prompt (:func:`timed_generate` also
    returns the times, and prefills the prompt apart)."""
    return timed_generate(model, input_ids, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                          sampling=sampling, seed=seed, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
                          use_cache=use_cache, on_logits=on_logits, prefill=False).tokens


@torch.inference_mode()
@serial_kernels
def timed_generate(model, input_ids, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128,
                   eos_token_id=None, use_cache=True, on_logits=None, prefill: bool = True,
                   sampling: SamplingParams | None = None) -> GenerateResult:
    """:func:`generate` with its clock (:class:`GenerateResult`): the prompt before its last token is
    prefilled into the KV cache (timed apart), then each token costs one decoding forward and one draw.
    ``prefill=False``: no separate prefill (``prefill_s`` = 0; the first forward covers the whole prompt)."""
    params = given_sampling(sampling, temperature, top_k, top_p, min_p)
    seq, n_new, eos, rng = _loop_inputs(input_ids, max_new_tokens, eos_token_id, seed)
    t_start = time.perf_counter()
    run = KVRunner(model, use_cache)
    if prefill:
        run.prefill(seq[:-1])
    t_prefill = time.perf_counter() - t_start if prefill else 0.0
    out = []
    for i in range(n_new):
        row = run.logits(seq, 1)[0]
        if on_logits is not None:
            on_logits(i, row)
        x = draw_token(row, rng, params)
        seq.append(x)
        out.append(x)
        if x in eos:
            break
    return GenerateResult(np.asarray(out, dtype=np.int64), t_prefill, time.perf_counter() - t_start)


class _Stamps:
    """A ``generate`` streamer that records when each chunk of tokens arrives and its size (the prompt comes
    first)."""

    def __init__(self):
        self.times: list[float] = []
        self.sizes: list[int] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())
        self.sizes.append(int(value.numel()))

    def end(self) -> None:
        pass


def hf_generation_config(params: SamplingParams, max_new_tokens: int, eos: list, **extra):
    """The only generation config Hugging Face ``generate`` runs with here: ``params`` (greedy at temperature 0,
    else sampling; ``top_k=0`` disables top-k, as in fastspec), ``max_new_tokens``, the EOS ids ``eos`` (none:
    EOS off), plus ``extra`` fields."""
    from transformers import GenerationConfig

    kw = dict(max_new_tokens=max_new_tokens, num_beams=1, use_cache=True, pad_token_id=eos[0] if eos else 0,
              eos_token_id=eos or None, do_sample=not params.greedy)
    if params.greedy:
        kw.update(temperature=None, top_k=None, top_p=None)
    else:
        kw.update(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                  min_p=params.min_p if params.min_p > 0 else None)
    kw.update(extra)
    return GenerationConfig(**kw)


@torch.inference_mode()
def run_hf_generate(model, seq: list, config, seed: int, **kwargs):
    """``model.generate`` of one prompt ``seq`` with ``config`` (and ``kwargs``), torch's global generator seeded
    with ``seed`` right before, timed: ``(tokens int64 [n], first_s, total_s, first_step_tokens)`` -- the time to
    the first generated chunk (the prefill forward also produces it), the whole call, and that chunk's size."""
    torch.manual_seed(int(seed) % (2 ** 63))
    ids = torch.tensor([seq], dtype=torch.long)
    stamps = _Stamps()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=stamps,
                         **kwargs)
    total = time.perf_counter() - t0
    tokens = out[0, len(seq):].cpu().numpy().astype(np.int64)
    first = stamps.times[1] - t0 if len(stamps.times) > 1 else total
    first_tokens = stamps.sizes[1] if len(stamps.sizes) > 1 else len(tokens)
    return tokens, first, total, first_tokens


@torch.inference_mode()
def hf_generate(model, input_ids, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128,
                eos_token_id=None, sampling: SamplingParams | None = None) -> GenerateResult:
    """Plain decoding with Hugging Face ``model.generate`` under the same settings, timed: the reference that
    fastspec's own runner (:func:`timed_generate`) is compared with.

    Greedy at temperature 0, else multinomial sampling with temperature / top-k / top-p / min-p (``top_k=0``
    disables top-k, as in fastspec; torch's generator seeded with ``seed``: the tokens are the same law, not the
    same draws).  ``eos_token_id=None`` ignores EOS (``min_new_tokens = max_new_tokens``): exactly
    ``max_new_tokens`` tokens.  Its prefill forward over the whole prompt also produces the first token, so
    ``prefill_s`` is the time to the first token and ``decode_tokens`` excludes it.  Only a generation
    config built here is used (no sampling defaults of the model's own)."""
    start_numba_pool()  # as the runner's loops do, so both time torch on the same threads
    params = given_sampling(sampling, temperature, top_k, top_p, min_p)
    seq = as_token_ids(input_ids)
    n_new = check_max_new_tokens(max_new_tokens)
    eos = sorted(eos_set(eos_token_id))
    extra = {"min_new_tokens": n_new} if eos_token_id is None else {}
    config = hf_generation_config(params, n_new, eos, **extra)
    tokens, first, total, _ = run_hf_generate(model, seq, config, seed)
    return GenerateResult(tokens, first, total, first_token_in_prefill=True)


@dataclass
class SpecResult:
    """What one :func:`speculative_generate` run produced and measured.

    tokens: int64 [n] generated tokens (EOS included if reached).  verify_steps: steps that drafted >= 1 token;
    plain_steps: target-only steps (nothing left to draft, or no n-gram match); empty_steps: those of them
    where an n-gram proposer found no match.  drafted / accepted: totals over verify steps; emitted: tokens
    produced by verify steps; accepted_per_step: int64 [verify_steps]; per_position_accepted: int64 [k], steps
    whose draft j was accepted; draft_lengths: int64 [verify_steps], tokens drafted per verify step; policy:
    the draft-length policy's name (None: fixed k).  Times in seconds (draft forwards + draft sampling, or the
    n-gram lookups / target forwards / verify_logits + cache rollback / whole call / its prefill, included in
    every other time); ``decode_s`` = total less prefill.  trace: with ``return_trace``, one dict per step
    (drafts, target_logits, draft_logits (None for an n-gram or plain step), emitted)."""

    tokens: np.ndarray
    k: int
    verify_steps: int
    plain_steps: int
    drafted: int
    accepted: int
    emitted: int
    accepted_per_step: np.ndarray
    per_position_accepted: np.ndarray
    draft_s: float
    target_s: float
    verify_s: float
    total_s: float
    trace: list | None = None
    prefill_s: float = 0.0
    empty_steps: int = 0
    draft_lengths: np.ndarray | None = None
    policy: str | None = None

    @property
    def decode_s(self) -> float:
        """Seconds spent decoding (the call less its prefill)."""
        return self.total_s - self.prefill_s

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verify step (the bonus / recovered token included)."""
        return self.emitted / self.verify_steps if self.verify_steps else float("nan")

    @property
    def draft_acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def per_position_acceptance(self) -> np.ndarray:
        """Unconditional per-position acceptance (vLLM): steps whose draft j was accepted / verify steps."""
        return self.per_position_accepted / max(self.verify_steps, 1)

    def as_dict(self) -> dict:
        return {"tokens": self.tokens.tolist(), "k": self.k, "verify_steps": self.verify_steps,
                "plain_steps": self.plain_steps, "empty_steps": self.empty_steps, "drafted": self.drafted,
                "accepted": self.accepted, "emitted": self.emitted,
                "mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance.tolist(), "policy": self.policy,
                "draft_lengths": None if self.draft_lengths is None else self.draft_lengths.tolist(),
                "time_s": {"draft": self.draft_s, "target": self.target_s, "verify": self.verify_s,
                           "prefill": self.prefill_s, "decode": self.decode_s, "total": self.total_s}}


def as_ngram(draft) -> NgramProposer | None:
    """The prompt-lookup proposer ``draft`` stands for, or None when it is a model: an
    :class:`~fastspec.ngram.NgramProposer`, or a specification string
    (:func:`fastspec.hf.models.parse_ngram_spec`: ``"ngram"``, ``"ngramMIN-MAX"``, ``"ngram.vllm"``, ...).  Any other
    string is an InvalidInput."""
    if isinstance(draft, NgramProposer):
        return draft
    if isinstance(draft, str):
        from .models import parse_ngram_spec

        try:
            proposer = parse_ngram_spec(draft)
        except InvalidInput as exc:
            raise InvalidInput(str(exc) if shown(draft) in str(exc) else f"draft {shown(draft)}: {exc}") from None
        if proposer is None:
            raise InvalidInput(f"draft {shown(draft)} is not a model nor an n-gram specification (ngram, "
                               "ngramMIN-MAX, ngram.vllm, ngram.hf); "
                               "load models with fastspec.hf.load_model")
        return proposer
    return None


def as_policy(policy, ngram: bool):
    """``policy`` (a :class:`fastspec.policies.DraftPolicy`, its spec string, or None) as a DraftPolicy, or None; a
    policy other than ``fixed`` needs a draft model (its probabilities): InvalidInput naming ``policy`` otherwise."""
    if policy is None:
        return None
    from ..policies import parse_policy

    pol = parse_policy(policy, name="policy") if isinstance(policy, str) else policy
    if not callable(getattr(pol, "start", None)):
        raise InvalidInput(f"policy = {shown(policy)} is invalid: give a spec string (fastspec.policies."
                           "POLICY_GRAMMAR) or a fastspec.policies.DraftPolicy")
    if ngram and pol.kind != "fixed":
        raise InvalidInput(f"policy = {pol.name}: an n-gram draft has no probabilities to stop on; only fixed "
                           "policies (fixed:k=K) run with n-gram drafts")
    return pol


@torch.inference_mode()
@serial_kernels
def speculative_generate(target, draft, input_ids, k: int = 4, temperature: float = 1.0, top_k: int = 0,
                         top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, max_new_tokens: int = 128, *,
                         eos_token_id=None, use_cache: bool = True, return_trace: bool = False,
                         policy=None, sampling: SamplingParams | None = None) -> SpecResult:
    """Speculative sampling with real models; :func:`fastspec.verify_logits` decides every step.

    Per step (batch size 1) at most ``d = min(k, max_new_tokens - generated - 1)`` tokens are drafted:

    * a draft **model** proposes d tokens autoregressively, each sampled from the processed draft distribution
      (the same processing the verifier applies) by inverse CDF with a uniform from
      ``np.random.default_rng(seed)``;
    * an **n-gram** draft (``draft`` an :class:`~fastspec.ngram.NgramProposer` or a specification string,
      :func:`as_ngram`; its min_n, max_n and occurrence are used, the length is this call's k) proposes
      :func:`fastspec.ngram.propose` (prompt + generated tokens, at most d tokens) and draws nothing: its
      proposal is one-hot (``draft_logits=None``).  A step where it finds no match is a plain target step,
      counted in ``plain_steps`` and ``empty_steps``, not in ``verify_steps``.

    The target scores the drafts plus one position in one forward pass; ``verify_logits`` (raw float32 logits,
    the sampling params, a seed drawn from the same generator) returns the accepted drafts and the recovered /
    bonus token; the KV caches are cropped to the accepted prefix (the emitted token is fed at the next step).
    When ``d == 0`` a plain target step emits one token (``verify_logits`` with no drafts).  ``use_cache=False``
    recomputes every forward from the full sequence instead (the rollback reference: same uniforms, so the same
    tokens up to floating-point ties).  Stops after ``max_new_tokens`` or an EOS token (``eos_token_id=None``:
    never, every run emits exactly ``max_new_tokens``).

    ``policy`` (:func:`fastspec.policies.parse_policy` spec or DraftPolicy; None: fixed ``k``, as above, and ``k`` is
    ignored otherwise): one state per call (``policy.start()``); a step drafts at most ``d = min(state.budget(),
    max_new_tokens - generated - 1)`` tokens; after drafting token j the loop calls ``state.keep_drafting(j,
    q_j(x_j), max_v q_j(v))`` with the processed draft distribution (:func:`fastspec.probabilities`, the one the
    verifier applies) and stops drafting when it returns False (the token just drafted is kept); after
    verification ``state.update(drafted, accepted, [q_j(x_j)])`` (``(0, 0, [])`` after a plain step, as
    transformers does).  At temperature 0 the confidence is the draft's softmax at temperature 1 (the processed q
    is one-hot; Hugging Face's greedy ``ConfidenceCriteria`` reads the unwarped scores).  Every decision reads
    only drafted tokens and their probabilities, so verification stays exact.  Policies other than ``fixed`` need
    a draft model.  Every entry point of the loop takes its sampling as ``sampling`` (a :class:`SamplingParams`) or
    as the four settings, not both.
    """
    params = given_sampling(sampling, temperature, top_k, top_p, min_p)
    sp = params.as_dict()
    seq, n_new, eos, rng = _loop_inputs(input_ids, max_new_tokens, eos_token_id, seed)
    ngram = as_ngram(draft)
    pol = as_policy(policy, ngram is not None)
    state = None if pol is None else pol.start()
    k = check_k(k) if pol is None else max(1, min(int(pol.k_max), n_new - 1))
    n_prompt = len(seq)
    t_start = time.perf_counter()
    trun = KVRunner(target, use_cache)
    trun.prefill(seq[:-1])
    drun = None
    if ngram is None:
        drun = KVRunner(draft, use_cache)
        drun.prefill(seq[:-1])
    t_prefill = time.perf_counter() - t_start
    steps = plain = empty = drafted = accepted = emitted = 0
    acc_steps: list[int] = []
    lengths: list[int] = []
    pos_acc = np.zeros(k, np.int64)
    td = tt = tv = 0.0
    trace = [] if return_trace else None
    done = False
    while not done:
        budget = k if state is None else min(int(state.budget()), k)
        d = min(budget, n_new - (len(seq) - n_prompt) - 1)
        n0 = len(seq)
        props: list[int] = []
        qrows = []
        qdrawn: list[float] = []
        c0 = time.perf_counter()
        if d > 0 and ngram is not None:
            props = propose(seq, d, min_n=ngram.min_n, max_n=ngram.max_n, occurrence=ngram.occurrence).tolist()
            empty += not props
        elif d > 0:
            for j in range(d):
                lg = drun.logits(seq + props, 1)[0]
                qrows.append(lg)
                x = draw_token(lg, rng, params)
                props.append(x)
                if state is not None:  # greedy: the softmax at temperature 1 (what HF's ConfidenceCriteria reads)
                    qp = probabilities(lg, temperature=1.0) if params.greedy else probabilities(lg, **sp)
                    qdrawn.append(float(qp[x]))
                    if not state.keep_drafting(j, qdrawn[-1], float(qp.max())):
                        break
        c1 = time.perf_counter()
        td += c1 - c0
        if not props:  # plain target step: nothing left to draft, or no n-gram match
            tl = trun.logits(seq, 1)
            c2 = time.perf_counter()
            res = verify_logits(tl[None], None, np.zeros((1, 0), np.int64), **sp, seed=int(rng.integers(0, 2 ** 62)))
            trun.rollback(n0)
            tt += c2 - c1
            tv += time.perf_counter() - c2
            x = int(res.tokens[0, 0])
            seq.append(x)
            plain += 1
            if state is not None:  # as transformers' update_candidate_strategy after a step without drafts
                state.update(0, 0, [])
            if return_trace:
                trace.append({"drafts": [], "target_logits": tl, "draft_logits": None, "emitted": [x]})
            done = x in eos or len(seq) - n_prompt >= n_new
            continue
        nd = len(props)
        tl = trun.logits(seq + props, nd + 1)
        c2 = time.perf_counter()
        q = np.stack(qrows)[None] if qrows else None
        res = verify_logits(tl[None], q, np.asarray([props], np.int64), **sp, seed=int(rng.integers(0, 2 ** 62)))
        n_acc = int(res.num_accepted[0])
        out = [int(v) for v in res.tokens[0, :n_acc + 1]]
        # rollback: keep the prompt, the old tokens and the accepted drafts; the emitted token is not cached
        trun.rollback(n0 + n_acc)
        if drun is not None:
            drun.rollback(n0 + n_acc)
        tv += time.perf_counter() - c2
        tt += c2 - c1
        for j, x in enumerate(out):
            if x in eos:
                out = out[:j + 1]
                done = True
                break
        seq.extend(out)
        steps += 1
        drafted += nd
        accepted += n_acc
        emitted += len(out)
        acc_steps.append(n_acc)
        lengths.append(nd)
        if state is not None:
            state.update(nd, n_acc, qdrawn if ngram is None else [1.0] * nd)
        pos_acc[:n_acc] += 1
        if return_trace:
            trace.append({"drafts": props, "target_logits": tl, "draft_logits": None if q is None else q[0],
                          "emitted": out})
        if len(seq) - n_prompt >= n_new:
            done = True
    return SpecResult(tokens=np.asarray(seq[n_prompt:], np.int64), k=k, verify_steps=steps, plain_steps=plain,
                      drafted=drafted, accepted=accepted, emitted=emitted,
                      accepted_per_step=np.asarray(acc_steps, np.int64), per_position_accepted=pos_acc,
                      draft_s=td, target_s=tt, verify_s=tv, total_s=time.perf_counter() - t_start, trace=trace,
                      prefill_s=t_prefill, empty_steps=empty, draft_lengths=np.asarray(lengths, np.int64),
                      policy=None if pol is None else pol.name)
