"""fastspec.exact as a package: one name per enumeration and per verification rule (no aliases), method names from the
registry, typed errors that name the argument, and no command-line words in the library."""
from __future__ import annotations

import pathlib
import re
from fractions import Fraction as F

import pytest

from fastspec import exact as E
from fastspec import methods
from fastspec.errors import InvalidInput, InvalidType
from naive import random_model

P3, Q3 = (F(1, 2), F(3, 10), F(1, 5)), (F(1, 5), F(1, 2), F(3, 10))
PUBLIC = ["to_fraction", "as_distribution", "total_variation", "VerifyStep", "verify_step", "VerificationRule",
          "RULES", "get_rule", "rule_parameters", "PositionAudit", "audit_step", "BlockDistribution",
          "block_distribution", "SequenceDistribution", "sequence_distribution", "target_sequence_distribution",
          "FLOAT_SUM_TOLERANCE", "METHODS", "block_acceptance_weights", "CANDIDATE_SAMPLING", "top_candidates",
          "CandidateStep", "candidate_step"]
GONE = ["Policy", "POLICIES", "get_policy", "policy_parameters", "block_verification_distribution",
        "candidate_block_distribution", "verification_sequence_distribution"]


def const(d):
    return lambda _prefix: d


@pytest.fixture
def models():
    return random_model(11, 3), random_model(12, 3)


def test_one_name_per_concept_is_exported():
    # issue 29, item 2: verification rules are VerificationRule (draft-length policies are DraftPolicy); the old
    # names and the deprecated enumerations are gone, not aliased
    assert sorted(PUBLIC) == sorted(E.__all__)
    for name in E.__all__:
        assert getattr(E, name) is not None, name
    for name in GONE:
        assert not hasattr(E, name), name
    assert E.Fraction is F
    with pytest.raises(ImportError):
        __import__("fastspec.exact.policies")
    with pytest.raises(ImportError):
        __import__("fastspec.exact._deprecated")


def test_the_one_names_do_not_warn(models, recwarn):
    t, d = models
    for method in E.METHODS:
        E.block_distribution(t, d, 2, method=method)
        E.sequence_distribution(t, d, 2, 2, method=method)
    assert not [w for w in recwarn if issubclass(w.category, DeprecationWarning)]


# ----------------------------------------------------------------- registries

def test_names_come_from_the_registries():
    assert E.METHODS == (*methods.VERIFICATION_METHODS, "candidates") == ("token", "block", "candidates")
    assert E.CANDIDATE_SAMPLING == tuple(methods.CANDIDATE_SAMPLING)
    assert list(E.RULES) == ["standard", "unnormalized_residual", "resample_from_target", "prune_by_draft_prob",
                                "prune_by_draft_prob_corrected", "typical_acceptance", "exact_match"]
    assert E.rule_parameters("prune_by_draft_prob") == {"tau": None}
    assert E.rule_parameters("typical_acceptance") == {"epsilon": "0.09", "delta": "0.3"}
    assert E.rule_parameters("standard") == {}
    for name, description in E.RULES.items():
        rule = E.get_rule(name, tau="0.3") if "tau" in E.rule_parameters(name) else E.get_rule(name)
        assert rule.name == name and rule.description == description


def test_method_errors_list_every_method(models):
    t, d = models
    with pytest.raises(InvalidInput, match=r"'tree' is unknown.*'token'.*'block'.*'candidates'"):
        E.block_distribution(t, d, 1, method="tree")
    with pytest.raises(InvalidInput, match="candidate sampling 'beam'"):
        E.block_distribution(t, d, 1, method="candidates", candidate_sampling="beam")
    with pytest.raises(InvalidInput, match="widths and candidate_sampling apply to method='candidates' only"):
        E.block_distribution(t, d, 1, method="block", widths=(2,))
    with pytest.raises(InvalidInput, match="widths and candidate_sampling apply to method='candidates' only"):
        E.sequence_distribution(t, d, 1, 2, candidate_sampling="iid")
    with pytest.raises(InvalidInput, match="token verification only"):
        E.sequence_distribution(t, d, 1, 2, method="candidates", rule="exact_match")


