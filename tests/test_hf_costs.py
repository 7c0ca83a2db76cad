"""fastspec.hf costs and dumps (issue #13): measured cost tables, ``fastspec cost``, and dumps a user can trust.

Tiny random Llamas (no download).  What is checked is the machinery -- tables that validate and round-trip through
a dump, the command's output, target-only dumps, T = max_new_tokens and compatible shards, ignore-EOS, float32
storage, early-exit rows taken from the target's forwards, the staging directory, progress lines, bad input --
never a timing threshold.
"""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from hf_models import V, save_model as _save_model, tiny, torch

from fastspec import hf
from fastspec.io import check_dump_path
from fastspec.costs import CostTable, StepCost
from fastspec.errors import InvalidInput
from fastspec.stats import median_se
from fastspec.io import load_dump, save_dump
from fastspec.ngram import NgramProposer
from fastspec.io.shards import is_sharded, list_shards
from fastspec.io import open_dump

pytestmark = pytest.mark.hf

PROMPTS = [[1, 3, 5], [2, 4], [6, 2, 3, 7]]
FAST = ["--cost-repeats", "3", "--cost-k", "1,2"]  # keep the cost measurement short in CLI tests


@pytest.fixture(scope="module")
def models():
    target = tiny(0, layers=3)
    return target, tiny(1, layers=1), hf.early_exit(target, 2)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    prompts = root / "prompts.txt"
    prompts.write_text("a b c\nd e\nf a b c d\n")
    return {"target": _save_model(root / "target", 0), "draft": _save_model(root / "draft", 1, layers=1),
            "prompts": str(prompts)}


def _cli(args):
    from typer.testing import CliRunner

    from fastspec_cli.main import app

    return CliRunner().invoke(app, args)


_PROGRESS = re.compile(r"^fastspec: [\w ()]+: \d+(/\d+)?$")


def _errors(output: str) -> list[str]:
    return [ln for ln in output.strip().splitlines() if not _PROGRESS.match(ln)]


def _rows(d, role):
    parts = [c.target if role == "target" else c.drafts[role] for c in d.iter_chunks()]
    return np.concatenate(parts).reshape(d.N, d.T, -1)


# ------------------------------------------------------------------------------- cost tables

def test_median_se_is_the_order_statistic_interval():
    x = list(range(1, 21))  # n = 20: ranks 5 and 16 bound the 95% interval of the median
    med, se = median_se(x)
    assert med == 10.5 and se == pytest.approx((16 - 5) / (2 * 1.959963984540054))
    assert median_se([3.0]) == (3.0, 0.0)
    with pytest.raises(InvalidInput):
        median_se([])


def test_measured_table_validates_and_round_trips_through_a_dump(models, tmp_path):
    target, draft, exit2 = models
    ng = hf.parse_ngram_spec("ngram2-3")
    table = hf.measure_costs(target, {"small": draft, "exit2": exit2, "lookup": ng}, ks=[1, 2, 4], context_length=12,
                             repeats=3, warmup=1, temperature=0.7)
    again = CostTable.from_json(table.to_json())  # what a file or a dump holds validates and is the same table
    assert again == table
    # with an n-gram draft every k up to the largest is priced (its steps verify as many tokens as it found)
    assert set(table.target_forward_s) == {1, 2, 3, 4, 5} and set(table.overhead_s) == {0, 1, 2, 3, 4}
    assert set(table.draft_forward_s) == {"small", "exit2", "lookup"} and table.one_call == {"lookup"}
    assert set(table.draft_forward_s["small"]) == {1, 2} and set(table.draft_forward_s["lookup"]) == {1}
    assert all(v > 0 for v in table.target_forward_s.values())
    assert all(v >= 0 for v in table.target_forward_se.values())
    info = table.info
    assert info["context_length"] == 12 and info["repeats"] == 3 and info["threads"] == torch.get_num_threads()
    assert "logical CPUs" in info["machine"] and "median" in info["note"]
    for name in table.draft_forward_s:
        c = StepCost(table, name)
        assert np.isfinite(c.speedup(1.5, 2, 0.3)) and c.relative_se(4, 0.3) >= 0
    # through a dump: save_dump(costs=...) stores the JSON as a 0-d string array; the loader validates it
    P = np.random.default_rng(0).normal(size=(2, 3, V)).astype(np.float32)
    path = save_dump(tmp_path / "d.npz", P, {"x": P}, costs=table)
    with load_dump(path) as d:
        assert d.costs == table and d.describe()["costs"]["target"] == table.as_dict()["target"]
    with np.load(path) as z:
        assert z["costs"].shape == () and z["costs"].dtype.kind == "U"


