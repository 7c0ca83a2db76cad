"""llama.cpp's ngram-simple speculator (fastspec.engines.llamacpp.ngram): its rules on hand-made sequences, and its
T = 0 counters predicted exactly on recorded llama-server runs (tests/data/llamacpp_ngram_simple_t0.json), with
the broken variants of each rule shown to miss."""
from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastspec.engines.llamacpp import ngram as N
from fastspec.engines.llamacpp.ngram import (NgramSimple, accepted_length, draft_cap, ngram_simple_counters,
                                             ngram_simple_draft, ngram_simple_time)
from fastspec.errors import InvalidInput, InvalidType

RECORD = json.loads((pathlib.Path(__file__).parent / "data" / "llamacpp_ngram_simple_t0.json").read_text())


# -- the proposal (common_ngram_simple_draft) ------------------------------------------------------------------------

def test_the_latest_occurrence_is_copied():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12     sampled
    toks = [9, 1, 2, 5, 6, 7, 1, 2, 8, 8, 8, 8, 1]  # + 2: the pattern (1, 2) occurs at 1 and 6
    assert ngram_simple_draft(toks, 2, 2, 3) == [8, 8, 8]      # the latest (6): tokens 8..10
    assert ngram_simple_draft(toks, 2, 2, 2) == [8, 8]         # at most size_m
    assert ngram_simple_draft(toks, 3, 2, 3) == []             # (1, 3) never occurs


def test_position_zero_is_never_a_match():
    toks = [1, 2, 5, 6, 7, 8, 9, 4, 4, 1]
    assert ngram_simple_draft(toks, 2, 2, 2) == []              # (1, 2) occurs only at 0
    assert ngram_simple_draft([0] + toks, 2, 2, 2) == [5, 6]   # one token earlier it is found at 1


def test_a_copy_shorter_than_size_n_is_dropped():
    # the only occurrence of (7, 8, 9) leaves 2 < size_n = 3 tokens of `tokens` after it: no draft
    toks = [0, 5, 5, 5, 5, 5, 5, 5, 7, 8, 9, 3, 4, 7, 8]
    assert ngram_simple_draft(toks, 9, 3, 4) == [3, 4, 7, 8]
    short = [0, 5, 5, 5, 5, 5, 5, 5, 5, 7, 8, 9, 3, 7, 8]  # after the occurrence: 3, 7, 8 (3 tokens: kept)
    assert ngram_simple_draft(short, 9, 3, 4) == [3, 7, 8]
    shorter = [0, 5, 5, 5, 5, 5, 5, 5, 5, 5, 7, 8, 9, 7, 8]  # after the occurrence: 7, 8 (2 < 3: dropped)
    assert ngram_simple_draft(shorter, 9, 3, 4) == []


def test_too_short_a_sequence_drafts_nothing():
    toks = [0, 1, 2, 1, 2, 1]
    assert ngram_simple_draft(toks, 2, 2, 3) == []          # len 6 <= 2 + 3 + 1
    # len 7: the latest (1, 2) starts at 4 and leaves 1 < 2 tokens: nothing, although the one at 2 would leave 3
    assert ngram_simple_draft([0] + toks, 2, 2, 3) == []
    assert ngram_simple_draft([0, 0, 1, 2, 3, 4, 1], 2, 2, 3) == [3, 4, 1]


@given(st.lists(st.integers(0, 3), min_size=0, max_size=40), st.integers(0, 3), st.integers(1, 4),
       st.integers(1, 6))
def test_a_draft_follows_the_latest_earlier_occurrence(tokens, sampled, n, m):
    """Whatever the sequence: a draft is the continuation, inside ``tokens``, of the latest occurrence (start >= 1)
    of the last n tokens of tokens + [sampled] that ends before the last cached token; its length is
    min(m, what follows), at least n; no draft iff no such occurrence leaves n tokens."""
    d = ngram_simple_draft(tokens, sampled, n, m)
    ctx = tokens + [sampled]
    cur = len(tokens)
    starts = [j for j in range(1, cur - n) if ctx[j:j + n] == ctx[len(ctx) - n:]] if cur > n + m + 1 else []
    if not starts or min(m, cur - (max(starts) + n)) < n:
        assert d == []
    else:
        s = max(starts)
        assert d == tokens[s + n:s + n + min(m, cur - (s + n))]
        assert n <= len(d) <= m


# -- the cap and the acceptance ------------------------------------------------------------------------------------

def test_the_cap_is_the_budget_less_one_and_the_context():
    assert draft_cap(2048, 100, 80, 10) == 69          # n_remaining 70 - 1
    assert draft_cap(2048, 100, 80, 79) == 0           # the last token of the budget: no draft
    assert draft_cap(2048, 100, -1, 10) == 1946        # no budget: the context (n_ctx - cached - 2)
    assert draft_cap(110, 100, 80, 10) == 8


