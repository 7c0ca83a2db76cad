"""Draft-length policies in fastspec's real loop (issue 23, item 3): ``speculative_generate(..., policy=...)``.

* policy=None is the fixed-k loop as it was: same seed, same tokens (pinned below from the loop before policies
  were added, tiny random models of tests/hf_models.py);
* every policy kind passes the output audit (same distribution as the target's), and a policy whose stop rule
  peeks at the target (not prefix-only) fails it;
* per-step draft lengths follow the policy's own state (checked against a slow re-run of the state on the
  recorded probabilities);
* bad input names the argument."""
from __future__ import annotations

import pytest

from hf_models import tiny  # importing it skips this module without torch / transformers

import fastspec
from fastspec import hf
from fastspec.errors import InvalidInput
from fastspec.hf.audit import audit_model_output
from fastspec.policies import parse_policy

pytestmark = pytest.mark.hf

PROMPT = [1, 3, 5]
#: tokens and accepted drafts per verify step of the loop before policies existed (commit dea384f), 20 new tokens
PINNED = [
    (dict(k=3, temperature=1.0, seed=7), [2, 6, 5, 5, 2, 5, 1, 2, 0, 3, 3, 1, 5, 5, 2, 3, 2, 3, 0, 5],
     [3, 0, 0, 2, 0, 0, 3, 0, 0, 2]),
    (dict(k=2, temperature=0.0, seed=0), [5, 5, 5, 5, 2, 2, 1, 2, 3, 3, 5, 5, 5, 5, 2, 3, 5, 2, 3, 5],
     [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
    (dict(k=4, temperature=0.8, top_k=5, seed=3), [5, 5, 2, 2, 4, 2, 5, 1, 1, 0, 6, 3, 5, 5, 5, 5, 5, 2, 6, 6],
     [0, 0, 1, 0, 0, 2, 0, 2, 0, 0, 1, 0, 1]),
    (dict(k=5, temperature=1.0, top_p=0.9, min_p=0.05, seed=11),
     [5, 3, 6, 3, 3, 3, 2, 2, 5, 2, 5, 2, 3, 1, 5, 2, 6, 0, 3, 5], [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0]),
]
PINNED_NGRAM = ([4, 6, 0, 6, 4, 5, 2, 7, 4, 6, 5, 2, 6, 7, 7, 4, 4, 6, 7, 5], [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0])


@pytest.fixture(scope="module")
def pair():
    return tiny(0), tiny(1)


@pytest.mark.parametrize("case", range(len(PINNED)))
def test_no_policy_is_the_fixed_k_loop_as_pinned(pair, case):
    kw, tokens, accepted = PINNED[case]
    r = hf.speculative_generate(*pair, PROMPT, max_new_tokens=20, **kw)
    assert r.tokens.tolist() == tokens
    assert r.accepted_per_step.tolist() == accepted


def test_no_policy_ngram_as_pinned(pair):
    r = hf.speculative_generate(pair[0], "ngram1-2", [1, 3, 5, 1, 3], k=3, max_new_tokens=20, seed=5)
    assert (r.tokens.tolist(), r.accepted_per_step.tolist()) == PINNED_NGRAM


POLICIES = ["fixed:k=3", "conf:theta=0.5,kmax=6", "conf:theta=0.6,kmax=5,on=max", "specdec:h=0.5,kmax=6",
            "specdec:h=0.4,kmax=6,on=max", "hf", "hf:k=4,schedule=heuristic,theta=0",
            "hf:k=3,schedule=heuristic_transient,theta=0.3,tune=off"]
PARAMS = dict(temperature=1.0, top_k=6)
PROMPTS = [[1, 3, 5], [2, 4], [0, 7, 6, 5], [3]]


def _replay_lengths(policy, trace, params, n_new):
    """The draft lengths the policy's own state gives along a recorded trace (the slow reference): a fresh state,
    the budget capped by the tokens left, keep_drafting on each recorded draft's probability, update after."""
    pol = parse_policy(policy)
    state = pol.start()
    out, made = [], 0
    for step in trace:
        if not step["drafts"]:
            state.update(0, 0, [])
            made += len(step["emitted"])
            continue
        cap = min(state.budget(), pol.k_max, n_new - made - 1)
        n, qs = 0, []
        for j, (x, lg) in enumerate(zip(step["drafts"], step["draft_logits"], strict=True)):
            q = fastspec.probabilities(lg, temperature=1.0) if params["temperature"] == 0 else \
                fastspec.probabilities(lg, **params)
            qs.append(float(q[x]))
            n = j + 1
            if n == cap or not state.keep_drafting(j, q[x], q.max()):
                break
        out.append(n)
        state.update(n, len(step["emitted"]) - 1, qs)
        made += len(step["emitted"])
    return out


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("params", [PARAMS, dict(temperature=0.0)])
def test_draft_lengths_follow_the_policy_state(pair, policy, params):
    r = hf.speculative_generate(*pair, PROMPTS[2], max_new_tokens=30, seed=3, policy=policy, return_trace=True,
                                **params)
    assert r.policy == parse_policy(policy).name
    assert len(r.tokens) == 30
    assert r.draft_lengths.tolist() == [len(s["drafts"]) for s in r.trace if s["drafts"]]
    assert r.draft_lengths.tolist() == _replay_lengths(policy, r.trace, params, 30)
    assert r.drafted == int(r.draft_lengths.sum())


def test_a_fixed_policy_is_fixed_k(pair):
    """fixed:k=K draws the same uniforms as k=K: the same tokens, model and n-gram drafts."""
    for draft, prompt in ((pair[1], PROMPT), ("ngram1-2", [1, 3, 5, 1, 3])):
        a = hf.speculative_generate(pair[0], draft, prompt, 3, max_new_tokens=20, seed=9, **PARAMS)
        b = hf.speculative_generate(pair[0], draft, prompt, max_new_tokens=20, seed=9, policy="fixed:k=3", **PARAMS)
        assert a.tokens.tolist() == b.tokens.tolist()
        assert a.accepted_per_step.tolist() == b.accepted_per_step.tolist()


def test_a_stopping_policy_drafts_less(pair):
    """conf at a high threshold stops early: fewer drafts per step than its kmax, and never more."""
    r = hf.speculative_generate(*pair, PROMPT, max_new_tokens=40, seed=1, policy="conf:theta=0.9,kmax=6", **PARAMS)
    assert r.draft_lengths.max() <= 6
    assert r.draft_lengths.mean() < 3


def test_bad_policies(pair):
    with pytest.raises(InvalidInput, match=r"policy = conf\(theta=0.5,kmax=8,on=token\): an n-gram draft"):
        hf.speculative_generate(pair[0], "ngram", PROMPT, policy="conf:theta=0.5,kmax=8", max_new_tokens=4)
    with pytest.raises(InvalidInput, match=r"policy 'conf:theta=1.5'.*theta=1.5 must be in \(0, 1\)"):
        hf.speculative_generate(*pair, PROMPT, policy="conf:theta=1.5", max_new_tokens=4)
    with pytest.raises(InvalidInput, match="policy 'warp:k=2'.*unknown policy kind"):
        hf.speculative_generate(*pair, PROMPT, policy="warp:k=2", max_new_tokens=4)
    with pytest.raises(InvalidInput, match="policy = 3 is invalid"):
        hf.speculative_generate(*pair, PROMPT, policy=3, max_new_tokens=4)


def _runs(target, draft, policy, prompts=16, new=24, seed0=0, params=PARAMS):
    return [(PROMPTS[i % len(PROMPTS)],
             hf.speculative_generate(target, draft, PROMPTS[i % len(PROMPTS)], seed=seed0 + i, max_new_tokens=new,
                                     policy=policy, **params).tokens) for i in range(prompts)]


@pytest.mark.parametrize("policy", [p if p in ("conf:theta=0.5,kmax=6", "specdec:h=0.5,kmax=6", "hf") else
                                    pytest.param(p, marks=pytest.mark.slow) for p in POLICIES])
def test_every_policy_passes_the_output_audit(pair, policy):
    """Same distribution as the target's (fastspec.audit, teacher-forced): 16 prompts x 24 tokens per policy (one
    of each kind in the fast hf selection, the rest marked slow)."""
    target, draft = pair
    res = audit_model_output(target, _runs(target, draft, policy), **PARAMS, seed=1)
    assert res.passed, res.verdict


def test_greedy_policies_give_the_targets_greedy_tokens(pair):
    target, draft = pair
    ref = hf.generate(target, PROMPT, temperature=0, max_new_tokens=20)
    for policy in POLICIES:
        r = hf.speculative_generate(target, draft, PROMPT, temperature=0, max_new_tokens=20, policy=policy)
        assert r.tokens.tolist() == ref.tolist(), policy


class _TrustTrigger:
    """A deliberately broken policy run: the draft that stopped drafting (low confidence) is emitted even when
    verification rejects it, in place of the recovered token -- a loop that treats the policy's stop token as
    decided instead of verifying it."""

    def __init__(self, spec):
        self.policy = parse_policy(spec)
        self.stopped = False

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def start(self, previous=None):  # noqa: ARG002 (the DraftPolicy interface)
        run, state = self, self.policy.start()

        class State:
            def budget(self):
                run.stopped = False
                return state.budget()

            def keep_drafting(self, j, q_token, q_max):
                go = state.keep_drafting(j, q_token, q_max)
                run.stopped = not go
                return go

            def update(self, n, a, q):
                state.update(n, a, q)

        return State()

    def verifier(self, real):
        def verify(tl, dl, toks, **kw):
            res = real(tl, dl, toks, **kw)
            n = toks.shape[1]
            if self.stopped and int(res.num_accepted[0]) == n - 1:
                res.tokens[0, n - 1] = toks[0, n - 1]
            return res

        return verify


def test_an_unverified_stop_token_fails_the_audit(pair, monkeypatch):
    target, draft = pair
    broken = _TrustTrigger("conf:theta=0.6,kmax=6")
    monkeypatch.setattr(hf.loop, "verify_logits", broken.verifier(hf.loop.verify_logits))
    res = audit_model_output(target, _runs(target, draft, broken, prompts=16), **PARAMS, seed=1)
    assert not res.passed, res.verdict
