"""Bounds of the real-model commands (dump, cost, measure): every integer option has a documented range checked
before any model is loaded, and the models' position limits are checked once they are loaded, before anything is
generated (issue items 8, 9, 10, 13 and 15).

A bad value must give exactly one line ``fastspec: error: --flag VALUE ...`` and exit 2.  The parse-time checks are
proved to run first by making the hf extra's import (``import_hf``: torch, transformers) fail the test if it is
reached, so these tests load nothing; the draft checks need the extra and make model loading fail instead; the
position checks load tiny random models and make the generating entry points fail the test if they are reached.
"""
from __future__ import annotations

import os
import re

import pytest
from typer.testing import CliRunner

from fastspec_cli import cost_cmd, dump_cmd, measure_cmd
from fastspec_cli.main import app

# the documented bounds (README "Bounds"; fastspec_cli._options), written out: the tests pin the contract
MAX_TOKENS = 2 ** 20  # --max-new-tokens, --context-length
MAX_REPEATS = 1000  # --repeats, --cost-repeats
MAX_WARMUP = 100  # --warmup
SEED_END = 2 ** 63  # --seed in [0, 2**63)


def available_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

_PROGRESS = re.compile(r"^fastspec: [\w ()]+: \d+(/\d+)?$")


def _cli(args):
    return CliRunner().invoke(app, args)


def assert_one_error(res, *needles) -> str:
    """The single error line of a result that exited 2, holding every needle."""
    assert "Traceback" not in res.output, res.output
    lines = [ln for ln in res.output.strip().splitlines() if not _PROGRESS.match(ln)]
    assert res.exit_code == 2, res.output
    assert len(lines) == 1 and lines[0].startswith("fastspec: error: "), res.output
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


class _Reached(AssertionError):
    pass


def _reached(res) -> bool:
    """Whether the command got past its checks to the stage a fixture made fail (the CLI reports it, exit 1)."""
    return res.exit_code == 1 and "_Reached" in res.output


@pytest.fixture
def no_hf(monkeypatch):
    """Fail the test when a command gets as far as importing the hf extra (torch; models load after it)."""
    def boom():
        raise _Reached("import_hf was reached: the option was not checked first")

    for mod in (cost_cmd, dump_cmd, measure_cmd):
        monkeypatch.setattr(mod, "import_hf", boom)


@pytest.fixture
def prompts(tmp_path):
    p = tmp_path / "prompts.txt"
    p.write_text("a b c\nd e\n")
    return str(p)


def _base(command, prompts, tmp_path):
    """The required options of ``command``, with a target that does not exist (nothing can load)."""
    target = str(tmp_path / "no-such-model")
    if command == "cost":
        return ["cost", "--target", target]
    if command == "dump":
        return ["dump", "--target", target, "--prompts", prompts, "--out", str(tmp_path / "d.npz")]
    return ["measure", "--target", target, "--prompts", prompts, "--draft", "ngram"]


# ------------------------------------------------------------------------------- parse time (no torch)

BIG = str(10 ** 12)


@pytest.mark.parametrize("command, flag, value", [
    # item 8: no allocation or generation sized by a huge count
    ("cost", "--max-new-tokens", BIG), ("cost", "--context-length", BIG), ("dump", "--max-new-tokens", BIG),
    ("measure", "--max-new-tokens", BIG), ("cost", "--max-new-tokens", str(MAX_TOKENS + 1)),
    ("cost", "--context-length", str(MAX_TOKENS + 1)), ("dump", "--max-new-tokens", str(MAX_TOKENS + 1)),
    # item 10: run-time guards
    ("cost", "--repeats", BIG), ("cost", "--warmup", BIG), ("measure", "--repeats", BIG),
    ("measure", "--cost-repeats", BIG), ("dump", "--cost-repeats", BIG), ("cost", "--repeats", str(MAX_REPEATS + 1)),
    ("cost", "--warmup", str(MAX_WARMUP + 1)), ("measure", "--cost-repeats", str(MAX_REPEATS + 1)),
    ("dump", "--top-k-save", str(2 ** 24 + 1)), ("measure", "--top-k-save", BIG),
    # item 15: one seed range for the three commands, before anything loads
    ("cost", "--seed", "-1"), ("cost", "--seed", str(2 ** 64)), ("cost", "--seed", str(10 ** 26)),
    ("cost", "--seed", str(SEED_END)), ("measure", "--seed", str(2 ** 64)), ("measure", "--seed", "-1"),
    ("dump", "--seed", "-1"), ("dump", "--seed", str(10 ** 26)),
])
@pytest.mark.usefixtures("no_hf")
def test_out_of_range_is_refused_before_torch(prompts, tmp_path, command, flag, value):
    line = assert_one_error(_cli([*_base(command, prompts, tmp_path), flag, value]), f"{flag} {value} ")
    assert "--dump" not in line  # measure blamed --dump for a seed simulate refused after 15 s of work


