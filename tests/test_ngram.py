"""fastspec.ngram: the prompt-lookup proposer against a slow reference (naive.ngram_proposal), its replay along a
recorded sequence, its batching for verify_logits, bad input, and one-hot verification of its proposals."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import naive
from fastspec import InvalidInput, InvalidType, exact, probabilities, verify_logits
from fastspec.ngram import NgramProposer, Proposals, draft_batch, propose, proposals_along
from kernel_probes import verification_distributions_logits

BOTH = ("latest", "earliest")


def ref(context, k, min_n=1, max_n=3, occurrence="latest"):
    return naive.ngram_proposal(context, k, min_n, max_n, occurrence)


def check(context, k, min_n=1, max_n=3, occurrence="latest"):
    got = propose(context, k, min_n=min_n, max_n=max_n, occurrence=occurrence)
    assert got.dtype == np.int64 and got.ndim == 1 and got.shape[0] <= k
    assert got.tolist() == ref(context, k, min_n, max_n, occurrence), (context, k, min_n, max_n, occurrence)
    return got.tolist()


# --------------------------------------------------------------------------------------------- hand-written cases
@pytest.mark.parametrize("context, k, min_n, max_n, occurrence, expected", [
    ([1, 2, 3, 4, 2, 3], 4, 2, 3, "latest", [4, 2, 3]),           # vLLM's docstring example: fewer than k follow
    ([1, 2, 3, 4, 2, 3], 4, 2, 3, "earliest", [4, 2, 3]),
    ([1, 2, 3, 4], 3, 1, 3, "latest", []),                         # no match
    ([1, 2, 3], 2, 1, 3, "latest", []),                            # the suffix itself is not an occurrence
    ([5, 6, 9, 6], 3, 1, 3, "latest", [9, 6]),                     # match at the very start
    ([8, 1, 2, 1, 2], 3, 1, 2, "latest", [1, 2]),                  # match ending just before the suffix
    ([7, 7], 3, 1, 3, "latest", [7]),                              # match at the end: one token follows
    ([1, 2, 5, 1, 2, 6, 1, 2], 1, 1, 3, "latest", [6]),            # repeated pattern: the latest occurrence
    ([1, 2, 5, 1, 2, 6, 1, 2], 1, 1, 3, "earliest", [5]),          # ... or the earliest (vLLM's, HF's)
    ([1, 2, 5, 1, 2, 6, 1, 2], 9, 1, 3, "latest", [6, 1, 2]),      # k longer than the continuation
    ([4, 1, 1, 1], 5, 1, 3, "latest", [1]),                        # overlapping the suffix: [1, 1] at 1..2
    ([9, 1, 2, 1, 2, 1, 2], 4, 1, 3, "latest", [1, 2]),            # [2, 1, 2] at 2..4 overlaps the suffix
    ([5, 5, 5, 5, 5], 4, 1, 3, "latest", [5]),                     # a run: one period only
    ([5, 5, 5, 5, 5], 4, 1, 3, "earliest", [5, 5]),
    ([1, 2, 3, 8, 5, 3, 9, 2, 3], 2, 1, 2, "latest", [8, 5]),      # a longer n wins over a later shorter match
    ([1, 2, 3, 8, 5, 3], 3, 2, 3, "latest", []),                   # min_n excludes the 1-gram match
    ([1, 2, 3, 8, 5, 3], 3, 1, 3, "latest", [8, 5, 3]),
    ([1, 2], 2, 3, 4, "latest", []),                               # context shorter than min_n
    ([1, 1], 2, 2, 2, "latest", []),                               # context of length min_n
    ([3, 3, 3], 2, 2, 2, "latest", [3]),
    ([], 1, 1, 1, "latest", []),
    ([4], 1, 1, 1, "latest", []),
    ([2, 7, 2], 1, 1, 1, "latest", [7]),                           # k = 1
])
def test_hand_written(context, k, min_n, max_n, occurrence, expected):
    assert check(context, k, min_n, max_n, occurrence) == expected


def test_inputs_of_any_integer_type():
    ctx = [3, 1, 4, 1, 5, 9, 2, 6, 1, 4]
    for c in (ctx, tuple(ctx), np.array(ctx, np.int32), np.array(ctx, np.uint16), np.array(ctx, np.uint64)):
        assert propose(c, 3).tolist() == [1, 5, 9]
    big = np.array([2 ** 40, 7, 2 ** 40], dtype=np.int64)
    assert propose(big, 2).tolist() == [7, 2 ** 40]
    out = propose(np.array(ctx), 3)
    out[0] = -5  # a copy, never a view of the caller's array
    assert propose(np.array(ctx), 3).tolist() == [1, 5, 9]


# --------------------------------------------------------------------------------------------- generated cases
params = dict(k=st.integers(1, 6), min_n=st.integers(1, 4), extra=st.integers(0, 3), occurrence=st.sampled_from(BOTH))


@settings(max_examples=300)
@given(context=st.lists(st.integers(0, 3), max_size=40), **params)
def test_matches_reference(context, k, min_n, extra, occurrence):
    max_n = min_n + extra
    got = check(context, k, min_n, max_n, occurrence)
    assert NgramProposer(k, min_n, max_n, occurrence).propose(context).tolist() == got
    # the choice does not depend on k: a larger k extends the proposal
    assert propose(context, k + 3, min_n=min_n, max_n=max_n, occurrence=occurrence)[:k].tolist() == got


@settings(max_examples=150)
@given(tokens=st.lists(st.integers(0, 2), max_size=50), data=st.data(), **params)
def test_proposals_along_matches_reference(tokens, data, k, min_n, extra, occurrence):
    max_n = min_n + extra
    P = data.draw(st.integers(0, len(tokens)))
    r = proposals_along(np.array(tokens, dtype=np.int64), P, k, min_n=min_n, max_n=max_n, occurrence=occurrence)
    T = len(tokens) - P
    assert isinstance(r, Proposals)
    assert r.draft_tokens.shape == (T, k) and r.num_draft.shape == r.num_matching.shape == (T,)
    for t in range(T):
        want = ref(tokens[:P + t], k, min_n, max_n, occurrence)
        d = len(want)
        assert r.num_draft[t] == d and r.draft_tokens[t, :d].tolist() == want
        assert (r.draft_tokens[t, d:] == -1).all()
        m = 0
        while m < d and P + t + m < len(tokens) and tokens[P + t + m] == want[m]:
            m += 1
        assert r.num_matching[t] == m
    for k2 in range(1, k + 1):
        a, b = r.truncated(k2), proposals_along(tokens, P, k2, min_n=min_n, max_n=max_n, occurrence=occurrence)
        for f in ("draft_tokens", "num_draft", "num_matching"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert NgramProposer(k, min_n, max_n, occurrence).proposals_along(tokens, P).num_draft.tolist() == \
        r.num_draft.tolist()


def test_greedy_replay_counts_accepted_drafts():
    """When the recording is the target's greedy output, num_matching is what a greedy verify step accepts."""
    rng = np.random.default_rng(0)
    V, P = 6, 12
    tokens = np.concatenate([rng.integers(0, V, P), np.tile([1, 2, 3, 4], 3), [1, 2, 5, 4, 1, 2, 3, 0, 4]])
    r = proposals_along(tokens, P, 4)
    seen = set()
    for t in range(len(tokens) - P):
        d = int(r.num_draft[t])
        if P + t + d >= len(tokens):
            break  # the target's argmax is known inside the recording only
        x = np.zeros((1, d + 1, V))
        x[0, np.arange(d + 1), tokens[P + t:P + t + d + 1]] = 5.0
        v = verify_logits(x, None, r.draft_tokens[t:t + 1, :d], temperature=0)
        assert v.num_accepted[0] == r.num_matching[t]
        seen.add((d > 0, int(r.num_matching[t]) == d))
    assert seen == {(True, True), (True, False), (False, True)}


