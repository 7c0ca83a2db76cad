"""The exact (Fraction) path: one position, verification rules, blocks and sequences."""
from __future__ import annotations

from fractions import Fraction as F

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastspec import exact as E
from naive import dist_from_weights, random_model


# ----------------------------------------------------------------- strategies / helpers


def weights(min_size=1, max_size=50):
    return st.lists(st.integers(0, 12), min_size=min_size, max_size=max_size).filter(lambda w: sum(w) > 0)


@st.composite
def pq_pairs(draw, max_vocab=50):
    v = draw(st.integers(1, max_vocab))
    p = dist_from_weights(draw(weights(v, v)))
    q = dist_from_weights(draw(weights(v, v)))
    return p, q


WORKED_P = (F(1, 2), F(3, 10), F(1, 5))
WORKED_Q = (F(1, 5), F(1, 2), F(3, 10))


# ----------------------------------------------------------------- verify_step

def test_worked_case():
    s = E.verify_step(["0.5", "0.3", "0.2"], ["0.2", "0.5", "0.3"])
    assert s.accepted == (F(1, 5), F(3, 10), F(1, 5))
    assert s.acceptance == F(7, 10)
    assert s.rejection == F(3, 10)
    assert s.residual == (F(3, 10), 0, 0)
    assert s.recovered == (1, 0, 0)
    assert s.output == WORKED_P
    assert s.total_variation == F(3, 10)


def test_equal_distributions_never_divide():
    s = E.verify_step(["0.5", "0.5"], ["1/2", "1/2"])
    assert s.rejection == 0
    assert s.recovered is None
    assert s.residual == (0, 0)
    assert s.output == s.p


@settings(max_examples=300)
@given(pq_pairs())
def test_output_is_target_exactly(pq):
    p, q = pq
    s = E.verify_step(p, q)
    assert s.output == p
    assert s.acceptance == 1 - E.total_variation(p, q)
    assert sum(s.residual) == s.rejection
    if p == q:
        assert s.recovered is None
    else:
        assert s.recovered is not None and sum(s.recovered) == 1


@settings(max_examples=100)
@given(pq_pairs())
def test_equal_inputs_have_no_recovered(pq):
    p, _ = pq
    s = E.verify_step(p, p)
    assert s.recovered is None and s.acceptance == 1 and s.output == p


def test_input_kinds_are_exact():
    assert E.to_fraction("0.1") == F(1, 10)
    assert E.to_fraction("1/3") == F(1, 3)
    assert E.to_fraction(3) == 3
    assert E.to_fraction(0.1) == F(0.1) != F(1, 10)  # floats are converted exactly, not rounded
    # a float vector that does not sum to exactly 1 is divided by its exact sum
    p = E.as_distribution([0.1, 0.2, 0.7])
    assert sum(p) == 1
    s = E.verify_step([0.5, 0.25, 0.25], [F(1, 4), "0.25", "1/2"])
    assert s.acceptance == F(3, 4)


@pytest.mark.parametrize(
    "p, q, kwargs, match",
    [
        ([], ["1"], {}, "p is empty"),
        (["1"], [], {}, "q is empty"),
        (["0.5", "0.5"], ["1"], {}, "length mismatch"),
        (["1.5", "-0.5"], ["0.5", "0.5"], {}, r"p\[1\] = -1/2 is negative"),
        (["0.5", "0.4"], ["0.5", "0.5"], {}, "p sums to 9/10"),
        (["0.5", "0.5"], ["0.5", "abc"], {}, r"q\[1\] is 'abc', not a number"),
        (["0", "0"], ["0.5", "0.5"], {}, "sums to 0"),
        ([0.5, float("nan")], ["0.5", "0.5"], {}, "finite"),
        ([0.5, 0.4], [0.5, 0.5], {}, "not 1"),  # float off by far more than the tolerance
    ],
)
def test_bad_inputs(p, q, kwargs, match):
    with pytest.raises(ValueError, match=match):
        E.verify_step(p, q, **kwargs)


def test_bad_types():
    with pytest.raises(TypeError, match=r"p\[0\] is a bool"):
        E.verify_step([True], [1])
    with pytest.raises(TypeError, match="not a string"):
        E.as_distribution("0.5,0.5")
    with pytest.raises(TypeError, match=r"p\[0\] has type"):
        E.verify_step([object()], [1])


