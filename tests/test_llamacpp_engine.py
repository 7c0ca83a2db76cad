"""``fastspec measure --engine llamacpp`` (issue #31): llama.cpp's conventions and the exact prediction on synthetic
inputs (fast), the runner's faults with fake ``llama-server`` scripts (fast, no build), the refusal of a draft of
another vocabulary (fast, no build), and the real llama.cpp server (marked ``llamacpp``; skipped with one line when
the build is absent).

The real tests run tiny llama GGUF models written here (:mod:`tiny_gguf`, with gguf-py: the ``gguf`` package, or
the ``gguf-py`` of llama.cpp's tree next to the build): a float32 target of seeded random weights with a
SentencePiece vocabulary of ASCII pieces, and a draft that is the target plus seeded noise, so that llama.cpp's
draft is accepted at some steps and rejected at others.  Others write a draft of another vocabulary (llama-server
drops it and serves without speculation: refused up front, and by the runner) and a target cut short (llama.cpp
refuses it while loading).  Each real test starts llama-server a few times on these and takes about a second; no
model is downloaded or cached.
"""
from __future__ import annotations

import os
import stat
import sys
import textwrap

import numpy as np
import pytest

from fastspec.engines.errors import EngineError
from fastspec.engines.llamacpp.gguf_header import read_tokenizer, vocabulary_mismatch
from fastspec.engines.llamacpp.conventions import (LLAMACPP, draft_cap, draft_length, processed_top, step_accept,
                                                   top_probability)
from fastspec.engines.llamacpp.measure import ModelDraftSteps, greedy_steps, model_draft_time, predict_greedy
from fastspec.engines.llamacpp.runner import Server, find_binary, server_args
from fastspec.errors import InvalidInput
from tiny_gguf import import_gguf, vocabulary, write_llama

BIN = os.environ.get("FASTSPEC_LLAMACPP_BIN") or os.path.expanduser("~/.cache/fastspec/llama.cpp-11434/bin")
#: the tiny models' weights and the draft's noise (relative to each tensor's scale)
TINY_SEED, TINY_NOISE = 0, 0.05


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


def test_a_server_that_drops_its_draft_is_one_line(tmp_path):
    """llama-server serves without speculation when it refuses its draft; its /slots says so."""
    exe = _fake(tmp_path, _HTTP.replace('self.reply({"status": "ok"})',
                                        'self.reply([{"id": 0, "speculative": False}] if self.path == "/slots" '
                                        'else {"status": "ok"})')
                .replace("HTTPServer(", "print('E srv load_model: failed to initialize speculative decoding "
                         "context: x', flush=True)\nHTTPServer("))
    with pytest.raises(EngineError, match=r"^llamacpp d k=2: llama-server runs without the draft \(E srv load_model"):
        Server(exe, ["-md", "d.gguf"], name="d k=2").start()
    with Server(exe, ["-m", "t.gguf"], name="plain") as srv:  # no draft: nothing to drop
        assert srv.proc is not None


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


# ------------------------------------------------------------------ tiny GGUF models (written here)
def _gguf_or_skip():
    if import_gguf() is None:
        pytest.skip("neither the gguf package nor llama.cpp's gguf-py (next to the build) is there")


def _truncate(src, dst, keep: int) -> str:
    with open(src, "rb") as f:
        data = f.read(keep)
    with open(dst, "wb") as f:
        f.write(data)
    return str(dst)


def _cli(args):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    return CliRunner().invoke(app, ["measure", "--engine", "llamacpp", "--ignore-eos", "--temperature", "0",
                                    "--max-new-tokens", "8", "--k", "2", *args])


def _error_line(res, code: int) -> str:
    """The one error line of a CLI result that exited ``code`` (after llama.cpp's progress lines), nothing on
    stdout: no table, no JSON half-written."""
    assert "Traceback" not in res.output, res.output
    assert res.exit_code == code and res.stdout == "", res.output
    lines = [ln for ln in res.stderr.strip().splitlines() if not ln.startswith(("llamacpp: ", "fastspec: "))
             or ln.startswith("fastspec: error: ")]
    assert len(lines) == 1 and lines[0].startswith("fastspec: error: "), res.stderr
    return lines[0]


