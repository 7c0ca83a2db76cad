"""fastspec.hf: real models (tiny random Llamas built from a config, no download).

Which claim each test checks (README, "three kinds of same"):
* same distribution -- ``test_first_two_tokens_follow_target_distribution`` (calibrated chi-square against the
  target's exact autoregressive law, and a deliberately broken loop that the same test rejects);
* same text under a fixed seed / deterministic rule -- greedy speculative == greedy autoregressive, cached loop
  == recompute-from-scratch loop, early-exit draft == hidden-state path;
* dump format -- round trip through the loader, tiny-model dumps valid, mismatched tokenizer refused;
* the consolidation -- the loop's sampler (``fastspec.processing.sample_tokens``) picks the old sampler's token
  under the same uniform and draws as many uniforms; typed errors; top-k/top-p/min-p through dump, prediction
  and loop; library messages name no command-line option.
Skipped cleanly when torch / transformers (the ``fastspec[hf]`` extra) are absent.
"""
from __future__ import annotations

import json
import os
import re
from types import SimpleNamespace

import numpy as np
import pytest

from hf_models import V, save_model as _save_model, tiny, torch
from naive import chi2_pooled

import fastspec
from fastspec import hf
from fastspec.io import check_dump_path, load_dump

stats = pytest.importorskip("scipy.stats")

pytestmark = pytest.mark.hf

PROMPT = [1, 3, 5]



@pytest.fixture(scope="module")
def pair():
    return tiny(0), tiny(1)


def _probs(model, ids, **params):
    with torch.no_grad():
        lg = model(torch.tensor([ids])).logits[0, -1].float().numpy()
    return fastspec.probabilities(lg[None], **params)[0]


# ------------------------------------------------------------------------------- same distribution

def _two_token_law(target, params):
    p1 = _probs(target, PROMPT, **params)
    joint = np.zeros((V, V))
    for a in range(V):
        if p1[a] > 0:
            joint[a] = p1[a] * _probs(target, PROMPT + [a], **params)
    return joint


def _sample_pairs(target, draft, n, params, k=2, seed0=0):
    counts = np.zeros((V, V), np.int64)
    for s in range(n):
        r = hf.speculative_generate(target, draft, PROMPT, k=k, seed=seed0 + s, max_new_tokens=3, **params)
        counts[r.tokens[0], r.tokens[1]] += 1
    return counts


@pytest.mark.statistical
def test_first_two_tokens_follow_target_distribution(pair):
    """Same distribution: the first two tokens of the real loop (k=2: both come from one verify step or a
    rejection then a new step) follow the target's exact autoregressive law; chi-square at false-alarm 1e-6."""
    target, draft = pair
    params = dict(temperature=0.9, top_k=6)
    joint = _two_token_law(target, params)
    assert abs(joint.sum() - 1) < 1e-9
    n = 1500
    stat, df = chi2_pooled(_sample_pairs(target, draft, n, params), joint, n)
    assert stat < stats.chi2.isf(1e-6, df), (stat, df)


@pytest.mark.statistical
def test_broken_loop_fails_the_same_test(pair, monkeypatch):
    """The same test has power: a loop that resamples from p (not the residual max(p - q, 0)) after a rejection
    is biased, and the chi-square rejects it."""
    target, draft = pair
    params = dict(temperature=0.9, top_k=6)
    real = fastspec.verify_logits
    rng = np.random.default_rng(123)

    def broken(tl, dl, toks, **kw):
        res = real(tl, dl, toks, **kw)
        n = int(res.num_accepted[0])
        if dl is not None and n < toks.shape[1]:  # rejected: replace the recovered token by a fresh draw from p
            p = fastspec.probabilities(tl[0, n][None], temperature=kw["temperature"], top_k=kw["top_k"])[0]
            res.tokens[0, n] = rng.choice(len(p), p=p)
        return res

    monkeypatch.setattr(hf.loop, "verify_logits", broken)  # the loop's verifier
    joint = _two_token_law(target, params)
    n = 500
    stat, df = chi2_pooled(_sample_pairs(target, draft, n, params, seed0=10_000), joint, n)
    assert stat > stats.chi2.isf(1e-6, df), (stat, df)


