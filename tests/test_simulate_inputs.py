"""fastspec.simulate with hostile and careless inputs (issue #12): the verify-cost grammar.  Each test failed
before its fix."""
from __future__ import annotations

import pytest

from fastspec.errors import InvalidInput
from fastspec.simulate import VerifyCost


# ------------------------------------------------------------------ --verify-cost: a real grammar

@pytest.mark.parametrize("spec, const, slope", [
    ("1", 1, 0), ("1+0.05k", 1, 0.05), ("1 + 0.05*k", 1, 0.05), ("0.05k+1", 1, 0.05), ("k", 0, 1), ("1+k", 1, 1),
    ("2 - 0.5 k", 2, -0.5), (".5+.5*k", 0.5, 0.5), ("1e-2k + 1", 1, 0.01), ("1.+2E0k", 1, 2), (" 3 ", 3, 0),
    ("1 + 0.02k + 0.03*k", 1, 0.05),
])
def test_verify_cost_grammar_accepts_the_documented_forms(spec, const, slope):
    v = VerifyCost.parse(spec)
    assert v.table is None and v.const == pytest.approx(const) and v.slope == pytest.approx(slope)


@pytest.mark.parametrize("spec", ["1-+2k", "2-+1", "--", "+", "-", "1+", "+1", "-1+2k", "1--1", "*k", "k*2", "1**k",
                                  "2k2", "1 2", "kk", "1+x", "inf", "nan", "1e", "0x10", "1,5", "", "   ", "(1)"])
def test_verify_cost_grammar_refuses_everything_else(spec):
    # before: '1-+2k' was read as 1 + 2k, '2-+1' as 3, '--' and '+' as the constant 0
    with pytest.raises(InvalidInput, match="not understood") as info:
        VerifyCost.parse(spec)
    assert "a sum of terms joined by + or -" in str(info.value) and "1+0.05k" in str(info.value)


def test_verify_cost_tables_and_numbers_still_work(tmp_path):
    f = tmp_path / "cost.json"
    f.write_text('{"1": 1.02, "4": 1.1}')
    assert VerifyCost.parse(str(f))(4) == 1.1 and VerifyCost.parse('{"2": 1.5}')(2) == 1.5
    assert VerifyCost.parse(2)(7) == 2.0
    with pytest.raises(InvalidInput, match="finite"):
        VerifyCost.parse("1e400")
