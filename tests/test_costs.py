"""Cost tables (the JSON schema of fastspec.costs) and the loop's cost model: validation and arithmetic."""
from __future__ import annotations

import json

import pytest

from fastspec.costs import CostTable, StepCost

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
