"""Simulator throughput: simulated draft positions per second (Bernoulli and token mode), and the wall
time of the README's main command.  Not a test; run ``python benchmarks/bench_simulate.py``.

Bernoulli mode is compared, in the same process and interleaved, against a NumPy reference replay that
vectorizes over trials (the obvious way to write it without Numba).  "Judged draft positions" are the
drafted positions whose acceptance coin was actually thrown (the first rejection included).
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _common import time_interleaved  # noqa: E402

from fastspec.simulation.runners import bernoulli as _bernoulli  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]


def numpy_replay(alpha, lengths, k, trials, seed):
    """Reference: every trial of a row advances in lockstep; coins from NumPy's generator."""
    rng = np.random.default_rng(seed)
    steps = accepted = judged = 0
    for n in range(alpha.shape[0]):
        L = int(lengths[n])
        t = np.zeros(trials, dtype=np.int64)
        while True:
            live = t < L
            if not live.any():
                break
            kk = np.minimum(k, L - 1 - t)
            plain = live & (kk <= 0)
            t[plain] += 1
            act = live & (kk > 0)
            if not act.any():
                continue
            idx = np.flatnonzero(act)
            kk_a = kk[idx]
            pos = t[idx, None] + np.arange(k)[None, :]
            a = np.where(np.arange(k)[None, :] < kk_a[:, None], alpha[n, np.minimum(pos, L - 1)], 0.0)
            ok = rng.random((idx.size, k)) < a
            j = np.where(ok.all(1), kk_a, np.argmin(ok, axis=1))
            j = np.minimum(j, kk_a)
            steps += idx.size
            accepted += int(j.sum())
            judged += int(np.minimum(j + 1, kk_a).sum())
            t[idx] += j + 1
    return steps, accepted, judged


def judged_positions(mc, k):
    # judged = accepted + rejections (a step that accepted fewer than it drafted threw one failing coin)
    hist = mc["hist"]
    return int(mc["accepted"].sum() + hist[:k].sum())


def main():
    rng = np.random.default_rng(0)
    N, T, k, trials = 256, 1024, 4, 200
    alpha = rng.beta(4, 1.5, size=(N, T))
    lengths = np.full(N, T, dtype=np.int64)
    row_ids = np.arange(N, dtype=np.int64)
    mc = _bernoulli(alpha, lengths, row_ids, k, trials, 20, 1)
    judged = judged_positions(mc, k)
    ref_trials = 20
    _, _, judged_ref = numpy_replay(alpha, lengths, k, ref_trials, 1)
    res = time_interleaved({
        "fastspec": lambda: _bernoulli(alpha, lengths, row_ids, k, trials, 20, 1),
        "numpy_ref": lambda: numpy_replay(alpha, lengths, k, ref_trials, 1),
    }, repeats=5)
    fs_rate = judged / res["fastspec"]
    ref_rate = judged_ref / res["numpy_ref"]
    print(f"== Bernoulli replay: alpha [{N}, {T}], k={k}, {trials} trials ({judged / 1e6:.1f}M judged positions)")
    print(f"fastspec : {res['fastspec'] * 1e3:8.1f} ms  -> {fs_rate / 1e6:7.1f} M judged draft positions/s")
    print(f"numpy ref: {res['numpy_ref'] * 1e3:8.1f} ms ({ref_trials} trials) -> {ref_rate / 1e6:7.1f} M/s")
    print(f"ratio fastspec/numpy (throughput): {fs_rate / ref_rate:.1f}x")

    from fastspec.simulation import simulate

    dump = ROOT / "data" / "synthetic_pair.npz"
    simulate(str(dump), k=4, mode="token", trials=2, drafts=["mid"])  # compile
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        r = simulate(str(dump), k=4, mode="token", trials=8, drafts=["mid"])
        times.append(time.perf_counter() - t0)
    row = r.results[0]
    judged_tok = row.token_check["judged_positions"]
    med = float(np.median(times))
    print(f"\n== token mode on {dump.name} (V=512), k=4, 8 trials: {med:.2f} s median of 3, "
          f"{judged_tok / med / 1e3:.1f} k judged positions/s (every step through verify_logits)")

    main_dump = ROOT / "data" / "smollm2_exit_top64.npz"
    cmd = [sys.executable, "-m", "fastspec_cli", "simulate", str(main_dump), "--k", "1,2,4,8"]
    env = dict(os.environ)
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        walls.append(time.perf_counter() - t0)
    print(f"\n== README main command (fastspec simulate {main_dump.name} --k 1,2,4,8): "
          f"wall {np.median(walls):.2f} s median of 3 "
          "(process start, imports and cached Numba code included)")


if __name__ == "__main__":
    main()
