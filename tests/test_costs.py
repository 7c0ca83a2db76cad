"""Cost tables (the JSON schema of fastspec.costs) and the loop's cost model: validation and arithmetic."""
from __future__ import annotations

import json

import pytest

from fastspec.costs import CostTable, StepCost
from fastspec.errors import InvalidInput

TABLE = {
    "version": 1, "machine": "test", "threads": 2, "context_length": 50,
    "target": {"forward_s": {"1": 0.020, "2": 0.021, "3": 0.022, "5": 0.025},
               "forward_s_se": {"1": 0.001, "5": 0.002}},
    "drafts": {"small": {"forward_s": {"1": 0.004, "2": 0.005}, "forward_s_se": {"1": 0.0002}},
               "ngram": {"forward_s": {"1": 0.00002}, "one_call_per_step": True}},
    "overhead_s": {"0": 0.0005, "1": 0.001, "2": 0.0012},
}


def test_round_trip_and_the_loop_arithmetic():
    t = CostTable.from_json(json.dumps(TABLE))
    assert CostTable.from_dict(t.as_dict()) == t
    c = StepCost(t, "small")
    assert c.plain_step_s() == pytest.approx(0.0205)
    # k = 2: first draft forward (one token, or two with prob a), one more draft forward, target over 3, overhead(2)
    assert c.step_s(2, 0.0) == pytest.approx(0.004 + 0.004 + 0.022 + 0.0012)
    assert c.step_s(2, 1.0) == pytest.approx(0.005 + 0.004 + 0.022 + 0.0012)
    assert c.speedup(1.8, 2, 0.5) == pytest.approx(1.8 * 0.0205 / (0.0045 + 0.004 + 0.022 + 0.0012))
    # nothing is substituted: overhead and target forward must both be measured at k (issue #19, item 2)
    with pytest.raises(ValueError, match="no overhead for k = 4"):
        c.step_s(4, 0.0)
    with pytest.raises(ValueError, match="no target forward for n = 4"):
        c.step_s(3)
    assert t.missing("small", 4) == ['overhead_s["4"]'] and t.missing("small", 3) == ['target.forward_s["4"]',
                                                                                        'overhead_s["3"]']
    assert t.missing("small", 2) == [] and t.missing("ngram", 4, every_j=True) == [
        'target.forward_s["4"]', 'overhead_s["3"]', 'overhead_s["4"]']
    # the n-gram proposer: one call per step, whatever k
    full = CostTable.from_dict({**TABLE, "overhead_s": {**TABLE["overhead_s"], "4": 0.0013}})
    g = StepCost(full, "ngram")
    assert g.step_s(4, 0.3) == pytest.approx(0.00002 + 0.025 + 0.0013)
    assert 0 < StepCost(full, "small").relative_se(4, 0.2) < 0.2


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t.pop("target"), "'target' is missing"),
    (lambda t: t["target"]["forward_s"].pop("1"), "needs n = 1"),
    (lambda t: t["target"]["forward_s"].update({"x": 1.0}), "not an integer"),
    (lambda t: t["target"]["forward_s"].update({"0": 1.0}), r"integer in \[1, 1048576\]"),
    (lambda t: t["overhead_s"].update({"1": -1}), "seconds > 0"),
    (lambda t: t["target"]["forward_s"].update({"2": 0}), "seconds > 0"),
    (lambda t: t["drafts"]["small"]["forward_s_se"].update({"1": -0.1}), "seconds >= 0"),
    (lambda t: t["overhead_s"].update({"1": float("nan")}), "finite"),
    (lambda t: t.update({"bogus": 1}), "unknown key"),
    (lambda t: t["drafts"]["small"].update({"speed": 2}), "unknown key"),
    (lambda t: t.update({"version": 3}), "version"),
    (lambda t: t["drafts"]["ngram"].update({"one_call_per_step": "yes"}), "true or false"),
])
def test_bad_tables_are_refused(mutate, match):
    bad = json.loads(json.dumps(TABLE))
    mutate(bad)
    with pytest.raises(ValueError, match=match):
        CostTable.from_dict(bad)


def test_unknown_draft_and_bad_json():
    t = CostTable.from_dict(TABLE)
    with pytest.raises(ValueError, match="no draft named 'x'"):
        StepCost(t, "x")
    with pytest.raises(ValueError, match="not valid JSON"):
        CostTable.from_json("{")
    with pytest.raises(ValueError, match="no such file"):
        CostTable.from_file("/nonexistent/costs.json")
    assert isinstance(StepCost(t, "small"), StepCost)


def test_save_writes_atomically_and_leaves_no_temporary_file(tmp_path, monkeypatch):
    import os

    table = CostTable.from_dict(TABLE)
    path = tmp_path / "costs.json"
    assert table.save(path) == str(path)
    assert path.read_text(encoding="utf-8") == table.to_json() + "\n"
    assert CostTable.from_file(path).as_dict() == table.as_dict()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["costs.json"]

    def broken(_src, _dst):
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", broken)  # a failed write leaves the old table and no temporary file
    with pytest.raises(OSError, match="disk gone"):
        CostTable.from_dict({**TABLE, "machine": "other"}).save(path)
    assert path.read_text(encoding="utf-8") == table.to_json() + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["costs.json"]


