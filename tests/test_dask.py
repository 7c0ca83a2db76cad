"""Sharded dumps on a real Dask cluster (2 worker processes, loopback only): same bits as one machine,
a bad shard stops the run naming it, a worker killed mid-run changes nothing, unreachable scheduler.

Reference results come from this process; the workers and the CLI subprocesses use whatever Numba cache
they find (freshly compiled or loaded): the kernels' sums have a fixed order, so every origin gives the same bits
(``tests/test_jit.py::test_fresh_compile_equals_cached_kernel``).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

distributed = pytest.importorskip("distributed")

import shardutil  # noqa: E402
from fastspec.acceptance import dump_acceptance  # noqa: E402
from fastspec.distributed import TASK_PREFIX  # noqa: E402
from fastspec.io.shards import ShardedDump  # noqa: E402
from fastspec.simulation import simulate  # noqa: E402
from fastspec_cli.main import app  # noqa: E402

pytestmark = pytest.mark.dask

runner = CliRunner()
FLAGS = [{}, {"temperature": 0.7, "top_k": 20, "top_p": 0.9}]
SIM = dict(k="1-4", seed=9, trials=40, batches=10, draft_cost=0.05)

def _jsonable_sim(res):
    d = res.as_dict()
    d.pop("dump")
    return json.loads(json.dumps(d, sort_keys=True))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("dd")
    # enough rows per shard that each task takes a moment, and more shards than workers
    merged, sdir, _ = shardutil.write(root / "dense", shardutil.make_data(21, N=24, T=32, V=300),
                                      cuts=(0, 3, 8, 9, 15, 20, 24))
    smerged, ssdir, _ = shardutil.write(root / "sparse", shardutil.make_data(22, kind="sparse"))
    ref = {}
    for i, flags in enumerate(FLAGS):
        for n, r in dump_acceptance(merged, **flags).items():
            ref[f"dense{i}_{n}"] = r.alpha
    for n, r in dump_acceptance(smerged).items():
        ref[f"sparse_{n}_lower"], ref[f"sparse_{n}_upper"] = r.lower, r.upper
    sim = _jsonable_sim(simulate(merged, **SIM))
    return dict(merged=merged, sdir=sdir, sparse_sdir=ssdir, ref=ref, sim=sim)


@pytest.fixture(scope="module")
def client():
    import logging

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                       host="127.0.0.1", silence_logs=logging.ERROR)
    c = distributed.Client(cluster, set_as_default=False)
    try:
        c.wait_for_workers(2, timeout=60)
        yield c
    finally:
        c.close()
        cluster.close()


def _check_dense(got, ref, i):
    for n, r in got.items():
        want = ref[f"dense{i}_{n}"]
        assert r.alpha.dtype == want.dtype and r.alpha.shape == want.shape
        assert r.alpha.tobytes() == want.tobytes(), f"{n}: α differs from the single-machine computation"


@pytest.mark.parametrize("i", range(len(FLAGS)))
def test_alpha_bitwise_equal_on_the_cluster(client, data, i):
    s = ShardedDump(data["sdir"], client=client)
    got = dump_acceptance(s, **FLAGS[i])
    assert sorted(got) == ["far", "near"]
    _check_dense(got, data["ref"], i)
    assert s.last_run["tasks"] == 6
    assert all(w.startswith("tcp://127.0.0.1") for w in s.last_run["workers"])  # really ran on the workers
    assert s.last_run["numba_threads"] == [max(1, len(os.sched_getaffinity(0)) // 2)]  # cores / 2 workers


def test_sparse_bounds_bitwise_equal(client, data):
    got = dump_acceptance(ShardedDump(data["sparse_sdir"], client=client))
    for n, r in got.items():
        assert r.lower.tobytes() == data["ref"][f"sparse_{n}_lower"].tobytes()
        assert r.upper.tobytes() == data["ref"][f"sparse_{n}_upper"].tobytes()


def _run_py(code, *args):
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


@pytest.mark.subprocess
def test_simulate_identical_to_single_machine(client, data):
    code = ("import json, sys; from distributed import Client; from fastspec.simulation import simulate; "
            "c = Client(sys.argv[1], set_as_default=False); "
            "d = simulate(sys.argv[2], client=c, **json.loads(sys.argv[3])).as_dict(); d.pop('dump'); "
            "print(json.dumps(d, sort_keys=True)); c.close()")
    out = _run_py(code, client.scheduler.address, data["sdir"], json.dumps(SIM))
    assert json.loads(out) == data["sim"]
    assert out.strip() == json.dumps(data["sim"], sort_keys=True)  # identical text, not just close numbers


def test_bad_shard_stops_the_run(client, tmp_path):
    _, sdir, paths = shardutil.write(tmp_path, shardutil.make_data(23, N=6), cuts=(0, 2, 4, 6),
                                     names=["s0", "s1", "s2"])
    arr = np.load(os.path.join(paths[2], "draft_logits__far.npy"), mmap_mode="r+")
    arr[1, 0, 7] = np.inf  # position 0 is always valid
    arr.flush()
    del arr
    s = ShardedDump(sdir, client=client)
    with pytest.raises(ValueError, match=r"shard 2 of 3: .*shards/s2: array 'draft_logits__far': row \[1, 0\] "
                                         r"contains \+inf"):
        dump_acceptance(s)
    from fastspec.simulation import simulate

    with pytest.raises(ValueError, match="shard 2 of 3"):
        simulate(sdir, client=client, k=2)
    # the cluster is still usable, and a run without the bad draft is complete
    got = dump_acceptance(s, drafts=["near"])
    assert got["near"].alpha.shape == (6, 13)


def test_missing_shard_file_on_worker(client, tmp_path):
    _, sdir, paths = shardutil.write(tmp_path, shardutil.make_data(24, N=4), cuts=(0, 2, 4), names=["a.npz", "b.npz"])
    s = ShardedDump(sdir, client=client)
    os.remove(paths[1])  # e.g. storage a worker does not see
    with pytest.raises(ValueError, match=r"shard 1 of 2: .*b.npz: not found on worker"):
        dump_acceptance(s)


class _KillOnce(distributed.WorkerPlugin):
    """Kills the worker process the first time one of fastspec's α tasks starts executing on it."""

    name = "fastspec-test-kill-once"

    def __init__(self, marker):
        self.marker = marker

    def transition(self, key, _start, finish, **_kwargs):
        if finish == "executing" and str(key).startswith(TASK_PREFIX) and not os.path.exists(self.marker):
            with open(self.marker, "w") as fh:
                fh.write(f"{os.getpid()} {key}\n")
            os._exit(1)