# ----------------------------------------------------------------- typed errors

@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: E.audit_step(P3, Q3, 42), InvalidType, "rule must be a rule name .* got int"),
        (lambda: E.get_rule(None), InvalidType, "got NoneType"),
        (lambda: E.get_rule("nope"), InvalidInput, "unknown verification rule 'nope'; choose one of: standard"),
        (lambda: E.get_rule("standard", tau="0.3"), InvalidInput,
         "rule 'standard' takes no tau; tau applies to: prune_by_draft_prob, prune_by_draft_prob_corrected"),
        (lambda: E.get_rule("prune_by_draft_prob"), InvalidInput, r"needs tau, the draft-probability threshold"),
        (lambda: E.get_rule("prune_by_draft_prob", tau="-1/2"), InvalidInput, r"tau = -1/2 must lie in \[0, 1\]"),
        (lambda: E.get_rule("typical_acceptance", delta="-1"), InvalidInput, "delta = -1 must be >= 0"),
        (lambda: E.get_rule("prune_by_draft_prob", tau="x"), InvalidInput, "tau is 'x', not a number"),
        (lambda: E.audit_step(P3, Q3, "standard", theta=1), InvalidType, "unknown rule parameter 'theta'"),
        (lambda: E.audit_step(P3, Q3, E.get_rule("standard"), tau="0.3"), InvalidInput, "already built"),
        (lambda: E.block_distribution(const(P3), const(Q3), 2, method="block", rule=42), InvalidType,
         "rule must be"),
        (lambda: E.candidate_step(P3, Q3, 2, candidate_sampling="deterministic", candidates=[0, 3]), InvalidInput,
         r"candidates\[1\] = 3"),
        (lambda: E.candidate_step(P3, Q3, 2, candidate_sampling="deterministic", candidates=[0.5]), InvalidInput,
         r"candidates\[0\] must be an integer"),
        (lambda: E.candidate_step(P3, Q3, True), InvalidInput, "w must be an integer >= 1"),
        (lambda: E.block_distribution(const(P3), const(Q3), 2, method="candidates", widths=2), InvalidType,
         "widths must be a sequence"),
        (lambda: E.sequence_distribution(const(P3), const(Q3), 1, -1), InvalidInput, "length must be"),
        (lambda: E.block_distribution(const(P3), "q", 1), InvalidType, "draft must be a function"),
        (lambda: E.total_variation(P3, Q3[:2]), InvalidInput, "length mismatch"),
        (lambda: E.to_fraction("inf", "p", 2), InvalidInput, r"p\[2\] is 'inf'; probabilities must be finite"),
        (lambda: E.to_fraction(float("nan"), "q"), InvalidInput, "q is nan; probabilities must be finite"),
        (lambda: E.as_distribution(["0.5", "0.4"]), InvalidInput, "p sums to 9/10 .* pass normalize=True"),
        (lambda: E.as_distribution(5), InvalidType, "must be a sequence of probabilities"),
    ],
)
def test_typed_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_typed_errors_are_builtin_errors():
    assert issubclass(InvalidInput, ValueError) and issubclass(InvalidType, TypeError)


def test_the_library_never_names_command_line_flags():
    # the command line translates into its own words; the library speaks of its own arguments
    for path in pathlib.Path(E.__file__).parent.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"--[a-z]|\bCLI\b", text), path.name
    with pytest.raises(InvalidInput) as exc:
        E.get_rule("prune_by_draft_prob_corrected")
    assert "--" not in str(exc.value)


def test_fraction_strings_are_exact():
    s = E.verify_step(["1/3", "2/3"], ["1/2", "1/2"])
    assert s.acceptance == F(5, 6) and s.recovered == (0, 1)