@pytest.mark.parametrize("occurrence", BOTH)
def test_very_long_context(occurrence):
    """Performance sanity (no timing): contexts of 10^5 - 10^6 tokens, including a scan that never stops early."""
    rng = np.random.default_rng(1)
    ctx = rng.integers(0, 50_000, 1_000_000)
    ctx[123_456:123_459] = ctx[-3:]  # one planted 3-gram far back
    got = propose(ctx, 5, occurrence=occurrence)
    assert got.tolist() == ctx[123_459:123_464].tolist()
    # every position agrees on 2 tokens, none on 3: the whole context is scanned
    worst = np.concatenate([np.zeros(20_000, np.int64), [1, 0, 0]])
    check(worst, 4, 1, 3, occurrence)
    check(worst, 4, 3, 3, occurrence)
    # a replay along a long recording, spot-checked against the reference
    rec = np.concatenate([rng.integers(0, 30, 20_000), rng.integers(0, 30, 300)])
    r = proposals_along(rec, 20_000, 4, min_n=2, max_n=4, occurrence=occurrence)
    for t in (0, 1, 150, 299):
        want = ref(rec[:20_000 + t], 4, 2, 4, occurrence)
        assert r.draft_tokens[t, :r.num_draft[t]].tolist() == want


# --------------------------------------------------------------------------------------------- the proposer object
def test_proposer_record_and_describe():
    p = NgramProposer(4, min_n=2, max_n=5, occurrence="earliest")
    d = p.as_dict()
    assert d == {"name": "ngram", "k": 4, "min_n": 2, "max_n": 5, "occurrence": "earliest"}
    assert NgramProposer.from_dict(d) == p and NgramProposer.from_dict({"k": 4}) == NgramProposer(4)
    assert p.describe() == "ngram k=4, n=2..5, earliest occurrence"
    assert NgramProposer(np.int32(2)).k == 2 and type(NgramProposer(np.int32(2)).k) is int
    with pytest.raises(AttributeError):
        p.k = 3  # frozen
    for bad, pat in [({"k": 4, "n": 2}, "unknown key.*'n'"), ({"name": "eagle", "k": 4}, "name 'eagle'"),
                     ({"min_n": 2}, "needs k"), ({"k": 0}, "k = 0")]:
        with pytest.raises(InvalidInput, match=pat):
            NgramProposer.from_dict(bad)


