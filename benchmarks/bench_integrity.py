"""Cost of the CRC-32 check of stored ``.npz`` members (issue #12): the α pass and ``fastspec inspect`` with and
without it, on a large float16 stored dump.

    python benchmarks/bench_integrity.py [--dump PATH] [--gib 1.0] [--repeats 11] [--cli 7]

Without ``--dump`` it writes a stored ``.npz`` of about ``--gib`` GiB (float16, T=128, V=32768, target and one
draft) to a temporary directory (the page cache then holds it: what is timed is the check, not the disk).
Runs are interleaved, so a change in machine load hits every variant; prints medians of wall and CPU time and
the load average.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib

import numpy as np

from _common import time_interleaved


def make_dump(path: str, gib: float) -> str:
    from fastspec import save_dump

    T, V = 128, 32768
    N = max(1, int(gib * (1 << 30) / (2 * T * V * 2)))
    rng = np.random.default_rng(0)
    P, Q = np.empty((N, T, V), np.float16), np.empty((N, T, V), np.float16)
    for n in range(N):
        x = rng.standard_normal((T, V), np.float32) * 3
        P[n], Q[n] = x, x + rng.standard_normal((T, V), np.float32)
    return save_dump(path, P, {"d": Q}, temperature=1.0)


def cpu_medians(fns, repeats):
    samples = {k: [] for k in fns}
    for i in range(repeats):
        for name in (list(fns) if i % 2 == 0 else list(fns)[::-1]):
            c = time.process_time()
            fns[name]()
            samples[name].append(time.process_time() - c)
    return {k: statistics.median(v) for k, v in samples.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump")
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--cli", type=int, default=7)
    args = ap.parse_args()
    import fastspec.io.sources as sources
    from fastspec.acceptance import dump_acceptance
    from fastspec.io.crc import crc32

    with tempfile.TemporaryDirectory() as tmp:
        path = args.dump or make_dump(os.path.join(tmp, "big.npz"), args.gib)
        print(f"{path}: {os.path.getsize(path) / (1 << 30):.2f} GiB")

        def alpha(check, crc=crc32):
            def run():
                sources.crc32 = crc
                dump_acceptance(path, verify_integrity=check)
            return run

        fns = {"no check": alpha(False), "check": alpha(True), "check, one thread": alpha(True, zlib.crc32)}
        wall = time_interleaved(fns, repeats=args.repeats)
        cpu = cpu_medians(fns, args.repeats)
        for k in fns:
            print(f"alpha pass, {k:>18}: wall {wall[k]:.3f} s, CPU {cpu[k]:.3f} s (medians)")
        cmd = [sys.executable, "-m", "fastspec_cli", "inspect", path, "--json"]
        runs = {"check": cmd, "no check": cmd + ["--no-integrity-check"]}
        times = time_interleaved({k: (lambda c=c: subprocess.run(c, check=True, capture_output=True))
                                  for k, c in runs.items()}, repeats=args.cli)
        for k, t in times.items():
            print(f"fastspec inspect, {k:>8}: wall {t:.3f} s (median)")
    print("load average", os.getloadavg(), "cores", os.cpu_count())


if __name__ == "__main__":
    main()
