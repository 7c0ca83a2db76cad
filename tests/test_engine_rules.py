"""Issue #21, item 3: the engines' proposer rules everywhere.

A. The n-gram occurrence rule and named presets (``ngram.vllm``, ``ngram.hf``, fastspec's ``ngram``) from the
   ``--draft`` grammar and ``simulate(drafts=...)``; vLLM's rule against a transcription of vLLM's own scan; the
   simulator's n-gram replay with the vllm preset against a slow reference replay with earliest occurrences.
B. Argmax drafts (top-1 of the draft, judged with a one-hot q: vLLM V1) as a draft mode of ``simulate``: exact DP,
   Bernoulli and token replays, w candidates, sparse bounds, temperature 0 = greedy, against NumPy and Fraction
   references.
C. ``--candidate-sampling deterministic`` at one candidate is no longer silently the sampled-draft answer.
"""
from __future__ import annotations

import json
import os
from fractions import Fraction

import numpy as np
import pytest
from typer.testing import CliRunner

import naive
from fastspec import save_dump
from fastspec.errors import InvalidInput
from fastspec.ngram import PRESETS, NgramProposer, ngram_name, parse_ngram_draft, preset, propose
from fastspec.params import SamplingParams
from fastspec.simulation import SimulateConfig, simulate
from fastspec.simulation.ngram import ngram_replay
from fastspec_cli.main import app
from test_simulate_ngram import _dump

runner = CliRunner()
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                       "smollm2_exit_top64.npz")


def assert_one_line_exit_2(res, *needles):
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastspec: error:"), res.stderr
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]


# ============================================================================ A. n-gram rules and presets
def _vllm_propose(origin_tokens, min_ngram, max_ngram, k):
    """vLLM's ``_find_longest_matched_ngram_and_propose_tokens`` (vllm/v1/spec_decode/ngram_proposer.py), transcribed
    without its max_model_len cut: a KMP scan of the reversed context whose last hit (``>=``) is the earliest
    occurrence of the longest match."""
    total = origin_tokens.shape[0]
    if total < min_ngram:
        return []
    tokens = origin_tokens[::-1]
    lps = np.zeros(max_ngram, dtype=np.int32)
    longest = position = prev = 0
    i = 1
    while i < total:
        if tokens[prev] == tokens[i]:
            prev += 1
            if prev >= longest:
                longest, position = prev, i
            if i < max_ngram:
                lps[i] = prev
            if prev == max_ngram:
                prev = lps[max_ngram - 1]
            i += 1
        elif prev != 0:
            prev = lps[prev - 1]
        else:
            i += 1
    if longest < min_ngram:
        return []
    start = total - 1 - position + longest
    return origin_tokens[start:start + min(k, total - start)].tolist()


def test_presets():
    assert preset("fastspec", k=4) == NgramProposer(4)
    v = preset("vllm", k=4)
    assert (v.min_n, v.max_n, v.occurrence, v.preset) == (5, 5, "earliest", "vllm")
    assert (preset("vllm", 3, k=2).min_n, preset("vllm", 3, k=2).max_n) == (3, 3)  # one bound copies the other
    assert (preset("vllm", max_n=4, k=2).min_n, preset("vllm", max_n=4, k=2).max_n) == (4, 4)
    assert (preset("vllm", 2, 6, k=2).min_n, preset("vllm", 2, 6, k=2).max_n) == (2, 6)
    h = preset("hf", k=10)
    assert (h.min_n, h.max_n, h.occurrence, h.preset) == (1, 2, "earliest", "hf")
    assert preset("hf", max_n=4, k=3).max_n == 4
    with pytest.raises(InvalidInput, match="no minimum"):
        preset("hf", min_n=2, k=3)
    with pytest.raises(InvalidInput, match="unknown"):
        preset("eagle", k=3)
    with pytest.raises(InvalidInput, match="earliest"):
        NgramProposer(4, 1, 3, "latest", preset="vllm")
    assert set(PRESETS) == {"fastspec", "vllm", "hf"}
    # the label names the proposer; it does not change what it proposes, nor equality
    assert preset("hf", max_n=3, k=4) == preset("vllm", 1, 3, k=4) == NgramProposer(4, 1, 3, "earliest")
    assert preset("vllm", k=4).as_dict()["preset"] == "vllm" and "preset" not in NgramProposer(4).as_dict()
    assert NgramProposer.from_dict(preset("hf", k=4).as_dict()).preset == "hf"


