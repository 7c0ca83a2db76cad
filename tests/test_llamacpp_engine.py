"""``fastspec measure --engine llamacpp`` (issue #31): llama.cpp's conventions and the exact prediction on synthetic
inputs (fast), the runner's faults with fake ``llama-server`` scripts (fast, no build), and the real llama.cpp
server (marked ``llamacpp``; skipped with one line when the build or the models are absent).

The real tests use the cached SmolLM2-135M GGUF models that ``scripts/llamacpp_models.sh`` makes (an F16 target
and a Q4_0 draft), not tiny models made in the test: a GGUF that llama.cpp loads needs a tokenizer's metadata as
well as the weights, and the cached models already cost only seconds per run.
"""
from __future__ import annotations

import os
import stat
import sys
import textwrap

import numpy as np
import pytest

from fastspec.engines.errors import EngineError
from fastspec.engines.llamacpp.conventions import (LLAMACPP, draft_cap, draft_length, processed_top, step_accept,
                                                   top_probability)
from fastspec.engines.llamacpp.measure import ModelDraftSteps, greedy_steps, model_draft_time, predict_greedy
from fastspec.engines.llamacpp.runner import Server, find_binary, server_args
from fastspec.errors import InvalidInput

BIN = os.environ.get("FASTSPEC_LLAMACPP_BIN") or os.path.expanduser("~/.cache/fastspec/llama.cpp-11434/bin")
MODELS = os.path.expanduser("~/.cache/fastspec/llamacpp-models")


# ------------------------------------------------------------------ conventions (synthetic, fast)
def test_the_cap_leaves_the_last_token_to_the_target():
    assert LLAMACPP.first_step == 1 and not LLAMACPP.counts_past_budget
    assert [draft_cap(s, 8, 4) for s in range(1, 9)] == [4, 4, 4, 3, 2, 1, 0, 0]


def test_p_min_is_a_strict_stop_and_n_min_drops_short_drafts():
    tops = [0.9, 0.5, 0.49, 0.95]
    assert draft_length(tops, 4) == 4
    assert draft_length(tops, 4, p_min=0.5) == 2       # 0.5 is not below 0.5: kept; 0.49 stops
    assert draft_length(tops, 4, p_min=0.5, n_min=3) == 0  # 2 < n_min: dropped
    assert draft_length(tops, 1, p_min=0.5, n_min=2) == 0  # the cap shorter than n_min: nothing drafted
    assert draft_length([0.4], 3, p_min=0.5) == 0         # the first token stops: no draft
    with pytest.raises(ValueError):
        draft_length([0.9], 3)


def test_the_top_probability_is_renormalized_over_the_top_ten():
    lp = np.log(np.array([[0.5] + [0.05] * 10]))  # 11 candidates: the 11th is outside the draft's top 10
    assert top_probability(lp)[0] == pytest.approx(0.5 / (0.5 + 0.45))
    q = processed_top(np.array([[3, 1, 2]]), np.log(np.array([[0.6, 0.3, 0.1]])), temperature=1.0, top_k=2,
                      vocab=5)
    assert q[0].tolist() == pytest.approx([0.0, 1 / 3, 0.0, 2 / 3, 0.0])
    assert step_accept([5, 6, 9], [1, 5, 6, 7], 1).tolist() == [1.0, 1.0, 0.0]


def _simulate_llamacpp(prompt, record, budget, k, rollout, p_min, n_min):
    """llama.cpp's server loop at T = 0, written out step by step (server-context.cpp), with draft() of
    common/speculative.cpp counting the draft's forwards: id_last first, then each drafted token unless it ends the
    draft at the cap."""
    n_gen, steps, forwards = 1, [], []  # the first token comes from the prompt's forward
    while n_gen < budget:
        cap = min(k, budget - n_gen - 1)
        draft, fwd = [], 0
        if cap > 0:
            toks, tops = rollout(list(prompt) + list(record[:n_gen]), cap)
            fwd = 1  # batch.add(dp.id_last, ...); llama_process
            for j in range(cap):
                if tops[j] < p_min:
                    break
                draft.append(toks[j])
                if len(draft) == cap:
                    break
                fwd += 1  # batch.add(id, ...); llama_process
            if len(draft) < n_min:
                draft = []
        n_acc = 0
        while n_acc < len(draft) and draft[n_acc] == record[n_gen + n_acc]:
            n_acc += 1
        steps.append((len(draft), n_acc))
        forwards.append(fwd)
        n_gen += n_acc + 1
    return steps, forwards