@pytest.mark.parametrize("command", ["cost", "dump", "measure"])
@pytest.mark.parametrize("value", ["100000", "0", str(available_cpus() + 1)])
@pytest.mark.usefixtures("no_hf")
def test_threads_bounded_before_torch(prompts, tmp_path, command, value):
    """Item 9: --threads 100000 crashed the process (OpenBLAS, RLIMIT_NPROC: rc -11) with no fastspec line."""
    line = assert_one_error(_cli([*_base(command, prompts, tmp_path), "--threads", value]), f"--threads {value} ")
    assert f"[1, {available_cpus()}]" in line


@pytest.mark.parametrize("command, args", [
    ("cost", ["--seed", str(SEED_END - 1), "--repeats", str(MAX_REPEATS), "--warmup", str(MAX_WARMUP),
              "--max-new-tokens", str(MAX_TOKENS), "--context-length", str(MAX_TOKENS), "--threads", "1"]),
    ("dump", ["--seed", "0", "--max-new-tokens", str(MAX_TOKENS), "--cost-repeats", str(MAX_REPEATS),
              "--top-k-save", str(2 ** 24), "--threads", str(available_cpus())]),
    ("measure", ["--seed", str(SEED_END - 1), "--repeats", str(MAX_REPEATS), "--cost-repeats", "1"]),
])
@pytest.mark.usefixtures("no_hf")
def test_values_at_the_bounds_pass_the_parse_time_checks(prompts, tmp_path, command, args):
    res = _cli([*_base(command, prompts, tmp_path), *args])
    assert _reached(res), res.output


@pytest.mark.parametrize("command, flags", [
    ("cost", ["--max-new-tokens", "--context-length", "--repeats", "--warmup", "--seed", "--threads"]),
    ("dump", ["--max-new-tokens", "--cost-repeats", "--top-k-save", "--seed", "--threads"]),
    ("measure", ["--max-new-tokens", "--repeats", "--cost-repeats", "--top-k-save", "--seed", "--threads"]),
])
def test_bounds_are_in_the_help(command, flags):
    res = _cli([command, "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())
    for needle in ("2**20", "[0, 2**63)", "the CPUs this process may run on", "1..1000"):
        assert needle in text, (command, needle)
    if command == "cost":
        assert "0..100" in text
    if command != "cost":
        assert "1..2**24" in text
    for flag in flags:
        assert flag in text


# ------------------------------------------------------------------------------- --draft before loading

@pytest.fixture
def no_loading(monkeypatch):
    hf = pytest.importorskip("fastspec.hf")

    def boom(*_a, **_k):
        raise _Reached("a model was loaded before --draft was checked")

    monkeypatch.setattr(hf, "resolve_models", boom)
    monkeypatch.setattr(hf, "load_model", boom)
    monkeypatch.setattr(hf.pipeline, "resolve_models", boom)  # measure's pipeline loads through it


@pytest.mark.hf
@pytest.mark.parametrize("command", ["cost", "measure", "dump"])
@pytest.mark.parametrize("spec", ["ngram1-99999999999999999999999", "look=ngram1-99999999999999999999999",
                                  "ngram3-1", "ngram0-2"])
@pytest.mark.usefixtures("no_loading")
def test_bad_ngram_draft_refused_before_loading(prompts, tmp_path, command, spec):
    """Item 13 (CLI part): a huge n-gram size ended in a long Numba TypingError after the models loaded."""
    base = _base(command, prompts, tmp_path)
    if command == "measure":
        base = base[:-2]  # its --draft ngram
    assert_one_error(_cli([*base, "--draft", spec]), "--draft", spec.split("=")[-1])


# ------------------------------------------------------------------------------- position limits, after loading

@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    import json

    from hf_models import save_model

    root = tmp_path_factory.mktemp("bounds-models")
    p = root / "prompts.txt"
    p.write_text("a b c\nd e\nf a b c d\n")  # longest prompt 5 tokens, median 3; the tiny models take 128
    short = save_model(root / "short", 1, layers=1)  # a draft that takes 64 positions only
    cfg = json.loads((root / "short" / "config.json").read_text())
    (root / "short" / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 64}))
    return {"target": save_model(root / "target", 0), "short": short, "prompts": str(p)}


