"""Decoding with real models: plain sampling, the speculative loop, and teacher-forced scoring.

* :func:`generate` -- plain autoregressive sampling (the reference the speculative loop is compared with).
* :func:`speculative_generate` -- standard speculative sampling.  The draft proposes tokens autoregressively
  with its own KV cache; the target scores them in one forward pass; :func:`fastspec.verify_logits` decides
  (it receives the raw float32 logits and applies the sampling parameters itself, identically to p and q);
  both caches are rolled back to the accepted prefix.
* :func:`teacher_forced_logits` -- one model's logits for every token of a given continuation.

Tokens are drawn with :func:`fastspec.processing.sample_tokens` (inverse CDF in token order over the processed
distribution, greedy = argmax), one uniform of ``np.random.default_rng(seed)`` per token.  Conventions match
:mod:`fastspec.simulate`: a step drafts ``min(k, max_new_tokens - generated - 1)`` tokens; a step that would
draft nothing is a plain target step and is not counted; mean acceptance length = tokens emitted per verify
step (bonus / recovered token included).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from .. import verify_logits
from ..errors import InvalidInput
from ..params import SamplingParams
from ..processing import sample_tokens
from .args import as_token_ids, check_k, check_max_new_tokens, eos_set
from .runner import KVRunner

__all__ = ["generate", "speculative_generate", "SpecResult", "teacher_forced_logits", "derive_seed"]

# rng.random() lies in [0, 1), sample_tokens takes (0, 1]: an exact 0 (probability 2**-53) becomes the smallest
# positive double, which, like 0 in an inverse CDF, selects the first token of positive probability.
_TINY = float(np.nextafter(0.0, 1.0))


def derive_seed(seed: int, *keys: int) -> int:
    """An independent seed for the run identified by ``keys`` (e.g. prompt index), derived from ``seed``."""
    return int(np.random.SeedSequence([int(seed) & ((1 << 63) - 1), *keys]).generate_state(1, np.uint64)[0] >> 2)


def _draw(logits_row: np.ndarray, rng: np.random.Generator, params: SamplingParams) -> int:
    """A token from the processed distribution of one raw logits row, with the next uniform of ``rng``."""
    u = float(rng.random())
    return int(sample_tokens(logits_row, u if u > 0.0 else _TINY, **params.as_dict()))


@torch.inference_mode()
def generate(model, input_ids, *, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, max_new_tokens=128,
             eos_token_id=None, use_cache=True, on_logits=None) -> np.ndarray:
    """Plain autoregressive sampling from ``model`` (the reference the speculative loop is compared with).

    Token i is drawn from the processed distribution of the model's logits (:func:`fastspec.probabilities`) by
    inverse CDF with the i-th uniform of ``np.random.default_rng(seed)``; temperature 0 is greedy.  Stops after
    ``max_new_tokens`` or an EOS token (included; ``eos_token_id=None``: never).  ``on_logits(i, row)``, when
    given, receives the raw float32 logits row [V] token i is drawn from (before it is drawn).  Returns int64
    [n] generated tokens."""
    params = SamplingParams(temperature, top_k, top_p, min_p)
    seq = as_token_ids(input_ids)
    n_new = check_max_new_tokens(max_new_tokens)
    eos = eos_set(eos_token_id)
    rng = np.random.default_rng(seed)
    run = KVRunner(model, use_cache)
    out = []
    for i in range(n_new):
        row = run.logits(seq, 1)[0]
        if on_logits is not None:
            on_logits(i, row)
        x = _draw(row, rng, params)
        seq.append(x)
        out.append(x)
        if x in eos:
            break
    return np.asarray(out, dtype=np.int64)


@torch.inference_mode()
def teacher_forced_logits(model, prompt_ids, continuation) -> np.ndarray:
    """float32 [T, V]: row t is the logits ``model`` gives for continuation token t given prompt + tokens < t
    (one forward pass, no cache)."""
    prompt = as_token_ids(prompt_ids, "prompt_ids")
    cont = [int(t) for t in np.asarray(continuation).reshape(-1)]
    if not cont:
        raise InvalidInput("continuation is empty")
    return KVRunner(model, use_cache=False).logits(prompt + cont[:-1], len(cont))


@dataclass
class SpecResult:
    """What one :func:`speculative_generate` run produced and measured.

    tokens: int64 [n] generated tokens (EOS included if reached).  verify_steps: steps that drafted >= 1 token;
    plain_steps: target-only steps (nothing left to draft).  drafted / accepted: totals over verify steps;
    emitted: tokens produced by verify steps; accepted_per_step: int64 [verify_steps]; per_position_accepted:
    int64 [k], steps whose draft j was accepted.  Times in seconds (draft forwards + draft sampling / target
    forwards / verify_logits + cache rollback / whole call).  trace: with ``return_trace``, one dict per step
    (drafts, target_logits, draft_logits, emitted)."""

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
                "plain_steps": self.plain_steps, "drafted": self.drafted, "accepted": self.accepted,
                "emitted": self.emitted, "mean_acceptance_length": self.mean_acceptance_length,
                "draft_acceptance_rate": self.draft_acceptance_rate,
                "per_position_acceptance": self.per_position_acceptance.tolist(),
                "time_s": {"draft": self.draft_s, "target": self.target_s, "verify": self.verify_s,
                           "total": self.total_s}}


@torch.inference_mode()
def speculative_generate(target, draft, input_ids, k: int = 4, temperature: float = 1.0, top_k: int = 0,
                         top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, max_new_tokens: int = 128, *,
                         eos_token_id=None, use_cache: bool = True, return_trace: bool = False) -> SpecResult:
    """Speculative sampling with real models; :func:`fastspec.verify_logits` decides every step.

    Per step (batch size 1): the draft proposes ``d = min(k, max_new_tokens - generated - 1)`` tokens
    autoregressively, each sampled from the processed draft distribution (the same processing the verifier
    applies) by inverse CDF with a uniform from ``np.random.default_rng(seed)``; the target scores the d drafts
    plus one position in one forward pass; ``verify_logits`` (raw float32 logits, the sampling params, a seed
    drawn from the same generator) returns the accepted drafts and the recovered / bonus token; both KV caches
    are cropped to the accepted prefix (the emitted token is fed at the next step).  When ``d == 0`` a plain
    target step emits one token (``verify_logits`` with no drafts) and is not counted.  ``use_cache=False``
    recomputes every forward from the full sequence instead (the rollback reference: same uniforms, so the same
    tokens up to floating-point ties).  Stops after ``max_new_tokens`` or an EOS token.
    """
    params = SamplingParams(temperature, top_k, top_p, min_p)
    sp = params.as_dict()
    k = check_k(k)
    n_new = check_max_new_tokens(max_new_tokens)
    seq = as_token_ids(input_ids)
    n_prompt = len(seq)
    eos = eos_set(eos_token_id)
    rng = np.random.default_rng(seed)
    trun, drun = KVRunner(target, use_cache), KVRunner(draft, use_cache)
    steps = plain = drafted = accepted = emitted = 0
    acc_steps: list[int] = []
    pos_acc = np.zeros(k, np.int64)
    td = tt = tv = 0.0
    trace = [] if return_trace else None
    t_start = time.perf_counter()
    done = False
    while not done:
        d = min(k, n_new - (len(seq) - n_prompt) - 1)
        n0 = len(seq)
        if d <= 0:  # plain target step: nothing left to draft
            c0 = time.perf_counter()
            tl = trun.logits(seq, 1)
            c1 = time.perf_counter()
            res = verify_logits(tl[None], None, np.zeros((1, 0), np.int64), **sp, seed=int(rng.integers(0, 2 ** 62)))
            trun.rollback(n0)
            tt += c1 - c0
            tv += time.perf_counter() - c1
            x = int(res.tokens[0, 0])
            seq.append(x)
            plain += 1
            if return_trace:
                trace.append({"drafts": [], "target_logits": tl, "draft_logits": None, "emitted": [x]})
            done = x in eos or len(seq) - n_prompt >= n_new
            continue
        c0 = time.perf_counter()
        props: list[int] = []
        qrows = []
        for _ in range(d):
            lg = drun.logits(seq + props, 1)[0]
            qrows.append(lg)
            props.append(_draw(lg, rng, params))
        c1 = time.perf_counter()
        tl = trun.logits(seq + props, d + 1)
        c2 = time.perf_counter()
        q = np.stack(qrows)
        res = verify_logits(tl[None], q[None], np.asarray([props], np.int64), **sp,
                            seed=int(rng.integers(0, 2 ** 62)))
        n_acc = int(res.num_accepted[0])
        out = [int(v) for v in res.tokens[0, :n_acc + 1]]
        # rollback: keep the prompt, the old tokens and the accepted drafts; the emitted token is not cached
        trun.rollback(n0 + n_acc)
        drun.rollback(n0 + n_acc)
        tv += time.perf_counter() - c2
        td += c1 - c0
        tt += c2 - c1
        for j, x in enumerate(out):
            if x in eos:
                out = out[:j + 1]
                done = True
                break
        seq.extend(out)
        steps += 1
        drafted += d
        accepted += n_acc
        emitted += len(out)
        acc_steps.append(n_acc)
        pos_acc[:n_acc] += 1
        if return_trace:
            trace.append({"drafts": props, "target_logits": tl, "draft_logits": q, "emitted": out})
        if len(seq) - n_prompt >= n_new:
            done = True
    return SpecResult(tokens=np.asarray(seq[n_prompt:], np.int64), k=k, verify_steps=steps, plain_steps=plain,
                      drafted=drafted, accepted=accepted, emitted=emitted,
                      accepted_per_step=np.asarray(acc_steps, np.int64), per_position_accepted=pos_acc,
                      draft_s=td, target_s=tt, verify_s=tv, total_s=time.perf_counter() - t_start, trace=trace)