def test_normalize_divides_by_sum():
    s = E.verify_step(["5", "3", "2"], ["2", "5", "3"], normalize=True)
    assert s.p == WORKED_P and s.acceptance == F(7, 10)


# ----------------------------------------------------------------- rule audit (one position)

@pytest.mark.parametrize(
    "rule, params, output, acceptance, tv",
    [
        ("standard", {}, WORKED_P, F(7, 10), 0),
        ("prune_by_draft_prob_corrected", {"tau": "0.3"}, WORKED_P, F(2, 5), 0),
        ("exact_match", {}, WORKED_P, F(31, 100), 0),
        ("prune_by_draft_prob", {"tau": "3/10"}, (F(2, 5), F(9, 25), F(6, 25)), F(1, 2), F(1, 10)),
        ("unnormalized_residual", {}, (F(29, 100), F(3, 10), F(41, 100)), F(7, 10), F(21, 100)),
        ("resample_from_target", {}, (F(7, 20), F(39, 100), F(13, 50)), F(7, 10), F(3, 20)),
    ],
)
def test_audit_worked_case(rule, params, output, acceptance, tv):
    a = E.audit_step(WORKED_P, WORKED_Q, rule, **params)
    assert a.output == output
    assert a.acceptance == acceptance
    assert a.total_variation == tv
    assert sum(a.output) == 1


def test_typical_acceptance_is_lossy_on_worked_case():
    # H(p) = 1.0297 nats; delta*exp(-H) = 0.1071; threshold = min(0.09, 0.1071) = 0.09: every draft accepted
    a = E.audit_step(WORKED_P, WORKED_Q, "typical_acceptance")
    assert a.acceptance == 1 and a.output == WORKED_Q and a.total_variation == F(3, 10)
    # a stricter epsilon rejects token 2 (p = 1/5) and emits the target argmax instead
    b = E.audit_step(WORKED_P, WORKED_Q, "typical_acceptance", epsilon="0.25", delta="1")
    assert b.output == (F(1, 2), F(1, 2), 0)
    assert b.acceptance == F(7, 10) and b.total_variation == F(1, 5)


EXACT_RULES = [("standard", {}), ("prune_by_draft_prob_corrected", {"tau": "0.2"}), ("exact_match", {})]
LOSSY_RULES = [("unnormalized_residual", {}), ("resample_from_target", {}), ("prune_by_draft_prob", {"tau": "0.2"})]


@settings(max_examples=200)
@given(pq_pairs(max_vocab=8))
def test_exact_rules_have_zero_tv(pq):
    p, q = pq
    for name, params in EXACT_RULES:
        a = E.audit_step(p, q, name, **params)
        assert a.total_variation == 0, name
        assert sum(a.output) == 1


@settings(max_examples=200)
@given(pq_pairs(max_vocab=8))
def test_lossy_rules_are_biased_exactly_when_expected(pq):
    p, q = pq
    residual = tuple(max(a - b, 0) for a, b in zip(p, q, strict=True))
    rej = 1 - sum(min(a, b) for a, b in zip(p, q, strict=True))
    # unnormalized residual: biased iff rejection is possible and the fall-through distribution
    # (residual, plus the missing mass on the last token) differs from the normalized residual
    a = E.audit_step(p, q, "unnormalized_residual")
    if rej > 0:
        fall_through = list(residual)
        fall_through[-1] += 1 - sum(residual)
        assert (a.total_variation > 0) == (tuple(fall_through) != tuple(r / rej for r in residual))
    else:
        assert a.total_variation == 0
    # resampling from p: biased iff rejection is possible and p differs from the normalized residual
    b = E.audit_step(p, q, "resample_from_target")
    if rej > 0:
        recovered = tuple(r / rej for r in residual)
        assert (b.total_variation > 0) == (recovered != p)
    else:
        assert b.total_variation == 0
    # the corrected pruning uses the same candidates but is exact
    c = E.audit_step(p, q, "prune_by_draft_prob_corrected", tau="0.2")
    assert c.total_variation == 0


