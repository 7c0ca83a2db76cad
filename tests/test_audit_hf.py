"""The teacher-forced output audit with real (tiny random) models: fastspec.hf.audit."""
from __future__ import annotations

import json

import numpy as np
import pytest

from hf_models import tiny  # importing it skips this module without torch / transformers

import fastspec
from fastspec import hf
from fastspec.audit import read_token_file
from fastspec.errors import InvalidInput
from fastspec.hf.audit import (audit_model_output, check_prompts_match, teacher_forced_logit_chunks,
                               write_token_file)

pytestmark = pytest.mark.hf

PARAMS = dict(temperature=1.0, top_k=6)
PROMPTS = [[1, 3, 5], [2, 4], [0, 7, 6, 5], [3]]


@pytest.fixture(scope="module")
def pair():
    return tiny(0), tiny(1)


def _runs(target, draft, prompts=16, new=24, seed0=0):
    out = []
    for i in range(prompts):
        p = PROMPTS[i % len(PROMPTS)]
        r = hf.speculative_generate(target, draft, p, k=3, seed=seed0 + i, max_new_tokens=new, **PARAMS)
        out.append((p, r))
    return out


def test_teacher_forced_probabilities_equal_the_loops(pair):
    """The audit's teacher-forced processed distributions are the ones the loop's verifier sampled from."""
    target, draft = pair
    r = hf.speculative_generate(target, draft, PROMPTS[0], k=3, seed=5, max_new_tokens=20, return_trace=True,
                                **PARAMS)
    loop_rows = []
    for step in r.trace:
        loop_rows.extend(step["target_logits"][:len(step["emitted"])])
    loop = fastspec.probabilities(np.stack(loop_rows), **PARAMS)
    for chunk in (None, 3):
        tf = np.concatenate([lg for _, lg in teacher_forced_logit_chunks(target, PROMPTS[0], r.tokens, chunk=chunk)])
        assert tf.shape == loop.shape
        np.testing.assert_allclose(fastspec.probabilities(tf, **PARAMS), loop, atol=2e-6)


def test_fastspec_loop_passes_the_audit(pair, tmp_path):
    target, draft = pair
    runs = _runs(target, draft)
    res = audit_model_output(target, [(p, r.tokens) for p, r in runs], **PARAMS, seed=1)
    assert res.passed, res.verdict
    assert res.tokens == 16 * 24
    # the token file round trip gives the same audit
    path = write_token_file(tmp_path / "t.jsonl", runs)
    recs = read_token_file(path)
    assert [list(r.prompt_token_ids) for r in recs] == [p for p, _ in runs]
    assert audit_model_output(target, recs, **PARAMS, seed=1) == res


def test_greedy_loop_passes_and_a_wrong_token_fails(pair):
    target, draft = pair
    runs = [(p, hf.speculative_generate(target, draft, p, k=2, temperature=0, max_new_tokens=12).tokens)
            for p in PROMPTS]
    res = audit_model_output(target, runs, temperature=0)
    assert res.passed and res.mode == "greedy"
    bad = [(p, t.copy()) for p, t in runs]
    bad[1][1][4] = (bad[1][1][4] + 1) % 8
    # a changed token changes the context after it too: at least that position is a mismatch
    res2 = audit_model_output(target, bad, temperature=0, greedy_tolerance=0.0)
    assert not res2.passed and res2.greedy_mismatches >= 1


def _broken_verifier(kind: str):
    """fastspec.verify_logits with a broken rejection branch: "no_residual" resamples from p; "unnormalized" draws
    the recovered token by inverse CDF of a uniform in [0, 1) over the unnormalized residual max(p - q, 0),
    falling through to the last id."""
    real = fastspec.verify_logits
    rng = np.random.default_rng(123)

    def broken(tl, dl, toks, **kw):
        res = real(tl, dl, toks, **kw)
        n = int(res.num_accepted[0])
        if dl is not None and n < toks.shape[1]:
            sp = dict(temperature=kw["temperature"], top_k=kw["top_k"])
            p = fastspec.probabilities(tl[0, n][None], **sp)[0]
            if kind == "no_residual":
                res.tokens[0, n] = rng.choice(len(p), p=p)
            else:
                r = np.maximum(p - fastspec.probabilities(dl[0, n][None], **sp)[0], 0.0)
                res.tokens[0, n] = min(int(np.searchsorted(np.cumsum(r), rng.random(), side="right")), len(p) - 1)
        return res

    return broken


@pytest.mark.parametrize("kind,prompts", [("unnormalized", 16), pytest.param("no_residual", 192,
                                                                          marks=pytest.mark.slow)])
def test_broken_loop_fails_the_audit(pair, monkeypatch, kind, prompts):
    """A loop whose rejection branch is broken fails the audit of its output: the unnormalized residual at 384
    tokens (16 prompts x 24), no residual at 4608 (192 x 24; at 2048 tokens its p-values were ~5e-5, above the
    1e-6 / 6 threshold)."""
    target, draft = pair
    monkeypatch.setattr(hf.loop, "verify_logits", _broken_verifier(kind))
    runs = _runs(target, draft, prompts=prompts, new=24, seed0=1000)
    res = audit_model_output(target, [(p, r.tokens) for p, r in runs], **PARAMS, seed=2)
    assert not res.passed, res.verdict


def test_bad_records(pair, tmp_path):
    target, _ = pair
    with pytest.raises(InvalidInput, match=r"records line 2: token_ids\[1\] = 8 is outside the target's vocabulary"):
        audit_model_output(target, [([1, 2], [3]), ([1], [2, 8])])
    with pytest.raises(InvalidInput, match="max_position_embeddings 128"):
        audit_model_output(target, [([1] * 100, [2] * 40)])
    recs = [r for r in read_token_file(write_token_file(tmp_path / "a.jsonl", [([1, 2], [3]), ([4], [5])]))]
    check_prompts_match(recs, [[1, 2], [4]], "a.jsonl", "p.txt")
    with pytest.raises(InvalidInput, match=r"a.jsonl line 2: prompt_token_ids .* first difference at index 0: 4 vs 6"):
        check_prompts_match(recs, [[1, 2], [6]], "a.jsonl", "p.txt")
    with pytest.raises(InvalidInput, match="holds 1 prompts but a.jsonl holds 2"):
        check_prompts_match(recs, [[1, 2]], "a.jsonl", "p.txt")
    assert json.loads((tmp_path / "a.jsonl").read_text().splitlines()[0]) == {"prompt_token_ids": [1, 2],
                                                                              "token_ids": [3]}