def test_worker_killed_mid_run(client, data, tmp_path):
    import cloudpickle

    marker = str(tmp_path / "killed")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import this test module
    try:
        client.register_plugin(_KillOnce(marker))
        pids_before = set(client.run(os.getpid).values())
        got = dump_acceptance(ShardedDump(data["sdir"], client=client))
        client.unregister_worker_plugin(_KillOnce.name)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    with open(marker) as fh:
        pid, key = fh.read().split()
    assert int(pid) in pids_before and key.startswith(TASK_PREFIX)  # a worker really died mid-run
    client.wait_for_workers(2, timeout=60)
    assert int(pid) not in set(client.run(os.getpid).values())  # ... and was replaced
    _check_dense(got, data["ref"], 0)  # complete and equal


def test_cli_unreachable_scheduler(data):
    r = runner.invoke(app, ["simulate", data["sdir"], "--scheduler", "tcp://127.0.0.1:1", "--json"])
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr.count("\n") == 1 and "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in r.stderr


@pytest.mark.subprocess
def test_cli_tcp_scheduler_same_json(client, data):
    cli = "import sys; from fastspec_cli.main import app; sys.argv[0] = 'fastspec'; app()"
    common = ["--json", "--k", "1-3", "--seed", "2"]
    a = json.loads(_run_py(cli, "simulate", data["sdir"], "--scheduler", client.scheduler.address,
                           *common))
    b = json.loads(_run_py(cli, "simulate", data["merged"], *common))
    assert a.pop("dump") == data["sdir"]
    b.pop("dump")
    assert a == b
    r = runner.invoke(app, ["inspect", data["sdir"], "--scheduler", client.scheduler.address, "--json"])
    assert r.exit_code == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["N"] == 24 and info["format"] == "sharded (6 shards)" and set(info["acceptance"]) == {"far", "near"}


def test_cli_local_cluster(data):
    r = runner.invoke(app, ["inspect", data["sdir"], "--scheduler", "local:1", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["N"] == 24


class _NoWorkers:
    """A client whose cluster has no workers, or cannot be reached (``run`` is all the probe calls)."""

    def __init__(self, error=None):
        self.error = error

    def run(self, _fn):
        if self.error is not None:
            raise self.error
        return {}


@pytest.mark.parametrize("client,pattern", [(_NoWorkers(), "has no workers"),
                                            (_NoWorkers(OSError("timed out")), "cannot reach the Dask workers")])
def test_cluster_failures_are_cluster_errors(tmp_path, client, pattern):
    from fastspec.errors import ClusterError

    _, sdir, _ = shardutil.write(tmp_path, shardutil.make_data(25, N=4), cuts=(0, 2, 4), names=["a.npz", "b.npz"])
    with pytest.raises(ClusterError, match=pattern) as ei:
        dump_acceptance(ShardedDump(sdir, client=client))
    assert isinstance(ei.value, RuntimeError) and not isinstance(ei.value, ValueError)  # exit 1, not "bad input"
