"""Sharded dumps on one machine (no Dask): same answers as the merged dump, layout rules, shard errors."""
from __future__ import annotations

import json
import os
import shutil
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import shardutil
from fastspec import load_dump, save_dump
from fastspec.acceptance import _chunk_acceptance, dump_acceptance
from fastspec.io import Dump
from fastspec.io.shards import ShardedDump, is_sharded, list_shards
from fastspec.io import open_dump
from fastspec.simulation import simulate
from fastspec_cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return shardutil.write(tmp_path_factory.mktemp("dense"), shardutil.make_data(1))


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    return shardutil.write(tmp_path_factory.mktemp("sparse"), shardutil.make_data(2, kind="sparse"))


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for n in a:
        assert np.array_equal(a[n].valid, b[n].valid)
        for f in ("alpha", "lower", "upper"):
            x, y = getattr(a[n], f), getattr(b[n], f)
            assert (x is None) == (y is None), f
            if x is not None:
                assert x.dtype == y.dtype and x.shape == y.shape
                assert x.tobytes() == y.tobytes(), f"{n}.{f} differs"  # bitwise


def test_structure_matches_merged(dense):
    merged, sdir, paths = dense
    s = ShardedDump(sdir)
    with load_dump(merged) as m:
        assert (s.N, s.T, s.V, s.kind, s.drafts, s.metadata) == (m.N, m.T, m.V, m.kind, m.drafts, m.metadata)
        assert np.array_equal(s.lengths, m.lengths)
        assert s.shards == paths
        assert s.offsets.tolist() == list(shardutil.CUTS)
        assert s.shard_of(2) == (1, 0) and s.shard_of(10) == (3, 3)
        info = s.describe()
        assert info["N"] == m.N and info["format"] == "sharded (4 shards)" and len(info["shards"]) == 4
        shapes = {a["name"]: a["shape"] for a in m.describe()["arrays"]}
        assert {a["name"]: a["shape"] for a in info["arrays"]} == shapes


@pytest.mark.parametrize("flags", [{}, {"temperature": 0.6, "top_k": 7, "top_p": 0.9}, {"temperature": 0.0},
                                   {"min_p": 0.05}])
def test_alpha_bitwise_equal_dense(dense, flags):
    merged, sdir, _ = dense
    want = dump_acceptance(merged, **flags)
    _assert_same(dump_acceptance(ShardedDump(sdir), **flags), want)
    _assert_same(_chunk_acceptance(ShardedDump(sdir), **flags), want)  # the generic chunk path agrees too
    _assert_same(dump_acceptance(ShardedDump(sdir), max_bytes=3000, **flags), want)


def test_alpha_bitwise_equal_sparse(sparse):
    merged, sdir, _ = sparse
    _assert_same(dump_acceptance(ShardedDump(sdir)), dump_acceptance(merged))
    _assert_same(dump_acceptance(ShardedDump(sdir), temperature=0.0, drafts=["far"]),
                 dump_acceptance(merged, temperature=0.0, drafts=["far"]))


@pytest.mark.parametrize("max_bytes", [80, 2000, 40 * 2 * 13 * 3, 1 << 26])
def test_chunks_cut_like_the_merged_dump(dense, max_bytes):
    merged, sdir, _ = dense
    with load_dump(merged) as m:
        want = list(m.iter_chunks(max_bytes=max_bytes, drafts=["near"]))
        got = list(ShardedDump(sdir).iter_chunks(max_bytes=max_bytes, drafts=["near"]))
        assert [(c.start, c.stop) for c in got] == [(c.start, c.stop) for c in want]
        for a, b in zip(got, want, strict=True):
            assert np.array_equal(a.valid, b.valid)
            assert np.array_equal(a.target, b.target) and np.array_equal(a.drafts["near"], b.drafts["near"])


@pytest.mark.parametrize("mode,k", [("bernoulli", "1-4"), ("token", "1,3")])
def test_simulate_identical_to_merged(dense, mode, k):
    merged, sdir, _ = dense
    a = simulate(sdir, k=k, mode=mode, seed=11, trials=20, batches=10, draft_cost=0.1).as_dict()
    b = simulate(merged, k=k, mode=mode, seed=11, trials=20, batches=10, draft_cost=0.1).as_dict()
    assert a.pop("dump") == sdir
    b.pop("dump")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_simulate_depends_on_the_seed(dense):  # the equality above is not vacuous
    _, sdir, _ = dense
    a = simulate(sdir, k=3, seed=1, trials=20, batches=10).as_dict()
    b = simulate(sdir, k=3, seed=2, trials=20, batches=10).as_dict()
    assert a["results"][0]["mean_acceptance_length"] != b["results"][0]["mean_acceptance_length"]


