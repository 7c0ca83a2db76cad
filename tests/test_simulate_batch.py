"""``simulate --batch`` (issue 24, item 2): throughput and speed-up per batch size from a version-2 cost table,
against a hand computation; best k per batch; break-even detection; the static-batch expected maximum against a
brute-force enumeration; bad input (one line, exit 2); the CLI's table, --json and --plot."""
from __future__ import annotations

import copy
import itertools
import json
import math
from fractions import Fraction

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec.costs import CostTable, MissingBatchEntries, StepCost
from fastspec.errors import InvalidInput, InvalidType
from fastspec.simulation import simulate
from fastspec.simulation.batch import _break_even, batch_predictions, check_batch_table, expected_max
from fastspec.simulation.results import DraftKResult, SimulationResult
from fastspec.simulation.speedup import speedup_interval
from fastspec_cli.main import app

BS = (1, 2, 4, 8)


def table_dict(drafts=("d",), growth=0.25):
    """A version-2 table: the target forward grows with the B n tokens it feeds (``growth`` per 8 tokens)."""
    def target(b):
        return {str(n): 0.020 * (1 + growth * b * n / 8) for n in range(1, 10)}

    obj = {"version": 2, "machine": "fake", "threads": 2, "context_length": 64, "note": "made up for the tests",
           "target": {"forward_s": target(1), "forward_s_se": {str(n): 0.0002 for n in range(1, 10)},
                      "batch_forward_s": {str(b): target(b) for b in BS if b > 1}},
           "drafts": {}, "overhead_s": {str(k): 0.0005 + 0.0001 * k for k in range(0, 9)},
           "batch_overhead_s": {str(b): {str(k): (0.0005 + 0.0001 * k) * b for k in range(0, 9)} for b in BS if b > 1}}
    for name in drafts:
        obj["drafts"][name] = {"forward_s": {"1": 0.004, "2": 0.0045},
                               "batch_forward_s": {str(b): {"1": 0.004 * (1 + 0.1 * b), "2": 0.0045 * (1 + 0.1 * b)}
                                                   for b in BS if b > 1}}
    return obj


def row(draft, k, m, p_all=0.5, half=0.1, kind="model"):
    return DraftKResult(draft=draft, k=k, alpha=0.7, mean_acceptance_length=m, ci95=None,
                        mean_acceptance_length_exact=m, draft_acceptance_rate=0.7, per_position_acceptance=None,
                        accepted_length_histogram=None, speedup=None, ci95_sequences=(m - half, m + half),
                        p_all_accepted=p_all, kind=kind)


def result(rows):
    return SimulationResult(dump="fake.npz", config={"k": sorted({r.k for r in rows}), "costs": None}, results=rows,
                            best={}, warnings=[], alpha_summary={}, assumptions=[])


def test_hand_computation():
    t = CostTable.from_dict(table_dict())
    res = result([row("d", 1, 1.6, p_all=0.6), row("d", 2, 2.0, p_all=0.4)])
    bp = batch_predictions(res, t, [1, 4])
    r = next(x for x in bp.rows if x.batch == 4 and x.k == 2)
    tgt = {n: 0.020 * (1 + 0.25 * 4 * n / 8) for n in (1, 3)}
    plain = tgt[1] + 0.0005 * 4
    q = 1 - (1 - 0.4) ** 4  # some sequence of the 4 accepted every draft: the first draft forward feeds 2 tokens
    step = q * 0.0045 * 1.4 + (1 - q) * 0.004 * 1.4 + 0.004 * 1.4 + tgt[3] + 0.0007 * 4
    assert r.step_s == pytest.approx(step, rel=1e-12)
    assert r.tokens_per_s == pytest.approx(4 * 2.0 / step, rel=1e-12)
    assert r.tokens_per_s_per_sequence == pytest.approx(2.0 / step, rel=1e-12)
    assert r.speedup == pytest.approx(2.0 * plain / step, rel=1e-12)
    rel = StepCost(t, "d", batch=4).relative_se(2, 0.4)
    assert rel == 0.0  # no standard errors at B = 4 in this table
    assert r.speedup_ci95 == pytest.approx(speedup_interval(r.speedup, 2.0, 0.1, rel))
    p4 = next(p for p in bp.plain if p["batch"] == 4)
    assert p4["tokens_per_s"] == pytest.approx(4 / plain)
    assert p4["tokens_per_s_per_sequence"] == pytest.approx(1 / plain)
    # batch 1 is the version-1 loop cost (StepCost at batch 1), the same figure simulate prints
    r1 = next(x for x in bp.rows if x.batch == 1 and x.k == 1)
    assert r1.speedup == pytest.approx(1.6 * t.plain_step_s() / StepCost(t, "d").step_s(1, 0.6), rel=1e-12)
    d = bp.as_dict()
    assert json.loads(json.dumps(d)) == d and d["model"] == "continuous batching"
    assert d["best"]["4"] == {"d": bp.best[4]["d"]} and not d["static"] and not d["extrapolated"]


