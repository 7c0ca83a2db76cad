"""Cost tables with a batch axis (issue 24, item 1): schema v2 round trip, version-1 tables still read, the batch
cost model against a hand computation, missing entries and extrapolation, and ``fastspec cost --batch`` with tiny
random models (marked hf)."""
from __future__ import annotations

import copy
import json
import math
from fractions import Fraction

import pytest

from fastspec.costs import MAX_BATCH_SIZE, CostTable, MissingBatchEntries, StepCost, parse_batch_list
from fastspec.errors import InvalidInput, InvalidType

V1 = {
    "version": 1, "machine": "test", "threads": 2, "context_length": 64,
    "target": {"forward_s": {"1": 0.020, "2": 0.022, "3": 0.024, "5": 0.028},
               "forward_s_se": {"1": 0.0002, "2": 0.0002, "3": 0.0003, "5": 0.0004}},
    "drafts": {"d": {"forward_s": {"1": 0.005, "2": 0.006}, "forward_s_se": {"1": 0.0001, "2": 0.0001}},
               "ngram": {"forward_s": {"1": 0.00002}, "one_call_per_step": True}},
    "overhead_s": {"0": 0.0005, "1": 0.001, "2": 0.0012, "4": 0.0015},
}


def v2():
    t = copy.deepcopy(V1)
    t["version"] = 2
    t["target"]["batch_forward_s"] = {"4": {"1": 0.025, "2": 0.030, "3": 0.035, "5": 0.045},
                                      "8": {"1": 0.030, "2": 0.040, "3": 0.050, "5": 0.070}}
    t["target"]["batch_forward_s_se"] = {"4": {"1": 0.001, "2": 0.001, "3": 0.001, "5": 0.002},
                                         "8": {"1": 0.001, "2": 0.002, "3": 0.002, "5": 0.003}}
    t["drafts"]["d"]["batch_forward_s"] = {"4": {"1": 0.007, "2": 0.009}, "8": {"1": 0.009, "2": 0.012}}
    t["drafts"]["d"]["batch_forward_s_se"] = {"4": {"1": 0.0002, "2": 0.0002}, "8": {"1": 0.0003, "2": 0.0003}}
    t["drafts"]["ngram"]["batch_forward_s"] = {"4": {"1": 0.00008}, "8": {"1": 0.00016}}
    t["batch_overhead_s"] = {"4": {"0": 0.001, "1": 0.002, "2": 0.0025, "4": 0.003},
                             "8": {"0": 0.002, "1": 0.004, "2": 0.005, "4": 0.006}}
    t["batch_overhead_s_se"] = {"4": {"0": 0.0001, "1": 0.0001, "2": 0.0001, "4": 0.0001}}
    return t


def check_error(obj, *words):
    with pytest.raises(InvalidInput) as exc:
        CostTable.from_dict(obj)
    for w in words:
        assert w in str(exc.value), str(exc.value)
    return str(exc.value)


def test_v2_round_trip_and_batch_sizes():
    t = CostTable.from_dict(v2())
    assert t.version == 2 and t.has_batch_axis
    assert t.batch_sizes == [1, 4, 8]
    assert t.target_batch_s[8][5] == 0.070 and t.draft_batch_s["ngram"][4] == {1: 0.00008}
    assert t.overhead_batch_se[4][2] == 0.0001
    d = t.as_dict()
    assert d["version"] == 2
    assert d["target"]["batch_forward_s"]["8"]["5"] == 0.070
    assert d["drafts"]["d"]["batch_forward_s_se"]["8"]["2"] == 0.0003
    assert d["batch_overhead_s"]["8"]["4"] == 0.006
    back = CostTable.from_json(t.to_json())
    assert back == t
    assert json.loads(back.to_json()) == json.loads(t.to_json())


def test_v1_still_read_and_written_as_v1():
    t = CostTable.from_dict(V1)
    assert t.version == 1 and not t.has_batch_axis and t.batch_sizes == [1]
    assert t.as_dict()["version"] == 1 and "batch_overhead_s" not in t.as_dict()
    assert CostTable.from_dict({k: v for k, v in V1.items() if k != "version"}).version == 1  # no version: 1
    # a v2 table without batch fields stays v2
    obj = copy.deepcopy(V1)
    obj["version"] = 2
    assert CostTable.from_dict(obj).as_dict()["version"] == 2


