"""The whole suite on every core: with pytest-xdist installed (the test extra), a run of the whole suite -- no test
paths given: the README test command or the fast selection -- is spread over the machine's cores.

The tests are independent (a tmp_path each, free ports, a Numba cache folder of their own where a cold cache is the
point; the vLLM environment is made under a lock).  ``-n 0`` runs the suite in one process; naming test files or
``-k`` runs in one process as before, unless ``-n`` is given.  The files are handed out whole (``--dist
loadfile``), so a module fixture is built once per run.  The long tests are handed out first, so that none of them
runs alone at the end: those marked slow, then the real vLLM engines.  With ``--all``, vLLM's environment, when it
is missing, is made in the background from the start (``vllm_env``, under its lock), while the workers run the
slow tests; the vLLM tests wait for it only if it is not finished when their turn comes.  In a worker, torch
computes with one thread (two workers each running two threads on two cores made a torch-bound test 5x slower);
processes the tests start keep their defaults.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

_creator: subprocess.Popen | None = None


def _order(item) -> int:
    if item.get_closest_marker("vllm"):
        return 1
    return 0 if item.get_closest_marker("slow") else 2


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which turns the number into workers
def pytest_cmdline_main(config):
    if (config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None) is None
            and not hasattr(config, "workerinput") and config.args_source == pytest.Config.ArgsSource.TESTPATHS
            and not config.getoption("keyword") and not config.getoption("collectonly")
            and not config.getoption("usepdb") and _cores() > 1):
        config.option.numprocesses = _cores()
        if config.getoption("dist", "no") == "no":
            config.option.dist = "loadfile"  # a test file's module fixtures (models, dumps) are built once
            # files in the order below (long first), not xdist's default of most tests first: with that, a file of
            # one long test (the real vLLM engine, 66 s) came last and ran alone for 70 s
            config.option.loadscopereorder = False


@pytest.hookimpl(trylast=True)  # after the fast selection (conftest) has dropped what it drops
def pytest_collection_modifyitems(config, items):
    if config.getoption("numprocesses", None) or hasattr(config, "workerinput"):
        items.sort(key=_order)


@pytest.fixture(autouse=True)
def _one_torch_thread_per_worker(request):
    def one():
        torch = sys.modules.get("torch")
        if torch is not None and torch.get_num_threads() != 1:
            torch.set_num_threads(1)

    if hasattr(request.config, "workerinput"):
        one()
        yield
        one()
    else:
        yield


def pytest_configure(config):
    global _creator
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None) or not config.getoption("--all"):
        return
    import vllm_env

    if os.environ.get("FASTSPEC_VLLM_PYTHON") or os.path.exists(os.path.join(vllm_env.ENV_DIR, ".complete")):
        return
    # a failure here is not reported: the first vLLM test then makes the environment itself, and reports it
    _creator = subprocess.Popen([sys.executable, "-c", "import vllm_env; vllm_env.make()"],
                                cwd=os.path.dirname(os.path.abspath(__file__)), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)


def pytest_unconfigure():
    if _creator is not None:
        _creator.wait()
