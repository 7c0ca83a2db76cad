"""Build data/synthetic_pair.npz: a clearly SYNTHETIC dense logit dump (no real model behind it).

It exists so the README's main command has something to run on before a real-model dump ships.
Target logits at each position are a random Zipf-like profile over a shuffled vocabulary (so some
positions are near-deterministic and others are flat); each draft is the target plus Gaussian noise of
a different scale, plus an occasional "hard" position where the draft disagrees more.  The trajectory
tokens are sampled from the target at temperature 1, so the metadata says temperature 1, no filters.

    python data/make_synthetic.py            # writes data/synthetic_pair.npz (deterministic: seed 2026)
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from fastspec.io import save_dump  # noqa: E402

N, T, V = 12, 64, 512
SEED = 2026


def main(out: str | None = None) -> str:
    rng = np.random.default_rng(SEED)
    ranks = np.arange(1, V + 1, dtype=np.float64)
    target = np.empty((N, T, V), np.float64)
    for n in range(N):
        for t in range(T):
            sharp = rng.uniform(0.6, 3.0)  # how peaked this position's distribution is
            target[n, t, rng.permutation(V)] = -sharp * np.log(ranks)
    hard = rng.random((N, T, 1)) < 0.15
    drafts = {}
    for name, scale in (("near", 0.35), ("mid", 0.9), ("far", 2.0)):
        noise = rng.normal(0.0, scale, size=(N, T, V)) * np.where(hard, 2.5, 1.0)
        drafts[name] = (target + noise).astype(np.float16)
    target16 = target.astype(np.float16)
    p = np.exp(target16.astype(np.float64) - target16.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    tokens = np.array([[rng.choice(V, p=p[n, t]) for t in range(T)] for n in range(N)], dtype=np.int64)
    lengths = np.full(N, T, dtype=np.int64)
    lengths[::3] = T - 16  # some shorter sequences
    path = out or str(pathlib.Path(__file__).with_name("synthetic_pair.npz"))
    return save_dump(path, target16, drafts, tokens=tokens, lengths=lengths, temperature=1.0, top_k=0,
                     top_p=1.0, compressed=True)


if __name__ == "__main__":
    print(main(*sys.argv[1:]))
