"""Hugging Face's own assisted generation, run and counted by fastspec (fastspec.hf.assisted; issue 23,
item 3), with the tiny random models of tests/hf_models.py."""
from __future__ import annotations

import pytest

from hf_models import tiny  # importing it skips this module without torch / transformers

from fastspec import hf
from fastspec.errors import InvalidInput
from fastspec.hf.assisted import AssistantSettings, hf_assisted_generate
from fastspec.hf.audit import audit_model_output
from fastspec.policies import parse_policy, sklearn_available

pytestmark = pytest.mark.hf

PARAMS = dict(temperature=1.0, top_k=6)
PROMPTS = [[1, 3, 5], [2, 4], [0, 7, 6, 5], [3]]


@pytest.fixture(scope="module")
def pair():
    return tiny(0, eos=1), tiny(1, eos=1)  # EOS = 1 in both configs: the run must ignore it


def check_counters(r, n_new):
    """The hooks' counts against the candidate generator's: one target forward per step, one draft forward per
    drafted token, every token from a step."""
    assert len(r.tokens) == n_new
    assert r.target_forwards == len(r.draft_lengths) == len(r.accepted_per_step)
    assert r.draft_forwards == r.drafted
    assert r.emitted + r.plain_steps == n_new
    assert all(0 <= a <= d for d, a in zip(r.draft_lengths, r.accepted_per_step, strict=True))
    assert 0 < r.first_step_tokens <= n_new and 0 < r.prefill_s <= r.total_s


@pytest.mark.parametrize("k", [1, 3])
def test_fixed_k_drafts_k_every_step(pair, k):
    target, draft = pair
    before = dict(vars(draft.generation_config))
    r = hf_assisted_generate(target, draft, PROMPTS[0], k=k, seed=1, max_new_tokens=25, **PARAMS)
    check_counters(r, 25)
    made, want = 0, []
    for a in r.accepted_per_step:
        want.append(min(k, 25 - made - 1))
        made += a + 1
    assert r.draft_lengths == want  # no confidence stop: threshold 0 turns it off
    assert r.settings == {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
                          "assistant_confidence_threshold": 0.0}
    assert r.thresholds == [None] * len(want) and not r.roc_tuning
    assert dict(vars(draft.generation_config)) == before  # restored
    assert target.generation_config.eos_token_id == 1


def test_defaults_are_transformers_own(pair):
    target, draft = pair
    r = hf_assisted_generate(target, draft, PROMPTS[2], seed=2, max_new_tokens=30, **PARAMS)
    check_counters(r, 30)
    assert r.settings == {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
                          "assistant_confidence_threshold": 0.4}
    assert r.roc_tuning == sklearn_available()
    if not sklearn_available():  # no ROC tuning: the threshold stays 0.4
        assert set(r.thresholds) == {0.4}
    assert max(r.draft_lengths) < 20  # the confidence stop cut some steps


def test_heuristic_schedule_follows_hf_state(pair):
    """The budgets transformers used step by step are fastspec.policies' HFState replayed on the counters."""
    target, draft = pair
    pol = parse_policy("hf:k=4,schedule=heuristic,theta=0")
    r = hf_assisted_generate(target, draft, PROMPTS[1], settings=AssistantSettings.from_policy(pol), seed=3,
                             max_new_tokens=40, **PARAMS)
    check_counters(r, 40)
    state = pol.start()
    for budget, d, a in zip(r.budgets, r.draft_lengths, r.accepted_per_step, strict=True):
        assert budget == state.budget()
        state.update(d, a, None)
    assert draft.generation_config.num_assistant_tokens is None  # transformers' write-back undone


def test_greedy_is_the_targets_greedy(pair):
    target, draft = pair
    for settings in (AssistantSettings.defaults(), AssistantSettings.fixed(3)):
        r = hf_assisted_generate(target, draft, PROMPTS[0], settings=settings, temperature=0, max_new_tokens=20)
        assert r.tokens.tolist() == hf.generate(target, PROMPTS[0], temperature=0, max_new_tokens=20).tolist()


def test_prompt_lookup(pair):
    target, _ = pair
    r = hf_assisted_generate(target, None, [1, 3, 5, 1, 3], settings=AssistantSettings.ngram(3), seed=1,
                             max_new_tokens=20, **PARAMS)
    assert len(r.tokens) == 20 and r.draft_forwards == 0 and max(r.draft_lengths) <= 3
    assert r.target_forwards == len(r.draft_lengths)


def test_hf_assisted_output_passes_the_audit(pair):
    """transformers' speculative sampling gives the target's distribution (16 prompts x 24 tokens, EOS ignored)."""
    target, draft = pair
    recs = [(PROMPTS[i % 4], hf_assisted_generate(target, draft, PROMPTS[i % 4], k=3, seed=i, max_new_tokens=24,
                                                  **PARAMS).tokens) for i in range(16)]
    res = audit_model_output(target, recs, **PARAMS, seed=1)
    assert res.passed, res.verdict


def test_bad_input(pair):
    target, draft = pair
    with pytest.raises(InvalidInput, match="policy conf.*only fixed and hf policies"):
        AssistantSettings.from_policy("conf:theta=0.5,kmax=8")
    with pytest.raises(InvalidInput, match="settings or k, not both"):
        hf_assisted_generate(target, draft, [1], k=2, settings=AssistantSettings.defaults())
    with pytest.raises(InvalidInput, match="draft must be a model"):
        hf_assisted_generate(target, None, [1], k=2)
    with pytest.raises(InvalidInput, match=r"k = 0 is invalid"):
        AssistantSettings.fixed(0)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from hf_models import save_model

    root = tmp_path_factory.mktemp("models")
    prompts = root / "prompts.txt"
    prompts.write_text("a b c\nd e\nf a b c d\nc c d\n")
    return {"target": save_model(root / "target", 0), "draft": save_model(root / "draft", 1, layers=1),
            "prompts": str(prompts)}