def test_a_draft_of_another_vocabulary_is_refused_before_any_server_starts(tmp_path):
    """llama.cpp's own rule (common_speculative_are_compatible), read from the GGUF headers: exit 2, one line,
    before the binary is even looked for."""
    _gguf_or_skip()
    target = write_llama(tmp_path / "t.gguf")
    other = write_llama(tmp_path / "o.gguf", extra_words=200)           # 200 more tokens: beyond llama.cpp's 128
    near = write_llama(tmp_path / "n.gguf", noise=0.05, extra_words=20)  # 20 more: llama.cpp speculates with it
    assert vocabulary_mismatch(read_tokenizer(target), read_tokenizer(near)) is None
    prompts = tmp_path / "p.txt"
    prompts.write_text("The cat\n")
    base = ["--target", target, "--prompts", str(prompts), "--llamacpp-bin", str(tmp_path / "no-build")]
    line = _error_line(_cli(base + ["--draft", f"o={other}"]), 2)
    assert line.startswith("fastspec: error: --draft o=") and "its vocabulary is not the target's (it has 588 " \
        "tokens, the target 388: more than llama.cpp's 128 apart)" in line, line
    renamed = write_llama(tmp_path / "r.gguf")
    with open(renamed, "r+b") as f:  # one token's text changed in place, the same length
        data = f.read()
        f.seek(data.index("\u2581queen".encode()))
        f.write("\u2581quEEn".encode())
    line = _error_line(_cli(base + ["--draft", f"r={renamed}"]), 2)
    i = vocabulary()[0].index("\u2581queen")
    assert f"its token {i} is '\u2581quEEn', the target's '\u2581queen'" in line, line
    line = _error_line(_cli(base + ["--draft", f"t={_truncate(target, tmp_path / 'h.gguf', 200)}"]), 2)
    assert "not a readable GGUF file (the GGUF header ends early" in line, line
    line = _error_line(_cli(base + ["--draft", f"n={near}"]), 1)  # past the check: the missing build, exit 1
    assert "llamacpp: no llama-server at" in line, line


def test_the_vocabulary_rule_is_llamacpps():
    t = {"model": "llama", "tokens": ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(300)], "bos_token_id": 1,
         "eos_token_id": 2, "add_bos_token": True, "add_eos_token": False}
    assert vocabulary_mismatch(t, dict(t)) is None
    assert vocabulary_mismatch(t, {**t, "tokens": t["tokens"] + ["x"] * 128}) is None  # 128 more: allowed
    assert "more than llama.cpp's 128 apart" in vocabulary_mismatch(t, {**t, "tokens": t["tokens"] + ["x"] * 129})
    assert vocabulary_mismatch(t, {**t, "tokens": ["a", "b", "c", "d", "e"] + t["tokens"][5:]}) is None  # ids < 5
    assert "its token 5 is 'y'" in vocabulary_mismatch(t, {**t, "tokens": t["tokens"][:5] + ["y"] + t["tokens"][6:]})
    assert "tokenizer is 'gpt2'" in vocabulary_mismatch(t, {**t, "model": "gpt2"})
    assert vocabulary_mismatch({**t, "model": "gpt2"}, {**t, "model": "whitespace"}) is None  # both BPE
    assert "BOS token is 5" in vocabulary_mismatch(t, {**t, "bos_token_id": 5})
    assert vocabulary_mismatch(t, {**t, "eos_token_id": 5}) is None  # EOS is not added: llama.cpp ignores its id
    assert "add_bos_token is False" in vocabulary_mismatch(t, {**t, "add_bos_token": False})
    assert vocabulary_mismatch(t, {k: v for k, v in t.items() if k != "add_bos_token"}) is None  # the default


# ------------------------------------------------------------------ the real llama.cpp server
def _need_real():
    if not os.path.isfile(os.path.join(BIN, "llama-server")):
        pytest.skip(f"llama.cpp is not built at {BIN} (scripts/llamacpp_build.sh)")
    _gguf_or_skip()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """Tiny llama GGUF models of one vocabulary (:mod:`tiny_gguf`): the target, and a draft that is the target
    plus seeded noise (it agrees with the target often, not always)."""
    _need_real()
    d = tmp_path_factory.mktemp("tiny-gguf")
    return {"target": write_llama(d / "target.gguf", seed=TINY_SEED),
            "draft": write_llama(d / "draft.gguf", seed=TINY_SEED, noise=TINY_NOISE)}


