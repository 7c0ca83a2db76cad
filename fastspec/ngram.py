"""Prompt lookup (n-gram) drafts: propose the tokens that followed an earlier occurrence of the context's end.

What fastspec does, for a context ``c`` of length ``L`` (the prompt followed by every token generated so far):

* For ``n = max_n, max_n - 1, ..., min_n`` look for an earlier occurrence of the suffix ``c[L-n:]``: a start ``s``
  with ``c[s:s+n] == c[L-n:]`` and ``s + n <= L - 1``, so that at least one token follows it.  The suffix itself
  is not an occurrence; an occurrence may overlap it (in ``... a b a b a`` the suffix ``a b a`` occurs two
  tokens earlier).  The first ``n`` with an occurrence wins: the longest match.
* Among that n-gram's occurrences take the latest (largest ``s``); ``occurrence="earliest"`` takes the smallest.
* Propose ``c[s+n : s+n+k]``: ``k`` tokens, or fewer (at least one) when the context ends first; nothing (an
  empty array) when no ``n`` in ``[min_n, max_n]`` matches, in particular when ``L <= min_n``.

The choice does not depend on ``k``: the proposal for ``k`` is the first ``k`` tokens of the proposal for any
larger ``k`` (:meth:`Proposals.truncated`).  Cost: one scan from the end (``"earliest"``: from the start) comparing
at most ``max_n`` tokens per position and stopping at the first ``max_n``-long match, O(L * max_n) at worst, in a
Numba kernel.  The latest occurrence of a periodic pattern overlaps the suffix, so it proposes one period only:
in a run ``a a a a`` it proposes one ``a`` whatever ``k``.

Rules and presets (:func:`preset`; the ``--draft`` grammar of ``fastspec simulate``/``measure``/``dump`` and the
``drafts=`` of :func:`fastspec.simulate`, parsed by one function, :func:`parse_ngram_draft`):

=================  ==========  ===================================  ==============================================
preset             occurrence  bounds when not given                ``--draft`` spellings (name in output)
=================  ==========  ===================================  ==============================================
``fastspec``       latest      ``min_n = 1``, ``max_n = 3``         ``ngram``, ``ngramMIN-MAX`` (``ngramMIN-MAX``;
                                                                    also ``ngram:MIN-MAX``, ``ngram[MIN-MAX]``,
                                                                    ``ngram.fastspec``, ``ngram.fastspecMIN-MAX``)
``vllm``           earliest    both 5; one given: the other copies  ``ngram.vllm``, ``ngram.vllmN`` (N-N),
                               it                                   ``ngram.vllmMIN-MAX`` (``ngram.vllmMIN-MAX``)
``hf``             earliest    ``min_n = 1`` always, ``max_n = 2``  ``ngram.hf``, ``ngram.hfMAX``, ``ngram.hf1-MAX``
                                                                    (``ngram.hf1-MAX``)
=================  ==========  ===================================  ==============================================

MIN, MAX and N are decimal integers in [1, :data:`MAX_NGRAM`], MIN <= MAX.  ``vllm`` is vLLM's ``ngram`` method
(``prompt_lookup_min``/``prompt_lookup_max``), ``hf`` Hugging Face's prompt lookup (``max_matching_ngram_size``):
as fastspec models them (the lists below) the two share one rule, the earliest occurrence of the longest match,
and differ in their bounds.  A proposer built by hand with ``occurrence="earliest"`` is named ``ngram.vllmMIN-MAX``
(vLLM's rule with those bounds).  The name says the rule, is a valid draft name (letters, digits, '.', '-') and
parses back to the same proposer.  ``ngram@vllm`` and other spellings are refused with the grammar.

Verification: the proposer is deterministic, so q is one-hot on each proposed token: pass ``draft_logits=None``
to :func:`fastspec.verify_logits` (the acceptance probability is then p(x)).  A proposal of ``d`` tokens is
verified with ``d + 1`` target positions; a ragged batch goes through :func:`draft_batch` (``num_draft``), and
``d = 0`` is a plain decoding step (``K = 0``).

Differences from vLLM's ``ngram`` method (``prompt_lookup_min``/``prompt_lookup_max`` = ``min_n``/``max_n``,
``num_speculative_tokens`` = ``k``), read in ``vllm/v1/spec_decode/ngram_proposer.py``
(``_find_longest_matched_ngram_and_propose_tokens``) and ``SpeculativeConfig.__post_init__``:

* vLLM takes the *earliest* occurrence of the longest matching n-gram (a KMP scan of the reversed context that
  keeps its last hit); fastspec the latest unless ``occurrence="earliest"``.
* Defaults: vLLM sets both bounds to 5 when neither is given (one given: the other copies it), ``k`` has none;
  fastspec ``min_n=1, max_n=3``, ``k`` required.
* vLLM proposes at most ``max_model_len - L`` tokens; fastspec knows no length limit: the caller trims.
* vLLM returns the context's dtype (int32); fastspec int64.
* The same: context = prompt + output, longest n first, overlap with the suffix allowed (earlier vLLM releases
  searched each n with a KMP that required the occurrence to end before the suffix), fewer than ``k`` tokens
  when the context ends, nothing when ``L <= min_n``.

Differences from Hugging Face ``generate`` (``prompt_lookup_num_tokens`` = ``k``, ``max_matching_ngram_size`` =
``max_n``), read in ``transformers/generation/candidate_generator.py`` (``PromptLookupCandidateGenerator``) and the
``GenerationConfig`` docstring:

* No minimum: n runs from ``min(max_matching_ngram_size, L - 1)`` down to 1 (``min_n = 1``); ``max_n`` defaults to
  2; ``k`` has no default in ``generate`` (the class's own default is 10).
* HF scans left to right and takes the first occurrence with a non-empty continuation: the earliest.
* HF cuts the proposal before the first EOS token, drops tokens its logits processors forbid (trying the next
  occurrence when none is left) and never proposes past ``max_length``; fastspec does none of these (the loop
  stops at EOS; a token of target probability 0 is rejected by verification).  HF handles batch size 1 only.
* The same: context = prompt + output, longest n first, overlap allowed, fewer than ``k`` tokens at the end.
The page that explains it: ``docs/guide/simulate.md``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence

import numpy as np

from ._kernels.codes import PAD
from ._kernels.ngram import along, match
from .config import MAX_NGRAM, MAX_PROPOSAL
from .errors import InvalidInput, InvalidType, shown

__all__ = ["NgramProposer", "Proposals", "propose", "proposals_along", "draft_batch", "preset", "OCCURRENCES",
           "PRESETS", "MAX_NGRAM", "MAX_PROPOSAL", "parse_ngram_draft", "ngram_name", "NGRAM_GRAMMAR"]

OCCURRENCES = ("latest", "earliest")

#: the named rules (module docstring): preset -> its occurrence
PRESETS = {"fastspec": "latest", "vllm": "earliest", "hf": "earliest"}


# --------------------------------------------------------------------------------------------- validation
def _count(name: str, value, low: int, high: int, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidType(f"{name} must be an integer in [{low}, {high}] ({what}), got {type(value).__name__} "
                          f"{value!r}", argument=name)
    if not low <= value <= high:
        raise InvalidInput(f"{name} = {shown(int(value))} is invalid: {what} must be in [{low}, {high}]", argument=name)
    return int(value)


def _check(k, min_n, max_n, occurrence) -> tuple[int, int, int, bool]:
    """(k, min_n, max_n, latest) validated: k in [1, MAX_PROPOSAL], n in [1, MAX_NGRAM]."""
    k = _count("k", k, 1, MAX_PROPOSAL, "the number of tokens to propose")
    min_n = _count("min_n", min_n, 1, MAX_NGRAM, "the shortest n-gram to match")
    max_n = _count("max_n", max_n, 1, MAX_NGRAM, "the longest n-gram to match")
    if min_n > max_n:
        raise InvalidInput(f"min_n = {min_n} is greater than max_n = {max_n}: pass min_n <= max_n (the shortest "
                           "and the longest n-gram to match)", argument="min_n")
    if not isinstance(occurrence, str) or occurrence not in OCCURRENCES:
        raise InvalidInput(f"occurrence = {occurrence!r} is invalid: use 'latest' or 'earliest'", argument="occurrence")
    return k, min_n, max_n, occurrence == "latest"


def _token_ids(name: str, tokens) -> np.ndarray:
    """A 1-D sequence of token ids as contiguous int64, every id >= 0."""
    a = np.asarray(tokens)
    if a.ndim != 1:
        raise InvalidInput(f"{name} must be a 1-D sequence of token ids, got shape {list(a.shape)}", argument=name)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise InvalidType(f"{name} must hold integer token ids, got dtype {a.dtype}: pass the tokenizer's ids",
                          argument=name)
    if a.dtype == np.uint64 and a.max() > np.iinfo(np.int64).max:
        i = int(np.argmax(a > np.iinfo(np.int64).max))
        raise InvalidInput(f"{name}[{i}] = {int(a[i])} is not a token id: ids must lie in [0, 2**63)", argument=name)
    a = np.ascontiguousarray(a, dtype=np.int64)
    if a.min() < 0:
        i = int(np.argmax(a < 0))
        raise InvalidInput(f"{name}[{i}] = {int(a[i])} is a negative token id: ids must be >= 0 (strip padding "
                           "before proposing)", argument=name)
    return a


# --------------------------------------------------------------------------------------------- public API
def propose(context: Sequence[int] | np.ndarray, k: int, *, min_n: int = 1, max_n: int = 3,
            occurrence: str = "latest") -> np.ndarray:
    """The proposal for ``context`` (prompt + generated tokens): int64 [d], 0 <= d <= k (module docstring)."""
    k, min_n, max_n, latest = _check(k, min_n, max_n, occurrence)
    ctx = _token_ids("context", context)
    start, _ = match(ctx, ctx.shape[0], min_n, max_n, latest)
    return ctx[start:start + k].copy() if start >= 0 else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Proposals:
    """The proposals along one recorded sequence (:func:`proposals_along`), one row per generated position t.

    draft_tokens: int64 [T, k] -- row t is the proposal made with context ``tokens[:prompt_len + t]``, padded
        with -1 after its ``num_draft[t]`` tokens (the ``draft_tokens``/``num_draft`` of
        :func:`fastspec.verify_logits`).
    num_draft: int64 [T] -- tokens proposed at t (0 when nothing matches).
    num_matching: int64 [T] -- how many leading proposed tokens equal the recorded ones, ``tokens[prompt_len + t:]``
        (counted within the recording).  When the recording is the target's own greedy output and
        ``t + num_draft[t] < T``, this is exactly the number of drafts a greedy verify step at t accepts.
    """

    draft_tokens: np.ndarray
    num_draft: np.ndarray
    num_matching: np.ndarray

    def truncated(self, k: int) -> "Proposals":
        """The proposals of the same proposer with ``k`` no larger than this one's (the first k tokens)."""
        k = _count("k", k, 1, MAX_PROPOSAL, "the number of tokens to propose")
        if k > self.draft_tokens.shape[1]:
            raise InvalidInput(f"k = {k} exceeds the k = {self.draft_tokens.shape[1]} these proposals were made "
                               "with: compute them with the largest k needed", argument="k")
        return Proposals(self.draft_tokens[:, :k].copy(), np.minimum(self.num_draft, k),
                         np.minimum(self.num_matching, k))