def test_vllm_rule_on_hand_built_contexts():
    a = [1, 2, 3, 4, 5]
    ctx = np.array(a + [10] + a + [20] + a)  # the 5-gram suffix occurs at 0 and at 6
    assert preset("vllm", k=3).propose(ctx).tolist() == [10, 1, 2]  # earliest occurrence (vLLM)
    assert NgramProposer(3, 5, 5).propose(ctx).tolist() == [20, 1, 2]  # fastspec's rule: latest
    assert _vllm_propose(ctx, 5, 5, 3) == [10, 1, 2]
    ctx = np.array([7, 8, 9, 7, 8, 1, 8])  # 2-gram "7 8" absent at the end; 1-gram "8": at 1 and 4
    assert preset("vllm", 1, 2, k=2).propose(ctx).tolist() == [9, 7] == _vllm_propose(ctx, 1, 2, 2)
    assert NgramProposer(2, 1, 2).propose(ctx).tolist() == [1, 8]
    # the default bounds 5-5: nothing shorter counts
    assert preset("vllm", k=2).propose(np.array([1, 2, 3, 9, 1, 2, 3])).tolist() == []
    assert preset("hf", k=2).propose(np.array([4, 5, 6, 4, 5, 7, 4, 5])).tolist() == [6, 4]  # earliest "4 5"


def test_vllm_rule_equals_vllms_scan_on_random_contexts():
    rng = np.random.default_rng(21)
    differ = 0
    for _ in range(3000):
        V, L = int(rng.integers(2, 5)), int(rng.integers(1, 30))
        ctx = rng.integers(0, V, L)
        lo = int(rng.integers(1, 4))
        hi = int(rng.integers(lo, 6))
        k = int(rng.integers(1, 6))
        got = preset("vllm", lo, hi, k=k).propose(ctx).tolist()
        assert got == _vllm_propose(ctx, lo, hi, k) == naive.ngram_proposal(ctx, k, lo, hi, "earliest")
        differ += got != NgramProposer(k, lo, hi).propose(ctx).tolist()
    assert differ > 100  # the contexts tell the two rules apart


@pytest.mark.parametrize("spec, want, name", [
    ("ngram", NgramProposer(4), "ngram1-3"),
    ("ngram2-4", NgramProposer(4, 2, 4), "ngram2-4"),
    ("ngram:2-4", NgramProposer(4, 2, 4), "ngram2-4"),
    ("ngram[2-4]", NgramProposer(4, 2, 4), "ngram2-4"),
    ("ngram.fastspec", NgramProposer(4), "ngram1-3"),
    ("ngram.fastspec2-5", NgramProposer(4, 2, 5), "ngram2-5"),
    ("ngram.vllm", NgramProposer(4, 5, 5, "earliest"), "ngram.vllm5-5"),
    ("ngram.vllm3", NgramProposer(4, 3, 3, "earliest"), "ngram.vllm3-3"),
    ("ngram.vllm3-5", NgramProposer(4, 3, 5, "earliest"), "ngram.vllm3-5"),
    ("ngram.hf", NgramProposer(4, 1, 2, "earliest"), "ngram.hf1-2"),
    ("ngram.hf3", NgramProposer(4, 1, 3, "earliest"), "ngram.hf1-3"),
    ("ngram.hf1-3", NgramProposer(4, 1, 3, "earliest"), "ngram.hf1-3"),
])
def test_grammar_and_names(spec, want, name):
    p = parse_ngram_draft(spec, 4)
    assert p == want and ngram_name(p) == name
    back = parse_ngram_draft(name, 4)  # the name parses back to the same proposer, and keeps its rule
    assert back == p and ngram_name(back) == name
    from fastspec.io import check_draft_name

    assert check_draft_name(name) == name  # a valid draft name for dump and measure
    assert parse_ngram_draft(NgramProposer(9, 2, 3, "earliest"), 4) == NgramProposer(4, 2, 3, "earliest")
    assert ngram_name(NgramProposer(4, 2, 3, "earliest")) == "ngram.vllm2-3"