def test_best_k_per_batch_and_break_even_on_a_table():
    # a compute-bound target: verifying B (k + 1) tokens grows fast with B, so large k stop paying first
    t = CostTable.from_dict(table_dict(growth=0.6))
    res = result([row("d", 1, 1.7, 0.7), row("d", 4, 3.0, 0.3)])
    bp = batch_predictions(res, t, BS)
    s = {(r.k, r.batch): r.speedup for r in bp.rows}
    assert s[(4, 1)] > s[(1, 1)] and bp.best[1]["d"] == 4  # at batch 1 the long draft wins
    assert s[(4, 8)] < s[(1, 8)] and bp.best[8]["d"] == 1  # at batch 8 the short one
    be = {e["k"]: e for e in bp.break_even}
    for k in (1, 4):
        e = be[k]
        pays = [s[(k, b)] > 1 for b in BS]
        if all(pays):
            assert e["status"] == "pays at every batch measured"
        else:  # monotone here: pays up to some B, then not
            i = pays.index(False)
            assert all(pays[:i]) and not any(pays[i:])
            assert (e["pays_up_to"], e["stops_at"]) == (BS[i - 1], BS[i])
            assert BS[i - 1] < e["break_even_estimate"] < BS[i]
    assert be[4]["status"] == "stops paying"


def test_break_even_cases():
    e = _break_even("d", 2, [(1, 1.5), (2, 1.2), (4, 0.9), (8, 0.5)])
    assert (e["status"], e["pays_up_to"], e["stops_at"]) == ("stops paying", 2, 4)
    t = math.log(1.2) / (math.log(1.2) - math.log(0.9))
    assert e["break_even_estimate"] == pytest.approx(2 * 2 ** t)
    assert "stops paying above B = 2" in e["text"]
    assert _break_even("d", 2, [(1, 1.5), (8, 1.01)])["status"] == "pays at every batch measured"
    assert _break_even("d", 2, [(1, 0.9), (8, 0.5)])["status"] == "never pays"
    odd = _break_even("d", 2, [(1, 0.9), (2, 1.1), (4, 0.8)])
    assert odd["status"] == "pays at some batch sizes" and "B = 2 only" in odd["text"]
    # exactly 1 does not pay
    assert _break_even("d", 2, [(1, 1.0)])["status"] == "never pays"


def brute_expected_max(values, b):
    vals = [Fraction(v) for v in values]
    n = len(vals)
    total = sum(max(c) for c in itertools.product(vals, repeat=b))
    return total / Fraction(n) ** b


@pytest.mark.parametrize("values, b", [([3, 1, 2], 1), ([3, 1, 2], 3), ([5, 5, 1, 2], 2), ([7], 4),
                                       ([1, 4, 2, 8, 3], 3)])
def test_expected_max_matches_enumeration(values, b):
    assert expected_max(values, b) == pytest.approx(float(brute_expected_max(values, b)), rel=1e-12)


def test_expected_max_broken_variant_fails():
    # the mean instead of the maximum: what a static batch must not use
    values, b = [1, 4, 2, 8, 3], 3
    assert float(np.mean(values)) != pytest.approx(float(brute_expected_max(values, b)), rel=1e-3)


def test_static_batch_from_per_sequence_figures():
    t = CostTable.from_dict(table_dict())
    res = result([row("d", 2, 2.0, 0.4)])
    tokens, steps = np.array([40.0, 20.0, 30.0]), np.array([20.0, 12.0, 14.0])
    bp = batch_predictions(res, t, [1, 4], per_sequence={("d", 2): (tokens, steps)})
    assert bp.static and any("static synchronous batch" in a for a in bp.assumptions)
    r = next(x for x in bp.rows if x.batch == 4)
    plain = StepCost(t, batch=4).plain_step_s()
    want = float(brute_expected_max(tokens, 4)) * plain / (float(brute_expected_max(steps, 4)) * r.step_s)
    assert r.static_speedup == pytest.approx(want, rel=1e-12)
    assert r.static_tokens_per_s == pytest.approx(4 * 30.0 / (float(brute_expected_max(steps, 4)) * r.step_s))
    with pytest.raises(InvalidInput, match="per_sequence"):
        batch_predictions(res, t, [4], per_sequence={("d", 2): (tokens, steps[:2])})


