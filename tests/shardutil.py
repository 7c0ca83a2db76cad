"""Test helper: one dump's data written both merged and split into shards of mixed layouts."""
from __future__ import annotations

import os

import numpy as np

from fastspec import save_dump

CUTS = (0, 2, 3, 7, 11)  # shard sizes 2, 1, 4, 4 (uneven on purpose)


def make_data(seed=0, N=11, T=13, V=40, kind="dense"):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, N)
    lengths[0] = T
    if kind == "dense":
        tgt = rng.normal(0, 2.5, (N, T, V))
        tgt[:, :, 3] = -np.inf  # a masked token
        target = tgt.astype(np.float16)
        drafts = {"near": (tgt + rng.normal(0, 0.6, (N, T, V))).astype(np.float16),
                  "far": (tgt + rng.normal(0, 2.0, (N, T, V))).astype(np.float16)}
        meta = dict(temperature=0.9)
    else:
        k = 6

        def topk(logits):
            lp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
            ids = np.argsort(-lp, axis=-1)[..., :k]
            return ids.astype(np.int32), np.take_along_axis(lp, ids, -1).astype(np.float32)

        base = rng.normal(0, 2.0, (N, T, V))
        target = topk(base)
        drafts = {"near": topk(base + rng.normal(0, 0.5, (N, T, V))),
                  "far": topk(base + rng.normal(0, 2.0, (N, T, V)))}
        meta = dict(temperature=1.0, vocab_size=V)
    return target, drafts, lengths, meta


def _rows(x, a, b):
    return tuple(y[a:b] for y in x) if isinstance(x, tuple) else x[a:b]


def write(root, data, cuts=CUTS, names=None):
    """Write ``merged.npz`` and ``shards/`` (npz and directory-of-npy shards alternately) under ``root``."""
    target, drafts, lengths, meta = data
    root = str(root)
    os.makedirs(root, exist_ok=True)
    merged = save_dump(os.path.join(root, "merged.npz"), target, drafts, lengths=lengths, **meta)
    sdir = os.path.join(root, "shards")
    os.makedirs(sdir, exist_ok=True)
    paths = []
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:], strict=True)):
        name = names[i] if names else (f"part-{i}.npz" if i % 2 == 0 else f"part-{i}")
        p = save_dump(os.path.join(sdir, name), _rows(target, a, b), {k: _rows(v, a, b) for k, v in drafts.items()},
                      lengths=lengths[a:b], **meta)
        paths.append(p)
    return merged, sdir, paths
