"""Benchmark: α extraction over a sharded dense float16 dump -- one process vs Dask LocalCluster 1 / 2 workers.

    python benchmarks/bench_dask.py [--gb 2.1] [--shards 8] [--vocab 32000] [--repeats 3] [--dir /tmp] [--keep]

Writes a sharded dump (target + one draft, float16, directory-of-.npy shards) of about ``--gb`` GB under
``--dir`` (deleted afterwards unless ``--keep``), then times ``dump_acceptance(ShardedDump(...))`` (temperature 1, no
filters: the fused kernel) three ways, interleaved round-robin, medians of ``--repeats`` after one warm-up
round: in this process (Numba on every core), on a LocalCluster with 1 worker process (Numba threads = cores)
and with 2 worker processes (Numba threads = cores // 2 each).  Every result is compared bitwise with
the first single-process result (a 1-ulp difference there means a kernel freshly compiled in one process vs
loaded from Numba's cache in another -- see tests/test_shards.py::test_fresh_compile_equals_cached_kernel).
Throughput = logit bytes read (target + draft) / median wall time.

The dump is freshly written, so it is in the page cache (RAM) when the machine has room: this measures
the compute + process/transfer overhead, not the disk.  Cluster start-up is not timed.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fastspec.acceptance import dump_acceptance  # noqa: E402
from fastspec.io.shards import ShardedDump  # noqa: E402


def write_dump(root, gb, shards, V, T=256, seed=0):
    bytes_per_seq = T * V * 2 * 2  # target + draft, float16
    N = max(shards, int(round(gb * 1e9 / bytes_per_seq)))
    N = -(-N // shards) * shards
    per = N // shards
    rng = np.random.default_rng(seed)
    for i in range(shards):
        d = os.path.join(root, f"shard-{i:03d}")
        os.makedirs(d)
        tgt = np.lib.format.open_memmap(os.path.join(d, "target_logits.npy"), "w+", np.float16, (per, T, V))
        dft = np.lib.format.open_memmap(os.path.join(d, "draft_logits.npy"), "w+", np.float16, (per, T, V))
        for n in range(per):
            x = rng.standard_normal((T, V), dtype=np.float32) * 3
            tgt[n] = x
            dft[n] = x + rng.standard_normal((T, V), dtype=np.float32)
        tgt.flush()
        dft.flush()
        del tgt, dft
        np.save(os.path.join(d, "temperature.npy"), np.float64(1.0))
    return N, T, N * bytes_per_seq


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gb", type=float, default=2.1)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    logging.getLogger("distributed").setLevel(logging.ERROR)

    cores = len(os.sched_getaffinity(0))
    root = tempfile.mkdtemp(prefix="fastspec-bench-dask-", dir=args.dir)
    clusters = []
    try:
        t0 = time.perf_counter()
        N, T, nbytes = write_dump(root, args.gb, args.shards, args.vocab)
        print(f"dump: {root}  {args.shards} shards, N={N} T={T} V={args.vocab} float16 target+draft, "
              f"{nbytes / 1e9:.2f} GB of logits (written in {time.perf_counter() - t0:.0f} s)")
        ref = dump_acceptance(ShardedDump(root))["draft"].alpha  # also compiles / loads the Numba cache
        runs = {"single process": ShardedDump(root)}
        for workers in (1, 2):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cl = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1", silence_logs=logging.ERROR)
            c = Client(cl, set_as_default=False)
            clusters.append((c, cl))
            runs[f"dask {workers} worker{'s' if workers > 1 else ''}"] = ShardedDump(root, client=c)
        samples = {k: [] for k in runs}
        equal = {k: True for k in runs}
        maxdiff = {k: 0.0 for k in runs}
        for rnd in range(args.repeats + 1):  # round 0: warm-up (worker imports, page cache), not counted
            for name, s in runs.items():
                t1 = time.perf_counter()
                a = dump_acceptance(s)["draft"].alpha
                dt = time.perf_counter() - t1
                equal[name] &= a.tobytes() == ref.tobytes()
                maxdiff[name] = max(maxdiff[name], float(np.abs(a - ref).max()))
                if rnd:
                    samples[name].append(dt)
        load = open("/proc/loadavg").read().split()[:3]
        print(f"machine: {cores} cores; load average before timing table: {' '.join(load)} (shared machine)")
        base = statistics.median(samples["single process"])
        one = statistics.median(samples["dask 1 worker"])
        print(f"\n{'path':<16} {'numba thr/task':>14} {'median s':>9} {'GB/s':>7} {'vs single':>9} {'vs 1 worker':>11}"
              f"   samples")
        for name, s in runs.items():
            med = statistics.median(samples[name])
            thr = s.last_run.get("numba_threads") or [cores]
            print(f"{name:<16} {','.join(map(str, thr)):>14} {med:9.2f} {nbytes / med / 1e9:7.2f} {base / med:8.2f}x "
                  f"{one / med:10.2f}x   {' '.join(f'{x:.2f}' for x in samples[name])}")
        for name in runs:
            print(f"{name}: α bitwise equal to the first single-process result: "
                  f"{'yes' if equal[name] else 'NO (max |diff| %.3g)' % maxdiff[name]}")
        print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    finally:
        for c, cl in clusters:
            c.close()
            cl.close()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