def proposals_along(tokens: Sequence[int] | np.ndarray, prompt_len: int, k: int, *, min_n: int = 1,
                    max_n: int = 3, occurrence: str = "latest") -> Proposals:
    """Replay the proposer along a recorded sequence (prompt tokens, then T generated tokens): for every
    generated position t, the proposal with context ``tokens[:prompt_len + t]`` (:class:`Proposals`)."""
    k, min_n, max_n, latest = _check(k, min_n, max_n, occurrence)
    toks = _token_ids("tokens", tokens)
    if isinstance(prompt_len, (bool, np.bool_)) or not isinstance(prompt_len, (int, np.integer)):
        raise InvalidType(f"prompt_len must be an integer (the number of prompt tokens), got {prompt_len!r}",
                          argument="prompt_len")
    if not 0 <= prompt_len <= toks.shape[0]:
        raise InvalidInput(f"prompt_len = {int(prompt_len)} is outside [0, {toks.shape[0]}] (the length of tokens): "
                           "pass the number of prompt tokens at the start of tokens", argument="prompt_len")
    T = toks.shape[0] - int(prompt_len)
    out = Proposals(np.full((T, k), PAD, dtype=np.int64), np.zeros(T, dtype=np.int64), np.zeros(T, dtype=np.int64))
    along(toks, int(prompt_len), k, min_n, max_n, latest, out.draft_tokens, out.num_draft, out.num_matching)
    return out