@pytest.mark.parametrize("k, p_min, n_min", [(1, 0.0, 0), (3, 0.0, 0), (4, 0.3, 0), (4, 0.3, 2), (5, 0.0, 3)])
def test_the_prediction_replays_llamacpps_loop_exactly(k, p_min, n_min):
    rng = np.random.default_rng(7)
    budget, prompt = 40, [1, 2, 3]
    record = rng.integers(0, 4, budget).tolist()
    asked = []

    def rollout(context, n):  # a deterministic fake draft: mostly the record, sometimes wrong, varied confidence
        asked.append(len(context))
        s = len(context) - len(prompt)
        toks = [record[s + j] if (s * 7 + j) % 5 else (record[s + j] + 1) % 4 for j in range(n)]
        tops = [((s + 3 * j) % 10) / 10 + 0.05 for j in range(n)]
        return toks, tops

    c = predict_greedy(prompt, record, budget, k, rollout, p_min=p_min, n_min=n_min)
    steps, forwards = _simulate_llamacpp(prompt, record, budget, k, rollout, p_min, n_min)
    assert (c.num_draft_tokens, c.num_accepted_tokens) == (sum(d for d, _ in steps), sum(a for _, a in steps))
    assert min(asked) == len(prompt) + 1  # the first step starts after the prompt's own token
    got = greedy_steps(prompt, record, budget, k, rollout, p_min=p_min, n_min=n_min)
    assert list(got.steps) == steps and list(got.draft_forwards) == forwards
    assert (got.draft_n, got.draft_n_accepted) == (c.num_draft_tokens, c.num_accepted_tokens)
    assert got.tokens == budget
    if p_min == 0:  # rejections and fully accepted drafts are both exercised
        assert any(a < d for d, a in steps) and any(0 < a == d for d, a in steps)
    extra = [f - d for (d, _), f in zip(steps, forwards, strict=True)]
    if p_min > 0:  # a p_min stop decodes one token more than it drafts
        assert max(extra) >= 1
    elif n_min == 0:  # every draft reaches the cap: as many forwards as tokens
        assert set(extra) == {0}


def test_a_model_draft_step_costs_its_draft_forwards_and_both_models_on_the_verified_batch():
    steps = ModelDraftSteps(((3, 1), (2, 2), (0, 0)), (3, 3, 0))  # cap 3; p_min stopped the second at 2
    t = model_draft_time(steps, lambda n: 10.0 * n, lambda n: 1.0 + 0.1 * n, lambda d: 0.5 * (d + 1))
    # draft forwards (3 + 3) x draft(1); target(4) + draft(4), target(3) + draft(3), target(1) + draft(1); overheads
    assert t == pytest.approx(6 * 1.1 + (40 + 1.4) + (30 + 1.3) + (10 + 1.1) + (2.0 + 1.5 + 0.5))
    assert model_draft_time(steps, lambda _n: 0.0, lambda _n: 0.0, 0.25) == pytest.approx(0.75)


# ------------------------------------------------------------------ the runner's faults (fake binaries, fast)
def _fake(tmp_path, body: str) -> str:
    path = tmp_path / "llama-server"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


_HTTP = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, obj):
        data = json.dumps(obj).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply({"status": "ok"})
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        ANSWER
HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_a_missing_binary_is_one_line(tmp_path):
    with pytest.raises(EngineError, match=r"^llamacpp: no llama-server at .*scripts/llamacpp_build.sh"):
        find_binary(str(tmp_path))


def test_a_server_that_refuses_its_model_is_one_line_with_its_error(tmp_path):
    exe = _fake(tmp_path, "import sys\nprint('loading'); print('error: failed to load model x.gguf'); sys.exit(1)\n")
    with pytest.raises(EngineError, match=r"exited with status 1 while loading \(error: failed to load model"):
        Server(exe, ["-m", "x.gguf"], name="plain").start()


def test_an_answer_without_timings_is_an_engine_error(tmp_path):
    exe = _fake(tmp_path, _HTTP.replace("ANSWER", 'self.reply({"tokens": [1, 2]})'))
    with Server(exe, [], name="plain") as srv:
        with pytest.raises(EngineError, match="answered without 'timings'"):
            srv.complete({"prompt": [1]})
    assert srv.proc is None


def test_a_server_dying_mid_run_is_an_engine_error(tmp_path):
    exe = _fake(tmp_path, _HTTP.replace("ANSWER", "print('error: crashed', flush=True); import os; os._exit(3)"))
    with Server(exe, [], name="q4 k=3") as srv:
        with pytest.raises(EngineError, match=r"^llamacpp q4 k=3: llama-server exited with status 3 mid-run"):
            srv.complete({"prompt": [1]})