@pytest.fixture(scope="module")
def bigram_target(tmp_path_factory):
    """A tiny target whose next token depends on the current token alone (tiny_gguf's ``bigram``): its greedy output
    turns periodic within the budget, so an n-gram lookup drafts and most of its drafts are accepted."""
    _need_real()
    return write_llama(tmp_path_factory.mktemp("tiny-bigram") / "bigram.gguf", seed=TINY_SEED, bigram=True)


@pytest.fixture
def prompts_file(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("The capital of France is\nOnce upon a time, there was a little\n")
    return str(p)


def _measure(models, prompts, temperature, ks=(3,), **kw):
    from fastspec.engines.llamacpp.measure import measure_llamacpp
    from fastspec.params import SamplingParams

    return measure_llamacpp(models["target"], [f"noisy={models['draft']}"], prompts, list(ks),
                            sampling=SamplingParams(temperature, 40 if temperature else 0, 1.0, 0.0),
                            max_new_tokens=24, seed=3, binary=BIN, threads=1, **kw)


@pytest.mark.llamacpp
@pytest.mark.parametrize("ks, p_min, n_min", [((1, 3), 0.0, 0), ((4,), 0.5, 2)])
def test_real_t0_counters_equal_the_prediction_per_prompt(tiny, prompts_file, ks, p_min, n_min):
    res = _measure(tiny, prompts_file, 0.0, ks, p_min=p_min, n_min=n_min)
    assert [r.k for r in res.rows] == list(ks)
    for row in res.rows:
        assert row.exact and row.measured == [[round(a), round(b)] for a, b in row.predicted], row.verdict
        drafted, accepted = sum(m[0] for m in row.measured), sum(m[1] for m in row.measured)
        assert row.matches == 2 and 0 < accepted < drafted, row.verdict  # accepted sometimes, rejected sometimes
        assert row.audit["passed"], row.verdict
    assert res.plain_audit["passed"]


@pytest.mark.llamacpp
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_real_sampled_output_passes_the_audit(tiny, prompts_file, method):
    res = _measure(tiny, prompts_file, 1.0, draft_sample_method=method)
    (row,) = res.rows
    assert row.audit["passed"] and row.audit["mode"] == "sampling", row.audit["verdict"]
    assert sum(m[0] for m in row.measured) > 0


@pytest.mark.llamacpp
def test_real_flags_llamacpp_lacks_are_one_line(tiny):
    srv = Server(find_binary(BIN), server_args(tiny["target"], extra=["--no-such-flag"]), name="plain")
    try:
        with pytest.raises(EngineError, match="exited with status .* while loading"):
            srv.start()
    finally:  # a server that started after all is not left running
        srv.stop()


@pytest.mark.llamacpp
def test_real_llamacpp_drops_the_drafts_fastspec_refuses(tiny, tmp_path):
    """The header rule is llama.cpp's: llama-server given the draft fastspec refuses (200 tokens more) logs an error
    and serves without speculation, which the runner refuses in one line; a target with 20 tokens more than the
    draft passes both, and llama.cpp drafts with it."""
    other = write_llama(tmp_path / "o.gguf", seed=TINY_SEED, extra_words=200)
    srv = Server(find_binary(BIN), server_args(tiny["target"], draft=other), name="other")
    try:
        with pytest.raises(EngineError, match=r"^llamacpp other: llama-server runs without the draft \(srv +"
                           r"load_model: failed to initialize speculative decoding context"):
            srv.start()
    finally:
        srv.stop()
    bigger = write_llama(tmp_path / "b.gguf", seed=TINY_SEED, extra_words=20)
    assert vocabulary_mismatch(read_tokenizer(bigger), read_tokenizer(tiny["draft"])) is None
    with Server(find_binary(BIN), server_args(bigger, draft=tiny["draft"]), name="bigger") as srv:
        ans = srv.complete({"prompt": [1, 300, 301], "n_predict": 12, "ignore_eos": True, "temperature": 0.0,
                            "return_tokens": True})
    assert ans["timings"]["draft_n"] > 0


@pytest.mark.llamacpp
def test_real_a_gguf_llamacpp_refuses_is_one_line_exit_1(tiny, tmp_path, prompts_file):
    """A tiny target cut short after its header: fastspec reads its header, llama.cpp refuses its tensor data."""
    cut = _truncate(tiny["target"], tmp_path / "cut.gguf", os.path.getsize(tiny["target"]) // 2)
    line = _error_line(_cli(["--target", cut, "--draft", f"d={tiny['draft']}", "--prompts", prompts_file,
                             "--llamacpp-bin", BIN]), 1)
    assert "llamacpp plain: llama-server exited with status 1 while loading (llama_model_load: error loading " \
        "model: tensor 'blk." in line and "not within the file bounds" in line, line


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


@pytest.mark.llamacpp
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_real_ngram_simple_counters_replayed_exactly_and_audited(bigram_target, prompts_file, temperature):
    """llama.cpp's ngram-simple speculator (lookups of 1 and of 2 tokens): its counters replayed per prompt (at T = 0
    from the plain record, at T = 1 along the run's own output) equal llama-server's, and its output passes the
    audit.  The bigram target repeats itself, so at T = 0 most drafts are accepted (36 drafted / 33 accepted and
    32 / 32 for the first prompt on the build of scripts/llamacpp_build.sh)."""
    from fastspec.engines.llamacpp.measure import measure_llamacpp
    from fastspec.params import SamplingParams

    res = measure_llamacpp(bigram_target, ["ngram-simple:1", "ngram-simple:2"], prompts_file, [3],
                           sampling=SamplingParams(temperature, 40 if temperature else 0, 1.0, 0.0),
                           max_new_tokens=96, seed=3, binary=BIN, threads=1)
    assert [r.draft for r in res.rows] == ["ngram-simple-1", "ngram-simple-2"]
    for row in res.rows:
        assert row.exact and not row.flips, row.verdict
        assert row.measured == row.predicted and row.matches == 2, row.verdict
        drafted, accepted = (sum(m[i] for m in row.measured) for i in (0, 1))
        assert drafted >= 10, row.verdict  # it drafts
        if temperature == 0:
            assert accepted >= drafted // 2, row.verdict  # and its drafts are accepted
        assert row.audit["passed"] and row.audit["mode"] == ("greedy" if temperature == 0 else "sampling"), row.audit


def test_ngram_simple_specs_are_parsed_and_others_refused():
    from fastspec.engines.llamacpp.measure import check_drafts

    assert [(d.name, d.path, d.ngram_n) for d in check_drafts(["ngram-simple", "ng=ngram-simple:3"])] == \
        [("ngram-simple-12", "", 12), ("ng", "", 3)]
    for bad in ("ngram-simple:0", "ngram-simple:x", "ngram-map-k", "ngram.vllm"):
        with pytest.raises(InvalidInput, match="ngram-simple or ngram-simple:N"):
            check_drafts([bad])


def test_request_seeds_that_reach_the_random_seed_are_refused_before_any_server_starts(tmp_path):
    """Every request seed seed + prompt index stays below 2**32 - 1, llama.cpp's random seed (a request's seed is a
    uint32: larger values wrap): checked once the prompts are counted, before the binary is looked for."""
    from fastspec.engines.llamacpp.measure import measure_llamacpp
    from fastspec.params import SamplingParams

    _gguf_or_skip()
    target = write_llama(tmp_path / "t.gguf")
    draft = write_llama(tmp_path / "d.gguf", noise=0.05)
    prompts = tmp_path / "p.txt"
    prompts.write_text("The cat\nThe dog\nThe king\n")
    kwargs = dict(sampling=SamplingParams(temperature=0), max_new_tokens=8, binary=str(tmp_path / "no-build"))
    with pytest.raises(InvalidInput) as exc:
        measure_llamacpp(target, [f"d={draft}"], str(prompts), [2], seed=2 ** 32 - 3, **kwargs)
    assert exc.value.argument == "seed" and "reach 2**32 - 1; use a seed <= 4294967292" in str(exc.value)
    with pytest.raises(Exception) as exc:  # 2**32 - 4 + 2 = 2**32 - 2: on to the binary, which is not there
        measure_llamacpp(target, [f"d={draft}"], str(prompts), [2], seed=2 ** 32 - 4, **kwargs)
    assert "no-build" in str(exc.value)