@pytest.mark.parametrize("spec, needle", [
    ("ngram@vllm", "ngram.vllm"),
    ("ngram.foo", "unknown n-gram rule 'foo'"),
    ("ngram.hf2-3", "no minimum"),
    ("ngram.vllm0", "[1, 1024]"),
    ("ngram.vllm3-1", "greater than"),
    ("ngram.fastspec3", "decimal digits"),
    ("ngram3", "decimal digits"),
    ("ngram.", "decimal digits"),
    ("ngram.VLLM", "decimal digits"),
    ("ngram.vllm²", "decimal digits"),
])
def test_bad_specs_are_one_line_errors(spec, needle):
    with pytest.raises(InvalidInput) as exc:
        parse_ngram_draft(spec, 4)
    assert needle in str(exc.value) and "\n" not in str(exc.value)
    res = runner.invoke(app, ["simulate", SHIPPED, "--k", "2", "--draft", spec, "--temperature", "0"])
    assert_one_line_exit_2(res, "--draft")


def _reference_replay(d, min_n, max_n, occurrence, k, temperature):
    """The n-gram replay spelled out: a distribution over step starts per sequence, the proposal from
    naive.ngram_proposal (the context as recorded), draft j accepted with p_{t+j}(x_j) (naive.probabilities)
    while the earlier ones were.  Returns (verify steps, plain steps, mean acceptance length)."""
    steps = plain = accepted = 0.0
    for n in range(d.N):
        L = int(d.lengths[n])
        start = np.zeros(L + 1)
        start[0] = 1.0
        probs = naive.probabilities(d.logits[n, :L].astype(np.float64), temperature=temperature)
        for t in range(L):
            w = start[t]
            if w == 0:
                continue
            ctx = list(d.prompt_tokens[n]) + list(d.tokens[n, :t])
            prop = naive.ngram_proposal(ctx, k, min_n, max_n, occurrence)
            dd = min(len(prop), k, L - 1 - t)
            if dd == 0:
                plain += w
                start[t + 1] += w
                continue
            steps += w
            alive = 1.0
            for a in range(dd + 1):  # a drafts accepted, then a rejection (or all accepted)
                stop = 1.0 - probs[t + a, prop[a]] if a < dd else 1.0
                accepted += w * alive * stop * a
                start[t + a + 1] += w * alive * stop
                if a < dd:
                    alive *= probs[t + a, prop[a]]
    return steps, plain, 1.0 + accepted / steps if steps > 0 else 1.0


@pytest.mark.parametrize("greedy, temperature", [(True, 0.0), (False, 1.0), (False, 0.7)])
@pytest.mark.parametrize("spec", ["ngram.vllm1-3", "ngram.vllm2", "ngram.vllm", "ngram.hf"])
def test_vllm_preset_replay_equals_a_slow_reference(greedy, temperature, spec):
    d = _dump(4, greedy=greedy)
    p = parse_ngram_draft(spec, 4)
    rows = ngram_replay(d, p, [1, 2, 4], SamplingParams(temperature=temperature))
    differs = False
    for r in rows:
        steps, plain, m = _reference_replay(d, p.min_n, p.max_n, "earliest", r["k"], temperature)
        assert r["verify_steps"] == pytest.approx(steps, rel=1e-12)
        assert r["plain_steps"] == pytest.approx(plain, rel=1e-12)
        assert r["mean_acceptance_length_exact"] == pytest.approx(m, rel=1e-12)
        latest = _reference_replay(d, p.min_n, p.max_n, "latest", r["k"], temperature)[2]
        differs |= abs(latest - m) > 1e-9
    if spec == "ngram.vllm1-3":
        assert differs  # the reference tells the rules apart on this dump


