"""Shared test settings: hypothesis profiles sized for a 2-core CI machine."""
from hypothesis import HealthCheck, settings

settings.register_profile(
    "fastspec",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # CI runs are reproducible: same examples every time
)
settings.load_profile("fastspec")