@pytest.fixture
def no_generation(monkeypatch):
    """Fail the test when a command reaches an entry point that generates or times anything."""
    from fastspec import hf
    from fastspec.hf import pipeline

    def boom(*_a, **_k):
        raise _Reached("generation started before the position limit was checked")

    for name in ("dump_logits", "measure_costs", "measure", "generate", "speculative_generate"):
        monkeypatch.setattr(hf, name, boom)
        if hasattr(pipeline, name):  # measure's pipeline (fastspec.hf.measure_and_predict) calls them from there
            monkeypatch.setattr(pipeline, name, boom)


@pytest.mark.hf
@pytest.mark.parametrize("args, flag, value, detail", [
    (["cost", "--prompts", "{P}", "--max-new-tokens", "300"], "--max-new-tokens", "300",
     "need 162 positions but the target takes 128 (its max_position_embeddings); at most 233 fit"),
    (["cost", "--context-length", "125", "--k", "1-4"], "--context-length", "125",
     "a context of 125 tokens + the 5 tokens the timed forwards feed (largest k + 1) need 130 positions but the "
     "target takes 128 (its max_position_embeddings); at most 123 fit"),
    (["cost", "--context-length", "62", "--k", "2", "--draft", "small={S}"], "--context-length", "62",
     "need 65 positions but draft small takes 64 (its max_position_embeddings); at most 61 fit"),
    (["dump", "--prompts", "{P}", "--out", "{OUT}", "--max-new-tokens", "200"], "--max-new-tokens", "200",
     "the longest prompt (5 tokens) + 200 new tokens need 204 positions but the target takes 128 (its "
     "max_position_embeddings); at most 124 fit"),
    (["dump", "--prompts", "{P}", "--out", "{OUT}", "--max-new-tokens", "124", "--cost-k", "64"], "--cost-k", "64",
     "need 132 positions but the target takes 128 (its max_position_embeddings); at most 60 fit"),
    (["dump", "--prompts", "{P}", "--out", "{OUT}", "--max-new-tokens", "100", "--draft", "small={S}", "--no-costs"],
     "--max-new-tokens", "100", "need 104 positions but draft small takes 64 (its max_position_embeddings); "
     "at most 60 fit"),
    (["measure", "--prompts", "{P}", "--draft", "exit1", "--max-new-tokens", "200"], "--max-new-tokens", "200",
     "need 204 positions but the target takes 128"),
    (["measure", "--prompts", "{P}", "--draft", "ngram", "--k", "64", "--max-new-tokens", "124"], "--max-new-tokens",
     "124", "the cost context (the median-length prompt's 3 tokens + 124 // 2) + the 65 tokens the timed forwards "
     "feed (largest k + 1) need 130 positions but the target takes 128 (its max_position_embeddings); at most 121 fit"),
])
@pytest.mark.usefixtures("no_generation")
def test_position_limit_checked_before_generation(dirs, tmp_path, args, flag, value, detail):
    """Item 8: cost/measure generated for CPU-minutes before the position check; dump never checked it."""
    args = [a.format(P=dirs["prompts"], S=dirs["short"], OUT=tmp_path / "d.npz") for a in args]
    assert_one_error(_cli([args[0], "--target", dirs["target"], *args[1:]]), f"{flag} {value}: ", detail)
    assert not (tmp_path / "d.npz").exists()