def test_acceptance_stops_at_the_first_mismatch_and_at_an_inner_end_of_generation():
    assert accepted_length([5, 6, 7], [5, 6, 7]) == 3
    assert accepted_length([5, 6, 7], [5, 9, 7]) == 1
    assert accepted_length([5, 6, 7], [5, 6]) == 2                # the generation ended
    assert accepted_length([5, 2, 7], [5, 2, 7], eog={2}) == 1    # EOG before the last drafted position
    assert accepted_length([5, 6, 2], [5, 6, 2], eog={2}) == 3    # EOG as the last drafted token: accepted


# -- the counters on recorded llama-server runs ---------------------------------------------------------------------

def _predict(run, record, **over):
    i = run["prompt"]
    output = record["plain"][i] if run["tokens"] is None else run["tokens"]
    kw = {"n_predict": record["n_predict"], "n_ctx": record["n_ctx"], "eog": record["eog"], **over}
    s = ngram_simple_counters(record["prompts"][i], output, NgramSimple(run["size_n"], run["size_m"]), **kw)
    return s.draft_n, s.draft_n_accepted


def _misses(**over):
    return sum(_predict(r, RECORD, **over) != (r["draft_n"], r["draft_n_accepted"]) for r in RECORD["runs"])


def test_recorded_llama_server_counters_are_predicted_exactly():
    """32 requests (8 prompts x 4 (size_n, size_m)) of llama-server at T = 0: draft_n and draft_n_accepted of every
    request equal the prediction from its output; here the speculative outputs are the plain server's, token for
    token (same text under greedy decoding, one run each)."""
    assert len(RECORD["runs"]) == 32 and all(r["tokens"] is None for r in RECORD["runs"])
    assert {(r["size_n"], r["size_m"]) for r in RECORD["runs"]} == {(3, 4), (2, 8), (5, 5), (1, 3)}
    for r in RECORD["runs"]:
        assert _predict(r, RECORD) == (r["draft_n"], r["draft_n_accepted"]), r
    assert sum(r["draft_n_accepted"] for r in RECORD["runs"]) > 900  # the drafts did get accepted


def test_each_rule_is_needed_to_predict_the_record(monkeypatch):
    """The broken variants miss: without the budget cap, without the inner end-of-generation rule, or with the
    earliest occurrence instead of the latest."""
    assert _misses(n_predict=-1) >= 5
    assert _misses(eog=()) >= 1

    def earliest(tokens, sampled, n, m):
        tokens = list(tokens)
        cur = len(tokens)
        if cur <= n + m + 1:
            return []
        pat = tokens[cur - n + 1:] + [sampled]
        for j in range(1, cur - n):
            if tokens[j:j + n] == pat:
                c = min(m, cur - (j + n))
                return tokens[j + n:j + n + c] if c >= n else []
        return []

    monkeypatch.setattr(N, "ngram_simple_draft", earliest)
    assert _misses() >= 5


def test_steps_and_time():
    s = ngram_simple_counters([0, 7, 8, 9, 7, 8, 9, 7, 8, 9, 7], [8, 9, 7, 8, 9, 1], NgramSimple(2, 3))
    assert s.steps[0][0] > 0 and s.tokens == 6
    assert s.as_dict()["draft_n"] == s.draft_n
    assert ngram_simple_time(s, lambda n: 0.01 * (n + 1), 0.001) == pytest.approx(
        sum(0.01 * (d + 2) + 0.001 for d, _ in s.steps))
    # a per-drafted-length overhead (a cost table's overhead_s[k]): a speculative step may cost more than a plain one
    assert ngram_simple_time(s, lambda n: 0.01 * (n + 1), lambda d: 0.001 * (d + 1) + (0.002 if d else 0.0)) == \
        pytest.approx(sum(0.01 * (d + 2) + 0.001 * (d + 1) + (0.002 if d else 0.0) for d, _ in s.steps))


def test_bad_input_names_the_argument():
    with pytest.raises(InvalidInput, match=r"output\[1\] = -3"):
        ngram_simple_counters([1, 2], [4, -3], NgramSimple(2, 2))
    with pytest.raises(InvalidInput, match="more than n_predict = 1"):
        ngram_simple_counters([1, 2], [4, 5], NgramSimple(2, 2), n_predict=1)
    with pytest.raises(InvalidInput, match="prompt is empty"):
        ngram_simple_counters([], [4, 5], NgramSimple(2, 2))
    with pytest.raises(InvalidInput, match="size_n = 0"):
        NgramSimple(0, 4)
    with pytest.raises(InvalidType, match="size_m"):
        NgramSimple(2, 2.5)
    assert NgramSimple(3, 4).server_args() == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3",
                                               "--spec-ngram-simple-size-m", "4"]