# ------------------------------------------------------------------------------- same text (deterministic)

@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_speculative_equals_greedy_decoding(pair, k):
    """Same text: at temperature 0 the speculative output equals plain greedy decoding token for token."""
    target, draft = pair
    ref = hf.generate(target, PROMPT, temperature=0, max_new_tokens=24)
    ref_nocache = hf.generate(target, PROMPT, temperature=0, max_new_tokens=24, use_cache=False)
    np.testing.assert_array_equal(ref, ref_nocache)
    for d in (draft, hf.early_exit(target, 1)):
        r = hf.speculative_generate(target, d, PROMPT, k=k, temperature=0, max_new_tokens=24)
        np.testing.assert_array_equal(r.tokens, ref)
        assert r.verify_steps >= 1 and r.emitted + r.plain_steps == len(ref)


@pytest.mark.parametrize("which", ["independent", "exit1"])
def test_cache_rollback_matches_recompute_from_scratch(pair, which):
    """Rollback: the cached loop (crop to the accepted prefix each step) gives, under one seed, the same drafts,
    emitted tokens and (to float tolerance) the same target/draft logits as a loop that recomputes every forward
    from the full sequence without a cache."""
    target, draft = pair
    d = draft if which == "independent" else hf.early_exit(target, 1)
    for k in (2, 4):
        a = hf.speculative_generate(target, d, PROMPT, k=k, seed=7, max_new_tokens=30, return_trace=True)
        b = hf.speculative_generate(target, d, PROMPT, k=k, seed=7, max_new_tokens=30, return_trace=True,
                                    use_cache=False)
        np.testing.assert_array_equal(a.tokens, b.tokens)
        assert len(a.trace) == len(b.trace)
        rejected = 0
        for sa, sb in zip(a.trace, b.trace, strict=True):
            assert sa["drafts"] == sb["drafts"] and sa["emitted"] == sb["emitted"]
            np.testing.assert_allclose(sa["target_logits"], sb["target_logits"], atol=1e-4)
            if sa["draft_logits"] is not None:
                np.testing.assert_allclose(sa["draft_logits"], sb["draft_logits"], atol=1e-4)
                rejected += len(sa["emitted"]) <= len(sa["drafts"])
        assert rejected >= 2  # rollback really happened (steps with rejected drafts)
        assert len(a.tokens) == 30
        assert a.verify_steps == len(a.accepted_per_step) and a.accepted == a.accepted_per_step.sum()
        assert a.emitted == a.accepted + a.verify_steps
        np.testing.assert_array_equal(a.per_position_accepted,
                                      [(a.accepted_per_step > j).sum() for j in range(k)])


def test_early_exit_shares_weights_and_matches_hidden_states(pair):
    target, _ = pair
    e = hf.early_exit(target, 1)
    assert len(target.model.layers) == 2 and target.config.num_hidden_layers == 2  # target untouched
    assert e.model.embed_tokens.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()
    assert e.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    ids = torch.tensor([PROMPT + [2, 4]])
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states[1]
        ref = target.lm_head(target.model.norm(hs))
        got = e(ids).logits
    torch.testing.assert_close(got, ref)
    with pytest.raises(ValueError, match="exit depth"):
        hf.early_exit(target, 3)