def test_measure_costs_contexts_and_bad_input(models):
    target, draft, _ = models
    t = hf.measure_costs(target, None, kmax=2, prompts=PROMPTS, max_new_tokens=10, repeats=2, warmup=0)
    assert t.info["context_length"] == 3 + 5 and set(t.target_forward_s) == {1, 2, 3} and not t.draft_forward_s
    t = hf.measure_costs(target, {"d": draft}, ks=[1, 3], context=[1, 2, 3, 4, 5, 6], repeats=2, warmup=0)
    assert t.info["context_length"] == 6 and set(t.target_forward_s) == {1, 2, 4} and set(t.overhead_s) == {0, 1, 3}
    t = hf.measure_costs(target, {"ng": NgramProposer(k=3)}, ks=[1, 2], repeats=2, warmup=0, context_length=20)
    assert t.one_call == {"ng"} and "one-hot" in t.info["note"] and set(t.overhead_s) == {0, 1, 2}
    with pytest.raises(InvalidInput, match="context_length"):
        hf.measure_costs(target, None, ks=[1], context=[1, 2], context_length=5)
    with pytest.raises(InvalidInput, match="positions"):
        hf.measure_costs(target, None, ks=[1], context_length=200)
    with pytest.raises(InvalidInput, match="repeats"):
        hf.measure_costs(target, None, ks=[1], repeats=0)
    with pytest.raises(InvalidInput, match="k"):
        hf.measure_costs(target, None, ks=[0])
    with pytest.raises(TypeError, match="NgramProposer"):
        hf.measure_costs(target, {"x": "exit1"}, ks=[1])


@pytest.mark.parametrize("mutate, match", [
    (lambda t: t.update({"bogus": 1}), "unknown key"),
    (lambda t: t["target"]["forward_s"].update({"1": 0}), "seconds > 0"),
    (lambda t: t["overhead_s"].update({"0": -0.001}), "seconds > 0"),
])
def test_bad_cost_tables_are_refused_in_a_dump(tmp_path, mutate, match):
    """An unknown key or a zero / negative cost in a dump's costs array: one clear line, exit 2."""
    table = {"version": 1, "target": {"forward_s": {"1": 0.02, "2": 0.021}}, "drafts": {},
             "overhead_s": {"0": 0.001, "1": 0.002}}
    mutate(table)
    with pytest.raises(ValueError, match=match):
        CostTable.from_dict(table)
    P = np.zeros((1, 2, V), np.float32)
    path = str(tmp_path / "bad.npz")
    np.savez(path, target_logits=P, costs=np.asarray(json.dumps(table)))
    with pytest.raises(ValueError, match=f"bad.npz: array 'costs': .*{match}"):
        load_dump(path)
    res = _cli(["inspect", path])
    assert res.exit_code == 2 and match in res.output and len(_errors(res.output)) == 1, res.output
    np.savez(path, target_logits=P, costs=np.asarray(3.0))
    with pytest.raises(ValueError, match="0-d string array"):
        load_dump(path)


