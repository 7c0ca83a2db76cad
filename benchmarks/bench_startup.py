"""Start-up time of the README main command: an empty Numba cache (every kernel compiled) vs a warm one.

    python benchmarks/bench_startup.py [--cold 3] [--warm 5] [--against OLD_CHECKOUT]

Each run is a fresh process (``python -m fastspec_cli simulate data/smollm2_exit_top64.npz --k 1,2,4,8``); cold
runs get a new empty ``NUMBA_CACHE_DIR`` each, warm runs share one filled by a first run.  Cold and warm runs
alternate, so a change in machine load hits both.  Also reported: the bare ``import fastspec`` and the warm
command split into import vs the rest.  Prints medians and the machine's load average.

``--against DIR`` (another checkout, e.g. ``git worktree add /tmp/fastspec-old 7aba47f``) times instead the warm
main command and the bare imports of this checkout and of DIR, interleaved run by run, each with its own warm
Numba cache, and prints the medians and their ratios (old / new: above 1 means this checkout is faster).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = [sys.executable, "-m", "fastspec_cli", "simulate", os.path.join(ROOT, "data", "smollm2_exit_top64.npz"),
        "--k", "1,2,4,8"]
IMPORT = [sys.executable, "-c", "import fastspec, fastspec_cli.main"]


def run(cmd, cache):
    env = {**os.environ, "NUMBA_CACHE_DIR": cache}
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{r.stderr}")
    return dt, r.stderr


def checkout_env(path: str) -> dict:
    """The environment that imports ``fastspec`` and ``fastspec_cli`` from the checkout at ``path``."""
    links = tempfile.mkdtemp(prefix="fastspec-bench-src-")
    os.symlink(os.path.join(os.path.abspath(path), "fastspec"), os.path.join(links, "fastspec"))
    os.symlink(os.path.join(os.path.abspath(path), "cli"), os.path.join(links, "fastspec_cli"))
    return {**os.environ, "PYTHONPATH": links, "NUMBA_CACHE_DIR": tempfile.mkdtemp(prefix="fastspec-bench-warm-")}


def timed(cmd, env) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)} (PYTHONPATH={env['PYTHONPATH']})\n{r.stderr}")
    return dt


def against(old: str, repeats: int) -> None:
    envs = {"new": checkout_env(ROOT), "old": checkout_env(old)}
    bare = [sys.executable, "-c", "import fastspec"]
    for env in envs.values():
        timed(MAIN, env)  # fills each checkout's warm cache
    times = {(v, w): [] for v in envs for w in ("main", "import")}
    for _ in range(repeats):
        for v, env in envs.items():
            times[v, "main"].append(timed(MAIN, env))
            times[v, "import"].append(timed(bare, env))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"this checkout vs {old}, {repeats} interleaved runs each, load average {load:.2f}, {os.cpu_count()} CPUs")
    for what, label in (("main", "warm main command"), ("import", "import fastspec")):
        o, n = statistics.median(times["old", what]), statistics.median(times["new", what])
        print(f"  {label:18s} old {o:.3f} s  new {n:.3f} s  old/new {o / n:.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--against", help="another checkout: time its warm main command and import against this one's")
    args = ap.parse_args()
    if args.against:
        return against(args.against, args.warm)
    warm_cache = tempfile.mkdtemp(prefix="fastspec-bench-warm-")
    run(MAIN, warm_cache)  # fills the warm cache
    cold, warm, imp, notices = [], [], [], 0
    for i in range(max(args.cold, args.warm)):
        if i < args.cold:
            with tempfile.TemporaryDirectory(prefix="fastspec-bench-cold-") as c:
                dt, err = run(MAIN, c)
                cold.append(dt)
                notices += "compiling the kernels" in err
        if i < args.warm:
            warm.append(run(MAIN, warm_cache)[0])
            imp.append(run(IMPORT, warm_cache)[0])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"README main command (python -m fastspec_cli simulate smollm2_exit_top64.npz --k 1,2,4,8), "
          f"load average {load:.2f}, {os.cpu_count()} CPUs")
    print(f"  cold (empty Numba cache): median {statistics.median(cold):.2f} s over {len(cold)} runs "
          f"({', '.join(f'{v:.2f}' for v in cold)}); compile notice printed in {notices} of {len(cold)}")
    print(f"  warm (cache filled):      median {statistics.median(warm):.2f} s over {len(warm)} runs "
          f"({', '.join(f'{v:.2f}' for v in warm)})")
    print(f"  of which import fastspec + the CLI: median {statistics.median(imp):.2f} s")
    print(f"  cold / warm = {statistics.median(cold) / statistics.median(warm):.1f}x")


if __name__ == "__main__":
    main()
