"""Every public entry point takes its sampling as one :class:`fastspec.SamplingParams` (``sampling=``), or the four
settings one by one, not both (issue #29, item 4); the hot paths -- the array APIs that take per-row arrays --
keep their scalars and arrays."""
from __future__ import annotations

import dataclasses
import importlib
import inspect

import numpy as np
import pytest

from fastspec import SamplingParams, save_dump
from fastspec.errors import InvalidInput, InvalidType
from fastspec.io import load_dump
from fastspec.params import given_sampling

#: the array APIs: per-row arrays of the four settings (fastspec.params.per_row), one call per batch of rows
HOT_PATHS = {"verify_logits", "verify_tree_logits", "probabilities", "sample_tokens", "acceptance_rates",
             "SamplingParams", "resolve_sampling"}
MODULES = ["fastspec", "fastspec.audit", "fastspec.acceptance", "fastspec.simulation", "fastspec.runs",
           "fastspec.io", "fastspec.hf", "fastspec.hf.audit", "fastspec.hf.assisted", "fastspec.engines.vllm.measure",
           "fastspec.engines.llamacpp.measure"]


def _entry_points():
    out = {}
    for name in MODULES:
        try:
            mod = importlib.import_module(name)
        except ImportError:  # fastspec.hf without the extra
            continue
        for attr in getattr(mod, "__all__", []):
            obj = getattr(mod, attr, None)
            if callable(obj) and attr not in HOT_PATHS:
                try:
                    params = inspect.signature(obj).parameters
                except (TypeError, ValueError):
                    continue
                if {"temperature", "sampling"} & set(params):
                    out[f"{name}.{attr}"] = params
    return out


def test_every_entry_point_that_samples_takes_sampling_params():
    entries = _entry_points()
    assert len(entries) >= 10, sorted(entries)
    missing = sorted(n for n, params in entries.items() if "sampling" not in params)
    assert not missing, f"entry points without sampling=: {missing}"


def test_given_sampling_is_one_or_the_other():
    sp = SamplingParams(temperature=0.5, top_k=4)
    assert given_sampling(sp) == sp
    assert given_sampling(sp, 1.0, 0, 1.0, 0.0) == sp  # the defaults count as not given
    assert given_sampling(None, 0.5, 4) == sp
    assert given_sampling() == SamplingParams()
    with pytest.raises(InvalidInput) as exc:
        given_sampling(sp, top_p=0.9)
    assert exc.value.arguments == ("sampling",)
    with pytest.raises(InvalidType) as exc:
        given_sampling({"temperature": 0.5})
    assert exc.value.arguments == ("sampling",)
    with pytest.raises(InvalidInput) as exc:
        given_sampling(None, top_p=0)
    assert exc.value.arguments == ("top_p",)


@pytest.mark.parametrize("cls", ["fastspec.runs:DumpConfig", "fastspec.runs:CostMeasureConfig",
                                 "fastspec.runs:MeasureConfig", "fastspec.audit:AuditConfig"])
def test_the_run_configs_take_sampling_and_stay_as_given(cls):
    module, _, name = cls.partition(":")
    config_cls = getattr(importlib.import_module(module), name)
    sp = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
    c = config_cls(sampling=sp)
    assert c.params == sp
    again = dataclasses.replace(c, seed=3)  # another field replaced: the sampling is still the one given
    assert again.params == sp and again.seed == 3
    assert config_cls(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05).params == sp
    with pytest.raises(InvalidInput) as exc:
        config_cls(sampling=sp, temperature=0.3)
    assert exc.value.arguments == ("sampling",)


def test_save_dump_records_the_sampling_params(tmp_path):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 8)).astype(np.float32)
    sp = SamplingParams(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05)
    path = save_dump(str(tmp_path / "d.npz"), logits, {"d": logits}, sampling=sp)
    d = load_dump(path)
    assert SamplingParams.recorded(d.metadata) == sp
    with pytest.raises(InvalidInput, match="not both"):
        save_dump(str(tmp_path / "e.npz"), logits, None, sampling=sp, temperature=0.5)


def test_the_output_audit_takes_sampling_params():
    from fastspec import OutputAudit

    sp = SamplingParams(temperature=0.5, top_k=3)
    assert OutputAudit(sampling=sp).params == sp
    with pytest.raises(InvalidInput):
        OutputAudit(sampling=sp, temperature=0.9)


@pytest.mark.hf
def test_the_real_loop_draws_the_same_tokens_either_way():
    """generate / speculative_generate with sampling= are the calls with the four settings (same seed, same
    tokens), and refuse both at once."""
    from hf_models import tiny

    from fastspec import hf

    target, draft = tiny(0), tiny(1)
    sp = SamplingParams(temperature=0.8, top_k=5, top_p=0.95)
    prompt = [0, 2, 3]
    a = hf.generate(target, prompt, sampling=sp, seed=4, max_new_tokens=12)
    b = hf.generate(target, prompt, temperature=0.8, top_k=5, top_p=0.95, seed=4, max_new_tokens=12)
    assert np.array_equal(a, b)
    s1 = hf.speculative_generate(target, draft, prompt, 3, sampling=sp, seed=4, max_new_tokens=12)
    s2 = hf.speculative_generate(target, draft, prompt, 3, 0.8, 5, 0.95, seed=4, max_new_tokens=12)
    assert np.array_equal(s1.tokens, s2.tokens) and s1.verify_steps == s2.verify_steps
    with pytest.raises(InvalidInput):
        hf.generate(target, prompt, sampling=sp, temperature=0.5)
