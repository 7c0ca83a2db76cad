"""Issue #19, items outside the cost tables and n-gram drafts: seeds, exact entries (each failed before its fix)."""
from __future__ import annotations

import os

import numpy as np
import pytest
from typer.testing import CliRunner

import fastspec
from fastspec.errors import InvalidInput, InvalidType
from fastspec.exact import to_fraction
from fastspec.io import check_dump_path
from fastspec_cli.main import app

runner = CliRunner()


# ------------------------------------------------------------------ item 14: seed=None recursed without end
@pytest.mark.parametrize("call", ["row_seeds", "verify_logits", "verify_probs"])
@pytest.mark.parametrize("seed", [None, np.array(None), 2.5, "7"])
def test_a_seed_that_is_not_an_integer_is_a_type_error(call, seed):
    xt = np.zeros((2, 2, 5))
    toks = np.zeros((2, 1), np.int64)
    fn = {"row_seeds": lambda: fastspec.row_seeds(seed, 2),
          "verify_logits": lambda: fastspec.verify_logits(xt, xt[:, :1], toks, seed=seed),
          "verify_probs": lambda: fastspec.verify_probs(np.full((2, 2, 5), 0.2), np.full((2, 1, 5), 0.2), toks,
                                                        seed=seed)}[call]
    with pytest.raises(InvalidType, match="seed"):
        fn()


def test_a_zero_dimensional_integer_seed_still_works():
    assert (fastspec.row_seeds(np.array(5, dtype=object), 3) == fastspec.row_seeds(5, 3)).all()
    assert (fastspec.row_seeds(np.int64(5), 3) == fastspec.row_seeds(5, 3)).all()


# ------------------------------------------------------------------ round 1 leftover: exact --p 1e-999999
@pytest.mark.parametrize("text", ["1e-999999", "1e-999999999", "1E+5000", "1e-1001",
                                  "0." + "0" * 3000 + "1", "1/" + "9" * 2000])
def test_exact_entries_with_too_many_digits_are_bad_input(text):
    with pytest.raises(InvalidInput, match="limited to 1000 digits"):
        to_fraction(text, "p", 0)
    res = runner.invoke(app, ["exact", "--p", f"{text},1", "--q", "0.5,0.5", "--normalize"])
    assert res.exit_code == 2 and "--p[0]" in res.stderr and "limited to 1000 digits" in res.stderr
    assert res.stderr.count("\n") == 1


def test_exact_entries_within_the_limit_still_work():
    assert to_fraction("1e-999") == to_fraction("1/" + "1" + "0" * 999)
    res = runner.invoke(app, ["exact", "--p", "1e-300,1", "--q", "0.5,0.5", "--normalize", "--json"])
    assert res.exit_code == 0, res.stderr


# ------------------------------------------------------------------ item 9, the library side: hf.set_threads
@pytest.mark.hf
def test_set_threads_is_bounded_by_the_cpus_this_process_may_use():
    pytest.importorskip("torch")
    from fastspec import hf
    from fastspec.machine import available_cpus

    with pytest.raises(InvalidInput, match="threads"):
        hf.set_threads(100_000)
    with pytest.raises(InvalidInput, match="threads"):
        hf.set_threads(available_cpus() + 1)
    assert hf.set_threads(1) == 1


# ------------------------------------------------------------------ issue #30, item 23: paths as the user typed them
def test_dump_paths_and_their_staging_are_printed_as_typed(tmp_path, monkeypatch):
    """The --save-dump / dump parent directory was printed absolute, and the staging directory made absolute."""
    pytest.importorskip("torch")
    from fastspec.hf import dumping

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidInput) as exc:
        check_dump_path("no/such/d.npz")
    assert "directory no/such does not exist" in str(exc.value) and str(tmp_path) not in str(exc.value)
    os.mkdir("sub")
    staged = dumping._stage("sub/d.npz")
    assert staged.startswith("sub" + os.sep + dumping.STAGING_PREFIX) and os.path.isdir(staged)
    staged = dumping._stage("d.npz")
    assert os.path.dirname(staged) == "." and os.path.isdir(staged)


def test_vllm_model_drafts_keep_the_path_as_typed(tmp_path, monkeypatch):
    """A vLLM model draft's path was made absolute for the messages; the runner makes it absolute for vLLM."""
    from fastspec.engines.vllm.measure import engine_drafts
    from fastspec.engines.vllm.runner import speculative_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "drafts" / "small").mkdir(parents=True)
    (d,) = engine_drafts(["drafts/small"])
    assert (d.name, d.kind, d.path) == ("small", "model", "drafts/small")
    (d,) = engine_drafts(["x=drafts/small/"])
    assert (d.name, d.path) == ("x", "drafts/small/")
    assert speculative_config(d.path, 2)["model"] == str(tmp_path / "drafts" / "small")
