"""The exact (Fraction) path for block verification, multi-candidate verification and token trees."""
from __future__ import annotations

from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastspec import exact as E
from naive import dist_from_weights, random_model


def const(d):
    return lambda _prefix: d


P2, Q2 = (F(1, 3), F(2, 3)), (F(2, 3), F(1, 3))
P3, Q3 = (F(1, 2), F(3, 10), F(1, 5)), (F(1, 5), F(3, 10), F(1, 2))

models = st.tuples(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 3), st.integers(0, 3))


# ----------------------------------------------------------------- block verification

def test_block_example_from_the_paper():
    tok = E.block_distribution(const(P2), const(Q2), 2)
    blk = E.block_distribution(const(P2), const(Q2), 2, method="block")
    assert tok.expected_accepted == F(10, 9)
    assert blk.expected_accepted == F(11, 9)
    assert blk.rule == "block" and blk.exact and blk.expected_tokens == F(20, 9)
    assert sum(blk.accepted_count) == 1


@settings(max_examples=40, deadline=None)
@given(models)
def test_block_is_exact_and_never_accepts_fewer(m):
    st_, sd, vocab, k = m
    t, d = random_model(st_, vocab), random_model(sd, vocab)
    blk = E.block_distribution(t, d, k, method="block")
    tok = E.block_distribution(t, d, k)
    assert blk.total_variation == 0
    assert sum(blk.accepted_count) == 1
    assert blk.expected_accepted >= tok.expected_accepted
    # P(tau >= i) = E[w_i]
    assert blk.expected_accepted == sum(E.block_acceptance_weights(t, d, k), F(0))


@pytest.mark.parametrize("seed", range(4))
def test_block_equals_token_at_k1_and_greedy(seed):
    t, d = random_model(seed, 3), random_model(seed + 50, 3)
    a = E.block_distribution(t, d, 1, method="block")
    b = E.block_distribution(t, d, 1)
    assert a.emitted == b.emitted and a.accepted_count == b.accepted_count

    def onehot(m):
        def f(prefix):
            p = m(prefix)
            best = max(range(len(p)), key=lambda i: (p[i], -i))
            return tuple(F(int(i == best)) for i in range(len(p)))
        return f

    a = E.block_distribution(onehot(t), onehot(d), 3, method="block")
    b = E.block_distribution(onehot(t), onehot(d), 3)
    assert a.emitted == b.emitted and a.accepted_count == b.accepted_count


@settings(max_examples=12, deadline=None)
@given(models)
def test_block_sequences_with_rollback_are_exact(m):
    st_, sd, vocab, k = m
    t, d = random_model(st_, vocab), random_model(sd, vocab)
    seq = E.sequence_distribution(t, d, max(k, 1), 3, method="block")
    tok = E.sequence_distribution(t, d, max(k, 1), 3)
    assert seq.total_variation == 0 and seq.rule == "block"
    assert seq.expected_steps <= tok.expected_steps


def test_block_rejects_rule_and_unknown_method():
    with pytest.raises(ValueError, match="token verification only"):
        E.block_distribution(const(P2), const(Q2), 2, method="block", rule="resample_from_target")
    with pytest.raises(ValueError, match="unknown"):
        E.block_distribution(const(P2), const(Q2), 2, method="tree")
    with pytest.raises(ValueError, match="unknown"):
        E.sequence_distribution(const(P2), const(Q2), 2, 2, method="tree")


# ----------------------------------------------------------------- multi-candidate

def test_candidate_numbers():
    assert E.candidate_step(P3, Q3, 1).acceptance == F(7, 10)
    assert E.candidate_step(P3, Q3, 1, candidate_sampling="without_replacement").acceptance == F(7, 10)
    assert E.candidate_step(P3, Q3, 2).acceptance == F(19, 25)
    assert E.candidate_step(P3, Q3, 2, candidate_sampling="without_replacement").acceptance == F(41, 50)
    det = E.candidate_step(P3, Q3, 2, candidate_sampling="deterministic")
    assert det.candidates == (2, 1) and det.acceptance == F(1, 2) and det.exact
    assert E.candidate_step(P3, Q3, 2, candidate_sampling="deterministic", candidates=[0]).acceptance == F(1, 2)


