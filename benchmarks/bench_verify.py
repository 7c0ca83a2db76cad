"""Benchmark fastspec.verify_logits against the peers a user would otherwise call.

Peers: Hugging Face ``transformers.generation.utils._speculative_sampling`` (one
sequence per call, looped over the batch, at 1 and 2 torch threads), a clean
batched PyTorch CPU reference, a NumPy reference.  Two floors: one plain read
pass over the same logits (a parallel Numba sum), and one vectorized float64
exp pass (fastspec's exp, stored) over the rows the verifier actually visited
(their count is printed: per row, the positions up to the first rejection, target
and draft).  ``fastspec visited`` is the same call with ``validate="visited"`` (only
the rows the decision reads are read); at batch 1 both are also timed back to back
(each contender's calls in a row: a service's steady state).  torch/transformers
are an optional benchmark-only extra: missing peers are skipped with a note.

Data: ``--data close`` (default: a draft close to the target, drafts sampled from
it, several positions visited) or ``random`` (independent target and draft logits:
the first draft is almost always rejected); ``--dtype float16`` passes float16
logits as they are.

Usage: python benchmarks/bench_verify.py [--repeats 7] [--sizes all|small] [--data close|random]
       [--dtype float32|float16]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# Two OpenMP runtimes (Numba's and torch's) share the cores here; without a passive wait
# policy the idle one spin-waits and steals the CPU from the other, which distorts every row.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numba  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import flush_caches, print_table, time_interleaved  # noqa: E402

import fastspec  # noqa: E402
from fastspec._numba.fastexp import fexp  # noqa: E402

SIZES = [(1, 4, 32000), (1, 4, 128256), (8, 4, 128256), (32, 4, 128256), (64, 8, 152064)]


@numba.njit(parallel=True, fastmath={"reassoc", "nsz"})  # a floor, not a result: any summation order will do
def read_pass(t, d):
    """Floor: read every logit once (sum per row, parallel over rows)."""
    s = np.zeros(t.shape[0])
    for b in numba.prange(t.shape[0]):
        acc = 0.0
        for i in range(t.shape[1]):
            for v in range(t.shape[2]):
                acc += t[b, i, v]
        for i in range(d.shape[1]):
            for v in range(d.shape[2]):
                acc += d[b, i, v]
        s[b] = acc
    return s


def _exp_rows(rows, out):
    for r in numba.prange(rows.shape[0]):
        x = rows[r]
        o = out[r]
        m = np.float64(x[0])
        for v in range(x.shape[0]):
            o[v] = fexp(np.float64(x[v]) - m - 5.0)


_exp_parallel = numba.njit(parallel=True)(_exp_rows)
_exp_serial = numba.njit(_exp_rows)


def exp_pass(rows, out, parallel):
    """Floor: fastspec's vectorized exp over ``rows`` [R, V] into ``out``: parallel over rows when fastspec runs
    threads (B >= 2), one thread when it runs one (B = 1: no thread wake-up in the floor either)."""
    return (_exp_parallel if parallel else _exp_serial)(rows, out)


def visited_rows(res):
    """Rows the token verifier reads past their max pass: target and draft rows of the positions up to the
    first rejection (or the bonus position)."""
    n = res.num_accepted + 1
    return int((n + np.minimum(n, res.num_draft)).sum())


LAT_CALLS = 50
LAT_BLOCKS = 5


def back_to_back(fns, calls=LAT_CALLS, blocks=LAT_BLOCKS):
    """Median seconds per call when each function is called ``calls`` times in a row (a service's steady state
    for the verifier alone: its data and code stay cached), blocks of the contenders alternating."""
    samples = {k: [] for k in fns}
    for _ in range(blocks):
        for name, fn in fns.items():
            fn()
            for _ in range(calls):
                t0 = time.perf_counter()
                fn()
                samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def numpy_reference(t, d, toks, rng):
    """Batched NumPy: softmax everything, gather, compare, residual, inverse-CDF sample."""
    B, K1, V = t.shape
    K = K1 - 1

    def softmax(x):
        x = x.astype(np.float64)
        x = np.exp(x - x.max(-1, keepdims=True))
        return x / x.sum(-1, keepdims=True)

    p, q = softmax(t), softmax(d)
    px = np.take_along_axis(p[:, :K], toks[:, :, None], 2)[:, :, 0]
    qx = np.take_along_axis(q, toks[:, :, None], 2)[:, :, 0]
    u = rng.random((B, K))
    acc = u * qx <= px
    n_acc = np.where(acc.all(1), K, np.argmin(acc, 1))
    out = np.full((B, K1), -1)
    for b in range(B):
        n = n_acc[b]
        out[b, :n] = toks[b, :n]
        if n < K:
            w = np.maximum(p[b, n] - q[b, n], 0)
        else:
            w = p[b, K]
        c = np.cumsum(w)
        out[b, n] = min(int(np.searchsorted(c, rng.random() * c[-1])), V - 1)
    return out


def make_torch_peers(t, d, toks):
    try:
        import torch
    except ImportError:
        print("note: torch not installed -- skipping the PyTorch and Hugging Face peers "
              "(pip install torch transformers)")
        return {}
    tt, td, tk = torch.from_numpy(t), torch.from_numpy(d), torch.from_numpy(toks)
    B, K1, V = t.shape
    K = K1 - 1

    def torch_batched():
        p = torch.softmax(tt.double(), -1)
        q = torch.softmax(td.double(), -1)
        px = p[:, :K].gather(2, tk[:, :, None])[:, :, 0]
        qx = q.gather(2, tk[:, :, None])[:, :, 0]
        u = torch.rand(B, K, dtype=torch.float64)
        acc = u * qx <= px
        n_acc = torch.where(acc.all(1), K, (~acc).int().argmax(1))
        rows = torch.arange(B)
        pn = p[rows, n_acc]
        qn = torch.cat([q, torch.zeros(B, 1, V, dtype=q.dtype)], 1)[rows, n_acc]
        res = torch.clamp(pn - qn, min=0)
        res = torch.where((n_acc == K)[:, None], pn, res)
        res = res / res.sum(-1, keepdim=True)
        return torch.multinomial(res, 1)

    peers = {}
    for nt in (1, 2):
        def f(nt=nt):
            torch.set_num_threads(nt)
            return torch_batched()
        peers[f"torch batched {nt}t"] = f
    try:
        from transformers.generation.utils import _speculative_sampling
    except Exception as exc:  # noqa: BLE001
        print(f"note: transformers not importable ({exc.__class__.__name__}) -- skipping the HF peer")
        return peers
    candidate = torch.cat([torch.zeros(B, 3, dtype=torch.long), tk], 1)

    def hf(nt):
        torch.set_num_threads(nt)
        for b in range(B):
            _speculative_sampling(candidate[b:b + 1], td[b:b + 1].float(), K, tt[b:b + 1].float(), False)

    peers["HF 1t"] = lambda: hf(1)
    peers["HF 2t"] = lambda: hf(2)
    return peers


def make_data(B, K, V, kind, dtype, seed=0):
    rng = np.random.default_rng(seed)
    t = rng.standard_normal((B, K + 1, V), dtype=np.float32) * 2
    if kind == "random":
        d = rng.standard_normal((B, K, V), dtype=np.float32) * 2
    else:
        d = (t[:, :K] + rng.standard_normal((B, K, V), dtype=np.float32)).astype(np.float32)
    toks = fastspec.sample_tokens(d, rng.random((B, K)) * 0.999 + 1e-6)  # drafts sampled from q
    return t.astype(dtype), d.astype(dtype), toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--sizes", default="all")
    ap.add_argument("--data", choices=["close", "random"], default="close")
    ap.add_argument("--dtype", choices=["float32", "float16"], default="float32")
    ap.add_argument("--cache", choices=["cold", "hot"], default="cold",
                    help="cold: every contender's call starts from flushed caches (logits in DRAM); hot: calls "
                    "follow each other with whatever the previous one left in cache")
    args = ap.parse_args()
    sizes = SIZES if args.sizes == "all" else SIZES[:2]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"data {args.data}, dtype {args.dtype}, caches {args.cache}, load average {load:.2f}, {os.cpu_count()} CPUs")
    rows = []
    lat = []
    for B, K, V in sizes:
        rng = np.random.default_rng(0)
        t, d, toks = make_data(B, K, V, args.data, args.dtype)
        res0 = fastspec.verify_logits(t, d, toks, seed=1)
        n_vis = visited_rows(res0)
        vis = np.ascontiguousarray(np.concatenate([t.reshape(-1, V), d.reshape(-1, V)])[:n_vis].astype(np.float32))
        vis_out = np.empty(vis.shape)
        t32, d32 = t.astype(np.float32), d.astype(np.float32)
        fns = {
            "fastspec": lambda: fastspec.verify_logits(t, d, toks, seed=1),
            "fastspec visited": lambda: fastspec.verify_logits(t, d, toks, seed=1, validate="visited"),
            "read floor": lambda: read_pass(t32, d32),
            "exp floor": lambda: exp_pass(vis, vis_out, B >= 2),
            "numpy": lambda: numpy_reference(t32, d32, toks, rng),
        }
        fns.update(make_torch_peers(t32, d32, toks))
        res = time_interleaved(fns, repeats=args.repeats, warmup=1,
                               before=flush_caches if args.cache == "cold" else None)
        rows.append((f"B={B} K={K} V={V}", res))
        if B == 1:
            lat.append((f"B={B} K={K} V={V}", n_vis,
                        back_to_back({n: fns[n] for n in ("fastspec", "fastspec visited", "exp floor",
                                                          "read floor")})))
        print(f"B={B} K={K} V={V}: {n_vis} rows visited; " + ", ".join(f"{k}={v * 1e3:.2f}ms" for k, v in res.items()),
              flush=True)
    if lat:
        print(f"\n== batch 1 back to back (each contender's calls follow each other: its own data and code cached; "
              f"median of {LAT_BLOCKS} x {LAT_CALLS} calls, blocks alternating)")
        for label, n_vis, res in lat:
            e = res["exp floor"]
            print(f"{label}: exp over the {n_vis} visited rows {e * 1e3:.3f} ms, read of all rows "
                  f"{res['read floor'] * 1e3:.3f} ms; fastspec {res['fastspec'] * 1e3:.3f} ms = "
                  f"{res['fastspec'] / e:.2f}x the exp, validate='visited' {res['fastspec visited'] * 1e3:.3f} ms "
                  f"= {res['fastspec visited'] / e:.2f}x (target <= 1.5x)")
    print_table(f"verify_logits, {args.dtype} logits ({args.data} draft, {args.cache} caches)", rows,
                subject="fastspec", floor="read floor")
    peers = [n for n in rows[0][1] if not n.startswith("fastspec") and n not in ("read floor", "exp floor")]
    for label, res in rows:
        best = min(res[n] for n in peers)
        print(f"{label}: fastest peer {best / res['fastspec']:.1f}x slower (target >= 3x); "
              f"fastspec/read floor {res['fastspec'] / res['read floor']:.2f}x; "
              f"fastspec/exp over the visited rows {res['fastspec'] / res['exp floor']:.2f}x "
              f"(validate='visited' {res['fastspec visited'] / res['exp floor']:.2f}x); "
              f"latency {res['fastspec'] * 1e3:.3f} ms ({res['fastspec visited'] * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
