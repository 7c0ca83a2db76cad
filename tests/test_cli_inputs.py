"""`fastspec simulate` and `fastspec inspect` with hostile and careless input (issue #12): every mistake is one
line naming the flag and the value as typed (exit 2), bounds before work, paths printed as they are, the plot
path checked first and reported as written, results never lost to the plot."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import save_dump
from fastspec_cli import simulate_cmd
from fastspec_cli.main import app

runner = CliRunner()
SYNTHETIC = os.path.join(os.path.dirname(__file__), os.pardir, "data", "synthetic_pair.npz")


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    rng = np.random.default_rng(5)
    target = rng.normal(0, 2, (3, 10, 8))
    path = tmp_path_factory.mktemp("d") / "small.npz"
    return save_dump(str(path), target, {"near": target + rng.normal(0, 0.5, target.shape),
                                         "far": target + rng.normal(0, 2, target.shape)},
                     temperature=1.0, top_k=0, top_p=1.0)


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def one_line_error(r, needle, code=2):
    assert r.exit_code == code, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastspec: error: ") and needle in lines[0], r.stderr
    assert "np." not in r.stderr and "Traceback" not in r.stderr
    return lines[0]


# ------------------------------------------------------------------ --verify-cost

@pytest.mark.parametrize("spec", ["1-+2k", "2-+1", "--", "+", "1+", "k*2", "1 2", "inf"])
def test_verify_cost_is_parsed_by_its_grammar(dump, spec):
    # before: 1-+2k ran as 1 + 2k, 2-+1 as 3, -- and + as the constant 0 (exit 0)
    line = one_line_error(run("simulate", dump, "--draft-cost", "0.1", f"--verify-cost={spec}"), "--verify-cost")
    assert "a sum of terms joined by + or -" in line


def test_verify_cost_documented_forms(dump, tmp_path):
    table = tmp_path / "cost.json"
    table.write_text('{"1": 1.02, "2": 1.05}')
    for spec, cost2 in (("1", 1.0), ("1+0.05k", 1.1), ("1 + 0.05*k", 1.1), ("0.05k+1", 1.1),
                        ('{"1": 1.02, "2": 1.05}', 1.05), (str(table), 1.05)):
        r = run("simulate", dump, "--k", "1,2", "--draft-cost", "0.1", "--verify-cost", spec, "--json")
        assert r.exit_code == 0, r.stderr
        row = [x for x in json.loads(r.stdout)["results"] if x["k"] == 2][0]
        assert row["speedup"] == pytest.approx(row["mean_acceptance_length_exact"] / (0.2 + cost2)), spec


# ------------------------------------------------------------------ sampling flags: the flag, the value as typed

@pytest.mark.parametrize("command", ["simulate", "inspect"])
@pytest.mark.parametrize("flag, value", [("--temperature", "inf"), ("--temperature", "nan"), ("--temperature", "-0.7"),
                                         ("--top-p", "nan"), ("--top-p", "1.5"), ("--top-p", "0"), ("--min-p", "inf"),
                                         ("--min-p", "1"), ("--top-k", "-3")])
def test_sampling_flag_errors_name_the_flag_and_the_value(dump, command, flag, value):
    line = one_line_error(run(command, dump, f"{flag}={value}"), f"{flag} {value} is invalid")
    assert "temperature =" not in line and "top_p" not in line and "min_p" not in line and "top_k" not in line


@pytest.mark.parametrize("args, flag", [
    (["--trials", "1"], "--trials 1 is invalid"), (["--trials", "10000001"], "--trials 10000001 is invalid"),
    (["--block-trials", "0"], "--block-trials 0 is invalid"), (["--mode", "fast"], "--mode 'fast'"),
    (["--block-trials", "100000000"], "--block-trials 100000000 is invalid"),
    (["--k", "1-100000000"], "--k range '1-100000000' is outside [1, 256]"), (["--k", "0"], "--k 0 is invalid"),
    (["--seed", str(2 ** 64)], f"--seed {2 ** 64} does not fit"), (["--candidates", "2.5"], "--candidates 2.5"),
    (["--candidates", "1,2.0"], "--candidates 2.0"), (["--candidates", "65"], "--candidates 65 is invalid"),
    (["--verify", "tree"], "--verify"), (["--candidate-sampling", "without_replacement"], "--candidate-sampling"),
    (["--verify", "block", "--candidates", "2"], "--verify/--candidates"),
])
def test_simulate_flag_errors_before_any_work(dump, args, flag):
    # --block-trials is checked without --verify block; --seed is named; nothing is read before the checks
    one_line_error(run("simulate", dump, *args), flag)


@pytest.mark.parametrize("trials", ["1", "10000001"])
def test_measure_trials_bounded_before_any_model_is_loaded(trials):
    """measure's --trials has simulate's bounds and is refused before the models are read (here: none exist)."""
    line = one_line_error(run("measure", "--target", "no-such-model", "--draft", "exit1", "--prompts", "no-such-file",
                              "--trials", trials), f"--trials {trials} is invalid")
    assert "no-such" not in line  # the bound came first: nothing was looked for on disk


@pytest.mark.parametrize("command, args", [("simulate", ["--trials", "2.5"]), ("simulate", ["--block-trials", "2.5"]),
                                           ("simulate", ["--k", "2.5"]), ("simulate", ["--top-k", "2.5"]),
                                           ("simulate", ["--seed", "2.5"]), ("inspect", ["--k", "2.5"]),
                                           ("inspect", ["--top-k", "2.5"])])
def test_no_integer_option_is_truncated(dump, command, args):
    r = run(command, dump, *args)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_inspect_k_is_bounded_before_work(dump):
    line = one_line_error(run("inspect", dump, "--k", "1000000000"), "--k 1000000000 is too large")
    assert "256" in line  # the documented cap is named


def test_a_repeated_draft_is_reported_once(dump):
    r = run("simulate", dump, "--k", "1,2", "--draft", "near", "--draft", "near", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["config"]["drafts"] == ["near"] and [(x["draft"], x["k"]) for x in d["results"]] == [("near", 1),
                                                                                                 ("near", 2)]


# ------------------------------------------------------------------ intervals, defaults, warnings

def test_two_trials_report_no_zero_width_interval(tmp_path):
    p = np.log([0.5, 0.3, 0.2])
    q = np.log([0.2, 0.5, 0.3])
    path = save_dump(str(tmp_path / "one.npz"), np.tile(p, (1, 2, 1)), {"d": np.tile(q, (1, 2, 1))}, temperature=1.0)
    r = run("simulate", path, "--k", "1", "--trials", "2", "--json")  # seed 0: both trials agree
    row = json.loads(r.stdout)["results"][0]
    assert row["ci95"] is None and row["mc_vs_exact_z"] is None and row["mc_agrees_with_exact"] is None
    assert "WARNING" not in r.stderr
    r = run("simulate", path, "--k", "1", "--trials", "2")
    assert r.exit_code == 0 and "n/a" in r.stdout and "no Monte-Carlo interval" in r.stdout and "inf" not in r.stdout


def test_token_mode_default_trials(dump):
    r = run("simulate", dump, "--k", "2", "--mode", "token", "--json")
    assert json.loads(r.stdout)["config"]["trials"] == 20


def test_disagreement_warning_names_the_check_and_its_threshold(dump, monkeypatch):
    from fastspec.simulation import runners

    honest = runners.bernoulli
    monkeypatch.setattr(runners, "bernoulli", lambda alpha, *a, **kw: honest(alpha * 0.5, *a, **kw))
    r = run("simulate", dump, "--k", "3", "--draft", "near", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["results"][0]["mc_agrees_with_exact"] is False
    assert "disagrees with the exact expectation (|z| = " in r.stderr and "> 4.90)" in r.stderr
    assert "probability 0.0001" in r.stderr


# ------------------------------------------------------------------ user text printed as it is

@pytest.mark.parametrize("name", ["x[/bold].npz", "[red]y.npz", "[link=file:///]z[/link].npz"])
def test_markup_in_paths_is_printed_as_it_is(tmp_path, monkeypatch, name):
    # before the markup-free consoles: x[/bold].npz crashed the human output after the computation, and
    # [red]y.npz was shown as y.npz
    monkeypatch.chdir(tmp_path)
    os.makedirs(os.path.dirname(name) or ".", exist_ok=True)
    shutil.copy(SYNTHETIC, name)
    r = run("simulate", name, "--k", "1,2", "--temperature", "0.7", "--draft-cost", "0.1")
    assert r.exit_code == 0, r.stderr
    assert f"fastspec simulate {name}  (T=0.7" in r.stdout and "warning: the requested sampling" in r.stdout
    r = run("inspect", name)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith(f"{name}  (.npz") and "draft_logits__near" in r.stdout


# ------------------------------------------------------------------ --plot

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")


@needs_matplotlib
def test_plot_suffix_is_added_and_reported(dump, tmp_path):
    r = run("simulate", dump, "--k", "1,2", "--plot", tmp_path / "curves")
    assert r.exit_code == 0, r.stderr
    written = tmp_path / "curves.png"
    assert written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not (tmp_path / "curves").exists()
    assert f"plot written to {written}" in r.stdout


@needs_matplotlib
def test_plot_with_json_keeps_stdout_json(dump, tmp_path):
    r = run("simulate", dump, "--k", "1", "--json", "--plot", tmp_path / "p")
    assert r.exit_code == 0 and json.loads(r.stdout)["results"]
    assert f"plot written to {tmp_path / 'p.png'}" in r.stderr


@needs_matplotlib
@pytest.mark.parametrize("where, needle", [("missing/dir/p.png", "does not exist"),
                                           ("file.txt/p.png", "not a directory"), ("adir.png", "not a regular file")])
def test_bad_plot_paths_are_refused_before_computing(dump, tmp_path, monkeypatch, where, needle):
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "adir.png").mkdir()
    monkeypatch.setattr(simulate_cmd, "open_scheduler", lambda _s: pytest.fail("computed before checking --plot"))
    line = one_line_error(run("simulate", dump, "--plot", tmp_path / where), "--plot")
    assert needle in line and r"\[" not in line


@needs_matplotlib
def test_unwritable_plot_path_is_refused_before_computing(dump, tmp_path, monkeypatch):
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        target = ro / "p.png"
    elif os.path.isdir("/sys/kernel"):  # root writes anywhere a mode allows: use a directory nobody may create in
        target = "/sys/fastspec-cannot-write.png"
    else:
        pytest.skip("no unwritable directory for root here")
    monkeypatch.setattr(simulate_cmd, "open_scheduler", lambda _s: pytest.fail("computed before checking --plot"))
    one_line_error(run("simulate", dump, "--plot", target), "cannot write a file there")
    existing = tmp_path / "keep.png"
    existing.write_bytes(b"old")
    monkeypatch.undo()
    assert run("simulate", dump, "--k", "1", "--plot", existing).exit_code == 0 and existing.stat().st_size > 3


@needs_matplotlib
def test_results_survive_a_plot_that_fails_late(dump, tmp_path, monkeypatch):
    def broken(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(simulate_cmd, "_plot", broken)
    r = run("simulate", dump, "--k", "1", "--json", "--plot", tmp_path / "p.png")
    assert json.loads(r.stdout)["results"]  # the JSON came first
    one_line_error(r, "--plot", code=1)
    assert not (tmp_path / "p.png").exists()