def test_one_step_cost_object_for_every_case():
    """StepCost prices candidates per depth, an n-gram step and vLLM's schedule; each case's arithmetic."""
    t = CostTable.from_dict(TABLE)
    small, ngram = StepCost(t, "small"), StepCost(t, "ngram")
    # w candidates per depth: k one-token draft forwards (no catch-up), target(k w + 1), overhead(k)
    assert small.tree_step_s(2, 2) == pytest.approx(2 * 0.004 + 0.025 + 0.0012)
    assert ngram.tree_step_s(2, 2) == pytest.approx(0.00002 + 0.025 + 0.0012)
    with pytest.raises(InvalidInput, match="target forward for n = 4"):
        small.tree_step_s(1, 3)
    # a lookup that found nothing: the call, then a plain step
    assert ngram.no_proposal_step_s() == t.plain_step_s() + 0.00002
    assert ngram.ngram_step_s(2, 0.0) == ngram.step_s(2)
    assert ngram.ngram_step_s(2, 0.25) == pytest.approx(0.25 * (0.0205 + 0.00002) + 0.75 * ngram.step_s(2))
    with pytest.raises(InvalidInput, match="batch 1 only"):
        StepCost(t, "small", batch=2).tree_step_s(1, 2)
    with pytest.raises(InvalidInput, match="give batch="):
        small.entry("target", 1)
    # vLLM's schedule: the same price from a CostTable as from its JSON
    v2 = CostTable.from_dict({**TABLE, "version": 2,
                              "target": {**TABLE["target"], "batch_forward_s": {"2": {"1": 0.03, "3": 0.04},
                                                                                "4": {"1": 0.05, "3": 0.07}}},
                              "batch_overhead_s": {"2": {"0": 0.001, "2": 0.002}, "4": {"0": 0.002, "2": 0.003}}})
    for args in [(2, 2, 2), (2, 6, 2), (3, 6, 2), (4, 8, 2), (1, 1, 2), (9, 20, 2)]:
        assert StepCost.scheduled_step_s(v2, *args) == StepCost.scheduled_step_s(v2.as_dict(), *args)
    assert StepCost.scheduled_step_s(v2, 2, 4, 2) == pytest.approx(0.035 + 0.002)  # n = 2: half-way in n


def test_one_break_even():
    """One rule: the vLLM benchmark's and simulate --batch's break-even are fastspec.costs.break_even."""
    import sys
    from pathlib import Path

    from fastspec.costs import break_even
    from fastspec.simulation.batch import _break_even

    benchmarks = str(Path(__file__).resolve().parents[1] / "benchmarks")
    if benchmarks not in sys.path:  # the experiment lives with its benchmark (benchmarks/vllm_batch/)
        sys.path.insert(0, benchmarks)
    from vllm_batch import driver

    assert driver.break_even is break_even
    pts = [(1, 1.4), (2, 1.2), (4, 1.05), (8, 0.9), (16, 0.7)]
    be, sim = break_even(pts), _break_even("d", 3, pts)
    assert be["status"] == sim["status"] == "stops paying"
    assert (be["pays_up_to"], be["stops_at"], be["estimate"]) == (sim["pays_up_to"], sim["stops_at"],
                                                                 sim["break_even_estimate"]) == (4, 8, be["estimate"])
    assert 4 < be["estimate"] < 8
    assert break_even([(1, 2.0), (2, 1.5)])["status"] == "pays at every batch"
    assert _break_even("d", 1, [(1, 2.0), (2, 1.5)])["status"] == "pays at every batch measured"
    assert break_even([(1, 0.5), (2, 1.5), (4, 0.5)])["status"] == "not monotone"
    assert _break_even("d", 1, [(1, 0.5), (2, 1.5), (4, 0.5)])["text"] == "pays at B = 2 only (not monotone)"


def test_the_cost_modules_import_one_way():
    """table <- step <- batch model: the table imports no other cost module, the step cost only the table, and
    nothing in fastspec.costs imports the simulation, hf or engines."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "fastspec" / "costs"

    def imports(name):
        tree = ast.parse((root / f"{name}.py").read_text(encoding="utf-8"))
        return {("." * n.level) + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}

    assert not {m for m in imports("table") if m.startswith(".") and not m.startswith("..")}
    assert {m for m in imports("step") if m.startswith(".") and not m.startswith("..")} == {".table"}
    assert {m for m in imports("relative") if m.startswith(".") and not m.startswith("..")} == {".table"}
    assert not {m for m in imports("batch") if m.startswith(".")}
    for name in ("table", "step", "relative", "batch", "__init__"):
        assert not any(m.startswith(("..simulation", "..hf", "..engines")) for m in imports(name))