def test_batch_one_is_the_loop_cost_of_a_v1_table():
    t = CostTable.from_dict(V1)
    for k in (1, 2, 4):
        for a in (0.0, 0.3, 1.0):
            assert math.isclose(StepCost(t, "d", batch=1).step_s(k, a), StepCost(t, "d").step_s(k, a), rel_tol=1e-12)
            if k == 1 and a in (0.0, 1.0):  # draft(1) used once: the same delta method as batch 1 (batch=None)
                assert math.isclose(StepCost(t, "d", batch=1).relative_se(k, a), StepCost(t, "d").relative_se(k, a),
                                    rel_tol=1e-12)
    # k draft(1) forwards are one measured entry used k times: its error enters k-fold (perfectly correlated)
    step = 0.7 * 0.006 + (0.3 + 3) * 0.005 + 0.028 + 0.0015
    var = (0.7 * 0.0001) ** 2 + (3.3 * 0.0001) ** 2 + 0.0004 ** 2
    plain, var_p = 0.0205, 0.0002 ** 2
    assert math.isclose(StepCost(t, "d", batch=1).relative_se(4, 0.7), math.sqrt(var / step ** 2 + var_p / plain ** 2),
                        rel_tol=1e-12)
    assert StepCost(t, batch=1).plain_step_s() == t.plain_step_s()
    assert math.isclose(StepCost(t, "ngram", batch=1).step_s(2), StepCost(t, "ngram").step_s(2), rel_tol=1e-12)


def test_pricing_arithmetic_by_hand():
    t = CostTable.from_dict(v2())
    F = Fraction
    # plain at B = 8: target(8, 1) + overhead(8, 0)
    assert math.isclose(StepCost(t, batch=8).plain_step_s(), float(F("0.030") + F("0.002")), rel_tol=1e-12)
    # model draft, B = 4, k = 4, a = 0.5: q = 1 - 0.5^4; first draft forward (4, 2) w.p. q else (4, 1); 3 more (4, 1)
    q = 1 - F(1, 2) ** 4
    want = q * F("0.009") + (1 - q) * F("0.007") + 3 * F("0.007") + F("0.045") + F("0.003")
    assert math.isclose(StepCost(t, "d", batch=4).step_s(4, 0.5), float(want), rel_tol=1e-12)
    # a = 0: k forwards at (B, 1)
    assert math.isclose(StepCost(t, "d", batch=8).step_s(2, 0.0), float(2 * F("0.009") + F("0.050") + F("0.005")),
                        rel_tol=1e-12)
    # one-call draft: one call at (B, 1) whatever k
    assert math.isclose(StepCost(t, "ngram", batch=8).step_s(4), float(F("0.00016") + F("0.070") + F("0.006")),
                        rel_tol=1e-12)
    # relative se (delta method, independent entries) at B = 4, k = 1, a = 0
    step = 0.007 + 0.030 + 0.002
    plain = 0.025 + 0.001
    want_se = math.sqrt((0.0002 ** 2 + 0.001 ** 2 + 0.0001 ** 2) / step ** 2 + (0.001 ** 2 + 0.0001 ** 2) / plain ** 2)
    assert math.isclose(StepCost(t, "d", batch=4).relative_se(1, 0.0), want_se, rel_tol=1e-12)


def test_batch_axis_entry_overrides_v1_at_batch_one():
    obj = v2()
    obj["target"]["batch_forward_s"]["1"] = {"1": 0.019}
    t = CostTable.from_dict(obj)
    assert StepCost(t, batch=1).plain_step_s() == pytest.approx(0.019 + 0.0005)
    # n = 2 not on the axis at B = 1: the v1 entry
    assert StepCost(t, batch=1).step_s(1) == pytest.approx(0.022 + 0.001)