def test_simulate_reaches_the_rules(tmp_path):
    d = _dump(1)
    path = save_dump(str(tmp_path / "t.npz"), d.logits, None, tokens=d.tokens, lengths=d.lengths,
                     prompt_tokens=d.prompt_tokens, prompt_lengths=d.prompt_lengths, temperature=0.0)
    res = simulate(path, k=[2, 4], drafts=["ngram", "ngram.vllm1-3", preset("hf", max_n=3, k=1),
                                          NgramProposer(7, 2, 3)])
    assert res.config["drafts"] == ["ngram1-3", "ngram.vllm1-3", "ngram.hf1-3", "ngram2-3"]
    assert res.config["ngram"]["ngram.vllm1-3"]["occurrence"] == "earliest"
    assert res.config["ngram"]["ngram.hf1-3"]["preset"] == "hf"
    by = {(r.draft, r.k): r.mean_acceptance_length_exact for r in res.results}
    # vllm1-3 and hf1-3 are one rule with the same bounds: the same figures under two names
    assert by[("ngram.vllm1-3", 4)] == by[("ngram.hf1-3", 4)]
    want = ngram_replay(d, NgramProposer(4, 1, 3, "earliest"), [4], SamplingParams(temperature=0.0))[0]
    assert by[("ngram.vllm1-3", 4)] == pytest.approx(want["mean_acceptance_length_exact"], rel=1e-12)
    r = runner.invoke(app, ["simulate", path, "--k", "2", "--draft", "ngram.vllm", "--draft", "ngram.hf", "--json"])
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    assert [x["draft"] for x in out["results"]] == ["ngram.vllm5-5", "ngram.hf1-2"]
    assert out["config"]["ngram"]["ngram.vllm5-5"]["min_n"] == 5


def test_measure_and_dump_names_say_the_rule():
    hf = pytest.importorskip("fastspec.hf")
    specs = hf.parse_draft_specs(["ngram.vllm", "ngram.hf3", "ngram", "look=ngram.vllm2-3"])
    assert specs == {"ngram.vllm5-5": "ngram.vllm", "ngram.hf1-3": "ngram.hf3", "ngram": "ngram",
                     "look": "ngram.vllm2-3"}
    assert hf.parse_ngram_spec("ngram.vllm") == NgramProposer(hf.args.MAX_K, 5, 5, "earliest")
    assert hf.loop.as_ngram("ngram.hf").occurrence == "earliest"
    with pytest.raises(InvalidInput, match="ngram.vllm"):
        hf.parse_draft_specs(["ngram@vllm"])


@pytest.mark.parametrize("command", ["measure", "dump"])
def test_measure_and_dump_refuse_a_bad_rule_in_one_line(tmp_path, command):
    pytest.importorskip("torch")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    args = [command, "--target", str(tmp_path / "nothing"), "--draft", "ngram.eagle", "--prompts", str(prompts)]
    args += ["--out", str(tmp_path / "o.npz")] if command == "dump" else ["--k", "2"]
    assert_one_line_exit_2(runner.invoke(app, args), "--draft", "ngram.eagle")


# ============================================================================ B. argmax drafts
def _model_dump(tmp_path, seed=0, N=4, T=24, V=9, temperature=1.0, name="m.npz", ties=False):
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((N, T, V)) * 2
    q = t + rng.standard_normal((N, T, V)) * 1.5
    if ties:  # exact ties at the draft's maximum: the argmax is the lowest id among them
        top = q.max(-1, keepdims=True)
        q[..., 0] = np.maximum(q[..., 0], top[..., 0])
        q[..., 3] = np.maximum(q[..., 3], top[..., 0])
    t, q = t.astype(np.float32), q.astype(np.float32)
    lengths = np.array([T, T - 3, T, 5][:N])
    path = save_dump(str(tmp_path / name), t, {"dr": q}, tokens=rng.integers(0, V, (N, T)), lengths=lengths,
                     temperature=temperature)
    return path, t.astype(np.float64), q.astype(np.float64), lengths


