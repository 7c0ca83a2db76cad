"""fastspec.acceptance.inspect_dump: what ``fastspec inspect`` shows, computed in the library (issue #20, item 7)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from fastspec.acceptance import (ALPHA_PASS, DraftFigures, DumpInspection, acceptance_rates, alpha_summary,
                                 inspect_dump)
from fastspec.analysis import SpecStats, expected_tokens_per_step
from fastspec.errors import InvalidInput, InvalidType
from fastspec.io import load_dump, save_dump
from fastspec.params import SamplingParams

LENGTHS = np.array([6, 4])


def _dense(tmp_path):
    rng = np.random.default_rng(1)
    P = rng.standard_normal((2, 6, 30)).astype(np.float16)
    Q = (P + rng.standard_normal((2, 6, 30))).astype(np.float16)
    return str(save_dump(tmp_path / "d.npz", P, {"tiny": Q, "same": P}, lengths=LENGTHS, temperature=0.8)), P, Q


def _sparse(tmp_path):
    ids = np.tile(np.arange(3), (2, 4, 1))
    lp = np.log(np.full((2, 4, 3), 0.3))
    return str(save_dump(tmp_path / "s", (ids, lp), (ids, lp - 0.2), vocab_size=10))


def test_dense_figures_are_the_dp_of_the_alphas(tmp_path):
    path, P, Q = _dense(tmp_path)
    rep = inspect_dump(path, [1, 3], temperature=0.5)
    assert isinstance(rep, DumpInspection) and rep.ks == (1, 3) and list(rep.drafts) == ["same", "tiny"]
    assert rep.sampling == SamplingParams(temperature=0.5) and rep.info["N"] == 2 and rep.info["kind"] == "dense"
    f = rep.drafts["tiny"]
    assert isinstance(f, DraftFigures) and f.exact and f.alpha_lower is None
    valid = np.arange(6)[None] < LENGTHS[:, None]
    a = np.where(valid, acceptance_rates(P, Q, temperature=0.5), 0.0)
    assert f.alpha == pytest.approx(alpha_summary(a, valid), abs=1e-12)
    for k in (1, 3):
        assert isinstance(f.expected_by_k[k], SpecStats)
        want = expected_tokens_per_step(a, k, lengths=LENGTHS)
        assert f.expected_by_k[k].mean_acceptance_length == pytest.approx(want.mean_acceptance_length, abs=1e-12)
        assert f.expected_by_k[k].draft_acceptance_rate == pytest.approx(want.draft_acceptance_rate, abs=1e-12)
    d = rep.as_dict()
    assert d["settings"]["temperature"] == 0.5 and d["path"] == path
    e = d["acceptance"]["tiny"]
    assert list(e) == ["exact", "alpha", "expected", "expected_by_k"]  # the JSON names of `fastspec inspect --json`
    assert e["expected"] == e["expected_by_k"][1] == f.expected_by_k[1].as_dict()
    assert inspect_dump(path).sampling.temperature == 0.8  # the recorded settings by default
    assert inspect_dump(path, 2).ks == (2,) and inspect_dump(path, np.array([2, 5])).ks == (2, 5)


def test_sparse_figures_are_the_two_ends(tmp_path):
    rep = inspect_dump(_sparse(tmp_path), [2])
    f = rep.drafts["draft"]
    assert not f.exact and f.alpha is None and f.expected_by_k is None
    assert f.alpha_lower["mean"] <= f.alpha_upper["mean"]
    lo, hi = f.expected_at_lower_by_k[2], f.expected_at_upper_by_k[2]
    assert lo.mean_acceptance_length <= hi.mean_acceptance_length
    e = rep.as_dict()["acceptance"]["draft"]
    assert list(e) == ["exact", "alpha_lower", "alpha_upper", "expected_at_lower", "expected_at_upper",
                       "expected_at_lower_by_k", "expected_at_upper_by_k"]
    assert e["expected_at_upper"] == hi.as_dict()
    with pytest.raises(InvalidInput, match="full vocabulary"):
        inspect_dump(_sparse(tmp_path), top_p=0.9)


def test_progress_is_one_stage_around_the_alpha_pass(tmp_path):
    path, P, _ = _dense(tmp_path)
    seen = []

    @contextlib.contextmanager
    def progress(stage, total, every):
        seen.append([stage, total, every, 0])

        def advance(n=1):
            seen[-1][3] += n

        yield advance

    with load_dump(path) as d:
        rep = inspect_dump(d, progress=progress)  # an open dump is used as it is (and left open)
        assert d.N == 2
    assert seen == [[ALPHA_PASS, 12, 1, 12]] and rep.info["N"] == 2
    seen.clear()
    with pytest.raises(InvalidInput, match="full vocabulary"):  # bad settings fail before the pass starts
        inspect_dump(_sparse(tmp_path), top_p=0.9, progress=progress)
    assert seen == []


def test_bad_arguments(tmp_path):
    path, _, _ = _dense(tmp_path)
    for ks in ([], [0], [2, 2], "4", [1.5], True, None, 2.0):
        with pytest.raises(InvalidInput):
            inspect_dump(path, ks)
    with pytest.raises(InvalidInput, match="not both"):
        inspect_dump(path, sampling=SamplingParams(), temperature=1.0)
    with pytest.raises(InvalidType):
        inspect_dump(path, sampling={"temperature": 1.0})
    with pytest.raises(InvalidInput, match="no draft named"):
        inspect_dump(path, drafts=["nope"])
    assert list(inspect_dump(path, drafts=["tiny"]).drafts) == ["tiny"]
