"""Benchmark: α = Σ min(p, q) over dense logit dumps, fastspec vs NumPy and PyTorch CPU references.

    python benchmarks/bench_acceptance.py [--quick] [--repeats N]

Sizes (from issue #4): float16 [16, 256, 49152] and float32 [4, 256, 128256] (target and draft).
References, in the same process: NumPy float64 (softmax, minimum, sum; row blocks so memory stays sane)
and PyTorch CPU float32 (``torch.softmax``, ``torch.minimum``, ``sum``; skipped when torch is absent).
Floor: one plain parallel read pass over the same bytes.  Reported: medians (ms) and ratios.
"""
from __future__ import annotations

import argparse
import os
import sys

import numba
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import print_table, time_interleaved  # noqa: E402

from fastspec import acceptance_rates  # noqa: E402
from fastspec._numba.jit import parallel_kernel, prange  # noqa: E402

BLOCK = 256


@parallel_kernel
def _read_pass(a, b, nthreads):
    n = a.shape[0]
    acc = np.zeros(nthreads, dtype=np.uint64)
    for c in prange(nthreads):
        s = np.uint64(0)
        for i in range(c * n // nthreads, (c + 1) * n // nthreads):
            s += a[i] ^ b[i]
        acc[c] = s
    return acc.sum()


def read_pass(P, Q):
    return _read_pass(P.reshape(-1).view(np.uint64), Q.reshape(-1).view(np.uint64), numba.get_num_threads())


def numpy_ref(P, Q):
    P2 = P.reshape(-1, P.shape[-1])
    Q2 = Q.reshape(-1, Q.shape[-1])
    out = np.empty(P2.shape[0])
    for r in range(0, P2.shape[0], BLOCK):
        x = P2[r:r + BLOCK].astype(np.float64)
        y = Q2[r:r + BLOCK].astype(np.float64)
        x -= x.max(-1, keepdims=True)
        y -= y.max(-1, keepdims=True)
        np.exp(x, out=x)
        np.exp(y, out=y)
        x /= x.sum(-1, keepdims=True)
        y /= y.sum(-1, keepdims=True)
        out[r:r + BLOCK] = np.minimum(x, y).sum(-1)
    return out.reshape(P.shape[:-1])


def torch_ref_factory():
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(numba.get_num_threads())

    def ref(P, Q):
        tp = torch.from_numpy(P.reshape(-1, P.shape[-1]))
        tq = torch.from_numpy(Q.reshape(-1, Q.shape[-1]))
        outs = []
        with torch.no_grad():
            for r in range(0, tp.shape[0], BLOCK):
                p = torch.softmax(tp[r:r + BLOCK].float(), dim=-1)
                q = torch.softmax(tq[r:r + BLOCK].float(), dim=-1)
                outs.append(torch.minimum(p, q).sum(-1, dtype=torch.float64))
        return torch.cat(outs).numpy().reshape(P.shape[:-1])

    ref.version = torch.__version__
    return ref


def make(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    P = np.empty(shape, dtype=dtype)
    Q = np.empty(shape, dtype=dtype)
    for n in range(shape[0]):  # logits-like: heavy spread, draft correlated with target
        x = rng.standard_normal(shape[1:], dtype=np.float32) * 4
        P[n] = x
        Q[n] = x + rng.standard_normal(shape[1:], dtype=np.float32) * 2
    return P, Q


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke test)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [((16, 256, 49152), np.float16), ((4, 256, 128256), np.float32)]
    if args.quick:
        sizes = [((2, 64, 49152), np.float16), ((1, 64, 128256), np.float32)]
    tref = torch_ref_factory()
    print(f"threads: numba {numba.get_num_threads()}; torch: {getattr(tref, 'version', 'absent (skipped)')}")
    rows = []
    for shape, dt in sizes:
        P, Q = make(shape, dt)
        label = f"{np.dtype(dt).name} {list(shape)}"
        a = acceptance_rates(P, Q)
        sub = (slice(0, 1), slice(0, 16))
        err = np.abs(a[sub] - numpy_ref(P[sub], Q[sub])).max()
        fns = {"fastspec": lambda: acceptance_rates(P, Q), "read pass": lambda: read_pass(P, Q),
               "numpy f64": lambda: numpy_ref(P, Q)}
        if tref is not None:
            terr = np.abs(a[sub] - tref(P[sub], Q[sub])).max()
            fns["torch f32"] = lambda: tref(P, Q)
        else:
            terr = float("nan")
        res = time_interleaved(fns, repeats=args.repeats, warmup=1)
        rows.append((label, res))
        print(f"{label}: {2 * P.nbytes / 2**20:.0f} MiB read; max |Δα| vs numpy f64 {err:.2e}, vs torch f32 {terr:.2e}")
    print_table("alpha = sum min(p, q)", rows, subject="fastspec", floor="read pass")


if __name__ == "__main__":
    main()
