"""What this process may use of the machine: one place that counts CPUs (the affinity mask, not the host's total)."""
from __future__ import annotations

import os

__all__ = ["available_cpus"]


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a container or ``taskset`` limits it), or
    ``os.cpu_count()`` where the platform has none; at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1