# --------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, exc, pat", [
    (lambda: propose([1, 2], 0), InvalidInput, r"k = 0 .*number of tokens to propose must be in \[1, 65536\]"),
    (lambda: propose([1, 2], 2.0), InvalidType, r"k must be an integer"),
    (lambda: propose([1, 2], True), InvalidType, r"k must be an integer"),
    (lambda: propose([1, 2], 2, min_n=0), InvalidInput, r"min_n = 0"),
    (lambda: propose([1, 2], 2, max_n=0), InvalidInput, r"max_n = 0"),
    (lambda: propose([1, 2], 2, min_n=4, max_n=2), InvalidInput, r"min_n = 4 is greater than max_n = 2.*<= max_n"),
    (lambda: propose([1, 2], 2, occurrence="first"), InvalidInput, r"occurrence = 'first'.*'latest' or 'earliest'"),
    (lambda: propose([1.0, 2.0], 2), InvalidType, r"context must hold integer token ids, got dtype float64"),
    (lambda: propose([True, False], 2), InvalidType, r"context must hold integer token ids, got dtype bool"),
    (lambda: propose(["a"], 2), InvalidType, r"context must hold integer"),
    (lambda: propose([1, -1, 2], 2), InvalidInput, r"context\[1\] = -1 is a negative token id"),
    (lambda: propose(np.array([1, 2 ** 64 - 1], np.uint64), 2), InvalidInput, r"context\[1\] = 18446744073709551615"),
    (lambda: propose([[1, 2]], 2), InvalidInput, r"context must be a 1-D sequence.*\[1, 2\]"),
    (lambda: propose(3, 2), InvalidInput, r"context must be a 1-D sequence"),
    (lambda: proposals_along([1, 2], 3, 2), InvalidInput, r"prompt_len = 3 is outside \[0, 2\]"),
    (lambda: proposals_along([1, 2], -1, 2), InvalidInput, r"prompt_len = -1"),
    (lambda: proposals_along([1, 2], 1.0, 2), InvalidType, r"prompt_len must be an integer"),
    (lambda: proposals_along([1, -2], 1, 2), InvalidInput, r"tokens\[1\] = -2"),
    (lambda: proposals_along([1, 2], 1, 2).truncated(3), InvalidInput, r"k = 3 exceeds the k = 2"),
    (lambda: NgramProposer(2, min_n=3, max_n=2), InvalidInput, r"min_n = 3 is greater than max_n = 2"),
    (lambda: draft_batch([[1, 2, 3], [1]], k=2), InvalidInput, r"proposals\[0\] has 3 tokens, more than k = 2"),
    (lambda: draft_batch([[1], [-3]]), InvalidInput, r"proposals\[1\]\[0\] = -3"),
])
def test_bad_input(call, exc, pat):
    with pytest.raises(exc, match=pat) as info:
        call()
    assert "--" not in str(info.value)  # the library never names command-line flags


# --------------------------------------------------------------------------------------------- verification
def test_draft_batch_for_verify_logits():
    toks, nd = draft_batch([np.array([3, 1]), [], [2]])
    assert toks.tolist() == [[3, 1], [-1, -1], [2, -1]] and nd.tolist() == [2, 0, 1]
    assert draft_batch([[4]], k=3)[0].tolist() == [[4, -1, -1]]
    empty = draft_batch([])
    assert empty[0].shape == (0, 0) and empty[1].shape == (0,)
    V = 5
    x = np.zeros((3, 3, V))
    x[0, [0, 1, 2], [3, 4, 0]] = 5.0   # accepts 3, rejects 1 (argmax 4)
    x[1, 0, 2] = 5.0                   # no draft: a plain decoding step, emits the argmax of position 0
    x[2, [0, 1], [2, 1]] = 5.0         # accepts 2, bonus from position 1
    r = verify_logits(x, None, toks, num_draft=nd, temperature=0)
    assert r.tokens.tolist() == [[3, 4, -1], [2, -1, -1], [2, 1, -1]]
    one = propose([3, 1, 4, 3], 2)  # a single sequence needs no batching: K = len(proposal)
    assert one.tolist() == [1, 4]
    y = np.zeros((1, 3, V))
    y[0, [0, 1, 2], [1, 4, 0]] = 5.0
    assert verify_logits(y, None, one[None], temperature=0).tokens.tolist() == [[1, 4, 0]]
    z = verify_logits(y[:, :1], None, propose([1, 2], 4)[None], temperature=0)  # nothing proposed: K = 0
    assert z.tokens.tolist() == [[1]]