def _iid_closed_form(p, q, w):
    r, rej = p, F(1)
    for _ in range(w):
        a = sum((min(x, y) for x, y in zip(r, q, strict=True)), F(0))
        rej *= 1 - a
        if a == 1:
            break
        r = tuple(max(x - y, F(0)) / (1 - a) for x, y in zip(r, q, strict=True))
    return 1 - rej


pq = st.integers(1, 5).flatmap(lambda v: st.tuples(
    st.lists(st.integers(0, 9), min_size=v, max_size=v).filter(lambda w: sum(w) > 0),
    st.lists(st.integers(0, 9), min_size=v, max_size=v).filter(lambda w: sum(w) > 0)))


@settings(max_examples=60, deadline=None)
@given(pq, st.integers(1, 3), st.sampled_from(E.CANDIDATE_SAMPLING))
def test_candidates_are_exact(pqw, w, sampling):
    p, q = dist_from_weights(pqw[0]), dist_from_weights(pqw[1])
    c = E.candidate_step(p, q, w, candidate_sampling=sampling)
    assert c.output == p and c.exact
    assert c.acceptance >= E.candidate_step(p, q, 1, candidate_sampling=sampling).acceptance
    if sampling == "iid":
        assert c.acceptance == _iid_closed_form(p, q, w)
    if sampling == "deterministic":
        assert c.acceptance == sum((p[x] for x in c.candidates), F(0))
    if sampling == "without_replacement":  # at least as good as i.i.d. (no wasted duplicate proposals)
        assert c.acceptance >= E.candidate_step(p, q, w).acceptance


@settings(max_examples=15, deadline=None)
@given(models, st.sampled_from(E.CANDIDATE_SAMPLING), st.lists(st.integers(1, 2), min_size=1, max_size=2))
def test_trees_are_exact(m, sampling, widths):
    st_, sd, vocab, _ = m
    t, d = random_model(st_, vocab), random_model(sd, vocab)
    blk = E.block_distribution(t, d, len(widths), method="candidates", widths=widths, candidate_sampling=sampling)
    assert blk.total_variation == 0 and sum(blk.accepted_count) == 1
    seq = E.sequence_distribution(t, d, len(widths), 3, method="candidates", widths=widths, candidate_sampling=sampling)
    assert seq.total_variation == 0


def test_width_one_tree_is_token_verification():
    t, d = random_model(1, 3), random_model(2, 3)
    a = E.block_distribution(t, d, 3, method="candidates")  # widths default (1, 1, 1)
    b = E.block_distribution(t, d, 3)
    assert a.emitted == b.emitted and a.accepted_count == b.accepted_count


def test_candidate_argument_errors():
    with pytest.raises(ValueError, match="sampling"):
        E.candidate_step(P3, Q3, 2, candidate_sampling="beam")
    with pytest.raises(ValueError, match="w must be"):
        E.candidate_step(P3, Q3, 0)
    with pytest.raises(ValueError, match="distinct"):
        E.candidate_step(P3, Q3, 2, candidate_sampling="deterministic", candidates=[1, 1])
    with pytest.raises(ValueError, match="deterministic"):
        E.candidate_step(P3, Q3, 2, candidates=[1])
    with pytest.raises(ValueError, match=r"widths\[1\]"):
        E.block_distribution(const(P3), const(Q3), 2, method="candidates", widths=(2, 0))
    with pytest.raises(ValueError, match="one width per depth"):
        E.sequence_distribution(const(P3), const(Q3), 2, 2, method="candidates", widths=(1,))
