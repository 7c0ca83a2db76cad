"""``fastspec audit-output``: output, and bad input as one line with exit code 2 (tiny random models)."""
from __future__ import annotations

import json

import pytest

from hf_models import save_model

pytestmark = pytest.mark.hf


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from fastspec import hf

    root = tmp_path_factory.mktemp("audit_cli")
    target = save_model(root / "target", 0)
    draft = save_model(root / "draft", 1, layers=1)
    prompts = root / "prompts.txt"
    prompts.write_text("a b c\nd e\nf a b c d\n")
    tmodel, tok = hf.load_model(target)
    dmodel, _ = hf.load_model(draft)
    ids = hf.read_prompts(str(prompts), tok)
    runs = [(p, hf.speculative_generate(tmodel, dmodel, p, k=2, seed=i, max_new_tokens=16, temperature=1.0))
            for i, p in enumerate(ids)]
    from fastspec.hf.audit import write_token_file

    tokens = write_token_file(root / "tokens.jsonl", runs)
    return {"root": root, "target": target, "prompts": str(prompts), "tokens": tokens, "ids": ids, "runs": runs}


def _cli(args):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    return CliRunner().invoke(app, args)


def assert_bad_input(setup, args, pattern):
    r = _cli(["audit-output", "--target", setup["target"], *args])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.strip().splitlines() if not ln.startswith("fastspec: loading")]
    assert len(lines) == 1 and lines[0].startswith("fastspec: error"), r.output
    assert pattern in lines[0], lines[0]


def test_json_and_table(setup):
    r = _cli(["audit-output", "--target", setup["target"], "--tokens", setup["tokens"], "--json", "--seed", "3",
              "--prompts", setup["prompts"]])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output[r.output.index("{"):])
    assert out["passed"] is True and out["tokens"] == 48 and out["prompts"] == 3
    assert out["config"]["temperature"] == 1.0 and "same distribution" in out["verdict"]
    assert "NaN" not in r.output
    r2 = _cli(["audit-output", "--target", setup["target"], "--tokens", setup["tokens"], "--seed", "3"])
    assert r2.exit_code == 0, r2.output
    assert r2.output.strip().splitlines()[-1] == out["verdict"]
    assert "Kolmogorov-Smirnov" in r2.output and "tail count" in r2.output


def test_greedy_table(setup):
    r = _cli(["audit-output", "--target", setup["target"], "--tokens", setup["tokens"], "--temperature", "0"])
    assert r.exit_code == 0, r.output
    assert "argmax mismatches" in r.output  # sampled tokens are not greedy: the verdict says so
    assert r.output.strip().splitlines()[-1].startswith(("FAILED", "passed"))


def _write(setup, name, text):
    p = setup["root"] / name
    p.write_text(text)
    return str(p)


def test_bad_token_files(setup, monkeypatch):
    ok = json.dumps({"prompt_token_ids": [2, 3], "token_ids": [4, 5]})
    cases = [
        (ok + "\n" + json.dumps({"prompt_token_ids": [2], "token_ids": [4, 8]}) + "\n",
         "line 2: token_ids[1] = 8 is outside the target's vocabulary [0, 8)"),
        (json.dumps({"prompt_token_ids": [2, 99], "token_ids": [4]}) + "\n", "prompt_token_ids[1] = 99"),
        (ok + "\n\n" + ok + "\n", ":2: empty line"),
        ("{\"prompt_token_ids\": [2,\n", ":1: not valid JSON"),
        ("[1, 2]\n", ":1: expected a JSON object"),
        (json.dumps({"token_ids": [4]}) + "\n", "missing field 'prompt_token_ids'"),
        (json.dumps({"prompt_token_ids": [2], "token_ids": [4.0]}) + "\n", "token_ids[0] = 4.0 is not an integer"),
        (json.dumps({"prompt_token_ids": [2], "token_ids": ["4"]}) + "\n", "token_ids[0] = '4' is not an integer"),
        (json.dumps({"prompt_token_ids": [True], "token_ids": [4]}) + "\n", "prompt_token_ids[0] = True"),
        (json.dumps({"prompt_token_ids": [2], "token_ids": [-1]}) + "\n", "token_ids[0] = -1 is negative"),
        ("{\"prompt_token_ids\": [2], \"token_ids\": [NaN]}\n", "not valid JSON"),
        (json.dumps({"prompt_token_ids": [], "token_ids": [4]}) + "\n", "prompt_token_ids is empty"),
        (json.dumps({"prompt_token_ids": [2], "token_ids": []}) + "\n", "token_ids is empty"),
        (json.dumps({"prompt_token_ids": [2], "token_ids": 4}) + "\n", "token_ids must be a list"),
        ("", "is empty"),
        (json.dumps({"prompt_token_ids": [2] * 100, "token_ids": [4] * 40}) + "\n", "max_position_embeddings"),
    ]
    for i, (text, pattern) in enumerate(cases):
        assert_bad_input(setup, ["--tokens", _write(setup, f"bad{i}.jsonl", text)], pattern)
    big = _write(setup, "big.jsonl", ok + "\n")
    monkeypatch.setattr("fastspec.io.tokens.MAX_TOKEN_FILE_BYTES", 10)
    assert_bad_input(setup, ["--tokens", big], "more than the 10 bytes")


def test_bad_flags(setup):
    t = setup["tokens"]
    assert_bad_input(setup, ["--tokens", str(setup["root"] / "missing.jsonl")], "no such file")
    assert_bad_input(setup, ["--tokens", str(setup["root"])], "not a regular file")
    assert_bad_input(setup, ["--tokens", t, "--epsilon", "0"], "--epsilon 0.0 is invalid")
    assert_bad_input(setup, ["--tokens", t, "--epsilon", "nan"], "--epsilon nan is invalid")
    assert_bad_input(setup, ["--tokens", t, "--temperature", "-1"], "--temperature")
    assert_bad_input(setup, ["--tokens", t, "--top-p", "2"], "--top-p")
    assert_bad_input(setup, ["--tokens", t, "--seed", str(2 ** 64)], "--seed")
    assert_bad_input(setup, ["--tokens", t, "--prompts", str(setup["root"] / "nope.txt")], "--prompts")
    mismatch = _write(setup, "other_prompts.txt", "a b c\nd e d\nf a b c d\n")
    assert_bad_input(setup, ["--tokens", t, "--prompts", mismatch], "line 2: prompt_token_ids (2 ids) differ")
    fewer = _write(setup, "fewer_prompts.txt", "a b c\n")
    assert_bad_input(setup, ["--tokens", t, "--prompts", fewer], "holds 1 prompts but")
