"""``fastspec inspect``: human and JSON output, one-line errors with exit 2."""
from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from fastspec.io import save_dump
from fastspec_cli.main import app

runner = CliRunner()


def _dump(tmp_path):
    rng = np.random.default_rng(0)
    P = rng.standard_normal((2, 6, 30)).astype(np.float16)
    Q = (P + rng.standard_normal((2, 6, 30))).astype(np.float16)
    return str(save_dump(tmp_path / "d.npz", P, {"tiny": Q, "same": P}, lengths=[6, 4], temperature=0.8)), P, Q


def test_inspect_human(tmp_path):
    path, _, _ = _dump(tmp_path)
    r = runner.invoke(app, ["inspect", path])
    assert r.exit_code == 0, r.output
    for s in ("target_logits", "draft_logits__tiny", "dense", "N=2", "T=6", "V=30", "tiny", "same", "float16"):
        assert s in r.stdout


def test_inspect_json_values(tmp_path):
    from fastspec.acceptance import acceptance_rates

    path, P, Q = _dump(tmp_path)
    r = runner.invoke(app, ["inspect", path, "--json", "--temperature", "0.5", "--k", "3"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["kind"] == "dense" and out["drafts"] == ["same", "tiny"] and (out["N"], out["T"], out["V"]) == (2, 6, 30)
    a = acceptance_rates(P, Q, temperature=0.5)
    valid = np.arange(6)[None] < np.array([6, 4])[:, None]
    from fastspec.analysis import expected_tokens_per_step

    want = expected_tokens_per_step(np.where(valid, a, 0.0), 3, lengths=np.array([6, 4]))
    got = out["acceptance"]["tiny"]["expected"]
    assert got["mean_acceptance_length"] == want.mean_acceptance_length and got["k"] == 3
    assert out["acceptance"]["tiny"]["expected_by_k"] == {"3": got}
    assert abs(out["acceptance"]["tiny"]["alpha"]["mean"] - a[valid].mean()) < 1e-12
    assert abs(out["acceptance"]["same"]["alpha"]["mean"] - 1.0) < 1e-12
    assert out["acceptance"]["same"]["expected"]["mean_acceptance_length"] > 1
    assert out["settings"]["temperature"] == 0.5
    r = runner.invoke(app, ["inspect", path, "--json"])
    assert json.loads(r.stdout)["settings"]["temperature"] == 0.8  # recorded metadata is the default
    r = runner.invoke(app, ["inspect", path, "--json", "--k", "1-3"])  # --k takes what simulate's --k takes
    by_k = json.loads(r.stdout)["acceptance"]["tiny"]["expected_by_k"]
    assert sorted(by_k) == ["1", "2", "3"] and by_k["1"]["k"] == 1


def test_inspect_sparse(tmp_path):
    ids = np.tile(np.arange(3), (2, 4, 1))
    lp = np.log(np.full((2, 4, 3), 0.3))
    p = save_dump(tmp_path / "s", (ids, lp), (ids, lp - 0.2), vocab_size=10)
    r = runner.invoke(app, ["inspect", str(p), "--json"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)["acceptance"]["draft"]
    assert e["alpha_lower"]["mean"] <= e["alpha_upper"]["mean"]
    r = runner.invoke(app, ["inspect", str(p), "--top-p", "0.9"])
    assert r.exit_code == 2 and "full vocabulary" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_inspect_bad_files(tmp_path):
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    for target in (str(tmp_path / "junk.npz"), str(tmp_path / "missing.npz")):
        r = runner.invoke(app, ["inspect", target])
        assert r.exit_code == 2
        assert r.stderr.startswith("fastspec: error:") and len(r.stderr.strip().splitlines()) == 1
    np.savez(tmp_path / "nan.npz", target_logits=np.array([[0.0, np.nan]]), draft_logits=np.zeros((1, 2)))
    r = runner.invoke(app, ["inspect", str(tmp_path / "nan.npz")])
    assert r.exit_code == 2 and "target_logits" in r.stderr and "NaN" in r.stderr


def test_inspect_reports_progress_of_the_alpha_pass(tmp_path, monkeypatch):
    import fastspec_cli.inspect_cmd as inspect_cmd

    seen = {}

    def recording_bar(_console, label, total, *, every=None):
        seen.update(label=label, total=total, done=0, every=every)

        def advance(n=1):
            seen["done"] += n

        return (lambda: None), advance, (lambda _n: None), (lambda: None)

    monkeypatch.setattr(inspect_cmd, "progress_bar", recording_bar)
    path, P, _ = _dump(tmp_path)
    r = runner.invoke(app, ["inspect", path, "--json"])
    assert r.exit_code == 0, r.output
    assert seen["total"] == P.shape[0] * P.shape[1] == seen["done"] and "alpha pass" in seen["label"]
    assert seen["every"] is None  # a small dump prints no progress lines into logs
    monkeypatch.setattr(inspect_cmd, "PROGRESS_LINES_BYTES", 1)
    runner.invoke(app, ["inspect", path])
    assert seen["every"] is not None and seen["every"] >= 1


def test_alpha_pass_progress_adds_up(tmp_path):
    from fastspec.acceptance import dump_acceptance
    from fastspec.io.shards import ShardedDump

    path, P, Q = _dump(tmp_path)
    ticks = []
    dump_acceptance(path, progress=ticks.append, max_bytes=200)
    assert len(ticks) > 1 and sum(ticks) == P.shape[0] * P.shape[1]
    p2 = str(save_dump(tmp_path / "e.npz", P, {"tiny": Q, "same": P}, lengths=[6, 4], temperature=0.8))
    ticks = []
    dump_acceptance(ShardedDump([path, p2]), progress=ticks.append)
    assert ticks == [12, 12]


def test_the_command_shows_what_the_library_computes(tmp_path):
    """inspect's figures come from fastspec.acceptance.inspect_dump (issue #20, item 7): the command's JSON is the
    library result's as_dict, for a dense and a sparse dump, and its table prints the same numbers."""
    from fastspec.acceptance import inspect_dump

    path, _, _ = _dump(tmp_path)
    ids = np.tile(np.arange(3), (2, 4, 1))
    lp = np.log(np.full((2, 4, 3), 0.3))
    sparse = str(save_dump(tmp_path / "s", (ids, lp), (ids, lp - 0.2), vocab_size=10))
    for p, args, ks, lib in ((path, ["--temperature", "0.5", "--k", "1,3"], [1, 3], dict(temperature=0.5)),
                             (sparse, ["--k", "2"], [2], {})):
        r = runner.invoke(app, ["inspect", p, "--json", *args])
        assert r.exit_code == 0, r.output
        want = inspect_dump(p, ks, **lib).as_dict()
        assert json.loads(r.stdout) == json.loads(json.dumps(want))
    r = runner.invoke(app, ["inspect", path, "--temperature", "0.5", "--k", "1,3"])
    figures = inspect_dump(path, [1, 3], temperature=0.5).drafts["tiny"]
    assert f"{figures.alpha['mean']:.4f}" in r.stdout
    assert f"{figures.expected_by_k[3].mean_acceptance_length:.3f}" in r.stdout
