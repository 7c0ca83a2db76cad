"""Issue #19, cost tables: hostile and careless tables, from ``--costs`` files and from a dump's ``costs`` array.

Each test failed before its fix (the item numbers are the issue's).  Calls that could block on a FIFO run through
``_no_hang`` (tests/test_io_hostile.py), which fails the test instead of hanging the suite.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import save_dump
from fastspec.costs import MAX_TABLE_BYTES, CostTable
from fastspec.errors import DumpFormatError, InvalidInput
from fastspec.io.shards import ShardedDump
from fastspec.simulation import VerifyCost, simulate
from fastspec_cli.main import app
from test_io_hostile import _no_hang, needs_fifo

runner = CliRunner()
DUMP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "synthetic_pair.npz")

TABLE = {
    "version": 1, "machine": "test", "threads": 2,
    "target": {"forward_s": {str(n): 0.02 + 0.001 * n for n in range(1, 6)}},
    "drafts": {"near": {"forward_s": {"1": 0.004}}, "mid": {"forward_s": {"1": 0.004}},
               "far": {"forward_s": {"1": 0.004}}},
    "overhead_s": {str(k): 0.0005 for k in range(0, 5)},
}


def _table(**changes):
    t = json.loads(json.dumps(TABLE))
    t.update(changes)
    return t


def _cli(*args):
    res = runner.invoke(app, list(args))
    return res.exit_code, res.stdout, res.stderr


def assert_one_line_exit_2(code, stderr, *needles):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastspec: error:"), stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert "Traceback" not in stderr


def _write(tmp_path, text, name="costs.json", mode="w"):
    p = tmp_path / name
    with open(p, mode) as fh:
        fh.write(text)
    return str(p)


# ------------------------------------------------------------------ item 3: unknown keys at every level
@pytest.mark.parametrize("key", ["forward_se", "bogus"])
def test_unknown_keys_inside_target_are_refused(key):
    t = _table()
    t["target"][key] = {"1": 0.001}
    with pytest.raises(InvalidInput, match=f"target: unknown key.*'{key}'"):
        CostTable.from_dict(t)


# ------------------------------------------------------------------ items 6, 7, 19: files, FIFOs, devices, sizes
@needs_fifo
def test_a_fifo_as_costs_is_refused_without_blocking(tmp_path):
    fifo = str(tmp_path / "costs.json")
    os.mkfifo(fifo)
    with pytest.raises(InvalidInput, match="FIFO"):
        _no_hang(lambda: CostTable.from_file(fifo), [fifo])
    code, _, err = _no_hang(lambda: _cli("simulate", DUMP, "--k", "1", "--costs", fifo), [fifo])
    assert_one_line_exit_2(code, err, "--costs", "FIFO")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_as_costs_is_refused_unread():
    with pytest.raises(InvalidInput, match="character device"):
        _no_hang(lambda: CostTable.from_file("/dev/zero"))
    code, _, err = _cli("simulate", DUMP, "--k", "1", "--costs", "/dev/zero")
    assert_one_line_exit_2(code, err, "--costs", "character device")


def test_a_directory_as_costs_says_so(tmp_path):
    code, _, err = _cli("simulate", DUMP, "--k", "1", "--costs", str(tmp_path))
    assert_one_line_exit_2(code, err, "--costs", "a directory")


def test_tables_larger_than_the_cap_are_refused_unparsed(tmp_path):
    big = _table(note="x" * (MAX_TABLE_BYTES + 10))
    path = _write(tmp_path, json.dumps(big))
    with pytest.raises(InvalidInput, match="larger than"):
        CostTable.from_file(path)
    with pytest.raises(InvalidInput, match="a few kilobytes"):
        CostTable.from_json(json.dumps(big))
    # a long note under the size cap is still refused: the free text is short, never echoed by the megabyte
    with pytest.raises(InvalidInput, match="note must be text of at most"):
        CostTable.from_dict(_table(note="x" * 20_000))
    code, out, err = _cli("simulate", DUMP, "--k", "1", "--costs", path, "--json")
    assert_one_line_exit_2(code, err, "--costs", "larger than")
    assert out == ""


def test_many_keys_are_bounded_by_the_size_cap(tmp_path):
    keys = {str(n): 0.01 for n in range(1, 200_000)}
    path = _write(tmp_path, json.dumps(_table(target={"forward_s": keys})))
    assert os.path.getsize(path) > MAX_TABLE_BYTES
    with pytest.raises(InvalidInput, match="larger than"):
        CostTable.from_file(path)


# ------------------------------------------------------------------ item 11: parse failures are typed errors
HOSTILE_TEXTS = {
    "deep nesting": "[" * 200_000 + "]" * 200_000,
    "401-digit value": json.dumps(_table()).replace('"1": 0.021', '"1": 1' + "0" * 400),
    "5000-digit value": json.dumps(_table()).replace('"1": 0.021', '"1": 1' + "0" * 5000),
    "5000-digit key": json.dumps(_table()).replace('"5": 0.025', '"1' + "0" * 5000 + '": 0.025'),
    "NaN literal": json.dumps(_table()).replace('"threads": 2', '"threads": NaN'),
    "Infinity literal": json.dumps(_table()).replace('"1": 0.021', '"1": Infinity'),
}


@pytest.mark.parametrize("what", sorted(HOSTILE_TEXTS))
def test_hostile_json_is_one_typed_error_from_a_file_and_from_a_dump(tmp_path, what):
    text = HOSTILE_TEXTS[what]
    with pytest.raises(InvalidInput, match="cost table"):
        CostTable.from_json(text)
    path = _write(tmp_path, text)
    code, _, err = _cli("simulate", DUMP, "--k", "1", "--costs", path)
    assert_one_line_exit_2(code, err, "--costs", path)
    # the same text as a dump's recorded `costs` array: a DumpFormatError naming the array
    dump = str(tmp_path / "d.npz")
    rng = np.random.default_rng(0)
    lg = rng.standard_normal((1, 4, 9)).astype(np.float32)
    save_dump(dump, lg, {"near": lg})
    with np.load(dump, allow_pickle=False) as z:
        arrays = dict(z)
    arrays["costs"] = np.array(text)
    np.savez(dump, **arrays)
    with pytest.raises(DumpFormatError, match="array 'costs'"):
        simulate(dump, k=1)
    code, _, err = _cli("simulate", dump, "--k", "1")
    assert_one_line_exit_2(code, err, "costs")


def test_non_utf8_costs_file(tmp_path):
    path = _write(tmp_path, b'{"version": 1, "machine": "\xff\xfe"}', mode="wb")
    with pytest.raises(InvalidInput, match="not UTF-8"):
        CostTable.from_file(path)
    code, _, err = _cli("simulate", DUMP, "--k", "1", "--costs", path)
    assert_one_line_exit_2(code, err, "--costs", "not UTF-8")


# ------------------------------------------------------------------ items 12, 20: overflow, NaN, negative intervals
@pytest.mark.parametrize("where, value", [("se", 1e200), ("forward", 1.7e308), ("forward", 1e-320),
                                          ("overhead", 1e7)])
def test_times_outside_the_documented_range_are_refused(where, value):
    t = _table()
    if where == "se":
        t["target"]["forward_s_se"] = {"1": value}
    elif where == "forward":
        t["target"]["forward_s"]["2"] = value
    else:
        t["overhead_s"]["1"] = value
    with pytest.raises(InvalidInput, match="seconds"):
        CostTable.from_dict(t)


def test_large_standard_errors_give_a_positive_finite_interval_and_no_nan(tmp_path):
    t = _table()
    t["target"]["forward_s_se"] = {str(n): 1e6 for n in range(1, 6)}  # the largest allowed
    path = _write(tmp_path, json.dumps(t))
    code, out, err = _cli("simulate", DUMP, "--k", "1,2", "--costs", path, "--json")
    assert code == 0, err
    assert "nan" not in out.lower() and "RuntimeWarning" not in err
    res = json.loads(out)
    for r in res["results"]:
        ci = r["speedup_ci95"]
        assert ci is None or (0 < ci[0] <= r["speedup"] <= ci[1] and math.isfinite(ci[1]))
    t["target"]["forward_s_se"] = {str(n): 0.05 for n in range(1, 6)}  # wide, but finite: (was [-28.8, 31.5])
    r = simulate(DUMP, k=1, costs=t, drafts=["near"]).results[0]
    lo, hi = r.speedup_ci95
    assert 0 < lo < r.speedup < hi and lo * hi == pytest.approx(r.speedup ** 2, rel=1e-12)


# ------------------------------------------------------------------ items 16, 21: info fields and version
@pytest.mark.parametrize("changes, needle", [
    ({"threads": float("nan")}, "threads"),
    ({"threads": 0}, "threads"),
    ({"threads": "2"}, "threads"),
    ({"context_length": -1}, "context_length"),
    ({"repeats": 2.5}, "repeats"),
    ({"machine": 7}, "machine"),
    ({"version": True}, "version"),
    ({"version": 1.0}, "version"),
])
def test_info_fields_and_version_are_checked(changes, needle):
    with pytest.raises(InvalidInput, match=needle):
        CostTable.from_dict(_table(**changes))


def test_nan_threads_never_reaches_the_output(tmp_path):
    path = _write(tmp_path, json.dumps(_table()).replace('"threads": 2', '"threads": NaN'))
    code, out, err = _cli("simulate", DUMP, "--k", "1", "--costs", path)
    assert_one_line_exit_2(code, err, "--costs", "NaN")
    assert "nan threads" not in out


# ------------------------------------------------------------------ item 18: a shard set prices whatever the order
@pytest.mark.parametrize("which", [0, 1])
def test_a_shard_set_uses_the_recorded_table_whichever_shard_holds_it(tmp_path, which):
    rng = np.random.default_rng(1)
    sdir = tmp_path / "shards"
    sdir.mkdir()
    for i in range(2):
        lg = rng.standard_normal((2, 6, 11)).astype(np.float32)
        save_dump(str(sdir / f"part-{i}.npz"), lg, {"near": lg + 0.3}, temperature=1.0,
                  costs=TABLE if i == which else None)
    with ShardedDump(str(sdir)) as d:
        assert d.costs is not None and d.costs_differ
    res = simulate(str(sdir), k=1)
    assert res.config["costs"]["source"] == "dump" and res.results[0].speedup is not None
    assert any("shards recorded different cost tables" in w for w in res.warnings)


# ------------------------------------------------------------------ leftover of round 1: --verify-cost paths
@pytest.mark.parametrize("kind", ["directory", "device"])
def test_verify_cost_path_that_is_not_a_file_is_named(tmp_path, kind):
    path = str(tmp_path) + os.sep if kind == "directory" else "/dev/zero"
    if kind == "device" and not os.path.exists(path):
        pytest.skip("no /dev/zero")
    with pytest.raises(InvalidInput, match="directory" if kind == "directory" else "character device"):
        _no_hang(lambda: VerifyCost.parse(path))
    code, _, err = _cli("simulate", DUMP, "--k", "1", "--verify-cost", path)
    assert_one_line_exit_2(code, err, "--verify-cost", "not a regular file")
    assert "no such file" not in err


@pytest.mark.parametrize("value", [10 ** 5000, "x" * 10 ** 6, [[[[0.1]]]]], ids=["5001 digits", "1 MB", "nested"])
def test_hostile_values_from_a_mapping_are_typed_errors_with_a_short_message(value):
    """A table passed as a mapping (not parsed from JSON) may hold values JSON could not: an integer longer than
    repr() prints, a megabyte string; the message shows at most 40 characters of it."""
    t = _table()
    t["target"]["forward_s"]["2"] = value
    with pytest.raises(InvalidInput, match="must be a finite number of seconds") as exc:
        CostTable.from_dict(t)
    assert len(str(exc.value)) < 200


# ------------------------------------------------------------------ issue #30, item 1: keys that are not canonical
@pytest.mark.parametrize("key", [" 3", "3 ", "\t3", "+3", "03", "3\n"])
@pytest.mark.parametrize("where", ["target.forward_s", "overhead_s", "target.batch_forward_s",
                                   "batch_overhead_s", "drafts.batch_forward_s", "relative"])
def test_keys_that_are_not_the_canonical_decimal_are_refused(key, where):
    """Issue #30, item 1: " 3" beside "3" parsed as 3 too, and the later value silently won (the verdict moved from
    k = 2 to k = 1).  Every integer-keyed map refuses a key that is not the canonical decimal, naming it and the
    fix."""
    t = _table(version=2)
    if where == "target.forward_s":
        t["target"]["forward_s"][key] = 0.5
    elif where == "overhead_s":
        t["overhead_s"][key] = 0.5
    elif where == "target.batch_forward_s":
        t["target"]["batch_forward_s"] = {"2": {"1": 0.03}, key: {"1": 0.05}}
    elif where == "batch_overhead_s":
        t["batch_overhead_s"] = {"2": {"0": 0.001}, "4": {key: 0.002}}
    elif where == "drafts.batch_forward_s":
        t["drafts"]["near"]["batch_forward_s"] = {"2": {"1": 0.004}, key: {"1": 0.005}}
    if where == "relative":
        with pytest.raises(InvalidInput, match="canonical decimal") as exc:
            VerifyCost.parse({"1": 1.02, key: 1.1})
    else:
        with pytest.raises(InvalidInput, match="canonical decimal") as exc:
            CostTable.from_dict(t)
    assert repr(key) in str(exc.value) and 'write it as "3"' in str(exc.value)


def test_a_padded_key_no_longer_changes_the_verdict(tmp_path):
    """The issue's repro, end to end: a table with "3" and " 3" is one error line, exit 2, naming the key."""
    text = json.dumps(TABLE)[:-1] + "}"
    text = text.replace('"3": 0.023', '"3": 0.023, " 3": 0.5', 1)
    assert '" 3"' in text
    path = _write(tmp_path, text)
    code, _, err = _cli("simulate", DUMP, "--k", "1", "--costs", path)
    assert_one_line_exit_2(code, err, "' 3'", "canonical decimal")