@pytest.mark.hf
@pytest.mark.usefixtures("no_generation")
def test_values_that_fit_reach_the_run(dirs, tmp_path):
    """The largest values the messages name do fit: the command gets past every check to the run itself."""
    for args in (["cost", "--prompts", dirs["prompts"], "--max-new-tokens", "233"],
                 ["cost", "--context-length", "123", "--k", "1-4"],
                 ["cost", "--context-length", "61", "--k", "2", "--draft", f"small={dirs['short']}"],
                 ["dump", "--prompts", dirs["prompts"], "--out", str(tmp_path / "d.npz"), "--max-new-tokens", "124",
                  "--cost-k", "60"],
                 ["measure", "--prompts", dirs["prompts"], "--draft", "ngram", "--k", "64", "--max-new-tokens",
                  "121"]):
        res = _cli([args[0], "--target", dirs["target"], *args[1:]])
        assert _reached(res), (args, res.output)


# ------------------------------------------------------------------------------- the library's checks

@pytest.mark.hf
def test_library_refuses_before_generating(monkeypatch, tmp_path):
    """fastspec.hf: max_new_tokens and context_length are capped at 2**20, and measure_costs, dump_logits and
    measure check the models' position limits before the first forward (measure_costs generated its context
    first: 14 CPU-minutes for a huge max_new_tokens)."""
    import importlib

    from hf_models import tiny

    from fastspec import hf
    from fastspec.errors import InvalidInput

    from fastspec_cli import _options

    assert hf.args.MAX_NEW_TOKENS == _options.MAX_TOKENS == MAX_TOKENS  # one cap, library and command line
    target, draft = tiny(0), tiny(1, layers=1)  # 128 positions each
    draft.config.max_position_embeddings = 32

    def boom(*_a, **_k):
        raise _Reached("generated before checking the position limit")

    for mod in ("fastspec.hf.timing", "fastspec.hf.dumping", "fastspec.hf.measure"):
        m = importlib.import_module(mod)
        for name in ("generate", "timed_generate", "speculative_generate"):
            if hasattr(m, name):
                monkeypatch.setattr(m, name, boom)
    for call, match in [
        (lambda: hf.args.check_max_new_tokens(MAX_TOKENS + 1), r"max_new_tokens = 1048577 is invalid.*1048576"),
        (lambda: hf.measure_costs(target, context_length=MAX_TOKENS + 1), "context_length = 1048577 is invalid"),
        (lambda: hf.measure_costs(target, context_length=10 ** 12), "context_length"),
        (lambda: hf.measure_costs(target, prompts=[[1, 2, 3]], max_new_tokens=300, ks=[1]),
         r"max_new_tokens = 300: .* need 155 positions but the target takes 128.*at most 247 fit"),
        (lambda: hf.measure_costs(target, {"d": draft}, context_length=30, ks=[2]),
         "context_length = 30: .* need 33 positions but draft d takes 32"),
        (lambda: hf.dump_logits(tmp_path / "d.npz", target, {}, [[1, 2, 3]], max_new_tokens=127, costs=False),
         "max_new_tokens = 127: the longest prompt .3 tokens. . 127 new tokens need 129 positions"),
        (lambda: hf.dump_logits(tmp_path / "d.npz", target, {"d": draft}, [[1, 2]], max_new_tokens=40,
                                costs=False), "need 41 positions but draft d takes 32"),
        (lambda: hf.dump_logits(tmp_path / "d.npz", target, {}, [[1, 2]], max_new_tokens=100, cost_k=[80]),
         r"cost_k = 80: .* need 133 positions.*at most 75 fit"),
        (lambda: hf.measure(target, {"d": draft}, [[1, 2]], [1], max_new_tokens=40),
         "need 41 positions but draft d takes 32"),
        (lambda: hf.measure(target, {"n": "ngram"}, [[1, 2]], [1], max_new_tokens=200), "need 201 positions"),
    ]:
        with pytest.raises(InvalidInput, match=match):
            call()
    assert not (tmp_path / "d.npz").exists()
    assert hf.timing.check_cost_context(target, {"d": draft}, ks=[2], context_length=29) == 29