def test_loop_bad_input(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="k ="):
        hf.speculative_generate(target, draft, PROMPT, k=0)
    with pytest.raises(ValueError, match="temperature"):
        hf.speculative_generate(target, draft, PROMPT, k=2, temperature=-1)
    with pytest.raises(ValueError, match="input_ids"):
        hf.speculative_generate(target, draft, [], k=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        hf.speculative_generate(target, draft, PROMPT, k=2, max_new_tokens=0)


def test_one_teacher_forced_logits(pair):
    # issue 29, item 2: one teacher_forced_logits (fastspec.hf.teacher), its no-cache pass behind cached=False;
    # the loop's copy is gone
    from fastspec.hf import loop, teacher

    assert hf.teacher_forced_logits is teacher.teacher_forced_logits and not hasattr(loop, "teacher_forced_logits")
    target, _ = pair
    cont = [3, 7, 1, 4]
    cached = hf.teacher_forced_logits(target, PROMPT, cont)
    plain = hf.teacher_forced_logits(target, PROMPT, cont, cached=False)
    assert cached.dtype == plain.dtype == np.float32 and cached.shape == plain.shape == (len(cont), V)
    np.testing.assert_allclose(cached, plain, atol=1e-4)
    with torch.inference_mode():  # cached=False is one forward over prompt + continuation[:-1], no KV cache
        ref = target(torch.tensor([list(PROMPT) + cont[:-1]]), use_cache=False).logits[0, len(PROMPT) - 1:]
    np.testing.assert_array_equal(plain, ref.float().numpy())
    with pytest.raises(TypeError, match="cached must be True or False"):
        hf.teacher_forced_logits(target, PROMPT, cont, cached="no")
    with pytest.raises(ValueError, match=r"continuation\[1\] = 99999 is outside the model's vocabulary"):
        hf.teacher_forced_logits(target, PROMPT, [1, 99999], cached=False)


def test_eos_stops_and_plain_step(pair):
    target, draft = pair
    r = hf.speculative_generate(target, draft, PROMPT, k=4, seed=3, max_new_tokens=40, eos_token_id=2)
    toks = list(r.tokens)
    assert 2 not in toks[:-1] and (toks[-1] == 2 or len(toks) == 40)
    r = hf.speculative_generate(target, draft, PROMPT, k=3, seed=3, max_new_tokens=1)
    assert len(r.tokens) == 1 and r.verify_steps == 0 and r.plain_steps == 1


# ------------------------------------------------------------------------------- dumps and CLI

@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    t = _save_model(root / "target", 0)
    d = _save_model(root / "draft", 1, layers=1)
    other = _save_model(root / "other", 2, words=["<s>", "</s>", "x", "y", "z", "w", "v", "u"])
    prompts = root / "prompts.txt"
    prompts.write_text("a b c\n\nd e\nf a b c d\n")
    return {"target": t, "draft": d, "other": other, "prompts": str(prompts), "root": root}


_PROGRESS = re.compile(r"^fastspec: [\w ()]+: \d+(/\d+)?$")


def _lines(output: str) -> list[str]:
    """The output's lines except the plain progress lines (``fastspec: loading models: 1/2``)."""
    return [ln for ln in output.strip().splitlines() if not _PROGRESS.match(ln)]


def _cli(args):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("sparse", [False, True])
def test_dump_round_trip(model_dirs, tmp_path, sparse):
    """The dump command writes a valid dump: per position t, the logits that predict generated token t
    (teacher-forced), the sampled tokens, lengths and the sampling metadata."""
    out = str(tmp_path / "d.npz")
    args = ["dump", "--target", model_dirs["target"], "--draft", f"small={model_dirs['draft']}", "--draft", "exit1",
            "--prompts", model_dirs["prompts"], "--max-new-tokens", "6", "--temperature", "0.8", "--seed", "5",
            "--out", out, "--threads", "1"]
    if sparse:
        args += ["--top-k-save", "3"]
    res = _cli(args)
    assert res.exit_code == 0, res.output
    target, tok = hf.load_model(model_dirs["target"])
    prompts = hf.read_prompts(model_dirs["prompts"], tok)
    assert len(prompts) == 3  # the blank line is skipped
    with load_dump(out, validate=True) as d:
        assert d.kind == ("sparse" if sparse else "dense") and set(d.drafts) == {"small", "exit1"}
        assert d.N == 3 and d.V == V
        assert float(d.metadata["temperature"]) == 0.8
        assert (d.lengths >= 1).all() and d.lengths.max() <= d.T == 6  # T is the budget, rows end at EOS
        rows = {}
        for ch in d.iter_chunks():
            rows.setdefault("target", []).append(ch.target)
            for n in d.drafts:
                rows.setdefault(n, []).append(ch.drafts[n])
        for i, prompt in enumerate(prompts):
            L = int(d.lengths[i])
            cont = d.tokens[i, :L]
            # the continuation is the target's own sample under the derived seed (same text, fixed seed)
            again = hf.generate(target, prompt, temperature=0.8, seed=hf.loop.derive_seed(5, i), max_new_tokens=6,
                                eos_token_id=1)
            np.testing.assert_array_equal(cont, again)
            ref = hf.teacher_forced_logits(target, prompt, cont)
            if sparse:
                ids = np.concatenate([r[0] for r in rows["target"]]).reshape(d.N, d.T, -1)[i, :L]
                lp = np.concatenate([r[1] for r in rows["target"]]).reshape(d.N, d.T, -1)[i, :L]
                p = fastspec.probabilities(ref, temperature=0.8)
                np.testing.assert_array_equal(ids[:, 0], p.argmax(-1))
                np.testing.assert_allclose(np.exp(lp), np.take_along_axis(p, ids.astype(np.int64), -1), rtol=1e-5)
            else:
                got = np.concatenate(rows["target"]).reshape(d.N, d.T, -1)[i, :L]
                np.testing.assert_allclose(got.astype(np.float32), ref, atol=2e-2, rtol=1e-2)
    # simulate runs on it (sparse: bounds; dense: exact)
    from fastspec.simulation import simulate

    sim = simulate(out, k=2, trials=20)
    assert len(sim.results) == 2


def test_dump_refuses_mismatched_tokenizer(model_dirs, tmp_path):
    out = str(tmp_path / "d.npz")
    res = _cli(["dump", "--target", model_dirs["target"], "--draft", f"bad={model_dirs['other']}",
                "--prompts", model_dirs["prompts"], "--max-new-tokens", "4", "--out", out])
    assert res.exit_code == 2
    assert "tokenizer" in res.output and "Traceback" not in res.output
    assert not os.path.exists(out)
    with pytest.raises(ValueError, match="tokenizer"):
        hf.resolve_models(model_dirs["target"], [f"bad={model_dirs['other']}"])


def test_cli_bad_input_one_line(model_dirs, tmp_path):
    base = ["--target", model_dirs["target"], "--prompts", model_dirs["prompts"], "--out", str(tmp_path / "x.npz")]
    for extra, msg in [(["--draft", "exit9"], "exit depth"), (["--draft", "nope=/no/such/dir"], "no such file"),
                       (["--draft", "exit1", "--max-new-tokens", "0"], "max-new-tokens"),
                       (["--draft", "a__b=exit1"], "draft name")]:
        res = _cli(["dump", *base, *extra])
        assert res.exit_code == 2, (extra, res.output)
        assert msg in res.output and len(_lines(res.output)) == 1, res.output


def test_read_prompts_jsonl_and_chat_template(model_dirs, tmp_path):
    tok = hf.load_tokenizer(model_dirs["target"])
    f = tmp_path / "p.jsonl"
    f.write_text(json.dumps([{"role": "user", "content": "a b"}]) + "\n" + json.dumps({"prompt": "c d"}) + "\n")
    plain = hf.read_prompts(str(f), tok)
    assert len(plain) == 2
    tok.chat_template = ("{% for m in messages %}{{ m['content'] }} {% endfor %}"
                         "{% if add_generation_prompt %}e{% endif %}")
    chat = hf.read_prompts(str(f), tok)
    assert chat[0] == tok("a b e", add_special_tokens=False)["input_ids"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(ValueError, match="not valid JSON"):
        hf.read_prompts(str(bad), tok)


def test_measure_cli_json(model_dirs):
    res = _cli(["measure", "--target", model_dirs["target"], "--draft", "exit1", "--prompts", model_dirs["prompts"],
                "--k", "1,2", "--max-new-tokens", "8", "--trials", "20", "--json", "--threads", "1"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert [(r["draft"], r["k"]) for r in obj["results"]] == [("exit1", 1), ("exit1", 2)]
    for r in obj["results"]:
        m = r["measured"]
        assert 1.0 <= m["mean_acceptance_length"] <= r["k"] + 1
        assert m["ci95"][0] <= m["mean_acceptance_length"] <= m["ci95"][1]
        assert r["predicted"]["mean_acceptance_length_exact"] is not None and r["relative_error"] is not None
    assert {n: obj["config"][n] for n in ("temperature", "top_k", "top_p", "min_p")} == {
        "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}



def test_measure_and_predict_is_the_library_pipeline(model_dirs, tmp_path):
    """fastspec.hf.measure_and_predict runs measure's stages in order (progress per stage), keeps the dump at
    save_dump, and tags the errors about the token budget so a caller can name its own option."""
    from contextlib import contextmanager

    from fastspec.errors import InvalidInput

    seen = []

    @contextmanager
    def progress(stage, total, _every):
        done = []
        yield lambda n=1: done.append(n)
        seen.append((stage, total, sum(done)))

    hf.set_threads(1)
    kept = tmp_path / "kept.npz"
    report = hf.measure_and_predict(model_dirs["target"], ["exit1"], model_dirs["prompts"], [1], max_new_tokens=4,
                                    max_prompts=2, cost_repeats=1, hf_generate=False, trials=10,
                                    save_dump=str(kept), progress=progress)
    assert [s for s, _, _ in seen] == ["loading models", "measuring costs (rounds)", "dumping (prediction)",
                                       "timed runs (interleaved)"]
    assert all(total == done for _, total, done in seen)
    assert len(report.prompts) == 2 and kept.exists() and report.dump == str(kept) and report.costs_measured
    assert [(r["draft"], r["k"]) for r in report.rows] == [("exit1", 1)]
    assert set(report.as_dict()) == {"results", "plain", "hf_generate", "runner_vs_generate", "costs",
                                      "prediction_warnings", "schedule"}
    with pytest.raises(InvalidInput) as info:
        hf.measure_and_predict(model_dirs["target"], ["exit1"], model_dirs["prompts"], [1], max_new_tokens=1000)
    assert info.value.argument == "max_new_tokens"

def test_ratio_ci():
    est, se, half = hf.ratio_ci([3, 4, 5, 6], [2, 2, 2, 2])
    assert est == pytest.approx(18 / 8)
    assert se > 0 and half > se


def test_dump_refuses_non_empty_directory(model_dirs, tmp_path):
    (tmp_path / "keep.txt").write_text("not a dump")
    res = _cli(["dump", "--target", model_dirs["target"], "--draft", "exit1", "--prompts", model_dirs["prompts"],
                "--max-new-tokens", "2", "--out", str(tmp_path)])
    assert res.exit_code == 2 and "not empty" in res.output
    assert (tmp_path / "keep.txt").read_text() == "not a dump"


@pytest.mark.subprocess
def test_core_library_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, fastspec, fastspec.simulation, fastspec.io; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------- one sampler, typed errors, layers

def _old_sample(logits_row, u, params):
    """hf's sampler before the consolidation (NumPy cumsum inverse CDF), kept as the reference."""
    q = fastspec.probabilities(logits_row[None], **params)[0]
    cum = np.cumsum(q)
    i = min(int(np.searchsorted(cum, u * cum[-1], side="right")), len(q) - 1)
    while q[i] <= 0:
        i -= 1
    return i


SAMPLING = [dict(temperature=1.0), dict(temperature=0.7, top_k=5), dict(temperature=1.3, top_p=0.8, min_p=0.02),
            dict(temperature=0)]


@pytest.mark.parametrize("params", SAMPLING)
def test_loop_sampler_equals_the_old_one(params):
    """The loop draws with fastspec.processing.sample_tokens: under one uniform it picks the token the old cumsum
    sampler picked (also u = 0 exactly), and it consumes exactly one uniform per token."""
    from fastspec.hf.loop import draw_token
    from fastspec.params import SamplingParams

    sp = SamplingParams(**params)
    rng = np.random.default_rng(11)
    for _ in range(200):
        V = int(rng.integers(2, 2500))
        row = (rng.standard_normal(V) * rng.uniform(0.2, 6)).astype(np.float32)
        row[rng.random(V) < 0.2] = -np.inf
        row[rng.integers(V)] = 0.0
        seed = int(rng.integers(2 ** 32))
        mine, ref = np.random.default_rng(seed), np.random.default_rng(seed)
        for _ in range(3):
            assert draw_token(row, mine, sp) == _old_sample(row, ref.random(), params)
        assert mine.random() == ref.random()  # same number of uniforms drawn
    zero = SimpleNamespace(random=lambda: 0.0)  # a generator whose next uniform is exactly 0
    row = np.array([-np.inf, 0.5, 2.0, -1.0], np.float32)
    assert draw_token(row, zero, sp) == _old_sample(row, 0.0, params)


@pytest.mark.parametrize("params", SAMPLING[:3])
def test_generate_same_tokens_as_before(pair, params):
    """Same seeds, same text: generate() gives the tokens of the pre-consolidation loop (recompute from scratch,
    the old sampler, one uniform per token)."""
    target, _ = pair
    for seed in range(3):
        rng, seq, ref = np.random.default_rng(seed), list(PROMPT), []
        for _ in range(12):
            with torch.no_grad():
                lg = target(torch.tensor([seq])).logits[0, -1].float().numpy()
            ref.append(_old_sample(lg, rng.random(), params))
            seq.append(ref[-1])
        np.testing.assert_array_equal(hf.generate(target, PROMPT, seed=seed, max_new_tokens=12, **params), ref)


def test_typed_errors(pair, tmp_path):
    from fastspec.errors import InvalidInput, InvalidType

    target, draft = pair
    for kw, err in [(dict(k=0), InvalidInput), (dict(k=257), InvalidInput), (dict(k=1.5), InvalidType),
                    (dict(k=True), InvalidType), (dict(top_p=1.5), InvalidInput), (dict(top_k="3"), InvalidType),
                    (dict(min_p=1.0), InvalidInput), (dict(max_new_tokens=0), InvalidInput)]:
        with pytest.raises(err):
            hf.speculative_generate(target, draft, PROMPT, **{"k": 2, **kw})
    with pytest.raises(InvalidInput, match="temperature"):
        hf.generate(target, PROMPT, temperature=-0.5)
    with pytest.raises(InvalidInput, match="input_ids"):
        hf.generate(target, [[1, 2], [3, 4]])
    with pytest.raises(InvalidInput, match="exit depth"):
        hf.early_exit(target, 0)
    with pytest.raises(InvalidType, match="exit depth"):
        hf.early_exit(target, 1.0)
    with pytest.raises(InvalidInput, match="draft name"):
        hf.parse_draft_specs(["a__b=exit1"])
    with pytest.raises(InvalidInput, match="twice"):
        hf.parse_draft_specs(["x=exit1", "x=exit2"])
    with pytest.raises(InvalidInput, match="repeats"):
        hf.measure(target, {"d": draft}, [PROMPT], [1], repeats=0)
    with pytest.raises(InvalidInput, match="top_k_save"):
        hf.dump_logits(tmp_path / "d.npz", target, {"d": draft}, [PROMPT], top_k_save=0)
    with pytest.raises(InvalidInput, match="draft name"):
        hf.dump_logits(tmp_path / "d.npz", target, {"a__b": draft}, [PROMPT])
    with pytest.raises(InvalidInput, match="does not exist"):
        check_dump_path(tmp_path / "no" / "d.npz")
    with pytest.raises(InvalidInput, match="threads"):
        hf.set_threads(0)
    assert not os.path.exists(tmp_path / "d.npz")


def test_library_messages_name_no_cli_flags():
    """Layers: the library's messages never name command-line options (the CLI adds its own words)."""
    import ast
    import pathlib
    import re

    root = pathlib.Path(hf.__file__).parent
    for f in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert not re.search(r"(?<![\w-])--[a-z]", node.value), (f.name, node.value)


def test_dump_measure_compare_with_filters(pair, tmp_path):
    """top-k / top-p / min-p reach every stage: the dump records them, its continuations are generate()'s under
    them, the prediction and the real loop use them; compare() gives one row per (draft, k)."""
    target, draft = pair
    params = dict(temperature=0.9, top_k=5, top_p=0.95, min_p=0.02)
    prompts = [PROMPT, [2, 4]]
    out = hf.dump_logits(tmp_path / "d", target, {"d": draft}, prompts, max_new_tokens=8, seed=4, **params)
    with load_dump(out) as d:
        assert {n: d.metadata[n] for n in params} == pytest.approx(params)
        for i, p in enumerate(prompts):
            again = hf.generate(target, p, seed=hf.loop.derive_seed(4, i), max_new_tokens=8, **params)
            np.testing.assert_array_equal(d.tokens[i, :d.lengths[i]], again)
    pred = hf.predict(out, ["d"], [1, 2], **params, trials=4)
    meas = hf.measure(target, {"d": draft}, prompts, [1, 2], max_new_tokens=8, seed=4, **params)
    again = hf.measure(target, {"d": draft}, prompts, [1, 2], max_new_tokens=8, seed=4, **params)
    assert [m.as_dict()["emitted"] for m in meas] == [m.as_dict()["emitted"] for m in again]
    rows = hf.compare(meas, pred)
    assert [(r["draft"], r["k"]) for r in rows] == [("d", 1), ("d", 2)]
    for r, m in zip(rows, meas, strict=True):
        assert m.runs == 2 and m.ci95[0] <= m.mean_acceptance_length <= m.ci95[1]
        assert r["relative_error"] == pytest.approx(
            (r["predicted"]["mean_acceptance_length_exact"] - m.mean_acceptance_length) / m.mean_acceptance_length)


def test_cli_sampling_options(model_dirs, tmp_path):
    """dump and measure take --top-k/--top-p/--min-p; a bad value is one line naming the option (exit 2)."""
    base = ["--target", model_dirs["target"], "--draft", "exit1", "--prompts", model_dirs["prompts"]]
    for cmd, extra in [("dump", ["--out", str(tmp_path / "x.npz"), "--top-p", "1.5"]),
                       ("measure", ["--top-k", "-1"]), ("measure", ["--min-p", "1"])]:
        res = _cli([cmd, *base, *extra])
        assert res.exit_code == 2, res.output
        assert extra[-2] in res.output and len(_lines(res.output)) == 1, res.output
    out = str(tmp_path / "f.npz")
    res = _cli(["dump", *base, "--out", out, "--max-new-tokens", "4", "--top-k", "3", "--top-p", "0.9",
                "--min-p", "0.01", "--threads", "1"])
    assert res.exit_code == 0, res.output
    with load_dump(out) as d:
        assert (int(d.metadata["top_k"]), float(d.metadata["top_p"]), float(d.metadata["min_p"])) == (3, 0.9, 0.01)
