"""The simulator's seams: one validated configuration (SimulateConfig), the dump protocol, result kinds."""
from __future__ import annotations

import inspect
import pathlib

import numpy as np
import pytest

import fastspec
from fastspec.errors import InvalidInput, InvalidType
from fastspec.io import Dump, load_dump
from fastspec.params import SamplingParams
from fastspec.simulation import SimulateConfig, simulate
from fastspec.simulation.results import RESULT_KINDS, SECTIONS

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"
PAIR = DATA / "synthetic_pair.npz"
SPARSE = DATA / "smollm2_exit_top64.npz"
QUICK = dict(k=2, trials=4, batches=2)


def test_simulate_takes_at_most_eight_parameters():
    assert len(inspect.signature(simulate).parameters) <= 8


def test_config_and_keywords_give_the_same_result():
    a = simulate(PAIR, SimulateConfig(**QUICK, drafts=["near"], sampling={"temperature": 0.7})).as_dict()
    b = simulate(PAIR, **QUICK, drafts=["near"], temperature=0.7).as_dict()
    c = simulate(PAIR, **QUICK, drafts=["near"], sampling=SamplingParams(temperature=0.7)).as_dict()
    assert a == b == c


def test_config_is_validated_on_construction_with_the_same_messages():
    with pytest.raises(InvalidInput, match="k = 0 is invalid"):
        SimulateConfig(k=0)
    with pytest.raises(InvalidInput, match="batches = 1 is invalid"):
        SimulateConfig(batches=1)
    with pytest.raises(InvalidInput, match="temperature = -1 is invalid"):
        SimulateConfig(sampling={"temperature": -1})
    with pytest.raises(InvalidType, match="sampling must be a SamplingParams"):
        SimulateConfig(sampling=0.7)
    cfg = SimulateConfig(k="1-3", trials=7, batches=2, drafts=["a", "a"])
    assert cfg.ks == [1, 2, 3] and cfg.trials == 8 and cfg.draft_list == ("a",)


def test_settings_are_given_one_way():
    with pytest.raises(InvalidInput, match="not both"):
        simulate(PAIR, SimulateConfig(**QUICK), k=4)
    with pytest.raises(InvalidInput, match="not both"):
        simulate(PAIR, **QUICK, sampling={"temperature": 1.0}, temperature=0.5)
    with pytest.raises(InvalidType, match="unknown argument.*temprature"):
        simulate(PAIR, temprature=0.5)
    with pytest.raises(InvalidType, match="config must be a SimulateConfig"):
        simulate(PAIR, {"k": 2})


def test_bad_sampling_fails_before_the_dump_is_read(tmp_path):
    with pytest.raises(InvalidInput, match="top_p"):
        simulate(tmp_path / "missing.npz", top_p=2.0)


def test_every_dump_speaks_the_protocol():
    rng = np.random.default_rng(0)
    d = Dump.from_arrays({"target_logits": rng.standard_normal((2, 5, 7)).astype(np.float32),
                          "draft_logits__a": rng.standard_normal((2, 5, 7)).astype(np.float32),
                          "lengths": np.array([5, 4])})
    assert d.prompt_tokens is None and d.costs is None and d.costs_differ is False
    assert not hasattr(d, "row_offset")
    acc = fastspec.dump_acceptance(d, sampling=SamplingParams())
    np.testing.assert_array_equal(acc["a"].alpha, fastspec.dump_acceptance(d)["a"].alpha)
    with pytest.raises(InvalidInput, match="not both"):
        fastspec.dump_acceptance(d, sampling=SamplingParams(), temperature=0.5)


def test_rows_have_a_kind_and_sections():
    res = simulate(PAIR, **QUICK, drafts=["near"], verify="token,block", candidates="1,2", block_trials=4,
                   draft_cost=0.1)
    assert [r.kind for r in res.results] == ["model", "candidates", "block"]
    assert all(r.as_dict()["kind"] == r.kind for r in res.results)
    block = res.results[2]
    assert block.sections == RESULT_KINDS["block"][1] and set(block.section("speedup")) == set(SECTIONS["speedup"])
    assert res.best == {"near": 2} and res.best_overall["draft"] == "near"
    with load_dump(SPARSE) as d:
        sparse = simulate(d, k=1, drafts=["exit12", "ngram"], temperature=0)
    assert [r.kind for r in sparse.results] == ["bounds", "ngram"]
    assert sparse.results[0].section("bounds")["alpha_lower"] is not None