def _argmax_alpha(t, q, lengths, **sampling):
    """p_t(argmax q_t) by brute force (naive processing; np.argmax: the lowest id among ties), 0 at padding."""
    p = naive.probabilities(t, **sampling)
    x = np.argmax(q, axis=-1)
    a = np.take_along_axis(p, x[..., None], -1)[..., 0]
    return np.where(np.arange(t.shape[1])[None, :] < lengths[:, None], a, 0.0)


def _sampled_alpha(t, q, lengths, **sampling):
    a = np.minimum(naive.probabilities(t, **sampling), naive.probabilities(q, **sampling)).sum(-1)
    return np.where(np.arange(t.shape[1])[None, :] < lengths[:, None], a, 0.0)


def _reference_dp(alpha, lengths, k):
    """Tokens per verify step from per-position acceptance alpha [N, T] by a start-position distribution."""
    steps = acc = 0.0
    for n in range(alpha.shape[0]):
        L = int(lengths[n])
        start = np.zeros(L + 1)
        start[0] = 1.0
        for t in range(L):
            w, dd = start[t], min(k, L - 1 - t)
            if w == 0:
                continue
            if dd <= 0:
                start[t + 1] += w
                continue
            steps += w
            alive = 1.0
            for a in range(dd + 1):
                stop = 1.0 - alpha[n, t + a] if a < dd else 1.0
                acc += w * alive * stop * a
                start[t + a + 1] += w * alive * stop
                if a < dd:
                    alive *= alpha[n, t + a]
    return 1.0 + acc / steps


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_k=4),
                                      dict(temperature=1.3, top_p=0.8, min_p=0.05)])
@pytest.mark.parametrize("ties", [False, True])
def test_argmax_drafts_against_a_numpy_reference(tmp_path, sampling, ties):
    path, t, q, lengths = _model_dump(tmp_path, ties=ties)
    alpha = _argmax_alpha(t, q, lengths, **sampling)
    assert abs(alpha.sum() - _sampled_alpha(t, q, lengths, **sampling).sum()) > 0.1  # the two modes differ here
    valid = np.arange(t.shape[1])[None, :] < lengths[:, None]
    res = simulate(path, k=[1, 3], draft_sampling="argmax", seed=2, **sampling)
    assert res.config["draft_sampling"] == "argmax"
    for r in res.results:
        assert r.draft_sampling == "argmax" and r.kind == "model"
        assert r.alpha == pytest.approx(alpha[valid].mean(), abs=1e-12)
        assert r.mean_acceptance_length_exact == pytest.approx(_reference_dp(alpha, lengths, r.k), rel=1e-12)
        assert r.mc_agrees_with_exact is True
    assert any("argmax drafts" in a for a in res.assumptions)


def test_argmax_acceptance_is_exactly_the_one_hot_verification():
    """Fractions: verifying the draft's argmax against a one-hot q accepts with p(argmax q), the target mass of the
    top-1 candidate (fastspec.exact), and differs from the sampled draft's sum_v min(p, q)."""
    from fastspec.candidates import candidate_acceptance
    from fastspec.exact import candidate_step
    from fastspec.exact.core import verify_step

    rng = np.random.default_rng(5)
    for _ in range(20):
        p = rng.dirichlet(np.ones(6))
        q = rng.dirichlet(np.ones(6) * 0.5)
        x = int(np.argmax(q))
        pf = [Fraction(v) for v in p]
        one_hot = [Fraction(int(i == x)) for i in range(6)]
        pf[-1] = 1 - sum(pf[:-1])  # exactly normalized
        step = verify_step(pf, one_hot)
        assert step.acceptance == pf[x] and step.output == tuple(pf)  # lossless
        qf = [Fraction(v) for v in q]
        qf[-1] = 1 - sum(qf[:-1])
        assert candidate_step(pf, qf, 1, candidate_sampling="deterministic").acceptance == pf[x]
        got = candidate_acceptance(np.array([[float(v) for v in pf]]), np.array([[float(v) for v in qf]]), 1,
                                   candidate_sampling="deterministic")
        assert abs(Fraction(float(got[0])) - pf[x]) < Fraction(1, 10**12)
        assert verify_step(pf, qf).acceptance != pf[x]


