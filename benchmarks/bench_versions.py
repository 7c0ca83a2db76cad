"""Before/after: this checkout's fastspec against another checkout of it, in one process, interleaved.

    git worktree add /tmp/fastspec-old <commit>
    python benchmarks/bench_versions.py /tmp/fastspec-old [--repeats 7]

The other checkout's package is imported under the name ``fastspec_old`` (its modules import each other
relatively), so both versions run the same inputs in the same process, round-robin, and each row prints the
median of both and their ratio (old / new: above 1 means this checkout is faster).  Sizes: every size of
``bench_verify.py`` (float32 logits), the alpha pass of ``bench_acceptance.py`` (float16 and float32 dumps in
memory) and the Bernoulli replay of ``bench_simulate.py``.  Compile time is excluded (one warm-up round).
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import time_interleaved  # noqa: E402

import fastspec  # noqa: E402

VERIFY_SIZES = [(1, 4, 32000), (1, 4, 128256), (8, 4, 128256), (32, 4, 128256), (64, 8, 152064)]
ALPHA_SIZES = [(np.float16, (16, 256, 49152)), (np.float32, (4, 256, 128256))]


def load_old(path: str):
    link_dir = tempfile.mkdtemp(prefix="fastspec-old-")
    os.symlink(os.path.join(os.path.abspath(path), "fastspec"), os.path.join(link_dir, "fastspec_old"))
    sys.path.insert(0, link_dir)
    return importlib.import_module("fastspec_old")


def row(label, res):
    o, n = res["old"], res["new"]
    print(f"{label:>34}  old {o * 1e3:10.3f} ms   new {n * 1e3:10.3f} ms   old/new {o / n:5.2f}x", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("old", help="path of the other checkout (its repository root)")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    old = load_old(args.old)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"old: {old.__file__}\nnew: {fastspec.__file__}\nload average {load:.2f}, {os.cpu_count()} CPUs")
    rng = np.random.default_rng(0)
    print("\n== verify_logits (float32, draft logits, temperature 1)")
    for B, K, V in VERIFY_SIZES:
        t = (rng.standard_normal((B, K + 1, V)) * 3).astype(np.float32)
        d = (t[:, :K] + rng.standard_normal((B, K, V)).astype(np.float32)).astype(np.float32)
        toks = fastspec.sample_tokens(d, rng.random((B, K)) * 0.999 + 1e-6)
        a = fastspec.verify_logits(t, d, toks, seed=1)
        b = old.verify_logits(t, d, toks, seed=1)
        same = int((a.tokens == b.tokens).all())
        res = time_interleaved({"old": lambda: old.verify_logits(t, d, toks, seed=1),
                                "new": lambda: fastspec.verify_logits(t, d, toks, seed=1)}, repeats=args.repeats)
        row(f"B={B} K={K} V={V} (same tokens: {same})", res)
    print("\n== alpha over a dump in memory (acceptance_rates, temperature 1)")
    for dtype, shape in ALPHA_SIZES:
        P = (rng.standard_normal(shape) * 3).astype(dtype)
        Q = (P.astype(np.float32) + rng.standard_normal(shape).astype(np.float32)).astype(dtype)
        err = float(np.abs(fastspec.acceptance_rates(P, Q) - old.acceptance_rates(P, Q)).max())
        res = time_interleaved({"old": lambda: old.acceptance_rates(P, Q),
                                "new": lambda: fastspec.acceptance_rates(P, Q)}, repeats=args.repeats)
        row(f"{np.dtype(dtype).name} {list(shape)} (max |diff| {err:.1e})", res)
    print("\n== Bernoulli replay (simulate on alpha [256, 1024], k = 4, 200 trials)")
    alpha = rng.beta(4, 1.5, size=(256, 1024))
    lengths = np.full(256, 1024, np.int64)
    ids = np.arange(256, dtype=np.int64)
    from fastspec.simulation.runners import bernoulli as new_replay

    old_sim = importlib.import_module("fastspec_old.simulate")
    old_replay = getattr(old_sim, "_bernoulli", None)  # before the consolidation (31b14e8)
    if old_replay is None:  # a checkout after it
        old_replay = importlib.import_module("fastspec_old.simulate.runners").bernoulli
    res = time_interleaved({"old": lambda: old_replay(alpha, lengths, ids, 4, 200, 20, 0),
                            "new": lambda: new_replay(alpha, lengths, ids, 4, 200, 20, 0)}, repeats=args.repeats)
    a = new_replay(alpha, lengths, ids, 4, 200, 20, 0)
    b = old_replay(alpha, lengths, ids, 4, 200, 20, 0)
    row(f"replay (same counts: {int(all((a[k] == b[k]).all() for k in ('tokens', 'steps', 'hist')))})", res)


if __name__ == "__main__":
    main()
