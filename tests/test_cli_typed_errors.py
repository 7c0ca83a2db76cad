"""The CLI's helpers raise typed errors (issue #20, item 7): ``import_hf`` a :class:`fastspec.errors.MissingExtra`,
``open_scheduler`` a :class:`fastspec.errors.ClusterError`; the one error boundary (cli/_app.py) prints the same one
line and exit code 1 the helpers printed themselves before (with ``fail()``)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec.errors import ClusterError, FastspecError, MissingExtra
from fastspec.io import save_dump
from fastspec_cli.main import app

runner = CliRunner()

HF_HINT = ("install the extra: pip install 'fastspec[hf]' (CPU torch: pip install torch==2.13.0)")


@pytest.fixture
def no_hf(monkeypatch):
    """``from fastspec import hf`` raises ImportError, as without torch / transformers."""
    import fastspec

    for name in ("OMP_WAIT_POLICY", "HF_HUB_OFFLINE", "TRANSFORMERS_VERBOSITY", "HF_HUB_DISABLE_PROGRESS_BARS"):
        if name in os.environ:  # import_hf sets defaults; give them back afterwards
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delattr(fastspec, "hf", raising=False)
    monkeypatch.setitem(sys.modules, "fastspec.hf", None)
    try:
        from fastspec import hf
    except ImportError as exc:
        return str(exc)
    pytest.fail(f"fastspec.hf is still importable: {hf}")


def test_import_hf_raises_missing_extra(no_hf):
    from fastspec_cli._hf import import_hf

    with pytest.raises(MissingExtra) as ei:
        import_hf()
    e = ei.value
    assert isinstance(e, ImportError) and isinstance(e, FastspecError) and not isinstance(e, ValueError)
    assert str(e) == f"this command needs torch and transformers ({no_hf}); {HF_HINT}"


def test_missing_hf_is_one_line_exit_1(no_hf, tmp_path):
    r = runner.invoke(app, ["cost", "--target", str(tmp_path / "no-such-model")])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == f"fastspec: error: this command needs torch and transformers ({no_hf}); {HF_HINT}\n"


@pytest.fixture
def dask_fails(monkeypatch):
    """distributed's LocalCluster and Client that fail at once (no cluster is started, no port is dialled)."""
    distributed = pytest.importorskip("distributed")

    def no_cluster(*_a, **_k):
        raise RuntimeError("no free\nports")

    def no_client(*_a, **_k):
        raise OSError("connection refused")

    monkeypatch.setattr(distributed, "LocalCluster", no_cluster)
    monkeypatch.setattr(distributed, "Client", no_client)


LOCAL_MSG = "--scheduler local:2: cannot start a local Dask cluster (RuntimeError: no free ports)"
TCP_MSG = "cannot reach the Dask scheduler at tcp://127.0.0.1:9 within 5 s (OSError: connection refused)"


@pytest.mark.usefixtures("dask_fails")
def test_open_scheduler_raises_cluster_errors():
    from fastspec_cli._dask import open_scheduler

    for spec, msg in (("local:2", LOCAL_MSG), ("tcp://127.0.0.1:9", TCP_MSG)):
        with pytest.raises(ClusterError) as ei:
            with open_scheduler(spec):
                pytest.fail("the body ran")
        assert str(ei.value) == msg and isinstance(ei.value, RuntimeError) and not isinstance(ei.value, ValueError)


@pytest.mark.usefixtures("dask_fails")
def test_cluster_failures_are_one_line_exit_1(tmp_path):
    P = np.zeros((1, 3, 5), dtype=np.float16)
    path = str(save_dump(tmp_path / "d.npz", P, {"d": P}))
    for spec, msg in (("local:2", LOCAL_MSG), ("tcp://127.0.0.1:9", TCP_MSG)):
        for command in ("inspect", "simulate"):
            r = runner.invoke(app, [command, path, "--scheduler", spec, "--json"])
            assert r.exit_code == 1 and r.stdout == ""
            assert r.stderr == f"fastspec: error: {msg}\n"  # no "ClusterError:" before it, as before