def test_argmax_token_mode_drafts_the_argmax(tmp_path):
    path, t, q, lengths = _model_dump(tmp_path, seed=3)
    alpha = _argmax_alpha(t, q, lengths)
    res = simulate(path, k=[2], draft_sampling="argmax", mode="token", trials=40, seed=1)
    r = res.results[0]
    assert r.token_check["passed"] and r.mc_agrees_with_exact is True
    valid = np.arange(t.shape[1])[None, :] < lengths[:, None]
    assert r.token_check["expected_frequency"] != pytest.approx(_sampled_alpha(t, q, lengths)[valid].mean(), abs=0.02)
    assert r.mean_acceptance_length_exact == pytest.approx(_reference_dp(alpha, lengths, 2), rel=1e-12)
    # a replay that judged the argmax against the sampled q would accept min(1, p/q) instead: the check sees it
    sampled = simulate(path, k=[2], mode="token", trials=40, seed=1).results[0]
    assert abs(sampled.mean_acceptance_length - r.mean_acceptance_length) > 0.1


@pytest.mark.parametrize("mode", ["bernoulli", "token"])
def test_argmax_at_temperature_0_is_greedy(tmp_path, mode):
    path, *_ = _model_dump(tmp_path, seed=4)
    a = simulate(path, k=[1, 3], temperature=0.0, draft_sampling="argmax", mode=mode, trials=8).as_dict()
    b = simulate(path, k=[1, 3], temperature=0.0, mode=mode, trials=8).as_dict()
    for x, y in zip(a["results"], b["results"], strict=True):
        assert (x["draft_sampling"], y["draft_sampling"]) == ("argmax", "sampled")
        for f in ("alpha", "mean_acceptance_length_exact", "mean_acceptance_length", "per_position_acceptance"):
            assert x[f] == pytest.approx(y[f], abs=1e-12)


def test_argmax_candidates_are_the_deterministic_candidates(tmp_path):
    path, t, q, lengths = _model_dump(tmp_path, seed=6)
    a = simulate(path, k=[2], candidates=[1, 2, 3], draft_sampling="argmax").as_dict()
    b = simulate(path, k=[2], candidates=[1, 2, 3], candidate_sampling="deterministic").as_dict()
    assert a["results"] == b["results"] and a["config"]["candidate_sampling"] == "deterministic"
    p = naive.probabilities(t)
    valid = np.arange(t.shape[1])[None, :] < lengths[:, None]
    for row in a["results"]:
        w = row["candidates"]
        top = np.argsort(-q, axis=-1, kind="stable")[..., :w]
        beta = np.take_along_axis(p, top, -1).sum(-1)
        assert row["alpha"] == pytest.approx(beta[valid].mean(), abs=1e-12)
        assert row["draft_sampling"] == "argmax"


def _sparse_of(tmp_path, t, q, lengths, top, name="s.npz", temperature=1.0):
    def lists(x):
        lp = x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(-1, keepdims=True)
        ids = np.argsort(-lp, axis=-1, kind="stable")[..., :top].astype(np.int32)
        return ids, np.take_along_axis(lp, ids, -1).astype(np.float32)

    return save_dump(str(tmp_path / name), lists(t), {"dr": lists(q)}, lengths=lengths, vocab_size=t.shape[-1],
                     temperature=temperature)


