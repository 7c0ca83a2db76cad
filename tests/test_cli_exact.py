"""`fastspec exact` and `fastspec audit` through Typer's CliRunner, including every bad input."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fastspec_cli.main import app

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args))


def test_exact_worked_case_human():
    r = run("exact", "--p", "0.5,0.3,0.2", "--q", "0.2,0.5,0.3")
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "acceptance alpha = sum min(p, q) = 7/10" in out
    assert "rejection 1 - alpha = 3/10" in out
    assert "recovered = residual / sum(residual) = (1, 0, 0)" in out
    assert "(1/2, 3/10, 1/5) = p exactly" in out
    assert "nan" not in out.lower()


def test_exact_worked_case_json():
    r = run("exact", "--p", "0.5,0.3,0.2", "--q", "0.2,0.5,0.3", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["accepted"] == ["1/5", "3/10", "1/5"]
    assert d["acceptance"] == "7/10" and d["rejection"] == "3/10"
    assert d["residual"] == ["3/10", "0/1", "0/1"]
    assert d["recovered"] == ["1/1", "0/1", "0/1"]
    assert d["output"] == d["p"] == ["1/2", "3/10", "1/5"]
    assert d["output_equals_p"] is True


def test_exact_equal_distributions():
    r = run("exact", "--p", "0.5,0.5", "--q", "0.5,0.5")
    assert r.exit_code == 0
    assert "rejection is impossible" in r.stdout
    assert "recovered = residual" not in r.stdout and "output = accepted = (1/2, 1/2)" in r.stdout
    assert "nan" not in r.stdout.lower()
    d = json.loads(run("exact", "--p", "0.5,0.5", "--q", "0.5,0.5", "--json").stdout)
    assert d["recovered"] is None and d["rejection"] == "0/1"


def test_exact_normalize():
    r = run("exact", "--p", "5,3,2", "--q", "2,5,3", "--normalize", "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["acceptance"] == "7/10"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--p", "0.5,abc", "--q", "0.5,0.5"], "--p[1] is 'abc', not a number"),
        (["--p", "", "--q", "0.5,0.5"], "--p is empty"),
        (["--p", "0.5,,0.5", "--q", "0.5,0.2,0.3"], "empty entry at index 1"),
        (["--p", "0.5,0.5", "--q", "1"], "length mismatch"),
        (["--p=-0.5,1.5", "--q", "0.5,0.5"], "negative"),
        (["--p", "0.5,0.4", "--q", "0.5,0.5"], "--normalize"),
        (["--p", "inf,0", "--q", "0.5,0.5"], "finite"),
        (["--p", "0.5,0.5"], "Missing option '--q'"),
    ],
)
def test_exact_bad_input(args, needle):
    r = run("exact", *args)
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert needle in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize(
    "policy, extra, output, acceptance, tv",
    [
        ("standard", [], ["1/2", "3/10", "1/5"], "7/10", "0/1"),
        ("prune_by_draft_prob_corrected", ["--tau", "0.3"], ["1/2", "3/10", "1/5"], "2/5", "0/1"),
        ("exact_match", [], ["1/2", "3/10", "1/5"], "31/100", "0/1"),
        ("prune_by_draft_prob", ["--tau", "0.3"], ["2/5", "9/25", "6/25"], "1/2", "1/10"),
        ("unnormalized_residual", [], ["29/100", "3/10", "41/100"], "7/10", "21/100"),
        ("resample_from_target", [], ["7/20", "39/100", "13/50"], "7/10", "3/20"),
        ("typical_acceptance", ["--epsilon", "0.25", "--delta", "1"], ["1/2", "1/2", "0/1"], "7/10", "1/5"),
    ],
)
def test_audit_policies(policy, extra, output, acceptance, tv):
    r = run("audit", "--policy", policy, "--p", "0.5,0.3,0.2", "--q", "0.2,0.5,0.3", *extra, "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["output"] == output and d["acceptance"] == acceptance and d["total_variation"] == tv
    assert d["exact"] == (tv == "0/1")


def test_audit_human():
    r = run("audit", "--policy", "unnormalized_residual", "--p", "0.5,0.3,0.2", "--q", "0.2,0.5,0.3")
    assert r.exit_code == 0
    assert "total variation to p = 21/100" in r.stdout and "NOT exact" in r.stdout
    r = run("audit", "--p", "0.5,0.3,0.2", "--q", "0.2,0.5,0.3")
    assert "exact: output == p" in r.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--policy", "bogus", "--p", "1", "--q", "1"], "unknown policy 'bogus'"),
        (["--policy", "prune_by_draft_prob", "--p", "1", "--q", "1"], "needs --tau"),
        (["--policy", "prune_by_draft_prob", "--tau", "x", "--p", "1", "--q", "1"], "--tau is 'x', not a number"),
        (["--policy", "prune_by_draft_prob", "--tau", "2", "--p", "1", "--q", "1"], "must lie in [0, 1]"),
        (["--p", "0.5,0.5", "--q", "0.5,x"], "--q[1] is 'x', not a number"),
        (["--p", "0.3,0.3", "--q", "0.5,0.5"], "sums to 3/5"),
    ],
)
def test_audit_bad_input(args, needle):
    r = run("audit", *args)
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_unknown_command_and_no_args():
    r = run("bogus")
    assert r.exit_code == 2 and "No such command" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run()
    assert r.exit_code == 2 and "Usage" in r.stdout + r.stderr


def test_help_lists_commands():
    r = run("--help")
    assert r.exit_code == 0 and "exact" in r.stdout and "audit" in r.stdout


# ----------------------------------------------------------------- regressions (issue 11)

def test_exact_accepts_fractions_as_the_help_says():
    r = run("exact", "--p", "1/3,2/3", "--q", "1/2, 1/2", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["p"] == ["1/3", "2/3"] and d["acceptance"] == "5/6" and d["recovered"] == ["0/1", "1/1"]
    r = run("audit", "--policy", "prune_by_draft_prob", "--tau", "1/3", "--p", "1/2,3/10,1/5", "--q", "1/5,1/2,3/10",
            "--json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["params"] == {"tau": "1/3"}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--tau", "0.3"], "--tau does not apply to policy 'standard'; it is for: prune_by_draft_prob, "
                           "prune_by_draft_prob_corrected"),
        (["--policy", "exact_match", "--epsilon", "0.1"], "--epsilon does not apply to policy 'exact_match'"),
        (["--policy", "prune_by_draft_prob", "--tau", "0.3", "--delta", "1"], "--delta does not apply"),
        (["--policy", "typical_acceptance", "--tau", "0.3"], "--tau does not apply to policy 'typical_acceptance'"),
        (["--policy", "typical_acceptance", "--epsilon", "-1"], "--epsilon -1: epsilon = -1 must be >= 0"),
        (["--policy", "prune_by_draft_prob", "--tau", "1/0"], "--tau is '1/0', not a number"),
        (["--p", "1/3,1/3", "--q", "1/2,1/2"], "--p sums to 2/3"),
        (["--p", "nan,1", "--q", "1/2,1/2"], "--p[0] is 'nan'; probabilities must be finite"),
    ],
)
def test_audit_refuses_what_it_would_ignore(args, needle):
    pq = [] if "--p" in args else ["--p", "0.5,0.5", "--q", "0.5,0.5"]
    r = run("audit", *args, *pq)
    assert r.exit_code == 2, r.stdout
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "normalize=True" not in r.stderr and "CLI" not in r.stderr


def test_typical_acceptance_defaults_still_apply():
    r = run("audit", "--policy", "typical_acceptance", "--p", "0.5,0.3,0.2", "--q", "0.2,0.5,0.3", "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["params"] == {"epsilon": "9/100", "delta": "3/10"} and d["total_variation"] == "3/10"


def test_help_names_the_defaults_and_the_fraction_syntax():
    r = run("audit", "--help")
    assert r.exit_code == 0
    text = " ".join(r.stdout.replace("\u2502", " ").split())  # rich draws a box: drop its edges
    assert "default 0.09" in text and "default 0.3" in text and "1/3 also works" in text


@pytest.mark.parametrize("command", ["simulate", "inspect", "dump", "measure", "cost", "exact", "audit"])
def test_help_shows_square_brackets_and_no_bool_metavar(command):
    """Help text is not read as rich markup: extras keep their brackets, boolean flags show no ``<bool>``."""
    r = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "<bool>" not in r.output and "BOOLEAN" not in r.output
    if command == "simulate":
        text = " ".join(r.output.split())  # help lines wrap
        assert "pip install 'fastspec[plot]'" in text and "pip install 'fastspec[dask]'" in text