def test_rows_identified_globally(dense, tmp_path):
    """Re-splitting the same rows differently changes nothing."""
    merged, _, _ = dense
    _, sdir2, _ = shardutil.write(tmp_path, shardutil.make_data(1), cuts=(0, 5, 6, 11))
    a = simulate(sdir2, k=2, seed=4, trials=20, batches=10).as_dict()
    b = simulate(merged, k=2, seed=4, trials=20, batches=10).as_dict()
    assert a["results"] == b["results"]


# ---------------------------------------------------------------------------------------- layout rules

def test_directory_of_npy_is_one_dump(tmp_path):
    t, d, ln, meta = shardutil.make_data(3, N=2)
    p = save_dump(str(tmp_path / "one"), t, d, lengths=ln, **meta)
    os.makedirs(tmp_path / "one" / "sub")  # an extra subdirectory does not make it a shard set
    save_dump(str(tmp_path / "one" / "sub" / "x.npz"), t, d)
    assert not is_sharded(p)
    with open_dump(p) as x:
        assert isinstance(x, Dump) and x.N == 2
    with pytest.raises(ValueError, match="one dump"):
        list_shards(p)


def test_natural_order_and_ignored_entries(tmp_path):
    data = shardutil.make_data(4, N=12)
    names = [f"shard-{i}.npz" for i in (1, 2, 10)]  # lexicographic order would put 10 before 2
    merged, sdir, paths = shardutil.write(tmp_path, data, cuts=(0, 3, 7, 12), names=names)
    (tmp_path / "shards" / "README.txt").write_text("notes")
    os.makedirs(tmp_path / "shards" / "empty-dir")
    shutil.copy(paths[0], tmp_path / "shards" / ".hidden.npz")
    s = open_dump(sdir)
    assert isinstance(s, ShardedDump)
    assert [os.path.basename(p) for p in s.shards] == names
    _assert_same(dump_acceptance(s), dump_acceptance(merged))


def test_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    assert not is_sharded(str(tmp_path))
    with pytest.raises(ValueError, match="no shards found"):
        ShardedDump(str(tmp_path))


def test_explicit_list_of_paths(dense):
    merged, _, paths = dense
    _assert_same(dump_acceptance(ShardedDump(paths)), dump_acceptance(merged))
    with pytest.raises(ValueError, match="at least one"):
        ShardedDump([])


# ---------------------------------------------------------------------------------------- shard errors

def _split(tmp_path, data, cuts=(0, 3, 6)):
    return shardutil.write(tmp_path, data, cuts=cuts, names=["a.npz", "b.npz"])


@pytest.mark.parametrize("change,what", [
    (lambda t, d, ln, m: (t, {"near": d["near"]}, ln, m), "drafts"),
    (lambda t, d, ln, m: (t[..., :-1], {k: v[..., :-1] for k, v in d.items()}, ln, m), "vocabulary"),
    (lambda t, d, ln, _m: (t, d, ln, {"temperature": 0.5}), "metadata"),
    (lambda t, d, ln, m: (t.astype(np.float32), d, ln, m), "dtypes"),
    (lambda t, d, ln, m: (t[:, :-1], {k: v[:, :-1] for k, v in d.items()}, np.minimum(ln, 12), m), "positions T"),
])
def test_mismatched_shard_is_named(tmp_path, change, what):
    data = shardutil.make_data(5, N=6)
    _, sdir, paths = _split(tmp_path, data)
    t, d, ln, m = change(*data)
    os.remove(paths[1])
    save_dump(paths[1], t[3:6], {k: v[3:6] for k, v in d.items()}, lengths=ln[3:6], **m)
    with pytest.raises(ValueError, match=f"shard 1 of 2: .*b.npz: {what}"):
        ShardedDump(sdir)