def draft_batch(proposals: Sequence[Sequence[int] | np.ndarray], k: int | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """Proposals of several sequences as ``(draft_tokens int64 [B, K] padded with -1, num_draft int64 [B])`` for
    ``fastspec.verify_logits(target_logits, None, draft_tokens, num_draft=num_draft)``; K = ``k`` or the longest
    proposal.  Target position ``num_draft[b]`` of row b holds its bonus distribution."""
    rows = [_token_ids(f"proposals[{b}]", p) for b, p in enumerate(proposals)]
    longest = max((r.shape[0] for r in rows), default=0)
    K = longest if k is None else _count("k", k, 0, MAX_PROPOSAL, "the number of draft positions")
    if longest > K:
        b = next(b for b, r in enumerate(rows) if r.shape[0] > K)
        raise InvalidInput(f"proposals[{b}] has {rows[b].shape[0]} tokens, more than k = {K}: pass a larger k",
                           argument="proposals")
    draft_tokens = np.full((len(rows), K), PAD, dtype=np.int64)
    for b, r in enumerate(rows):
        draft_tokens[b, :r.shape[0]] = r
    return draft_tokens, np.array([r.shape[0] for r in rows], dtype=np.int64)


@dataclass(frozen=True)
class NgramProposer:
    """One validated prompt-lookup configuration (module docstring): what a loop calls and a dump records.

    ``preset``: the named rule it was made from (:func:`preset`; None: built by hand).  It names the proposer
    (:func:`ngram_name`) and takes no part in equality: two proposers that propose the
    same tokens are equal."""

    k: int
    min_n: int = 1
    max_n: int = 3
    occurrence: str = "latest"
    preset: str | None = field(default=None, compare=False)

    def __post_init__(self):
        k, min_n, max_n, _ = _check(self.k, self.min_n, self.max_n, self.occurrence)
        for name, v in (("k", k), ("min_n", min_n), ("max_n", max_n)):
            object.__setattr__(self, name, v)
        if self.preset is not None:
            _preset_name(self.preset)
            if PRESETS[self.preset] != self.occurrence:
                raise InvalidInput(f"preset {self.preset!r} takes the {PRESETS[self.preset]} occurrence, not "
                                   f"{self.occurrence!r}")
            if self.preset == "hf" and min_n != 1:
                raise InvalidInput(f"preset 'hf' has no minimum n-gram length (min_n = 1), got min_n = {min_n}")

    def propose(self, context: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 [d], 0 <= d <= k: the tokens to verify after ``context`` (prompt + generated tokens)."""
        return propose(context, self.k, min_n=self.min_n, max_n=self.max_n, occurrence=self.occurrence)

    def proposals_along(self, tokens: Sequence[int] | np.ndarray, prompt_len: int) -> Proposals:
        """:func:`proposals_along` with this configuration."""
        return proposals_along(tokens, prompt_len, self.k, min_n=self.min_n, max_n=self.max_n,
                               occurrence=self.occurrence)

    def as_dict(self) -> dict:
        """``{"name": "ngram", "k": ..., "min_n": ..., "max_n": ..., "occurrence": ...}`` (JSON-ready), with
        ``"preset"`` when the proposer came from one."""
        d = {"name": "ngram", "k": self.k, "min_n": self.min_n, "max_n": self.max_n, "occurrence": self.occurrence}
        if self.preset is not None:
            d["preset"] = self.preset
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "NgramProposer":
        """The proposer :meth:`as_dict` described (``name`` and ``preset`` optional); an unknown key is an error."""
        unknown = sorted(set(d) - {"name", "k", "min_n", "max_n", "occurrence", "preset"})
        if unknown or d.get("name", "ngram") != "ngram":
            what = f"unknown key(s) {', '.join(map(repr, unknown))}" if unknown else f"name {d.get('name')!r}"
            raise InvalidInput(f"not an n-gram proposer description: {what}; expected name 'ngram' and keys k, "
                               "min_n, max_n, occurrence")
        if "k" not in d:
            raise InvalidInput("an n-gram proposer description needs k (the number of tokens to propose)")
        return cls(**{key: v for key, v in d.items() if key != "name"})

    def describe(self) -> str:
        """``"ngram k=4, n=1..3, latest occurrence"`` (``", vllm preset"`` appended when it came from one)."""
        tail = f", {self.preset} preset" if self.preset is not None else ""
        return f"ngram k={self.k}, n={self.min_n}..{self.max_n}, {self.occurrence} occurrence{tail}"


def _preset_name(name) -> str:
    if not isinstance(name, str) or name not in PRESETS:
        raise InvalidInput(f"n-gram preset {shown(name)} is unknown; choose one of: {', '.join(PRESETS)}",
                           argument="name")
    return name


def preset(name: str, min_n: int | None = None, max_n: int | None = None, *, k: int) -> NgramProposer:
    """The proposer of a named rule (module docstring) with its defaults for the bounds not given:

    * ``"fastspec"``: latest occurrence, ``min_n`` 1 and ``max_n`` 3 by default (``NgramProposer(k)``);
    * ``"vllm"``: vLLM's ``ngram``: earliest occurrence; both bounds 5 when neither is given, one given: the
      other copies it;
    * ``"hf"``: Hugging Face prompt lookup: earliest occurrence, ``min_n`` 1 (no other value), ``max_n`` 2 by
      default.

    ``k``: the number of tokens to propose (keyword; neither engine has a default for it)."""
    name = _preset_name(name)
    if name == "vllm":
        if min_n is None and max_n is None:
            min_n = max_n = 5
        elif min_n is None:
            min_n = max_n
        elif max_n is None:
            max_n = min_n
    elif name == "hf":
        min_n = 1 if min_n is None else min_n
        max_n = 2 if max_n is None else max_n
    else:
        min_n = 1 if min_n is None else min_n
        max_n = 3 if max_n is None else max_n
    return NgramProposer(k, min_n, max_n, PRESETS[name], preset=name)


# ---- the spec grammar: the one parser of n-gram draft names (module docstring's table)
#: the grammar, as error messages and help texts state it (fastspec.ngram's module docstring has the table)
NGRAM_GRAMMAR = ("ngram or ngramMIN-MAX (fastspec's rule: latest occurrence, n from 1 to 3 by default), or a named "
                 "rule: ngram.vllm, ngram.vllmN, ngram.vllmMIN-MAX (vLLM's: earliest occurrence, both bounds 5 by "
                 "default), ngram.hf, ngram.hfMAX (Hugging Face prompt lookup: earliest, n from 1 to 2 by default)")

_SPEC = re.compile(r"ngram(?:\.([a-z]+))?(.*)", re.DOTALL)


def parse_ngram_draft(spec, k: int) -> NgramProposer | None:
    """The one parser of n-gram draft specifications (the ``--draft`` of ``simulate``, ``measure`` and ``dump``,
    :func:`fastspec.simulate`'s ``drafts``, :func:`fastspec.hf.parse_ngram_spec`); the grammar is the table in
    this module's docstring:

    ``"ngram"`` -> n in [1, 3], latest occurrence; ``"ngramA-B"``, ``"ngram:A-B"`` or ``"ngram[A-B]"`` -> n in
    [A, B]; ``"ngram.RULE"``, ``"ngram.RULEN"``, ``"ngram.RULEA-B"`` -> :func:`preset` (RULE: vllm,
    hf, fastspec) with the bounds given; an :class:`~fastspec.ngram.NgramProposer` -> itself with this ``k``; a spec
    not starting with "ngram" -> None (a model draft's name).  Anything else starting with "ngram": InvalidInput
    naming the spec and the grammar."""
    if isinstance(spec, NgramProposer):
        return replace(spec, k=k)
    if not isinstance(spec, str) or not spec.startswith("ngram"):
        return None
    m = _SPEC.fullmatch(spec)
    rule, rest = m.group(1), m.group(2)
    if rule is not None and rule not in PRESETS:
        raise InvalidInput(f"draft {shown(spec)}: unknown n-gram rule {rule!r}; use {', '.join(PRESETS)} "
                           f"({NGRAM_GRAMMAR})", argument="spec")
    if rule is None:
        rest = rest.lstrip(":")
    if rest.startswith("[") and rest.endswith("]"):
        rest = rest[1:-1]
    lo, sep, hi = rest.partition("-")
    if rest and not (_decimal(lo) and (not sep and rule in ("vllm", "hf") or sep and _decimal(hi))):
        raise InvalidInput(f"draft {shown(spec)}: write {NGRAM_GRAMMAR}, with decimal digits (e.g. ngram1-3, "
                           "ngram.vllm)", argument="spec")
    bounds = [int(v) for v in ((lo, hi) if sep else (lo,) if rest else ())]
    for n in bounds:
        if not 1 <= n <= MAX_NGRAM:
            raise InvalidInput(f"draft {shown(spec)}: n-gram lengths must lie in [1, {MAX_NGRAM}] (e.g. ngram1-3)",
                               argument="spec")
    if len(bounds) == 2 and bounds[0] > bounds[1]:
        raise InvalidInput(f"draft {shown(spec)}: MIN {bounds[0]} is greater than MAX {bounds[1]}; write "
                           "ngramMIN-MAX (e.g. ngram1-3)", argument="spec")
    if rule is None:
        return NgramProposer(k) if not bounds else NgramProposer(k, bounds[0], bounds[1])
    if rule == "hf":
        if len(bounds) == 2 and bounds[0] != 1:
            raise InvalidInput(f"draft {shown(spec)}: Hugging Face prompt lookup has no minimum n-gram length "
                               "(n runs down to 1): write ngram.hfMAX or ngram.hf1-MAX", argument="spec")
        return preset("hf", max_n=bounds[-1] if bounds else None, k=k)
    if len(bounds) == 1:
        return preset(rule, bounds[0], bounds[0], k=k) if rule == "vllm" else None  # fastspec: refused above
    return preset(rule, *bounds, k=k) if bounds else preset(rule, k=k)


def _decimal(text: str) -> bool:
    """ASCII digits only, at most 6 (``str.isdigit`` also accepts superscripts such as '²', which ``int`` refuses)."""
    return text.isascii() and text.isdigit() and len(text) <= 6


def ngram_name(proposer: NgramProposer) -> str:
    """The draft name of an n-gram proposer in results and cost tables; it says the rule and parses back to the
    same proposer (:func:`parse_ngram_draft`): ``"ngram1-3"`` (fastspec's rule, latest occurrence),
    ``"ngram.vllm5-5"`` (the earliest occurrence: vLLM's rule, also a hand-built ``occurrence="earliest"``),
    ``"ngram.hf1-2"`` (the ``hf`` preset)."""
    if proposer.occurrence == "latest":
        return f"ngram{proposer.min_n}-{proposer.max_n}"
    rule = "hf" if proposer.preset == "hf" else "vllm"
    return f"ngram.{rule}{proposer.min_n}-{proposer.max_n}"
