"""Shared test settings: hypothesis sized for a 2-core machine, and the fast development selection.

``python -m pytest`` runs the fast selection: everything but the tests marked ``slow``, ``hf`` (real or tiny
transformer models), ``dask`` (a local cluster), ``subprocess`` (fresh Python processes), ``statistical``
(calibrated goodness-of-fit tests with many samples) ``vllm`` (the real vLLM engine) and ``llamacpp``
(the real llama.cpp server).  ``python -m pytest
--all`` -- the README test command, which CI runs -- runs every test; an explicit ``-m EXPRESSION`` selects as usual.
"""
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fastspec",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # CI runs are reproducible: same examples every time
)
settings.load_profile("fastspec")

# the session fixture vllm_python (vLLM's own environment); the whole suite spread over the cores (pytest-xdist)
pytest_plugins = ["vllm_env", "spread"]

HEAVY = ("slow", "hf", "dask", "subprocess", "statistical", "vllm", "llamacpp")


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="run every test (the README test command and CI do); without it the fast development "
                          f"selection runs (no test marked {', '.join(HEAVY)})")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--all") or config.getoption("-m"):
        return
    keep, dropped = [], []
    for item in items:
        (dropped if any(item.get_closest_marker(m) for m in HEAVY) else keep).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def pytest_report_header(config):
    if not (config.getoption("--all") or config.getoption("-m")):
        return f"fast selection: tests marked {', '.join(HEAVY)} are deselected (run everything with --all)"