def test_bad_input():
    t = CostTable.from_dict(table_dict())
    res = result([row("d", 1, 1.6)])
    with pytest.raises(InvalidInput, match=r"batches item 0 = 0 is outside \[1, 4096\]"):
        batch_predictions(res, t, "0,2")
    with pytest.raises(InvalidInput, match=r"batches\[1\] = 4097 is outside"):
        batch_predictions(res, t, [1, 4097])
    v1 = table_dict()
    v1["version"] = 1
    del v1["target"]["batch_forward_s"], v1["batch_overhead_s"]
    for d in v1["drafts"].values():
        del d["batch_forward_s"]
    with pytest.raises(InvalidInput, match=r"the cost table is version 1 \(batch 1 only\) but batch sizes 2, 4 were"):
        batch_predictions(res, v1, [1, 2, 4])
    assert batch_predictions(res, v1, [1]).batches == [1]
    with pytest.raises(MissingBatchEntries) as exc:
        batch_predictions(res, t, [4, 16, 32])
    msg = str(exc.value)
    assert "target.batch_forward_s at (B, n) = (16, 1), (16, 2), (32, 1), (32, 2)" in msg
    assert "drafts['d'].batch_forward_s at (B, n) = (16, 1), (32, 1)" in msg
    assert "covers batch sizes 1, 2, 4, 8" in msg
    with pytest.raises(MissingBatchEntries, match=r"\(16, 1\)"):
        check_batch_table(t, [16], [1])
    with pytest.raises(InvalidType, match="SimulationResult"):
        batch_predictions({"results": []}, t, [1])
    with pytest.raises(InvalidType, match="extrapolate"):
        batch_predictions(res, t, [1], extrapolate="yes")


def test_extrapolation_is_said():
    t = CostTable.from_dict(table_dict())
    bp = batch_predictions(result([row("d", 1, 1.6)]), t, [4, 16], extrapolate=True)
    assert "target.batch_forward_s (B=16, n=1)" in bp.extrapolated and "batch_overhead_s (B=16, k=0)" in bp.extrapolated
    assert any(w.startswith("extrapolated, not measured") for w in bp.warnings)


def test_draft_without_entry_is_skipped_with_a_warning():
    t = CostTable.from_dict(table_dict())
    bp = batch_predictions(result([row("d", 1, 1.6), row("zz", 1, 1.9)]), t, [1, 2])
    assert {r.draft for r in bp.rows} == {"d"}
    assert any("no entry for zz" in w for w in bp.warnings)


# -- with real simulations ----------------------------------------------------------------------------------------

def synthetic_table():
    return table_dict(drafts=("far", "mid", "near"))


def test_batch_one_reproduces_simulate_dense():
    t = CostTable.from_dict(synthetic_table())
    res = simulate("data/synthetic_pair.npz", k=[1, 3], costs=t, trials=20)
    bp = batch_predictions(res, t, [1, 2])
    for r in res.results:
        b1 = next(x for x in bp.rows if x.batch == 1 and x.draft == r.draft and x.k == r.k)
        assert b1.speedup == pytest.approx(r.speedup, rel=1e-12)
        assert b1.tokens_per_step == r.mean_acceptance_length_exact


def fake_smollm_table(path):
    """The shipped dump's version-1 table plus a made-up batch axis (the tests' 'fake measured table')."""
    from fastspec.io import load_dump

    obj = load_dump("data/smollm2_exit_top64.npz").costs.as_dict()
    obj["version"], obj["note"] = 2, "FAKE batch axis for the tests"
    obj["target"]["batch_forward_s"] = {str(b): {n: v * (1 + 0.1 * b * int(n) ** 0.5)
                                                 for n, v in obj["target"]["forward_s"].items()} for b in (2, 4, 8, 16)}
    obj["batch_overhead_s"] = {str(b): {k: v * b for k, v in obj["overhead_s"].items()} for b in (2, 4, 8, 16)}
    for e in obj["drafts"].values():
        e["batch_forward_s"] = {str(b): {n: v * (1 + 0.05 * b) for n, v in e["forward_s"].items()}
                                for b in (2, 4, 8, 16)}
    path.write_text(json.dumps(obj))
    return str(path)


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return fake_smollm_table(tmp_path_factory.mktemp("c") / "v2.json")