@pytest.mark.parametrize("top", [1, 2, 4, 9])
def test_argmax_on_sparse_dumps_gives_true_bounds(tmp_path, top):
    path, t, q, lengths = _model_dump(tmp_path, seed=7)
    sparse = _sparse_of(tmp_path, t, q, lengths, top)
    dense = simulate(path, k=[1, 3], draft_sampling="argmax")
    sp = simulate(sparse, k=[1, 3], draft_sampling="argmax")
    alpha = _argmax_alpha(t, q, lengths)
    valid = np.arange(t.shape[1])[None, :] < lengths[:, None]
    for x, y in zip(dense.results, sp.results, strict=True):
        assert y.kind == "bounds" and y.draft_sampling == "argmax"
        assert y.alpha_lower - 1e-6 <= alpha[valid].mean() <= y.alpha_upper + 1e-6
        assert y.mean_acceptance_length_lower - 1e-6 <= x.mean_acceptance_length_exact
        assert x.mean_acceptance_length_exact <= y.mean_acceptance_length_upper + 1e-6
        if top == 9:  # the whole vocabulary listed: exact
            assert y.alpha_upper - y.alpha_lower < 1e-6
    # at temperature 0 the sparse bounds are exact and equal greedy's
    g = simulate(sparse, k=[2], draft_sampling="argmax", temperature=0.0).results[0]
    h = simulate(sparse, k=[2], temperature=0.0).results[0]
    assert (g.mean_acceptance_length_lower, g.mean_acceptance_length_upper) == \
        (h.mean_acceptance_length_lower, h.mean_acceptance_length_upper)


def test_argmax_bounds_rules():
    from fastspec.simulation.argmax import argmax_bounds

    ti = np.array([[2, 0], [2, 0], [2, 0]])
    tl = np.log(np.array([[0.5, 0.3], [0.5, 0.3], [0.5, 0.3]]))
    di = np.array([[0, 2], [4, 2], [3, 1]])
    dl = np.log(np.array([[0.6, 0.2], [0.6, 0.2], [0.4, 0.4]]))
    lo, hi = argmax_bounds(ti, tl, di, dl, vocab_size=6)
    assert lo[0] == pytest.approx(0.3) and hi[0] == pytest.approx(0.3)  # listed in the target's list: exact
    assert lo[1] == 0.0 and hi[1] == pytest.approx(0.2)  # unlisted: [0, min(0.3 smallest listed, 0.2 unlisted)]
    assert (lo[2], hi[2]) == (0.0, 1.0)  # every listed draft entry tied: an unlisted lower id may tie too


# ============================================================================ C. no silent fallback
def test_deterministic_candidate_sampling_at_one_candidate_is_honoured(tmp_path):
    """Before: --candidates 1 --candidate-sampling deterministic answered the sampled draft's alpha."""
    path, t, q, lengths = _model_dump(tmp_path, seed=8)
    valid = np.arange(t.shape[1])[None, :] < lengths[:, None]
    want, wrong = _argmax_alpha(t, q, lengths)[valid].mean(), _sampled_alpha(t, q, lengths)[valid].mean()
    assert abs(want - wrong) > 0.05
    r = runner.invoke(app, ["simulate", path, "--k", "2", "--candidates", "1", "--candidate-sampling",
                            "deterministic", "--json"])
    assert r.exit_code == 0, r.stderr
    row = json.loads(r.stdout)["results"][0]
    assert row["alpha"] == pytest.approx(want, abs=1e-9) and row["draft_sampling"] == "argmax"
    assert row["mean_acceptance_length_exact"] == pytest.approx(_reference_dp(_argmax_alpha(t, q, lengths),
                                                                              lengths, 2), rel=1e-12)
    r = runner.invoke(app, ["simulate", path, "--k", "2", "--draft-sampling", "argmax", "--json"])
    assert json.loads(r.stdout)["results"][0]["alpha"] == pytest.approx(want, abs=1e-9)
    default = json.loads(runner.invoke(app, ["simulate", path, "--k", "2", "--json"]).stdout)
    assert default["results"][0]["alpha"] == pytest.approx(wrong, abs=1e-9)
    assert default["results"][0]["draft_sampling"] == "sampled" and default["config"]["draft_sampling"] == "sampled"


