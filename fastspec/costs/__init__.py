"""Costs: the measured cost table and the one step-cost object that prices a speculative step from it.

* :mod:`fastspec.costs.table`: :class:`CostTable`, the JSON schema (version 1, and 2 with a batch axis), its strict
  reader and its one atomic writer (:meth:`CostTable.save`);
* :mod:`fastspec.costs.step`: :class:`StepCost`, the seconds of a step at batch 1, at batch B, with candidates per
  depth, for an n-gram proposer and under vLLM's schedule;
* :mod:`fastspec.costs.relative`: :class:`CostModel` / :class:`VerifyCost`, a step in units of one target forward;
* :mod:`fastspec.costs.batch`: :func:`break_even`, where speculation stops paying as the batch grows.

The imports run one way: table <- step <- batch model (``fastspec.simulation.batch``).  The schema:
docs/reference/cost-tables.md; the model: docs/design/cost-model.md.
"""
from __future__ import annotations

from .batch import break_even
from .relative import CostModel, VerifyCost
from .step import MissingBatchEntries, StepCost
from .table import (COST_TABLE_VERSION, COST_TABLE_VERSIONS, MAX_BATCH_SIZE, MAX_TABLE_BYTES, SECONDS_RANGE,
                    CostTable, check_batch_size, parse_batch_list, parse_json, read_json_file)

__all__ = ["CostTable", "StepCost", "MissingBatchEntries", "CostModel", "VerifyCost", "break_even",
           "COST_TABLE_VERSION", "COST_TABLE_VERSIONS", "MAX_BATCH_SIZE", "MAX_TABLE_BYTES", "SECONDS_RANGE",
           "check_batch_size", "parse_batch_list", "parse_json", "read_json_file"]
