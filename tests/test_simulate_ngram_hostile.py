"""Issue #19, n-gram drafts in the simulator: sparse dumps, long k, hostile specs, variants that do not apply.

Each test failed before its fix (the item numbers are the issue's).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import save_dump
from fastspec.errors import InvalidInput, InvalidType
from fastspec.ngram import MAX_NGRAM, NgramProposer
from fastspec.simulation import simulate
from fastspec.ngram import parse_ngram_draft
from fastspec_cli.main import app
from test_simulate_ngram import _dump

runner = CliRunner()
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                       "smollm2_exit_top64.npz")


def _pair(tmp_path, top=4, ties=False):
    """The stub n-gram dump saved twice: dense logits, and the same as sparse top-``top`` lists."""
    d = _dump(3)
    logits = d.logits.astype(np.float64)
    if ties:  # exact ties at the maximum: the greedy token is the lowest id among them, in both layouts
        idx = np.argmax(logits, axis=-1)
        other = (idx + 1) % d.V
        np.put_along_axis(logits, other[..., None], np.take_along_axis(logits, idx[..., None], -1), -1)
    lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.argsort(-lp, axis=-1, kind="stable")[..., :top].astype(np.int32)
    tl = np.take_along_axis(lp, ids, -1)
    common = dict(tokens=d.tokens, lengths=d.lengths, prompt_tokens=d.prompt_tokens,
                  prompt_lengths=d.prompt_lengths, temperature=0.0)
    dense = save_dump(str(tmp_path / "dense.npz"), lp.astype(np.float32), None, **common)
    sparse = save_dump(str(tmp_path / "sparse.npz"), (ids, tl.astype(np.float32)), None, vocab_size=d.V, **common)
    return dense, sparse, d


# ------------------------------------------------------------------ item 4: n-gram drafts on sparse dumps
@pytest.mark.parametrize("ties", [False, True])
def test_ngram_on_a_sparse_dump_at_temperature_0_equals_the_dense_dump(tmp_path, ties):
    dense, sparse, _ = _pair(tmp_path, ties=ties)
    a = simulate(dense, k=[1, 2, 4, 8], drafts=["ngram"], temperature=0.0)
    b = simulate(sparse, k=[1, 2, 4, 8], drafts=["ngram"], temperature=0.0)
    assert b.config["dump_kind"] == "sparse"
    for x, y in zip(a.results, b.results, strict=True):
        assert y.mean_acceptance_length_exact == pytest.approx(x.mean_acceptance_length_exact, abs=1e-12)
        assert (y.verify_steps, y.plain_steps) == (x.verify_steps, x.plain_steps)
    with pytest.raises(InvalidInput, match="temperature 0"):  # sampling needs the proposed token's probability
        simulate(sparse, k=2, drafts=["ngram"], temperature=1.0)


def test_ngram_on_the_shipped_sparse_dump_through_the_cli():
    res = runner.invoke(app, ["simulate", SHIPPED, "--k", "1,2,4", "--draft", "ngram", "--temperature", "0"])
    assert res.exit_code == 0, res.stderr
    assert "ngram1-3" in res.stdout and "best: ngram1-3" in res.stdout


# ------------------------------------------------------------------ item 5: k beyond the recorded length
def test_ngram_with_k_beyond_the_sequence_length(tmp_path):
    dense, _, d = _pair(tmp_path)
    ks = [d.T - 1, d.T, d.T + 2, d.T + 30]
    res = simulate(dense, k=ks, drafts=["ngram"], temperature=0.0)
    m = [r.mean_acceptance_length_exact for r in res.results]
    # a step never proposes past the sequence's end: every k >= T drafts alike
    assert m[1] == m[2] == m[3] and m[0] <= m[1] + 1e-12
    code = runner.invoke(app, ["simulate", dense, "--k", str(d.T + 2), "--draft", "ngram", "--json"]).exit_code
    assert code == 0


# ------------------------------------------------------------------ item 13: hostile n-gram specs
@pytest.mark.parametrize("spec, needle", [
    ("ngram²-³", "decimal digits"),
    ("ngram1-99999999999999999999999", "decimal digits"),
    ("ngram1-5000", f"[1, {MAX_NGRAM}]"),
    ("ngram0-2", f"[1, {MAX_NGRAM}]"),
    ("ngram3-1", "greater than"),
    ("ngram-3", "decimal digits"),
])
def test_hostile_ngram_specs_are_one_line_errors(spec, needle):
    with pytest.raises(InvalidInput, match=None) as exc:
        parse_ngram_draft(spec, 4)
    assert needle in str(exc.value)
    res = runner.invoke(app, ["simulate", SHIPPED, "--k", "2", "--draft", spec, "--temperature", "0"])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "--draft" in res.stderr
    assert "Traceback" not in res.stderr and "TypingError" not in res.stderr


def test_the_library_proposer_is_bounded():
    with pytest.raises(InvalidInput, match="max_n"):
        NgramProposer(4, 1, 10**23)
    with pytest.raises(InvalidInput, match="k = "):
        NgramProposer(10**23)
    with pytest.raises(InvalidType, match="max_n"):
        NgramProposer(4, 1, 2.0)


# ------------------------------------------------------------------ item 17: variants the n-gram draft has not
@pytest.mark.parametrize("flags", [["--verify", "block"], ["--candidates", "2"], ["--verify", "token,block"]])
def test_block_or_candidates_with_only_an_ngram_draft_is_refused(tmp_path, flags):
    dense, _, _ = _pair(tmp_path)
    res = runner.invoke(app, ["simulate", dense, "--k", "2", "--draft", "ngram", *flags])
    assert res.exit_code == 2 and "n-gram draft ngram1-3" in res.stderr and res.stderr.count("\n") == 1


def test_block_with_a_model_and_an_ngram_draft_warns_for_the_ngram_rows(tmp_path):
    d = _dump(3)
    lg = d.logits
    path = save_dump(str(tmp_path / "both.npz"), lg, {"near": lg + 0.2}, tokens=d.tokens, lengths=d.lengths,
                     prompt_tokens=d.prompt_tokens, prompt_lengths=d.prompt_lengths, temperature=1.0)
    res = simulate(path, k=2, drafts=["near", "ngram"], verify=["token", "block"], block_trials=20, trials=20)
    rows = {(r.draft, r.verify) for r in res.results}
    assert ("near", "block") in rows and ("ngram1-3", "token") in rows and ("ngram1-3", "block") not in rows
    assert any("ngram1-3 is verified token by token" in w for w in res.warnings)