@pytest.mark.parametrize("flags, needles", [
    (["--draft-sampling", "argmax", "--verify", "block"], ["--verify block", "argmax"]),
    (["--candidate-sampling", "deterministic", "--verify", "token,block"], ["--verify block"]),
    (["--draft-sampling", "top1"], ["--draft-sampling", "top1"]),
    (["--draft-sampling", "argmax", "--candidate-sampling", "iid"], ["contradict"]),
    (["--draft-sampling", "sampled", "--candidate-sampling", "deterministic"], ["contradict"]),
])
def test_flags_that_cannot_apply_are_refused(tmp_path, flags, needles):
    path, *_ = _model_dump(tmp_path, seed=9)
    assert_one_line_exit_2(runner.invoke(app, ["simulate", path, "--k", "2", *flags]), *needles)


def test_argmax_with_an_ngram_draft(tmp_path):
    d = _dump(3)
    only = save_dump(str(tmp_path / "t.npz"), d.logits, None, tokens=d.tokens, lengths=d.lengths,
                     prompt_tokens=d.prompt_tokens, prompt_lengths=d.prompt_lengths, temperature=1.0)
    assert_one_line_exit_2(runner.invoke(app, ["simulate", only, "--k", "2", "--draft-sampling", "argmax"]),
                     "n-gram draft ngram1-3")
    assert_one_line_exit_2(runner.invoke(app, ["simulate", only, "--k", "2", "--candidate-sampling", "deterministic"]),
                     "n-gram draft ngram1-3")
    both = save_dump(str(tmp_path / "b.npz"), d.logits, {"near": d.logits + 0.3}, tokens=d.tokens,
                     lengths=d.lengths, prompt_tokens=d.prompt_tokens, prompt_lengths=d.prompt_lengths,
                     temperature=1.0)
    res = simulate(both, k=2, drafts=["near", "ngram.vllm1-3"], draft_sampling="argmax")
    kinds = {r.draft: (r.kind, r.draft_sampling) for r in res.results}
    assert kinds == {"near": ("model", "argmax"), "ngram.vllm1-3": ("ngram", None)}
    assert any("argmax drafts apply to the model drafts only" in w for w in res.warnings)


def test_library_config_checks():
    assert SimulateConfig().draft_mode == "sampled" and SimulateConfig().candidate_mode == "iid"
    c = SimulateConfig(candidate_sampling="deterministic")
    assert (c.draft_mode, c.candidate_mode) == ("argmax", "deterministic")
    c = SimulateConfig(draft_sampling="argmax")
    assert (c.draft_mode, c.candidate_mode) == ("argmax", "deterministic")
    for bad, pat in [(dict(draft_sampling="argmax", verify="block"), "block verification"),
                     (dict(draft_sampling="argmax", candidate_sampling="iid"), "contradict"),
                     (dict(draft_sampling="greedy"), "unknown")]:
        with pytest.raises(InvalidInput, match=pat):
            SimulateConfig(**bad)
    assert propose([1, 2, 1], 2, occurrence="earliest").tolist() == [2, 1]


@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_argmax_on_shards_equals_the_merged_dump(tmp_path, kind):
    import shardutil

    merged, sdir, _ = shardutil.write(tmp_path, shardutil.make_data(kind=kind))
    a = simulate(merged, k=[1, 2], draft_sampling="argmax", candidates=[1, 2] if kind == "dense" else 1).as_dict()
    b = simulate(sdir, k=[1, 2], draft_sampling="argmax", candidates=[1, 2] if kind == "dense" else 1).as_dict()
    for x, y in zip(a["results"], b["results"], strict=True):
        assert x["draft_sampling"] == y["draft_sampling"] == "argmax"
        for f in ("alpha", "mean_acceptance_length_exact", "alpha_lower", "alpha_upper",
                  "mean_acceptance_length_lower", "mean_acceptance_length_upper"):
            assert (x[f] is None and y[f] is None) or x[f] == pytest.approx(y[f], rel=1e-12)