def test_cost_command_writes_a_valid_table(dirs, tmp_path):
    out = tmp_path / "costs.json"
    res = _cli(["cost", "--target", dirs["target"], "--draft", f"small={dirs['draft']}", "--draft", "exit1",
                "--draft", "ngram", "--prompts", dirs["prompts"], "--max-new-tokens", "8", "--k", "1,2",
                "--repeats", "3", "--warmup", "1", "--threads", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    table = CostTable.from_file(out)
    assert set(table.draft_forward_s) == {"small", "exit1", "ngram"} and table.one_call == {"ngram"}
    assert table.info["threads"] == 1 and table.info["context_length"] == 3 + 4  # median prompt (3) + 8 / 2
    assert "target forward, 3 new tokens" in res.output and f"wrote {out}" in res.output
    assert "fastspec: measuring costs (rounds): 4/4" in res.output  # plain progress lines off a terminal
    res = _cli(["cost", "--target", dirs["target"], "--k", "2", "--context-length", "9", "--repeats", "2",
                "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    t = CostTable.from_dict(obj)
    assert t.info["context_length"] == 9 and set(t.target_forward_s) == {1, 3}


@pytest.mark.parametrize("args, match", [
    (["--draft", "ngram5-2"], "'ngram5-2': MIN 5 is greater than MAX 2"),
    (["--draft", "ngram:x"], "write ngram or ngramMIN-MAX"),
    (["--draft", "=exit1"], "draft name"),
    (["--draft", "exit9"], "exit depth"),
    (["--repeats", "0"], "--repeats"),
    (["--k", "0"], "--k"),
    (["--context-length", "0"], "--context-length"),
    (["--prompts", "/no/such/file"], "no such file"),
])
def test_cost_command_bad_input_one_line(dirs, args, match):
    res = _cli(["cost", "--target", dirs["target"], "--repeats", "2", *args])
    assert res.exit_code == 2, res.output
    assert match in res.output and len(_errors(res.output)) == 1, res.output
    assert "Traceback" not in res.output


def test_parse_ngram_spec():
    """The syntax of simulate --draft: ngram, ngramMIN-MAX (also ngram:MIN-MAX, ngram[MIN-MAX])."""
    assert hf.parse_ngram_spec("exit3") is None
    assert hf.parse_ngram_spec("ngram") == NgramProposer(k=hf.args.MAX_K)
    assert hf.parse_ngram_spec("ngram2-5") == NgramProposer(k=hf.args.MAX_K, min_n=2, max_n=5)
    assert hf.parse_ngram_spec("ngram:2-5") == hf.parse_ngram_spec("ngram[2-5]") == hf.parse_ngram_spec("ngram2-5")
    assert hf.parse_draft_specs(["ngram", "ngram:2-4", "big=ngram1-5"]) == {
        "ngram": "ngram", "ngram2-4": "ngram:2-4", "big": "ngram1-5"}
    for bad in ("ngram3", "ngram0-2", "ngram3-1", "ngram1-2-3", "ngramx"):
        with pytest.raises(InvalidInput, match="ngram"):
            hf.parse_draft_specs([bad])


# ------------------------------------------------------------------------------- dumps

def test_dump_records_costs_prompts_and_T_is_max_new_tokens(dirs, tmp_path):
    out = str(tmp_path / "d.npz")
    res = _cli(["dump", "--target", dirs["target"], "--draft", f"small={dirs['draft']}", "--draft", "exit1",
                "--draft", "ng=ngram2-2", "--prompts", dirs["prompts"], "--max-new-tokens", "12", "--seed", "3",
                "--out", out, "--threads", "1", *FAST])
    assert res.exit_code == 0, res.output
    for line in ("fastspec: loading models: 2/2", "fastspec: dumping prompts: 3/3",
                 "fastspec: measuring costs (rounds): 5/5"):  # one plain line per prompt / per 5 rounds off a terminal
        assert line in res.output, res.output
    assert "costs recorded" in res.output
    target, tok = hf.load_model(dirs["target"])
    prompts = hf.read_prompts(dirs["prompts"], tok)
    with load_dump(out, validate=True) as d:
        assert d.T == 12 and set(d.drafts) == {"small", "exit1"}  # the n-gram draft has no logits
        assert d.metadata["ignore_eos"] is False and d.lengths.max() <= 12
        assert set(d.costs.draft_forward_s) == {"small", "exit1", "ng"} and d.costs.one_call == {"ng"}
        assert set(d.costs.target_forward_s) == {1, 2, 3}
        for i, p in enumerate(prompts):
            assert d.prompt_tokens[i, :d.prompt_lengths[i]].tolist() == p
        assert d.prompt_tokens.shape == (3, max(map(len, prompts)))


def test_identical_dump_commands_give_compatible_shards(dirs, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for i in range(2):
        res = _cli(["dump", "--target", dirs["target"], "--draft", "exit1", "--prompts", dirs["prompts"],
                    "--max-new-tokens", "30", "--temperature", "0", "--no-costs", "--out", str(shards / f"s-{i}.npz")])
        assert res.exit_code == 0, res.output
    with open_dump(str(shards)) as d:
        assert d.N == 6 and d.T == 30 and d.lengths.min() < 30  # a row stopped at EOS; T is the budget anyway
    res = _cli(["simulate", str(shards), "--k", "2", "--trials", "4"])
    assert res.exit_code == 0, res.output


def test_ignore_eos_runs_to_the_budget(models, dirs, tmp_path):
    target, draft, _ = models
    free = hf.generate(target, PROMPTS[0], temperature=0.0, max_new_tokens=8)
    eos = int(free[2])  # a token greedy decoding emits third: with EOS it ends the row there
    kw = dict(max_new_tokens=8, temperature=0.0, eos_token_id=eos, costs=False)
    a = hf.dump_logits(tmp_path / "a.npz", target, {"d": draft}, PROMPTS[:1], **kw)
    b = hf.dump_logits(tmp_path / "b.npz", target, {"d": draft}, PROMPTS[:1], ignore_eos=True, **kw)
    with load_dump(a) as da, load_dump(b) as db:
        assert da.lengths.tolist() == [3] and da.metadata["ignore_eos"] is False
        assert db.lengths.tolist() == [8] and db.metadata["ignore_eos"] is True and db.T == da.T == 8
        np.testing.assert_array_equal(db.tokens[0], free)
    res = _cli(["dump", "--target", dirs["target"], "--prompts", dirs["prompts"], "--max-new-tokens", "40",
                "--ignore-eos", "--no-costs", "--out", str(tmp_path / "c.npz")])
    assert res.exit_code == 0, res.output
    with load_dump(tmp_path / "c.npz") as d:
        assert d.lengths.tolist() == [40, 40, 40] and d.metadata["ignore_eos"] is True


def test_target_only_and_float32_dumps(models, dirs, tmp_path):
    target, draft, exit2 = models
    # no --draft: a target-only dump (for n-gram analysis), with the prompt tokens
    res = _cli(["dump", "--target", dirs["target"], "--prompts", dirs["prompts"], "--max-new-tokens", "5",
                "--out", str(tmp_path / "t.npz"), *FAST])
    assert res.exit_code == 0, res.output
    assert "drafts none (target only)" in res.output
    with load_dump(tmp_path / "t.npz", validate=True) as d:
        assert d.drafts == () and d.prompt_tokens is not None and d.costs.draft_forward_s == {}
    # float32: the rows are the very logits the tokens were drawn from; the exit rows those of the early exit
    out = hf.dump_logits(tmp_path / "f.npz", target, {"d": draft, "exit2": exit2}, PROMPTS, max_new_tokens=6,
                         temperature=0.0, dtype="float32", costs=False)
    with load_dump(out, validate=True) as d:
        assert d.arrays["target_logits"].dtype == "float32"
        tr, er, dr = _rows(d, "target"), _rows(d, "exit2"), _rows(d, "d")
        for i, p in enumerate(PROMPTS):
            L = int(d.lengths[i])
            cont = d.tokens[i, :L]
            np.testing.assert_array_equal(tr[i, :L].argmax(-1), cont)  # greedy: argmax of the stored rows
            np.testing.assert_allclose(tr[i, :L], hf.teacher_forced_logits(target, p, cont), atol=1e-4)
            np.testing.assert_allclose(er[i, :L], hf.teacher_forced_logits(exit2, p, cont), atol=1e-4)
            np.testing.assert_allclose(dr[i, :L], hf.teacher_forced_logits(draft, p, cont), atol=1e-4)
    res = _cli(["dump", "--target", dirs["target"], "--prompts", dirs["prompts"], "--dtype", "float64",
                "--out", str(tmp_path / "x.npz")])
    assert res.exit_code == 2 and "--dtype" in res.output
    with pytest.raises(InvalidInput, match="float16 or float32"):
        hf.dump_logits(tmp_path / "x.npz", target, {}, PROMPTS, dtype="int8")


def _staging(d) -> list[str]:
    return [f for f in os.listdir(d) if "fastspec-dump" in f]


def test_staging_directory_never_looks_like_a_shard_and_never_stays(models, tmp_path, monkeypatch):
    target, draft, _ = models
    shards = tmp_path / "shards"
    shards.mkdir()
    first = hf.dump_logits(shards / "s-0.npz", target, {"d": draft}, PROMPTS[:1], max_new_tokens=3, costs=False)
    seen = []

    def look(_n):  # while the next shard is being written, the directory still reads as the one shard
        seen.append(_staging(shards))
        assert all(f.startswith(".") for f in seen[-1])
        assert is_sharded(str(shards)) and list_shards(str(shards)) == [first]

    hf.dump_logits(shards / "s-1", target, {"d": draft}, PROMPTS, max_new_tokens=3, costs=False, progress=look)
    assert seen and all(seen) and not _staging(shards)
    assert len(list_shards(str(shards))) == 2

    # failure mid-way, or an interrupt: nothing left behind, no output
    def boom(_n):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        hf.dump_logits(tmp_path / "i.npz", target, {"d": draft}, PROMPTS, max_new_tokens=3, costs=False,
                       progress=boom)
    import fastspec.hf.dumping as dumping

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(dumping, "save_dump", broken)
    with pytest.raises(OSError, match="disk full"):
        hf.dump_logits(tmp_path / "e.npz", target, {"d": draft}, PROMPTS, max_new_tokens=3, costs=False)
    assert not _staging(tmp_path) and not os.path.exists(tmp_path / "i.npz") and not os.path.exists(tmp_path / "e.npz")
    with pytest.raises(InvalidInput, match="'.'"):
        check_dump_path(tmp_path / ".hidden.npz")


def test_set_threads_survives_numba_pool_start():
    n = hf.set_threads(1)
    from fastspec import verify_logits

    verify_logits(np.zeros((1, 2, V), np.float32), None, np.zeros((1, 1), np.int64))
    assert n == 1 and torch.get_num_threads() == 1


def test_gguf_loader_patch_is_quiet_and_restored():
    g = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from fastspec.hf.models import _quiet_gguf

    before = (g.tqdm, g.load_gguf_checkpoint)
    with _quiet_gguf():
        bar = g.tqdm([1, 2], desc="x")
        assert bar.disable and list(bar) == [1, 2] and g.load_gguf_checkpoint is not before[1]
    assert (g.tqdm, g.load_gguf_checkpoint) == before


def test_sigterm_is_an_interrupt_while_dumping():
    import signal

    from fastspec_cli._hf import sigterm_as_interrupt

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pause() if hasattr(signal, "pause") else None
    assert signal.getsignal(signal.SIGTERM) == before