# ------------------------------------------------------------------ issue #30, item 22: an orphan standard error
@pytest.mark.parametrize("place", ["target", "draft", "overhead", "target-n"])
def test_an_orphan_batch_standard_error_is_refused(place):
    """Issue #30, item 22: batch_forward_s_se for a batch size with no batch_forward_s was ignored without a word."""
    t = _table(version=2)
    if place == "target":
        t["target"]["batch_forward_s"] = {"2": {"1": 0.03}}
        t["target"]["batch_forward_s_se"] = {"2": {"1": 0.001}, "4": {"1": 0.001}}
        needle = 'target.batch_forward_s_se has batch size "4"'
    elif place == "target-n":
        t["target"]["batch_forward_s"] = {"2": {"1": 0.03}}
        t["target"]["batch_forward_s_se"] = {"2": {"1": 0.001, "2": 0.001}}
        needle = 'target.batch_forward_s_se["2"] has "2"'
    elif place == "draft":
        t["drafts"]["near"]["batch_forward_s_se"] = {"8": {"1": 0.001}}
        needle = "drafts['near'].batch_forward_s_se has batch size \"8\""
    else:
        t["batch_overhead_s"] = {"2": {"0": 0.001}}
        t["batch_overhead_s_se"] = {"4": {"0": 0.0001}}
        needle = 'batch_overhead_s_se has batch size "4"'
    with pytest.raises(InvalidInput) as exc:
        CostTable.from_dict(t)
    assert needle in str(exc.value) and "remove the standard error" in str(exc.value)
