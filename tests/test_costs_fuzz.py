"""Mutation fuzzing of cost tables (issue #19): whatever the text or the values, a table is either read or refused
with one of the documented errors (InvalidInput / InvalidType), and a table that is read prices every step with a
finite positive time, a finite speed-up and a positive, finite interval -- never NaN, inf, OverflowError,
RecursionError or UnicodeDecodeError.

Two kinds of mutation of a valid table: structural (a value anywhere replaced by any JSON value, including huge
integers, deep nesting, NaN/Infinity literals and extreme floats; a key deleted, added or renamed) and textual (the
JSON text's bytes flipped, deleted or inserted, through a file as ``--costs`` reads it).  Bounded: the suite's
derandomized hypothesis profile, each example a few kilobytes.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from fastspec.costs import CostTable, StepCost
from fastspec.errors import InvalidInput, InvalidType
from fastspec.simulation.speedup import TablePricing, speedup_interval

DOCUMENTED = (InvalidInput, InvalidType)

VALID = {
    "version": 1, "machine": "fuzz", "threads": 2, "context_length": 64, "repeats": 5, "note": "n",
    "target": {"forward_s": {str(n): 0.02 + 0.001 * n for n in range(1, 7)},
               "forward_s_se": {str(n): 0.0005 for n in range(1, 7)}},
    "drafts": {"d": {"forward_s": {"1": 0.004, "2": 0.0045}, "forward_s_se": {"1": 0.0001}},
               "ngram": {"forward_s": {"1": 0.00002}, "one_call_per_step": True}},
    "overhead_s": {str(k): 0.0004 + 0.0001 * k for k in range(0, 6)},
    "overhead_s_se": {"0": 0.00001},
}

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
    st.sampled_from([0, 1, -1, 2**63, 10**400, 1e-320, 5e-324, 1.7e308, -0.0, 1e6, 1e6 + 1, 1e-9, 9e-10]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
)
_json_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)), max_leaves=8)


def _paths(obj, prefix=()):
    """Every (path to a value) in a nested JSON object."""
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))


def _set(obj, path, value):
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _check_priced(table: CostTable):
    """Everything a simulation computes from a read table is finite; intervals positive."""
    pricing = TablePricing(table, "file")
    plain = table.plain_step_s()
    assert math.isfinite(plain) and plain > 0
    json.dumps(pricing.describe(), allow_nan=False)
    for draft in table.draft_forward_s:
        for k in (1, 2, 5, 8):
            for a in (0.0, 0.5, 1.0):
                s = pricing.speedup(draft, 2.0, k, a)
                if s is None:
                    assert table.missing(draft, k), (draft, k)
                    continue
                assert math.isfinite(s) and s > 0
                rel = pricing.relative_se(draft, k, a)
                assert math.isfinite(rel) and rel >= 0
                ci = speedup_interval(s, 2.0, 0.1, rel)
                assert ci is None or (0 < ci[0] <= s <= ci[1] and math.isfinite(ci[1]))
            got = pricing.ngram_costs(draft, k)
            if got is not None:
                assert np.isfinite(got[0]).all() and (got[0] > 0).all()


@settings(max_examples=300)
@given(data=st.data())
def test_structural_mutations_are_read_or_refused(data):
    obj = json.loads(json.dumps(VALID))
    paths = [p for p in _paths(obj) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        paths = [p for p in _paths(obj) if p]
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["replace", "delete", "add", "deep"]))
        parent = obj
        for k in path[:-1]:
            parent = parent[k]
        if not isinstance(parent, dict):
            continue
        if action == "replace":
            parent[path[-1]] = data.draw(_json_values)
        elif action == "delete":
            parent.pop(path[-1], None)
        elif action == "add":
            parent[data.draw(st.sampled_from(["7", "0", "bogus", "forward_se", "99999999", "-1", " 3", "²"]))] = \
                data.draw(_json_values)
        else:
            deep: object = 0.01
            for _ in range(data.draw(st.integers(50, 3000))):
                deep = [deep]
            parent[path[-1]] = deep
    try:
        text = json.dumps(obj)
    except (ValueError, RecursionError):  # Python cannot even write it: not a table anyone could pass
        return
    for source in (lambda: CostTable.from_json(text), lambda: CostTable.from_dict(obj)):
        try:
            table = source()
        except DOCUMENTED:
            continue
        _check_priced(table)


@settings(max_examples=200)
@given(data=st.data())
def test_textual_mutations_through_a_file_are_read_or_refused(tmp_path_factory, data):
    raw = bytearray(json.dumps(VALID).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        how = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if how == "flip":
            raw[i] = data.draw(st.integers(0, 255))
        elif how == "delete":
            del raw[i]
        else:
            raw[i:i] = data.draw(st.sampled_from([b"[", b"{", b"9" * 500, b"NaN", b"\xff", b"e999", b"-", b"\x00"]))
    path = tmp_path_factory.mktemp("c") / "costs.json"
    path.write_bytes(bytes(raw))
    try:
        table = CostTable.from_file(str(path))
    except DOCUMENTED:
        return
    _check_priced(table)


def test_the_valid_table_is_read_and_priced():
    """The fuzzers' starting point is a table that is read (so the mutations test refusals, not a broken base)."""
    _check_priced(CostTable.from_dict(VALID))
    assert StepCost(CostTable.from_dict(VALID), "d").speedup(2.0, 5) > 0
    with pytest.raises(InvalidInput):
        CostTable.from_json(json.dumps(VALID).replace('"threads": 2', '"threads": NaN'))
