"""The cost of a verify step in relative units (one target forward = 1), from ``--draft-cost`` / ``--verify-cost``.

``step_cost(k) = k * draft_cost + verify(k)``: k draft forwards (one per drafted token) and one target forward
over the k drafts plus one position, whose cost relative to a plain decode step is ``verify(k)``: a constant,
a linear ``const + slope * k``, or a table of measured per-k costs.  Speed-up = tokens per verify step /
step_cost(k) (plain decoding makes one token per target forward).  Steps in measured seconds are
:class:`fastspec.costs.step.StepCost`'s.  Explained in docs/design/cost-model.md.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .table import MAX_TABLE_BYTES, int_keyed, parse_json, read_json_file
from ..errors import InvalidInput, InvalidType
from ..params import format_value

__all__ = ["VerifyCost", "CostModel"]


def _positive(v: float, name: str) -> float:
    if not (math.isfinite(v) and v > 0):
        raise InvalidInput(f"{name} = {v!r} must be a finite number > 0")
    return v


#: what a linear verify cost may be (the grammar: expression := term (('+' | '-') term)*;  term := number ['*'] 'k'
#: | number | 'k';  number := a plain decimal or scientific literal; spaces between tokens are ignored)
LINEAR_GRAMMAR = ("a sum of terms joined by + or -, each a number (1, 0.05, .5, 2e-3), k, or a number times k "
                  "(0.05k or 0.05*k)")
_TOKEN = re.compile(r"\s*(?:(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)|(?P<sym>[-+*k]))")
_EXAMPLES = "e.g. 1, 1+0.05k, 1 + 0.05*k or 0.05k+1, or a JSON table {\"k\": cost} inline or in a .json file"


def _tokens(text: str, spec) -> list[tuple[int, str, str]]:
    """[(offset, kind, text)] of a linear expression: kind 'num' or the symbol itself."""
    out, i = [], 0
    while text[i:].strip():
        m = _TOKEN.match(text, i)
        if not m:
            j = len(text) - len(text[i:].lstrip())
            raise InvalidInput(f"verify_cost {spec!r} is not understood: {text[j]!r} at character {j + 1} is not "
                               f"allowed: give {LINEAR_GRAMMAR}; {_EXAMPLES}")
        group = "num" if m.group("num") is not None else "sym"
        out.append((m.start(group), "num" if group == "num" else m.group(group), m.group(group)))
        i = m.end()
    return out


def _parse_linear(text: str, spec) -> tuple[float, float]:
    """(const, slope) of ``text`` by :data:`LINEAR_GRAMMAR`; InvalidInput names what broke it and where."""
    toks = _tokens(text, spec) + [(len(text), "end", "")]

    def bad(at, expected):
        where, kind, what = toks[at]
        found = "the end" if kind == "end" else f"{what!r} at character {where + 1}"
        raise InvalidInput(f"verify_cost {spec!r} is not understood: expected {expected}, found {found}; give "
                           f"{LINEAR_GRAMMAR}; {_EXAMPLES}")

    const = slope = 0.0
    i, sign = 0, 1.0
    while True:
        coef = None
        if toks[i][1] == "num":
            coef, i = float(toks[i][2]), i + 1
            if toks[i][1] == "*":
                i += 1
                if toks[i][1] != "k":
                    bad(i, "'k' after '*'")
        if toks[i][1] == "k":
            slope, i = slope + sign * (1.0 if coef is None else coef), i + 1
        elif coef is None:
            bad(i, "a number or k")
        else:
            const += sign * coef
        if toks[i][1] == "end":
            break
        if toks[i][1] not in "+-":
            bad(i, "'+', '-' or the end")
        sign, i = (1.0 if toks[i][1] == "+" else -1.0), i + 1
    if not (math.isfinite(const) and math.isfinite(slope)):
        raise InvalidInput(f"verify_cost {spec!r} must be finite")
    return const, slope


def _parse_table(obj, name: str) -> dict[int, float]:
    out = {}
    for k, key, val in int_keyed(obj, name, 1, '{"k": cost, ...}'):
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, float, np.integer, np.floating)):
            raise InvalidInput(f"{name}[{key!r}] = {format_value(val)} is not a number")
        try:
            f = float(val)
        except OverflowError:  # an integer too large for a float
            f = math.inf
        out[k] = _positive(f, f"{name}[{key!r}]")
    return out


@dataclass(frozen=True)
class VerifyCost:
    """The target's verify-step cost as a function of k, relative to one target forward.

    Either linear ``const + slope * k`` or a table ``{k: cost}`` of measured per-k times.
    """

    const: float = 1.0
    slope: float = 0.0
    table: Mapping[int, float] | None = None

    def __call__(self, k: int) -> float:
        if self.table is not None:
            if k not in self.table:
                raise InvalidInput(f"verify-cost table has no entry for k = {k}; it covers k = "
                                   f"{', '.join(map(str, sorted(self.table)))}")
            return float(self.table[k])
        return self.const + self.slope * k

    def describe(self) -> str:
        if self.table is not None:
            return "table " + json.dumps({str(k): v for k, v in sorted(self.table.items())})
        return f"{self.const:g} + {self.slope:g}*k" if self.slope else f"{self.const:g}"

    @classmethod
    def parse(cls, spec) -> "VerifyCost":
        """``None``/number -> constant; a linear expression (:data:`LINEAR_GRAMMAR`: ``"1"``, ``"1+0.05k"``,
        ``"1 + 0.05*k"``, ``"0.05k+1"``) -> const + slope * k; a mapping, a JSON object string or a path to a
        ``.json`` file ``{"1": 1.02, "4": 1.10}`` -> table.  Anything else is refused, saying what is allowed."""
        if spec is None:
            return cls()
        if isinstance(spec, Mapping):
            return cls(table=_parse_table(spec, "verify_cost"))
        if isinstance(spec, (int, float)) and not isinstance(spec, bool):
            return cls(const=_positive(float(spec), "verify_cost"))
        if not isinstance(spec, str):
            raise InvalidType(f"verify_cost must be a number, a 'a+b*k' string, a mapping or a JSON path, "
                              f"got {type(spec).__name__}")
        text = spec.strip()
        if text.startswith("{"):
            if len(text) > MAX_TABLE_BYTES:
                raise InvalidInput(f"verify_cost: a JSON table of {len(text)} characters; at most {MAX_TABLE_BYTES}")
            return cls(table=_parse_table(parse_json(text, "verify_cost"), "verify_cost"))
        if text.endswith(".json") or os.path.sep in text:
            # a regular file of bounded size: a directory, a FIFO or /dev/zero is named as what it is
            return cls(table=_parse_table(read_json_file(text, "verify_cost"), f"verify_cost ({text})"))
        const, slope = _parse_linear(text, spec)
        return cls(const=const, slope=slope)


@dataclass(frozen=True)
class CostModel:
    """Cost of one verify step with k drafts, in units of one target forward: ``k * draft_cost + verify(k)``."""

    draft_cost: float = 0.0
    verify: VerifyCost = field(default_factory=VerifyCost)

    def step_cost(self, k: int) -> float:
        cost = k * self.draft_cost + self.verify(k)
        if not cost > 0:
            raise InvalidInput(f"the cost model gives a step cost of {cost!r} at k = {k}; it must be > 0")
        return cost

    def speedup(self, tokens_per_step: float, k: int) -> float:
        """Tokens per unit of target-forward time, relative to plain decoding (1 token per target forward)."""
        return tokens_per_step / self.step_cost(k)

    def tree_step_cost(self, k: int, candidates: int) -> float:
        """``candidates`` candidates per depth: k draft forwards, one target forward over k w + 1 positions
        (``verify(k w)``); InvalidInput when a verify-cost table lacks k w."""
        return k * self.draft_cost + self.verify(k * candidates)

    def ngram_step_costs(self, k: int) -> list[float]:
        """Costs of a step of a one-call proposer (one call of cost ``draft_cost``) that proposed j = 0..k tokens:
        j = 0 is a plain step after the call; InvalidInput when a verify-cost table lacks a j."""
        c = self.draft_cost
        return [1.0 + c] + [c + self.verify(j) for j in range(1, k + 1)]
