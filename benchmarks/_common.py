"""Timing helpers shared by fastspec benchmarks: interleaved runs, medians, ratio tables.

Not a test: run the benchmark scripts directly (``python benchmarks/bench_verify.py``).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping


def time_interleaved(fns: Mapping[str, Callable[[], object]], *, repeats: int = 7, warmup: int = 1,
                     min_time: float = 0.0, before: Callable[[], object] | None = None) -> dict[str, float]:
    """Median wall time (seconds) of each callable, runs interleaved round-robin.

    Every round calls each function once, so slow drifts (turbo, other load) hit
    all contenders alike.  ``warmup`` rounds are discarded (JIT compile, caches).
    Keeps going past ``repeats`` rounds until ``min_time`` seconds have elapsed.
    ``before`` (untimed) runs before every timed call, e.g. :func:`flush_caches` so that every contender
    starts from the same cold caches rather than from whatever the previous one left.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    t_start = time.perf_counter()
    rounds = 0
    while rounds < repeats or time.perf_counter() - t_start < min_time:
        for name, fn in fns.items():
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
        rounds += 1
    return {k: statistics.median(v) for k, v in samples.items()}


_FLUSH = None


def flush_caches(nbytes: int = 96 << 20) -> None:
    """Evict the CPU caches: read and write a buffer larger than any last-level cache (96 MiB by default)."""
    global _FLUSH
    import numpy as np

    if _FLUSH is None or _FLUSH.nbytes != nbytes:
        _FLUSH = np.ones(nbytes // 8)
    _FLUSH += 1.0


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f}"


def print_table(title: str, rows: list[tuple[str, dict[str, float]]], *, subject: str, floor: str | None = None):
    """Print ms medians per size plus ratios peer/subject (speed-up) and subject/floor."""
    names = []
    for _, res in rows:
        for k in res:
            if k not in names:
                names.append(k)
    print(f"\n== {title} (median ms; ratio = peer time / {subject} time)")
    header = f"{'size':>22} " + " ".join(f"{n[:18]:>18}" for n in names)
    print(header)
    for label, res in rows:
        print(f"{label:>22} " + " ".join(f"{fmt_ms(res[n]) if n in res else '      n/a':>18}" for n in names))
    print(f"{'':>22} speed-up of {subject} vs each, and {subject}/floor:")
    for label, res in rows:
        s = res[subject]
        parts = []
        for n in names:
            if n == subject or n not in res:
                continue
            if floor is not None and n == floor:
                parts.append(f"{subject}/floor={s / res[n]:.2f}x")
            else:
                parts.append(f"{n}={res[n] / s:.1f}x")
        print(f"{label:>22} " + "  ".join(parts))
