"""n-gram (prompt-lookup) drafts in the real loop, the interleaved wall-clock measurement, and ``fastspec measure``
with n-gram drafts and a cost table (tiny random Llamas built from a config, no download).

Which claim each test checks:
* same distribution -- the first two tokens of the n-gram loop follow the target's exact law (calibrated
  chi-square; a loop that resamples from p instead of the residual after a rejection fails the same test);
* same text -- greedy n-gram speculative output equals plain greedy output token for token; the cached loop (cache
  cropped to the accepted prefix) equals the recompute-from-scratch loop; every step proposes exactly
  ``fastspec.ngram.propose`` of prompt + generated text;
* the prediction machinery -- the n-gram DP against brute-force enumeration, and equal to the real loop's counts
  under greedy decoding (where the replay is exact); dump and in-memory sequences give the same prediction;
* the clock machinery -- interleaving (round-robin, rotating start), fixed-length runs, the speed-up arithmetic
  from the per-prompt totals; never a timing threshold;
* bad input -- a draft specification that cannot parse: one line naming --draft, exit 2.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from hf_models import V, save_model as _save_model, tiny, torch
from naive import chi2_pooled

import fastspec
from fastspec import hf
from fastspec.errors import InvalidInput
from fastspec.hf import prediction as P
from fastspec.ngram import NgramProposer, propose

stats = pytest.importorskip("scipy.stats")

pytestmark = pytest.mark.hf

# ends with the bigram (6, 3) seen at the start: the first step proposes [4, 5], each with target probability
# about 0.4 at temperature 0.9 / top-k 6 (checked in the tests that rely on it)
PROMPT = [6, 3, 4, 5, 6, 3]
PARAMS = dict(temperature=0.9, top_k=6)


@pytest.fixture(scope="module")
def target():
    return tiny(0)


def _probs(model, ids, **params):
    with torch.no_grad():
        lg = model(torch.tensor([ids])).logits[0, -1].float().numpy()
    return fastspec.probabilities(lg[None], **params)[0]


def _two_token_law(model):
    p1 = _probs(model, PROMPT, **PARAMS)
    joint = np.zeros((V, V))
    for a in range(V):
        if p1[a] > 0:
            joint[a] = p1[a] * _probs(model, PROMPT + [a], **PARAMS)
    return joint


def _sample_pairs(model, n, seed0):
    counts = np.zeros((V, V), np.int64)
    for s in range(n):
        r = hf.speculative_generate(model, "ngram", PROMPT, k=2, seed=seed0 + s, max_new_tokens=3, **PARAMS)
        counts[r.tokens[0], r.tokens[1]] += 1
    return counts


def test_prompt_calibration(target):
    """The statistical tests below have power only if the first step really drafts: two proposed tokens, each
    accepted with a probability well inside (0, 1)."""
    prop = propose(PROMPT, 2)
    assert prop.tolist() == [4, 5]
    assert 0.2 < _probs(target, PROMPT, **PARAMS)[4] < 0.8
    assert 0.2 < _probs(target, PROMPT + [4], **PARAMS)[5] < 0.8


@pytest.mark.statistical
def test_ngram_loop_first_two_tokens_follow_target_law(target):
    """Same distribution: the first two tokens of the n-gram loop (k = 2: one verify step of the proposal
    [4, 5], or a rejection and a new step with a new proposal) follow the target's exact two-token law;
    chi-square at false-alarm 1e-6."""
    joint = _two_token_law(target)
    n = 1500
    stat, df = chi2_pooled(_sample_pairs(target, n, 0), joint, n)
    assert stat < stats.chi2.isf(1e-6, df), (stat, df)


@pytest.mark.statistical
def test_broken_ngram_loop_fails_the_same_test(target, monkeypatch):
    """The same test has power: after a rejection, a loop that draws the recovered token from p (not from the
    residual p without the rejected one-hot proposal) emits the proposed token too often, and is rejected."""
    real = fastspec.verify_logits
    rng = np.random.default_rng(123)

    def broken(tl, dl, toks, **kw):
        res = real(tl, dl, toks, **kw)
        n = int(res.num_accepted[0])
        if dl is None and n < toks.shape[1]:
            p = fastspec.probabilities(tl[0, n][None], temperature=kw["temperature"], top_k=kw["top_k"])[0]
            res.tokens[0, n] = rng.choice(len(p), p=p)
        return res

    monkeypatch.setattr(hf.loop, "verify_logits", broken)
    joint = _two_token_law(target)
    n = 500
    stat, df = chi2_pooled(_sample_pairs(target, n, 10_000), joint, n)
    assert stat > stats.chi2.isf(1e-6, df), (stat, df)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_ngram_equals_greedy_decoding(target, k):
    """Same text: at temperature 0 the n-gram loop's output equals plain greedy decoding token for token, and it
    really speculates (accepted drafts) and really meets steps without a match (plain steps counted apart)."""
    ref = hf.generate(target, PROMPT, temperature=0, max_new_tokens=40)
    for spec in ("ngram", NgramProposer(7, 2, 3), "ngram1-1"):
        r = hf.speculative_generate(target, spec, PROMPT, k=k, temperature=0, max_new_tokens=40)
        np.testing.assert_array_equal(r.tokens, ref)
        assert r.emitted + r.plain_steps == len(ref)
        assert r.verify_steps == len(r.accepted_per_step) and r.accepted == r.accepted_per_step.sum()
        assert r.empty_steps <= r.plain_steps
    r = hf.speculative_generate(target, "ngram", PROMPT, k=k, temperature=0, max_new_tokens=40)
    assert r.accepted > 0 and r.verify_steps > 0


def test_ngram_cache_rollback_matches_recompute_and_proposals(target):
    """Rollback: the cached n-gram loop (target cache cropped to the accepted prefix) gives, under one seed, the
    drafts, emitted tokens and (to float tolerance) target logits of a loop that recomputes every forward from
    scratch; every step's drafts are exactly fastspec.ngram.propose of prompt + generated text, trimmed to k
    and to the budget; rejections happen (the crop is exercised)."""
    for k in (2, 4):
        a = hf.speculative_generate(target, "ngram:1-2", PROMPT, k=k, seed=7, max_new_tokens=40, return_trace=True)
        b = hf.speculative_generate(target, "ngram:1-2", PROMPT, k=k, seed=7, max_new_tokens=40, return_trace=True,
                                    use_cache=False)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert len(a.tokens) == 40 and len(a.trace) == len(b.trace)
        context = list(PROMPT)
        rejected = 0
        for sa, sb in zip(a.trace, b.trace, strict=True):
            assert sa["drafts"] == sb["drafts"] and sa["emitted"] == sb["emitted"]
            assert sa["draft_logits"] is None
            np.testing.assert_allclose(sa["target_logits"], sb["target_logits"], atol=1e-4)
            left = 40 - (len(context) - len(PROMPT)) - 1
            expected = propose(context, min(k, left), min_n=1, max_n=2).tolist() if left > 0 else []
            assert sa["drafts"] == expected
            rejected += 0 < len(sa["emitted"]) <= len(sa["drafts"])
            context += sa["emitted"]
        assert context[len(PROMPT):] == a.tokens.tolist()
        assert rejected >= 2


def test_ngram_eos_and_budget(target):
    r = hf.speculative_generate(target, "ngram", PROMPT, k=4, seed=3, max_new_tokens=40, eos_token_id=4)
    toks = list(r.tokens)
    assert 4 not in toks[:-1] and (toks[-1] == 4 or len(toks) == 40)
    r = hf.speculative_generate(target, "ngram", PROMPT, k=3, seed=3, max_new_tokens=1)
    assert len(r.tokens) == 1 and r.verify_steps == 0 and r.plain_steps == 1 and r.empty_steps == 0


def test_draft_specs():
    """The specifications the loop and the command line take (parser: fastspec.hf.parse_ngram_spec), the names a
    bare specification gets, and bad ones."""
    p = hf.parse_ngram_spec("ngram")
    assert (p.min_n, p.max_n, p.occurrence) == (1, 3, "latest")
    assert (hf.parse_ngram_spec("ngram:2-4").min_n, hf.parse_ngram_spec("ngram:2-4").max_n) == (2, 4)
    assert (hf.parse_ngram_spec("ngram2-4").min_n, hf.parse_ngram_spec("ngram2-4").max_n) == (2, 4)
    assert hf.parse_ngram_spec("exit3") is None and hf.parse_ngram_spec("m.gguf") is None
    for bad in ("ngram:3-1", "ngram:x", "ngram:0-2", "ngram5", "ngram:1-2-3", "ngramx-y"):
        with pytest.raises(InvalidInput):
            hf.parse_ngram_spec(bad)
        with pytest.raises(InvalidInput, match=f"draft {bad!r}"):  # the message names the specification
            hf.parse_draft_specs([bad])
    assert hf.parse_draft_specs(["ngram", "ngram:1-2", "ngram2-4", "look=ngram3-3", "exit1"]) == {
        "ngram": "ngram", "ngram1-2": "ngram:1-2", "ngram2-4": "ngram2-4", "look": "ngram3-3", "exit1": "exit1"}
    with pytest.raises(InvalidInput, match="ngram"):
        hf.parse_draft_specs(["ngram:4-2"])
    q = hf.loop.as_ngram("ngram:2-4")
    assert (q.min_n, q.max_n, q.occurrence) == (2, 4, "latest")
    assert hf.loop.as_ngram(NgramProposer(3)) == NgramProposer(3)
    with pytest.raises(InvalidInput, match="not a model nor an n-gram"):
        hf.loop.as_ngram("exit3")
    with pytest.raises(InvalidInput, match="ngram"):
        hf.speculative_generate(tiny(0), "ngram:5-2", PROMPT, k=2)


# ------------------------------------------------------------------------------- prediction of n-gram drafts

@pytest.mark.parametrize("spec", ["ngram", "ngram:2-3"])
def test_greedy_ngram_prediction_is_exact(target, tmp_path, spec):
    """Simulator against the real loop: under greedy decoding the replay of the n-gram proposer along a
    target-only dump (float32 rows, every row to the budget) is exact -- the prediction gives the real loop's
    tokens per verify step, plain steps and share of steps that accepted every draft."""
    prompts = [PROMPT, [1, 2, 3, 1, 2], [5, 5, 2, 7]]
    n, ks = 30, [1, 2, 4]
    path = hf.dump_logits(tmp_path / "g", target, {}, prompts, max_new_tokens=n, temperature=0, ignore_eos=True,
                          dtype="float32", costs=False)
    pred = P.predict(path, [], ks, ngram={"ng": hf.loop.as_ngram(spec)}, costs=False)
    for k in ks:
        runs = [hf.speculative_generate(target, spec, p, k=k, temperature=0, max_new_tokens=n, return_trace=True)
                for p in prompts]
        row = pred.row("ng", k)
        steps = sum(r.verify_steps for r in runs)
        assert pred.figures("ng", k)["mean_acceptance_length_exact"] == pytest.approx(
            sum(r.emitted for r in runs) / steps)
        assert row.plain_steps == pytest.approx(sum(r.plain_steps for r in runs))
        full = sum(len(st["emitted"]) == len(st["drafts"]) + 1 for r in runs for st in r.trace if st["drafts"])
        assert row.p_all_accepted == pytest.approx(full / steps)
        assert pred.over_prompts[("ng", k)][0] == pytest.approx(sum(r.emitted for r in runs) / steps)
    assert pred.names == {"ng": "ngram1-3" if spec == "ngram" else "ngram2-3"}


def test_ngram_prediction_priced_by_its_own_entry(target, tmp_path):
    """A cost table keyed by the measured draft's name (``look``) prices the n-gram row simulate names
    ``ngram2-3``: the prediction has a speed-up with an interval."""
    from fastspec.costs import CostTable

    path = hf.dump_logits(tmp_path / "c", target, {}, [PROMPT, [1, 2, 3, 1, 2]], max_new_tokens=12, **PARAMS,
                          costs=False)
    table = CostTable.from_dict({"target": {"forward_s": {str(i): 0.01 + 0.001 * i for i in range(1, 4)},
                                            "forward_s_se": {"1": 0.0002}},
                                 "drafts": {"look": {"forward_s": {"1": 0.00001}, "one_call_per_step": True}},
                                 "overhead_s": {"0": 0.0002, "1": 0.0003, "2": 0.0004}})
    pred = P.predict(path, [], [2], ngram={"look": hf.loop.as_ngram("ngram:2-3")}, costs=table)
    sp = pred.speedup("look", 2)
    assert sp is not None and sp["ci95"][0] < sp["estimate"] < sp["ci95"][1]
    assert pred.figures("look", 2)["mean_acceptance_length_exact"] >= 1.0


# ------------------------------------------------------------------------------- the clock machinery

def test_measure_interleaves_and_times(target):
    """measure(): plain decoding, HF generate and every (draft, k) visited round-robin per prompt and repeat with
    a rotating start; fixed-length runs under ignore_eos; the speed-ups are the ratio-of-totals arithmetic of
    the per-prompt clocks; acceptance figures as before."""
    draft = tiny(1, layers=1)
    prompts = [PROMPT, [1, 2, 3, 1, 2], [5, 5, 2, 7]]
    m = hf.measure(target, {"small": draft, "ngram": "ngram"}, prompts, [1, 2], **PARAMS, max_new_tokens=6,
                   eos_token_id=[4], ignore_eos=True, repeats=2, hf_generate=True)
    configs = ["plain", "hf_generate", "small k=1", "small k=2", "ngram k=1", "ngram k=2"]
    assert len(m.schedule) == 3 * 2 * len(configs)
    for r, block in enumerate(itertools.zip_longest(*[iter(m.schedule)] * len(configs))):
        assert len({(i, rep) for i, rep, _ in block}) == 1
        order = [c for _, _, c in block]
        assert sorted(order) == sorted(configs)
        assert order[0] == configs[r % len(configs)]  # the start rotates
    assert [s[:2] for s in m.schedule[::len(configs)]] == [(i, rep) for i in range(3) for rep in range(2)]
    assert m.plain.tokens == [12, 12, 12] and m.hf_generate.tokens == [12, 12, 12]  # 2 repeats x 6 tokens
    assert m.hf_generate.decode_tokens == [10, 10, 10] and m.plain.decode_tokens == [12, 12, 12]
    assert [(r.draft, r.k) for r in m] == [("small", 1), ("small", 2), ("ngram", 1), ("ngram", 2)]
    for r in m:
        assert r.clock.tokens == [12, 12, 12] and r.runs == 6
        assert r.emitted + r.plain_steps == 36
        a, b = np.asarray(r.clock.decode_tokens, float), np.asarray(r.clock.decode_s)
        c, d = np.asarray(m.plain.decode_tokens, float), np.asarray(m.plain.decode_s)
        assert r.speedup["estimate"] == pytest.approx((a.sum() / b.sum()) / (c.sum() / d.sum()))
        assert r.speedup["estimate"] == pytest.approx(r.clock.tokens_per_s / m.plain.tokens_per_s)
        lo, hi = r.speedup["ci95"]
        assert lo < r.speedup["estimate"] < hi
        assert r.speedup_end_to_end["estimate"] == pytest.approx(
            r.clock.end_to_end_tokens_per_s / m.plain.end_to_end_tokens_per_s)
        assert r.time_s["decode"] == pytest.approx(r.time_s["total"] - r.time_s["prefill"])
    assert m.results[2].empty_steps >= 0 and m.settings["ignore_eos"] is True
    v = m.runner_vs_generate
    assert v["decode"]["estimate"] == pytest.approx(m.plain.tokens_per_s / m.hf_generate.tokens_per_s)
    json.dumps(m.as_dict())


def test_hf_generate_reference(target):
    """The Hugging Face reference makes exactly the budget under ignore-EOS, greedy equals fastspec's greedy
    runner, and its time to the first token is inside the call."""
    g = hf.hf_generate(target, PROMPT, temperature=0, max_new_tokens=9)
    np.testing.assert_array_equal(g.tokens, hf.generate(target, PROMPT, temperature=0, max_new_tokens=9))
    assert 0 < g.prefill_s <= g.total_s and g.decode_tokens == 8
    s = hf.hf_generate(target, PROMPT, **PARAMS, seed=1, max_new_tokens=7)
    assert len(s.tokens) == 7 and s.tokens.min() >= 0 and s.tokens.max() < V
    t = hf.timed_generate(target, PROMPT, **PARAMS, seed=1, max_new_tokens=7)
    assert len(t.tokens) == 7 and 0 <= t.prefill_s <= t.total_s and t.decode_tokens == 7


# ------------------------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ngram_models")
    t = _save_model(root / "target", 0)
    prompts = root / "prompts.txt"
    prompts.write_text("a b c a b\nd e f d e\nf a b c f a\n")
    costs = {"version": 1, "machine": "test", "threads": 1,
             "target": {"forward_s": {str(n): 0.010 + 0.001 * n for n in range(1, 6)},
                        "forward_s_se": {str(n): 0.0002 for n in range(1, 6)}},
             "drafts": {"ngram": {"forward_s": {"1": 0.00002}, "one_call_per_step": True},
                        "exit1": {"forward_s": {"1": 0.006, "2": 0.0065}}},
             "overhead_s": {"0": 0.0002, "1": 0.0004, "2": 0.0005, "4": 0.0006}}
    cpath = root / "costs.json"
    cpath.write_text(json.dumps(costs))
    return {"target": t, "prompts": str(prompts), "costs": str(cpath), "table": costs}


def _cli(args):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    return CliRunner().invoke(app, args)


def test_cli_bad_draft_spec_one_line(model_dir, tmp_path):
    base = ["--target", model_dir["target"], "--prompts", model_dir["prompts"]]
    for spec in ("ngram:3-1", "ngram:x", "look=ngram:0"):
        res = _cli(["measure", *base, "--draft", spec])
        assert res.exit_code == 2, res.output
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and "--draft" in lines[0] and "ngram" in lines[0], res.output
    res = _cli(["measure", *base, "--draft", "ngram", "--costs", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and "--costs" in res.output and len(res.output.strip().splitlines()) == 1


def test_cli_measure_clock_json(model_dir):
    """measure with a model draft and an n-gram draft, fixed-length runs and a cost table: every row has the
    measured speed-up (with its CI) next to the predicted one (with its relative error and z); plain decoding
    and Hugging Face generate are reported side by side."""
    res = _cli(["measure", "--target", model_dir["target"], "--draft", "exit1", "--draft", "ngram", "--prompts",
                model_dir["prompts"], "--k", "1,2", "--max-new-tokens", "8", "--ignore-eos", "--costs",
                model_dir["costs"], "--trials", "20", "--json", "--threads", "1"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert [(r["draft"], r["k"]) for r in obj["results"]] == [("exit1", 1), ("exit1", 2), ("ngram", 1), ("ngram", 2)]
    assert obj["config"]["ignore_eos"] is True and obj["costs"]["drafts"]["ngram"]["one_call_per_step"] is True
    assert obj["plain"]["tokens"] == 3 * 8 and obj["hf_generate"]["tokens"] == 3 * 8
    assert obj["runner_vs_generate"]["decode"]["estimate"] > 0
    for r in obj["results"]:
        assert r["measured"]["clock"]["tokens"] == 3 * 8
        sp = r["speedup"]
        assert sp["measured"]["ci95"][0] <= sp["measured"]["estimate"] <= sp["measured"]["ci95"][1]
        pred = sp["predicted"]
        assert pred["ci95"][0] <= pred["estimate"] <= pred["ci95"][1]
        assert sp["relative_error"] == pytest.approx(
            (pred["estimate"] - sp["measured"]["estimate"]) / sp["measured"]["estimate"])
        assert sp["z_difference"] is not None and sp["agrees"] in (True, False)
        assert r["predicted"]["mean_acceptance_length_exact"] is not None and r["relative_error"] is not None
    # the predicted speed-up of a row is the cost model applied to the DP (cross-checked in test_hf_prediction)
    assert len(obj["schedule"]) == 3 * 6


def test_cli_measure_ngram_only_human(model_dir):
    """Only n-gram drafts (a target-only prediction dump), costs measured in the same run; the human output has
    both tables and the predicted speed-up."""
    res = _cli(["measure", "--target", model_dir["target"], "--draft", "ngram:1-2", "--prompts", model_dir["prompts"],
                "--k", "2", "--max-new-tokens", "6", "--temperature", "0", "--cost-repeats", "3",
                "--no-hf-generate", "--threads", "1"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "ngram1-2 k=2" in out and "wall clock" in out and "plain (fastspec runner)" in out
    assert "HF generate" not in out and "no speed-up" not in out
    row = next(line for line in out.splitlines() if "ngram1-2 k=2" in line)
    assert row.count("[") == 2  # measured and predicted speed-ups, each with its interval
    # a cost table without the draft: said in one warning, no predicted speed-up
    res = _cli(["measure", "--target", model_dir["target"], "--draft", "ngram:1-2", "--prompts", model_dir["prompts"],
                "--k", "2", "--max-new-tokens", "4", "--costs", model_dir["costs"], "--no-hf-generate",
                "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert "no entry for draft(s) ngram1-2" in res.stdout