KW = [dict(), dict(temperature=0.8, top_k=4), dict(top_p=0.7, min_p=0.05)]


@pytest.mark.parametrize("kw", KW)
def test_one_hot_kernel_distributions_recombine_into_target(kw):
    """The kernel's acceptance probability and recovered distribution for a one-hot proposal recombine into the
    processed target distribution: the first emitted token's distribution, without sampling."""
    rng = np.random.default_rng(len(kw))
    V = 9
    tok = int(propose([0, 5, 7, 2, 0, 5], 3)[0])  # 7
    for _ in range(5):
        x = rng.standard_normal(V) * 1.5
        p = naive.probabilities_row(x, **kw)
        np.testing.assert_allclose(probabilities(x, **kw), p, atol=1e-12)
        px, qx, rec = verification_distributions_logits(x, None, tok, **kw)
        assert qx == 1.0 and abs(px - p[tok]) <= 1e-12
        first = (1 - px) * rec
        first[tok] += px
        np.testing.assert_allclose(first, p, atol=1e-12)


def test_one_hot_first_token_distribution_exact():
    """Exact enumeration (Fractions): with q one-hot on the proposed token x, x is accepted with probability p(x),
    the recovered token follows p without x, and the first emitted token follows p -- also when p(x) = 0 or 1."""
    rng = np.random.default_rng(5)
    V, x = 7, 3
    for case in range(12):
        w = rng.integers(0, 16, V)
        w[(x + 1) % V] += 1
        w[x] = {0: 0, 1: 1 + w[x]}.get(case, w[x])
        if case == 2:
            w[:] = 0
            w[x] = 1
        p = [Fraction(int(a), int(w.sum())) for a in w]
        step = exact.verify_step(p, [Fraction(int(i == x)) for i in range(V)])
        assert step.acceptance == p[x]
        if step.recovered is None:
            assert p[x] == 1
            continue
        assert step.recovered[x] == 0
        assert all(step.recovered[i] == p[i] / (1 - p[x]) for i in range(V) if i != x)
        assert tuple(step.accepted[i] + step.rejection * step.recovered[i] for i in range(V)) == tuple(p)


def counts_of(a):
    return {int(v): int(c) for v, c in zip(*np.unique(a, return_counts=True), strict=True)}


N = 20000
N_TESTS = 2 * len(KW)  # chi-square tests in this file (Bonferroni)


@pytest.mark.statistical
@pytest.mark.parametrize("kw", KW)
def test_one_hot_verification_follows_processed_target(kw):
    """verify_logits(target_logits, None, proposal): the first emitted token follows the processed target
    distribution at position 0, and after an accepted first draft the second follows position 1."""
    rng = np.random.default_rng(100 + len(kw))
    V = 8
    proposal = propose([1, 6, 3, 2, 5, 1, 6], 3)  # [3, 2, 5]
    assert proposal.tolist() == [3, 2, 5]
    d = proposal.shape[0]
    x1 = rng.standard_normal((d + 1, V)) * 1.5
    x1[0, proposal[0]] = x1[0].max() + 0.2  # accepted often enough to test the second position
    r = verify_logits(np.broadcast_to(x1, (N, d + 1, V)), None, np.broadcast_to(proposal, (N, d)),
                      seed=np.arange(N), **kw)
    p0, p1 = (naive.probabilities_row(x1[i], **kw) for i in range(2))
    first = r.tokens[:, 0]
    assert ((first == proposal[0]) == (r.num_accepted >= 1)).all()  # one-hot: the residual never holds x
    counts = counts_of(first)
    assert naive.chi2_fits(counts, dict(enumerate(p0)), N_TESTS)
    second = r.tokens[r.num_accepted >= 1, 1]
    assert second.size > 1000
    assert naive.chi2_fits(counts_of(second), dict(enumerate(p1)), N_TESTS)
    if kw:  # the same test tells the processed distribution from the raw softmax
        assert not naive.chi2_fits(counts, dict(enumerate(naive.probabilities_row(x1[0]))), N_TESTS)