def test_rule_errors():
    with pytest.raises(ValueError, match="unknown verification rule"):
        E.get_rule("nope")
    with pytest.raises(ValueError, match="needs tau"):
        E.get_rule("prune_by_draft_prob")
    with pytest.raises(ValueError, match="must lie in"):
        E.get_rule("prune_by_draft_prob", tau="1.5")


# ----------------------------------------------------------------- blocks and sequences

@settings(max_examples=40)
@given(st.integers(0, 10_000), st.integers(2, 4), st.integers(1, 3))
def test_block_equals_target(seed, vocab, k):
    t, d = random_model(seed, vocab), random_model(seed + 1, vocab)
    b = E.block_distribution(t, d, k)
    assert b.total_variation == 0 and b.completed == b.target
    assert sum(b.emitted.values()) == 1
    assert sum(b.accepted_count) == 1
    assert b.expected_tokens == 1 + sum(j * pj for j, pj in enumerate(b.accepted_count))
    # the first emitted token follows the target's next-token distribution exactly
    first = [F(0)] * vocab
    for seq, pr in b.emitted.items():
        first[seq[0]] += pr
    assert tuple(first) == t(())


@settings(max_examples=25)
@given(st.integers(0, 10_000), st.integers(2, 4), st.integers(1, 3), st.integers(1, 4))
def test_sequence_equals_target(seed, vocab, k, length):
    t, d = random_model(seed, vocab), random_model(seed + 7, vocab)
    s = E.sequence_distribution(t, d, k, length)
    assert s.total_variation == 0 and s.distribution == s.target
    assert 1 <= s.expected_steps <= length


def test_accepted_count_closed_form_iid():
    # context-free models: the number of accepted drafts is truncated-geometric in alpha
    p, q = WORKED_P, WORKED_Q
    b = E.block_distribution(lambda _pre: p, lambda _pre: q, 3)
    a = F(7, 10)
    assert b.accepted_count == ((1 - a), a * (1 - a), a * a * (1 - a), a ** 3)
    assert b.expected_tokens == (1 - a ** 4) / (1 - a)


def test_block_with_k_zero_is_bonus_only():
    b = E.block_distribution(lambda _pre: WORKED_P, lambda _pre: WORKED_Q, 0)
    assert b.emitted == {(0,): F(1, 2), (1,): F(3, 10), (2,): F(1, 5)}
    assert b.expected_tokens == 1


def test_greedy_block():
    t = lambda pre: (0, 1, 0) if len(pre) % 2 == 0 else (1, 0, 0)  # noqa: E731
    d = lambda _pre: (0, 1, 0)  # noqa: E731 - always drafts token 1
    b = E.block_distribution(t, d, 3)
    # draft 1 accepted, draft 1 rejected (target wants 0), recovered = 0
    assert b.emitted == {(1, 0): 1}
    assert b.accepted_count == (0, 1, 0, 0)


def test_lossy_rule_visible_in_blocks_and_sequences():
    t, d = random_model(3, 3), random_model(4, 3)
    assert E.block_distribution(t, d, 2, rule="resample_from_target").total_variation > 0
    assert E.sequence_distribution(t, d, 2, 3, rule="unnormalized_residual").total_variation > 0
    assert E.sequence_distribution(t, d, 2, 3, rule="prune_by_draft_prob_corrected", tau="0.3").total_variation == 0
    assert E.sequence_distribution(t, d, 2, 3, rule="exact_match").total_variation == 0


def test_model_errors():
    with pytest.raises(ValueError, match="vocabulary has 2"):
        E.block_distribution(lambda _pre: (F(1, 2), F(1, 2)), lambda _pre: (1, 0, 0), 1)
    with pytest.raises(ValueError, match="k must be an integer"):
        E.block_distribution(lambda _pre: (1,), lambda _pre: (1,), -1)
    with pytest.raises(TypeError, match="target must be a function"):
        E.block_distribution([1], lambda _pre: (1,), 1)
    with pytest.raises(ValueError, match=r"target\(\(\)\) sums to"):
        E.block_distribution(lambda _pre: ("0.5", "0.4"), lambda _pre: ("0.5", "0.5"), 1)