@pytest.mark.slow
def test_measure_with_policies_and_the_hf_engine(model_dirs):
    """measure_and_predict with policies and Hugging Face's engine: one row per configuration in order, each
    predicted as its own policy (HF's defaults as hf with tune=off without scikit-learn), the skipped ones named."""
    hf.set_threads(1)
    report = hf.measure_and_predict(model_dirs["target"], ["d=" + model_dirs["draft"], "ngram.hf"],
                                    model_dirs["prompts"], [2], max_new_tokens=8, cost_repeats=1, trials=10,
                                    ignore_eos=True, policies=["conf:theta=0.5,kmax=4", "fixed:k=2", "hf"],
                                    hf_engine=True)
    labels = [r["measured"]["label"] for r in report.rows]
    assert labels == ["d k=2", "ngram.hf1-2 k=2", "d conf(theta=0.5,kmax=4,on=token)", "d fixed(k=2)",
                      "d hf(k=20,schedule=constant,theta=0.4,tune=roc)", "ngram.hf1-2 fixed(k=2)", "hf: d hf",
                      "hf: d fixed:k=2", "hf: ngram.hf1-2 k=2"]
    by = {r["measured"]["label"]: r for r in report.rows}
    tune = "roc" if sklearn_available() else "off"
    assert by["hf: d hf"]["measured"]["predicted_as"] == f"hf(k=20,schedule=constant,theta=0.4,tune={tune})"
    assert by["d conf(theta=0.5,kmax=4,on=token)"]["predicted"]["policy"] == "conf(theta=0.5,kmax=4,on=token)"
    # fixed k=2 as a policy is predicted by the policy replay: the same mean acceptance length as simulate's k=2
    assert by["d fixed(k=2)"]["predicted"]["mean_acceptance_length_exact"] == pytest.approx(
        by["d k=2"]["predicted"]["mean_acceptance_length_exact"], rel=1e-9)
    for r in report.rows:
        m = r["measured"]
        assert sum(m["per_position_acceptance"]) * m["verify_steps"] == pytest.approx(m["accepted"])
        assert sum(n * c for n, c in enumerate(m["draft_length_histogram"])) == m["drafted"]
        if m["engine"] == "hf":
            assert r["speedup"]["measured"] == m["speedup_vs_hf_plain"]
    skipped = report.measurement.settings["skipped"]
    assert any("ngram.hf1-2 conf" in s for s in skipped) and any("hf: d conf" in s for s in skipped)


@pytest.mark.parametrize("extra,needle", [
    (["--policy", "conf:theta=2"], "--policy 'conf:theta=2': theta=2 must be in (0, 1)"),
    (["--policy", "warp"], "--policy 'warp': unknown policy kind"),
    (["--engine", "hf"], "--engine hf compares fixed-length runs"),
    (["--engine", "hf", "--ignore-eos", "--no-hf-generate"], "--no-hf-generate: --engine hf times"),
    (["--engine", "vllm", "--ignore-eos", "--policy", "hf"], "--policy applies to fastspec's loop and --engine hf"),
])
def test_measure_cli_bad_policy_flags(model_dirs, extra, needle):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    res = CliRunner().invoke(app, ["measure", "--target", model_dirs["target"], "--draft", "exit1", "--prompts",
                                   model_dirs["prompts"], *extra])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastspec: error:") and needle in lines[0], res.stderr


def test_what_hf_runs_are_predicted_as(monkeypatch):
    """transformers' defaults are policy hf; without scikit-learn it never tunes, so hf policies with a threshold
    are predicted with tune=off; a fixed k of ks is simulate's (draft, k)."""
    import importlib

    from fastspec.hf.measure import predicted_policies

    M = importlib.import_module("fastspec.hf.measure")  # the module (fastspec.hf.measure is also a function's name)

    assert AssistantSettings.defaults().predicted_as(True) == "hf(k=20,schedule=constant,theta=0.4,tune=roc)"
    assert AssistantSettings.defaults().predicted_as(False) == "hf(k=20,schedule=constant,theta=0.4,tune=off)"
    assert AssistantSettings.fixed(3).predicted_as(False) is None
    assert AssistantSettings.ngram(3).predicted_as(False) is None
    assert AssistantSettings.from_policy("hf:theta=0").predicted_as(False) == \
        "hf(k=20,schedule=constant,theta=0,tune=roc)"
    assert AssistantSettings.from_policy("fixed:k=5").predicted_as(False) == "fixed(k=5)"
    monkeypatch.setattr(M, "sklearn_available", lambda: False)
    assert predicted_policies(["conf:theta=0.5,kmax=8", "hf:k=4,schedule=heuristic"], hf_engine=True) == [
        "conf(theta=0.5,kmax=8,on=token)", "hf(k=4,schedule=heuristic,theta=0.4,tune=roc)",
        "hf(k=20,schedule=constant,theta=0.4,tune=off)", "hf(k=4,schedule=heuristic,theta=0.4,tune=off)"]
    assert predicted_policies(["conf:theta=0.5,kmax=8"]) == ["conf(theta=0.5,kmax=8,on=token)"]