def cli(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def one_error(r) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("fastspec: error: "), r.stderr
    assert "Traceback" not in r.output
    return lines[0]


def test_cli_json_and_sparse_batch_one(fake):
    r = cli("simulate", "data/smollm2_exit_top64.npz", "--k", "1,2", "--costs", fake, "--batch", "1,2,4,8,16",
            "--json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    b = d["batch"]
    assert b["batches"] == [1, 2, 4, 8, 16] and len(b["rows"]) == 3 * 2 * 5
    assert set(b["rows"][0]) >= {"draft", "k", "batch", "tokens_per_s", "tokens_per_s_per_sequence", "speedup",
                                 "speedup_ci95", "static_speedup"}
    assert "NaN" not in r.stdout
    # a sparse dump: the lower bound, and batch 1 reproduces simulate's lower speed-up
    for res in d["results"]:
        b1 = next(x for x in b["rows"] if x["batch"] == 1 and x["draft"] == res["draft"] and x["k"] == res["k"])
        assert b1["bound"] == "lower" and b1["speedup"] == pytest.approx(res["speedup_lower"], rel=1e-9)
    assert {e["status"] for e in b["break_even"]} <= {"never pays", "stops paying", "pays at every batch measured",
                                                      "pays at some batch sizes"}


def test_cli_table(fake):
    r = cli("simulate", "data/smollm2_exit_top64.npz", "--k", "1", "--costs", fake, "--batch", "1,4,16",
            "--batch-extrapolate")
    assert r.exit_code == 0, r.stderr
    assert "by batch size (continuous batching" in r.stdout and "break-even batch size" in r.stdout
    assert "B = 16: best" in r.stdout and "batch model:" in r.stdout
    assert "extrapolated" not in r.stdout  # every B measured: nothing extrapolated


def test_cli_bad_input(fake):
    dump = "data/smollm2_exit_top64.npz"
    assert "error: --batch item 0 = 0 is outside [1, 4096]" in one_error(cli("simulate", dump, "--batch", "0,2"))
    assert "4097" in one_error(cli("simulate", dump, "--batch", "4097"))
    assert "version 1 (batch 1 only) but batch sizes 2" in one_error(cli("simulate", dump, "--batch", "1,2"))
    msg = one_error(cli("simulate", dump, "--k", "1", "--costs", fake, "--batch", "32"))
    assert "target.batch_forward_s at (B, n) = (32, 1), (32, 2)" in msg and "--batch-extrapolate" in msg
    assert "relative" in one_error(cli("simulate", dump, "--draft-cost", "0.5", "--batch", "1"))
    assert "needs --batch" in one_error(cli("simulate", dump, "--batch-extrapolate"))
    assert "--costs none" in one_error(cli("simulate", dump, "--costs", "none", "--batch", "1"))
    ok = cli("simulate", dump, "--k", "1", "--batch", "1")  # batch 1 of a version-1 table: fine
    assert ok.exit_code == 0, ok.stderr


def test_cli_extrapolation_is_said(fake):
    r = cli("simulate", "data/smollm2_exit_top64.npz", "--k", "1", "--costs", fake, "--batch", "8,32",
            "--batch-extrapolate")
    assert r.exit_code == 0, r.stderr
    assert "extrapolated, not measured" in r.stdout and "(B=32, n=1)" in r.stdout


def test_cli_plot(fake, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "p.png"
    r = cli("simulate", "data/smollm2_exit_top64.npz", "--k", "1,2", "--costs", fake, "--batch", "1,4,16", "--plot",
            out)
    assert r.exit_code == 0, r.stderr
    assert out.exists() and (tmp_path / "p_batch.png").exists()
    assert (tmp_path / "p_batch.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_of_the_fake_is_v2(fake):
    t = CostTable.from_file(fake)
    assert t.batch_sizes == [1, 2, 4, 8, 16] and t.version == 2
    assert copy.deepcopy(t.as_dict()) == CostTable.from_json(t.to_json()).as_dict()


def test_ngram_rows_by_hand():
    obj = table_dict()
    obj["drafts"]["ngram"] = {"forward_s": {"1": 0.0001}, "one_call_per_step": True,
                              "batch_forward_s": {str(b): {"1": 0.0001 * b} for b in BS if b > 1}}
    t = CostTable.from_dict(obj)
    r = row("ngram1-3", 2, 1.8, p_all=0.3, kind="ngram")
    r.tokens_per_target_forward, r.plain_steps = 1.5, 20.0  # 300 positions: 200 forwards, 20 of them plain (f = 0.1)
    res = result([r])
    res.config["positions"] = 300
    bp = batch_predictions(res, t, [1, 4])
    for b in (1, 4):
        x = next(y for y in bp.rows if y.batch == b)
        c = StepCost(t, "ngram", batch=b)
        plain, lookup = c.plain_step_s(), 0.0001 * b
        full = lookup + c.entry("target", 3)[0] + c.entry("overhead", 2)[0]
        step = 0.1 ** b * (plain + lookup) + (1 - 0.1 ** b) * full
        assert x.step_s == pytest.approx(step, rel=1e-12)
        assert x.tokens_per_step == 1.5 and x.speedup == pytest.approx(1.5 * plain / step, rel=1e-12)
    # the broken variant (every step a full k-draft step) differs: the plain-step share matters at B = 1
    x1 = next(y for y in bp.rows if y.batch == 1)
    assert x1.step_s != pytest.approx(StepCost(t, "ngram", batch=1).step_s(2), rel=1e-3)
