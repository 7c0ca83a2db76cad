"""The simulator's seams: one validated configuration (SimulateConfig), the dump protocol, result kinds."""
from __future__ import annotations

import dataclasses
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
    a = simulate(PAIR, SimulateConfig(**QUICK, drafts=["near"], temperature=0.7)).as_dict()
    b = simulate(PAIR, **QUICK, drafts=["near"], temperature=0.7).as_dict()
    c = simulate(PAIR, **QUICK, drafts=["near"], sampling=SamplingParams(temperature=0.7)).as_dict()
    assert a == b == c


def test_config_is_validated_on_construction_with_the_same_messages():
    with pytest.raises(InvalidInput, match="k = 0 is invalid"):
        SimulateConfig(k=0)
    with pytest.raises(InvalidInput, match="batches = 1 is invalid"):
        SimulateConfig(batches=1)
    with pytest.raises(InvalidInput, match="temperature = -1 is invalid") as exc:
        SimulateConfig(temperature=-1)
    assert exc.value.arguments == ("temperature",)  # the argument at fault, for a front end to name
    with pytest.raises(InvalidType, match="sampling must be a SamplingParams"):
        SimulateConfig(sampling=0.7)
    with pytest.raises(InvalidType, match="sampling must be a SamplingParams"):
        SimulateConfig(sampling={"temperature": 0.7})  # sampling= is a SamplingParams; one by one: temperature=
    with pytest.raises(InvalidInput, match="not both"):
        SimulateConfig(sampling=SamplingParams(), top_p=0.9)
    cfg = SimulateConfig(k="1-3", trials=7, batches=2, drafts=["a", "a"])
    assert cfg.ks == [1, 2, 3] and cfg.checked.trials == 8 and cfg.checked.drafts == ("a",)
    assert (cfg.k, cfg.trials, cfg.drafts) == ("1-3", 7, ["a", "a"])  # the fields stay as given


def test_config_fields_stay_as_given_and_replace_resolves_afresh():
    # before: __post_init__ overwrote trials, so replace() kept the Bernoulli default of 200 in token mode
    assert dataclasses.replace(SimulateConfig(k=4), mode="token").checked.trials == 20
    assert SimulateConfig(mode="token").checked.trials == 20
    assert SimulateConfig(k=4).trials is None and SimulateConfig(k=4).checked.trials == 200
    cfg = SimulateConfig(trials=7, batches=2)
    assert dataclasses.replace(cfg, batches=4).checked.trials == 8 and cfg.batches == 2
    assert dataclasses.replace(cfg) == cfg


def test_plan_is_resolved_against_the_dump():
    cfg = SimulateConfig(**QUICK, drafts=["near"], temperature=0.7)
    with load_dump(PAIR) as d:
        plan = cfg.resolve(d)
    assert plan.model_drafts == ("near",) and plan.ngrams == {} and plan.dump_kind == "dense"
    assert plan.sampling == SamplingParams(temperature=0.7, top_k=plan.sampling.top_k, top_p=plan.sampling.top_p,
                                           min_p=plan.sampling.min_p)
    assert cfg.checked.sampling is None and plan.trials == 4 and plan.batches == 2


def test_serving_batch_sizes_are_a_setting_and_a_result_section():
    with pytest.raises(InvalidInput, match="batch_sizes item 0 = 0") as exc:
        SimulateConfig(batch_sizes="0,2")
    assert exc.value.arguments == ("batch_sizes",)
    with pytest.raises(InvalidInput, match="relative") as exc:
        SimulateConfig(batch_sizes=[1], draft_cost=0.5)
    assert exc.value.arguments == ("batch_sizes", "draft_cost", "verify_cost")
    with pytest.raises(InvalidInput, match="needs batch_sizes"):
        SimulateConfig(batch_extrapolate=True)
    with pytest.raises(InvalidInput, match="records none"):
        simulate(PAIR, **QUICK, batch_sizes=[1])  # the pair records no cost table
    res = simulate(SPARSE, k=1, batch_sizes="1")  # batch 1 of the dump's version-1 table
    assert res.batch is not None and res.batch.batches == [1] and res.plan.batch_sizes == [1]
    assert res.as_dict()["batch"] == res.batch.as_dict() and list(res.as_dict())[-1] == "batch"
    assert "batch" not in simulate(SPARSE, k=1).as_dict()


def test_settings_are_given_one_way():
    with pytest.raises(InvalidInput, match="not both"):
        simulate(PAIR, SimulateConfig(**QUICK), k=4)
    with pytest.raises(InvalidInput, match="not both"):
        simulate(PAIR, **QUICK, sampling=SamplingParams(temperature=1.0), temperature=0.5)
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
    assert block.sections == RESULT_KINDS["block"][1]
    assert set(block.section("speedup")._fields) == set(SECTIONS["speedup"])
    assert block.exact is None and block.monte_carlo.verify_steps == block.verify_steps
    assert block.priced.speedup == block.speedup and block.section("bounds") is None
    assert res.best == {"near": 2} and res.best_overall["draft"] == "near"
    with load_dump(SPARSE) as d:
        sparse = simulate(d, k=1, drafts=["exit12", "ngram"], temperature=0)
    assert [r.kind for r in sparse.results] == ["bounds", "ngram"]
    assert sparse.results[0].bounds.alpha_lower is not None and sparse.results[0].monte_carlo is None
    assert sparse.results[1].ngram.off_record == sparse.results[1].off_record