def test_corrupt_shard_is_named(tmp_path):
    _, sdir, paths = _split(tmp_path, shardutil.make_data(6, N=6))
    with open(paths[1], "r+b") as fh:
        fh.truncate(os.path.getsize(paths[1]) // 2)
    with pytest.raises(ValueError, match="shard 1 of 2: .*b.npz"):
        ShardedDump(sdir)


def _poison(tmp_path, seed, value, where):
    """Two directory-of-.npy shards a/ and b/; then ``value`` written into b's target logits at ``where``."""
    _, sdir, paths = shardutil.write(tmp_path, shardutil.make_data(seed, N=6), cuts=(0, 3, 6), names=["a", "b"])
    arr = np.load(os.path.join(paths[1], "target_logits.npy"), mmap_mode="r+")
    arr[where] = value
    arr.flush()
    del arr
    return sdir


def test_bad_values_stop_the_run_naming_the_shard(tmp_path):
    sdir = _poison(tmp_path, 7, np.nan, (1, 0, 5))  # global sequence 4 = shard b, sequence 1
    s = ShardedDump(sdir)  # structure is fine: values are checked as rows are read
    with pytest.raises(ValueError, match=r"shard 1 of 2: .*b: array 'target_logits': row \[1, 0\] contains NaN"):
        dump_acceptance(s)
    with pytest.raises(ValueError, match=r"shard 1 of 2: .*b: array 'target_logits': NaN at index \[1, 0, 5\]"):
        s.validate()
    with pytest.raises(ValueError, match="shards/b"):
        simulate(sdir, k=2)


# ---------------------------------------------------------------------------------------- CLI, no cluster

def test_cli_inspect_and_simulate_on_shards(dense):
    merged, sdir, _ = dense
    r = runner.invoke(app, ["inspect", sdir, "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["N"] == 11 and info["format"] == "sharded (4 shards)"
    m = json.loads(runner.invoke(app, ["inspect", merged, "--json"]).stdout)
    assert info["acceptance"] == m["acceptance"]
    a = json.loads(runner.invoke(app, ["simulate", sdir, "--json", "--k", "2", "--seed", "3"]).stdout)
    b = json.loads(runner.invoke(app, ["simulate", merged, "--json", "--k", "2", "--seed", "3"]).stdout)
    assert a["results"] == b["results"]


def test_cli_bad_shard_one_line(tmp_path):
    sdir = _poison(tmp_path, 8, -np.inf, (2, 0))  # a row with no finite logit
    r = runner.invoke(app, ["simulate", sdir, "--json"])
    assert r.exit_code == 2
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "shard 1 of 2" in r.stderr and "shards/b" in r.stderr


@pytest.mark.parametrize("spec", ["bogus", "local:0", "tcp://host", "tcp://h:99999"])
def test_cli_bad_scheduler_spec(dense, spec):
    r = runner.invoke(app, ["inspect", dense[1], "--scheduler", spec])
    assert r.exit_code == 2
    assert r.stderr.startswith("fastspec: error:") and r.stderr.count("\n") == 1


def test_cli_scheduler_without_dask(dense, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if fastspec[dask] were not installed
    r = runner.invoke(app, ["simulate", dense[1], "--scheduler", "local:2"])
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and "pip install 'fastspec[dask]'" in r.stderr


@pytest.mark.subprocess
def test_library_does_not_import_dask():
    import subprocess

    code = ("import sys, fastspec, fastspec.io, fastspec.io.shards, fastspec.distributed, fastspec.acceptance, "
            "fastspec.simulation; "
            "print(sorted(m for m in ('dask', 'distributed', 'typer', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_typed_shard_errors(tmp_path, dense):
    from fastspec.errors import DumpFormatError, DumpNotFound, InvalidInput, InvalidType

    with pytest.raises(DumpNotFound):
        list_shards(tmp_path / "nope")
    (tmp_path / "f.txt").write_text("x")
    with pytest.raises(InvalidInput, match="not a directory of shards"):
        list_shards(tmp_path / "f.txt")
    with pytest.raises(DumpFormatError, match="no shards found"):
        ShardedDump(str(tmp_path))
    with pytest.raises(InvalidInput, match="at least one"):
        ShardedDump([])
    with pytest.raises(InvalidType, match="retries"):
        ShardedDump(dense[1], retries=1.5)
    with pytest.raises(InvalidInput, match="threads_per_worker"):
        ShardedDump(dense[1], threads_per_worker=0)
    with pytest.raises(InvalidInput, match="no draft named 'zz'"):
        dump_acceptance(ShardedDump(dense[1]), drafts=["zz"])


def test_one_code_fingerprint():
    """Workers are checked against the one library fingerprint (fastspec._numba.jit), not a second, hand-kept one."""
    import fastspec
    from fastspec import distributed
    from fastspec._numba.jit import library_fingerprint
    from fastspec.errors import ClusterError, DumpFormatError, DumpNotFound

    assert distributed.library_fingerprint is library_fingerprint
    part = {"error": None, "arrays": {}, "version": fastspec.__version__, "code": library_fingerprint(), "worker": "w"}
    distributed.check_part(part, 0, 1)
    with pytest.raises(ClusterError, match="shard 1 of 2: worker w runs fastspec"):
        distributed.check_part(dict(part, code="0" * 16), 1, 2)
    with pytest.raises(ClusterError):
        distributed.check_part(dict(part, version="0.0.0"), 1, 2)
    with pytest.raises(DumpFormatError, match="shard 0 of 1: bad"):
        distributed.check_part(dict(part, error="bad"), 0, 1)
    with pytest.raises(DumpNotFound):
        distributed.check_part(dict(part, error="gone", not_found=True), 0, 1)