def test_missing_entries_named_with_batch_and_n():
    t = CostTable.from_dict(v2())
    with pytest.raises(MissingBatchEntries) as exc:
        StepCost(t, "d", batch=16).step_s(2)
    msg = str(exc.value)
    assert "target.batch_forward_s at (B, n) = (16, 3)" in msg
    assert "batch_overhead_s at (B, k) = (16, 2)" in msg
    assert "drafts['d'].batch_forward_s at (B, n) = (16, 1)" in msg
    assert "covers batch sizes 1, 4, 8" in msg and "--batch-extrapolate" in msg
    assert ("target.batch_forward_s", 16, 3) in exc.value.missing
    # a k the table lacks at a measured B
    with pytest.raises(MissingBatchEntries, match=r"target.batch_forward_s at \(B, n\) = \(4, 4\)"):
        StepCost(t, batch=4).step_s(3)
    assert StepCost(t, "d", batch=16).missing([1]) == [("batch_overhead_s", 16, 0), ("batch_overhead_s", 16, 1),
                                             ("drafts['d'].batch_forward_s", 16, 1),
                                             ("target.batch_forward_s", 16, 1), ("target.batch_forward_s", 16, 2)]
    assert StepCost(t, "d", batch=8).missing([1, 2, 4]) == []


def test_extrapolation_only_when_asked_and_listed():
    t = CostTable.from_dict(v2())
    c = StepCost(t, batch=16, extrapolate=True)
    # target(·, 1) at B = 4, 8: 0.025, 0.030 -> slope 0.00125 per sequence; at 16: 0.040; overhead 0.001, 0.002 -> 0.004
    assert c.plain_step_s() == pytest.approx(0.040 + 0.004)
    assert ("target", 16, 1) in c.extrapolated and ("overhead", 16, 0) in c.extrapolated
    # interpolation inside the range (B = 6 between 4 and 8)
    assert StepCost(t, batch=6, extrapolate=True).entry("target", 1)[0] == pytest.approx(0.0275)
    # below the range: B = 2 from (1, 0.020) and (4, 0.025), interpolated
    assert StepCost(t, batch=2, extrapolate=True).entry("target", 1)[0] == pytest.approx(0.020 + 0.005 / 3)
    # never below the largest measured value above the range (a falling line is clamped)
    obj = v2()
    obj["target"]["batch_forward_s"]["8"]["1"] = 0.010
    assert StepCost(CostTable.from_dict(obj), batch=16, extrapolate=True).entry("target", 1)[0] == pytest.approx(0.010)
    # one measured B for an entry: nothing to draw a line through, still missing
    t2 = CostTable.from_dict(V1)
    with pytest.raises(MissingBatchEntries):
        StepCost(t2, batch=4, extrapolate=True).plain_step_s()
    with pytest.raises(MissingBatchEntries):
        StepCost(t, batch=16).plain_step_s()


@pytest.mark.parametrize("mutate, words", [
    (lambda o: o.update(version=1),
     ['cost table: batch_overhead_s needs "version": 2 (a version-1 table is batch 1 only)']),
    (lambda o: o.update(version=3), ["version 3 is not supported"]),
    (lambda o: o["target"]["batch_forward_s"].update({"0": {"1": 0.1}}), ["key '0' must be an integer in [1,"]),
    (lambda o: o["target"]["batch_forward_s"].update({"5000": {"1": 0.1}}), ["batch size '5000' is outside",
                                                                            str(MAX_BATCH_SIZE)]),
    (lambda o: o["target"]["batch_forward_s"].update({"2": {"1": -1}}), ["batch_forward_s['2']['1'] = -1"]),
    (lambda o: o["target"]["batch_forward_s"].update({"2": {}}), ["must be a non-empty object"]),
    (lambda o: o["drafts"]["ngram"]["batch_forward_s"].update({"2": {"1": 0.1, "2": 0.2}}),
     ["one-call draft", "drafts['ngram'].batch_forward_s['2']"]),
    (lambda o: o.update(batch_overhead_s=[1]), ["batch_overhead_s must be a non-empty object"]),
    (lambda o: o["target"].update(batch_forward_x={}), ["unknown key(s) 'batch_forward_x'"]),
])
def test_schema_errors(mutate, words):
    obj = v2()
    mutate(obj)
    check_error(obj, *words)


def test_v1_with_batch_field_in_a_draft_is_refused():
    obj = copy.deepcopy(V1)
    obj["drafts"]["d"]["batch_forward_s"] = {"2": {"1": 0.01}}
    check_error(obj, "drafts['d'].batch_forward_s needs \"version\": 2")


