"""`fastspec simulate` through Typer's CliRunner: options, --json schema, errors, --plot."""
from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import save_dump
from fastspec_cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    rng = np.random.default_rng(3)
    n, t, v = 4, 20, 16
    target = rng.normal(0, 2, (n, t, v))
    drafts = {"near": (target + rng.normal(0, 0.5, (n, t, v))).astype(np.float16),
              "far": (target + rng.normal(0, 2.0, (n, t, v))).astype(np.float16)}
    path = tmp_path_factory.mktemp("d") / "pair.npz"
    return save_dump(str(path), target.astype(np.float16), drafts, temperature=1.0, top_k=0, top_p=1.0)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


RESULT_KEYS = {"draft", "k", "alpha", "mean_acceptance_length", "ci95", "mean_acceptance_length_exact",
               "draft_acceptance_rate", "per_position_acceptance", "accepted_length_histogram", "speedup"}


def test_json_schema(dump):
    r = run("simulate", dump, "--k", "1,2,4", "--json", "--draft-cost", "0.1", "--verify-cost", "1+0.05k")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert set(d) >= {"dump", "config", "results", "best", "warnings"}
    assert d["config"]["k"] == [1, 2, 4] and d["config"]["mode"] == "bernoulli"
    assert len(d["results"]) == 6
    for row in d["results"]:
        assert RESULT_KEYS <= set(row)
        assert len(row["per_position_acceptance"]) == row["k"]
        assert len(row["accepted_length_histogram"]) == row["k"] + 1
        lo, hi = row["ci95"]
        assert lo <= row["mean_acceptance_length"] <= hi
        cost = row["k"] * 0.1 + 1 + 0.05 * row["k"]
        assert row["speedup"] == pytest.approx(row["mean_acceptance_length_exact"] / cost)
        assert row["mc_agrees_with_exact"] is True
    assert set(d["best"]) == {"near", "far"} and all(k in (1, 2, 4) for k in d["best"].values())
    assert "NaN" not in r.stdout


def test_same_seed_same_output(dump):
    a = run("simulate", dump, "--k", "1-3", "--json", "--seed", "4").stdout
    b = run("simulate", dump, "--k", "1-3", "--json", "--seed", "4").stdout
    c = run("simulate", dump, "--k", "1-3", "--json", "--seed", "5").stdout
    assert a == b and a != c


def test_options(dump):
    r = run("simulate", dump, "--k", "2", "--draft", "near", "--temperature", "0.7", "--top-k", "8", "--top-p", "0.9",
            "--min-p", "0.01", "--trials", "40", "--seed", "1", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    cfg = d["config"]
    assert (cfg["temperature"], cfg["top_k"], cfg["top_p"], cfg["min_p"], cfg["trials"]) == (0.7, 8, 0.9, 0.01, 40)
    assert [row["draft"] for row in d["results"]] == ["near"]
    assert d["warnings"] and "differs" in d["warnings"][0]
    r = run("simulate", dump, "--k", "2", "--mode", "token", "--trials", "4", "--draft", "far", "--json")
    assert r.exit_code == 0, r.stderr
    row = json.loads(r.stdout)["results"][0]
    assert row["token_check"]["judged_positions"] > 0


def test_human_output(dump):
    r = run("simulate", dump, "--k", "1-3", "--draft-cost", "0.05", "--mode", "token", "--trials", "4")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "MC (95% CI)" in out and "95% CI prompts" in out and "per-position acceptance" in out
    assert "best k per draft" in out and "speed-up (95% CI)" in out
    assert "trajectory replay" in out and "token-mode check" in out
    assert out.rstrip().splitlines()[-1].startswith("best: ")  # the plain sentence ends the output
    r = run("simulate", dump, "--k", "2")
    assert r.stdout.rstrip().splitlines()[-1].startswith("speed-up not computed: the dump records no costs")


@pytest.mark.parametrize("args, needle", [
    (["--k", "0"], "--k"),
    (["--k", "x"], "--k"),
    (["--draft", "nope"], "no draft named 'nope'"),
    (["--temperature", "-1"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-2"], "--top-k"),
    (["--min-p", "1"], "--min-p"),
    (["--mode", "fast"], "--mode"),
    (["--trials", "1"], "--trials"),
    (["--draft-cost", "-1"], "--draft-cost"),
    (["--verify-cost", "1+x"], "--verify-cost"),
])
def test_bad_arguments(dump, args, needle):
    r = run("simulate", dump, *args)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_missing_and_corrupt_files(tmp_path):
    r = run("simulate", tmp_path / "missing.npz")
    assert r.exit_code == 2 and "no such file" in r.stderr
    bad = tmp_path / "corrupt.npz"
    bad.write_bytes(b"PK\x03\x04 this is not a zip file")
    r = run("simulate", bad)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_plot_writes_png(dump, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "plot.png"
    r = run("simulate", dump, "--k", "1-3", "--draft-cost", "0.1", "--plot", out)
    assert r.exit_code == 0, r.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_plot_without_matplotlib(dump, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    r = run("simulate", dump, "--plot", tmp_path / "p.png")
    assert r.exit_code == 2 and "pip install 'fastspec[plot]'" in r.stderr


def _top_lists(x, top):
    x = np.asarray(x, dtype=np.float64)
    lp = x - x.max(-1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1, kind="stable")[..., :top].astype(np.int32)
    return ids, np.take_along_axis(lp, ids, -1).astype(np.float32)


def test_argmax_drafts_on_a_sparse_dump_without_vocab_size(tmp_path):
    """Issue #30, item 4: --draft-sampling argmax crashed with a TypeError (`< None`) on a sparse dump without
    vocab_size, i.e. on every dump-server output.  It gives the documented bounds: they contain the dense dump's
    exact figures and equal those of the same lists with vocab_size recorded."""
    rng = np.random.default_rng(11)
    n, t, v = 3, 12, 16
    target = rng.normal(0, 2, (n, t, v))
    draft = target + rng.normal(0, 1.0, (n, t, v))
    dense = save_dump(str(tmp_path / "dd.npz"), target, {"d": draft}, temperature=1.0)
    lists = (_top_lists(target, 4), {"d": _top_lists(draft, 4)})
    bare = save_dump(str(tmp_path / "sp.npz"), *lists, temperature=1.0)
    sized = save_dump(str(tmp_path / "spv.npz"), *lists, temperature=1.0, vocab_size=v)
    out = {}
    for name, path in (("dense", dense), ("bare", bare), ("sized", sized)):
        r = run("simulate", path, "--k", "1,3", "--draft-sampling", "argmax", "--json")
        assert r.exit_code == 0 and "Traceback" not in r.stderr, r.stderr
        assert "NaN" not in r.stdout
        out[name] = json.loads(r.stdout)["results"]
    for x, y, z in zip(out["dense"], out["bare"], out["sized"], strict=True):
        assert y["draft_sampling"] == "argmax" and y["kind"] == "bounds"
        assert y["alpha_lower"] - 1e-9 <= x["alpha"] <= y["alpha_upper"] + 1e-9
        assert y["mean_acceptance_length_lower"] - 1e-9 <= x["mean_acceptance_length_exact"]
        assert x["mean_acceptance_length_exact"] <= y["mean_acceptance_length_upper"] + 1e-9
        for key in ("alpha_lower", "alpha_upper", "mean_acceptance_length_lower", "mean_acceptance_length_upper"):
            assert y[key] == z[key]