def test_the_cli_refuses_llamacpp_flags_elsewhere_and_bad_sampling(tmp_path):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 60)
    runner = CliRunner()
    r = runner.invoke(app, ["measure", "--engine", "vllm", "--target", str(tmp_path), "--draft", "d=x",
                            "--prompts", str(prompts), "--ignore-eos", "--p-min", "0.5"])
    assert r.exit_code == 2 and "--p-min applies to --engine llamacpp only" in r.output
    base = ["measure", "--engine", "llamacpp", "--target", str(gguf), "--draft", f"d={gguf}", "--prompts",
            str(prompts)]
    r = runner.invoke(app, base)
    assert r.exit_code == 2 and "--engine llamacpp compares fixed-length runs" in r.output
    r = runner.invoke(app, base + ["--ignore-eos", "--temperature", "1"])
    assert r.exit_code == 2 and "--temperature: --engine llamacpp at T > 0 needs --top-k" in r.output
    r = runner.invoke(app, base + ["--ignore-eos", "--temperature", "0", "--draft", f"d={prompts}"])
    assert r.exit_code == 2 and "not a GGUF file" in r.output
    with pytest.raises(InvalidInput):
        from fastspec.engines.llamacpp.measure import check_drafts
        check_drafts(["ngram.vllm"])


# ------------------------------------------------------------------ the real llama.cpp server
def _need_real():
    if not os.path.isfile(os.path.join(BIN, "llama-server")):
        pytest.skip(f"llama.cpp is not built at {BIN} (scripts/llamacpp_build.sh)")
    for f in ("target-f16.gguf", "draft-q4_0.gguf"):
        if not os.path.isfile(os.path.join(MODELS, f)):
            pytest.skip(f"no {f} in {MODELS} (scripts/llamacpp_models.sh)")


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("The capital of France is\nOnce upon a time, there was a little\n")
    return str(p)


def _measure(prompts, temperature, **kw):
    from fastspec.engines.llamacpp.measure import measure_llamacpp
    from fastspec.params import SamplingParams

    return measure_llamacpp(os.path.join(MODELS, "target-f16.gguf"), [f"q4={MODELS}/draft-q4_0.gguf"], prompts,
                            [3], sampling=SamplingParams(temperature, 40 if temperature else 0, 1.0, 0.0),
                            max_new_tokens=24, seed=3, binary=BIN, threads=1, **kw)


@pytest.mark.llamacpp
def test_real_t0_counters_equal_the_prediction_per_prompt(prompts_file):
    _need_real()
    res = _measure(prompts_file, 0.0, p_min=0.5, n_min=2)
    (row,) = res.rows
    assert row.exact and row.measured == [[round(a), round(b)] for a, b in row.predicted], row.verdict
    assert row.matches == 2 and sum(m[0] for m in row.measured) > 0
    assert row.audit["passed"] and res.plain_audit["passed"]


@pytest.mark.llamacpp
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_real_sampled_output_passes_the_audit(prompts_file, method):
    _need_real()
    res = _measure(prompts_file, 1.0, draft_sample_method=method)
    (row,) = res.rows
    assert row.audit["passed"] and row.audit["mode"] == "sampling", row.audit["verdict"]
    assert sum(m[0] for m in row.measured) > 0


@pytest.mark.llamacpp
def test_real_flags_llamacpp_lacks_are_one_line():
    _need_real()
    args = server_args(os.path.join(MODELS, "target-f16.gguf"), extra=["--no-such-flag"])
    with pytest.raises(EngineError, match="exited with status .* while loading"):
        Server(find_binary(BIN), args, name="plain").start()


def test_the_rollout_drafts_eos_where_the_draft_argmax_is_banned():
    """llama-server bans EOS under ignore_eos; llama.cpp's draft sampler does not: where the raw argmax is EOS the
    replay takes it and continues after it."""
    from fastspec.engines.llamacpp.measure import TeacherForcing

    EOS = 2

    def probs(best, other):
        return {"top_logprobs": [{"id": best, "logprob": -0.1}, {"id": other, "logprob": -2.5}]}

    class Fake(TeacherForcing):
        def __init__(self):
            super().__init__(server=None)
            self.calls = []

        def _complete(self, context, n_predict, n_probs, **sampling):  # noqa: ARG002 (the runner's signature)
            self.calls.append((tuple(context), n_predict))
            if context[-1] == EOS:  # after the EOS the draft goes on: 7, 8
                return [7, 8][:n_predict], [probs(7, 9), probs(8, 9)][:n_predict]
            # the server's continuation: 5, then EOS is the argmax but banned, so 6 is generated
            return [5, 6, 6][:n_predict], [probs(5, 9), probs(EOS, 6), probs(6, 9)][:n_predict]

    tf = Fake()
    toks, tops = tf.rollout([1, 1], 4)
    assert toks == [5, EOS, 7, 8] and len(tops) == 4 and tf.eos_divergences == 1
    assert tf.calls == [((1, 1), 4), ((1, 1, 5, EOS), 2)]
    assert tops[0] == pytest.approx(1 / (1 + np.exp(-2.4)))