def test_parse_batch_list():
    assert parse_batch_list("8,1, 2,2") == [1, 2, 8]
    assert parse_batch_list(4) == [4] and parse_batch_list([16, 1]) == [1, 16]
    for bad, msg in (("0", "batch item 0 = 0 is outside [1, 4096]"), ("1,4097", "batch item 1 = 4097 is outside"),
                     ("1,x", "item 1 'x' is not an integer"), ("", "is not a list of batch sizes"),
                     ("1,,2", "is not a list")):
        with pytest.raises(InvalidInput) as exc:
            parse_batch_list(bad)
        assert msg in str(exc.value)
    with pytest.raises(InvalidType, match="batch must be an integer"):
        parse_batch_list(2.5)
    with pytest.raises(InvalidInput, match="empty"):
        parse_batch_list([])


def test_batch_cost_arguments():
    t = CostTable.from_dict(v2())
    with pytest.raises(InvalidInput, match="no draft named 'x'"):
        StepCost(t, "x", batch=4)
    with pytest.raises(InvalidInput, match="outside"):
        StepCost(t, batch=0)
    with pytest.raises(InvalidType, match="CostTable"):
        StepCost({"version": 2}, batch=4)


# -- measured with tiny random models -----------------------------------------------------------------------------

@pytest.mark.hf
@pytest.mark.slow
def test_measure_costs_with_batches_tiny_models():
    from hf_models import tiny

    from fastspec import hf
    from fastspec.ngram import NgramProposer

    target, draft = tiny(0, layers=2), tiny(1, layers=1)
    table = hf.measure_costs(target, {"d": draft, "ngram": NgramProposer(k=2)}, ks=[1, 2], context_length=8,
                             repeats=2, warmup=0, batches=[1, 3])
    assert table.version == 2 and table.batch_sizes == [1, 3]
    assert set(table.target_batch_s[3]) == {1, 2, 3}  # n = 1 and every k + 1 up to the largest (an n-gram draft)
    assert set(table.draft_batch_s["d"][3]) == {1, 2} and set(table.draft_batch_s["ngram"][3]) == {1}
    assert set(table.overhead_batch_s[3]) == {0, 1, 2}
    assert all(v > 0 for row in table.target_batch_se.values() for v in row.values()) or True  # se may be 0
    assert CostTable.from_json(table.to_json()) == table
    assert StepCost(table, "d", batch=3).step_s(2, 0.5) > 0 and "batch axis B = 1,3" in table.info["note"]


@pytest.mark.hf
@pytest.mark.slow
def test_cost_cli_batch(tmp_path):
    from hf_models import save_model
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    target = save_model(tmp_path / "t", 0)
    out = tmp_path / "c.json"
    r = CliRunner().invoke(app, ["cost", "--target", target, "--draft", "ngram", "--k", "1", "--repeats", "2",
                                 "--warmup", "0", "--context-length", "8", "--batch", "1,2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "batch axis" in r.output
    t = CostTable.from_file(out)
    assert t.batch_sizes == [1, 2] and t.version == 2
    bad = CliRunner().invoke(app, ["cost", "--target", target, "--batch", "0"])
    assert bad.exit_code == 2
    lines = [ln for ln in bad.output.strip().splitlines() if ln.startswith("fastspec: error")]
    assert lines == ["fastspec: error: --batch item 0 = 0 is outside [1, 4096] (sequences decoded together)"]


def test_measurement_size_caps():
    pytest.importorskip("torch")
    from fastspec.hf.timing import MAX_CACHED_TOKENS, check_batch_budget

    check_batch_budget([1, 2, 4, 8, 16], 8, 49152, 70, 4)  # the shipped dump's models: fine
    with pytest.raises(InvalidInput, match=r"B = 4096 with k up to 8 feeds 36864 tokens"):
        check_batch_budget([4096], 8, 8)
    with pytest.raises(InvalidInput, match=r"feeds 7168 tokens and returns 352321536 logits per timed forward"):
        check_batch_budget([1024], 6, 49152)
    with pytest.raises(InvalidInput, match=f"at most {MAX_CACHED_TOKENS}"):
        check_batch_budget([512, 1024], 1, 8, 128, 2)
