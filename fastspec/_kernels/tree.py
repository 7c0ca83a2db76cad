"""Token-tree kernels: recursive rejection sampling over candidates, tree checks, per-position beta(w).

The rules (node numbering, proposals ``iid`` / ``without_replacement`` / ``deterministic``, random streams)
are in :mod:`fastspec.tree`.  Candidate-sampling modes are the integer codes of
:data:`fastspec._kernels.codes.CANDIDATE_CODES`.
"""
from __future__ import annotations

import numpy as np

from .._numba.jit import kernel, parallel_kernel, prange
from .._numba.lanes import lane_sum
from .._numba.rng import Stream, candidate_uniform, position_uniform
from ..config import BLOCK
from .codes import (DETERMINISTIC, NO_EXCLUDED, NONE, OUT_OF_RANGE, REACHED_TWICE, TREE_OK,
                    UNREACHABLE, WITHOUT_REPLACEMENT)
from .sample import block_count, sample_weights

# columns of the per-row stats array
DEPTH = 0  # accepted path length
UNDERFLOWS = 1


@kernel
def _sample_row(r, bsum, tmp, u):
    """A token from the weights r (every block sum computed into bsum)."""
    return sample_weights(r, r, 1.0, 0.0, NO_EXCLUDED, bsum, tmp, u)


@kernel
def _reject(r, g, scale, x, mode):
    """r <- max(r - scale * g, 0) (a point mass at x for deterministic candidates); returns the new sum."""
    if mode == DETERMINISTIC:
        r[x] = 0.0
    else:
        for v in range(r.shape[0]):
            d = r[v] - g[v] * scale
            r[v] = d if d > 0.0 else 0.0
    return lane_sum(r, 0, r.shape[0])


@kernel
def tree_row(pt, pd, mode, tree, seed, out, path, stats, work):
    """Verify one row's tree: pt, pd [N, V] probabilities per node, tree = (toks [N], fc [N], ns [N]): the
    nodes' tokens and first-child / next-sibling links; writes out and path [D+1] and stats [2];
    work = (r [V], bsum [nb], tmp [BLOCK]): work arrays."""
    toks, fc, ns = tree
    r, bsum, tmp = work
    node = 0
    depth = 0
    while True:
        p = pt[node]
        child = fc[node]
        if child < 0:  # leaf: bonus token
            out[depth] = _sample_row(p, bsum, tmp, position_uniform(seed, depth, Stream.BONUS))
            stats[DEPTH] = depth
            return
        r[:] = p
        # draft mass not yet drawn (without replacement): the real row sum, not 1 - used
        rem = lane_sum(pd[node], 0, pd.shape[1]) if mode == WITHOUT_REPLACEMENT else 0.0
        s = 0
        accepted = NONE
        while child >= 0:
            x = toks[child]
            if mode == DETERMINISTIC:
                gx = 1.0
            elif mode == WITHOUT_REPLACEMENT:
                # q(x) over the mass still undrawn, at most 1 (a point mass when rounding leaves no other mass)
                gx = min(1.0, pd[node, x] / rem) if rem > 0.0 else 1.0
            else:
                gx = pd[node, x]
            if candidate_uniform(seed, depth, s) * gx <= r[x]:
                accepted = child
                break
            scale = 1.0
            if mode == WITHOUT_REPLACEMENT:
                scale = 1.0 / rem if rem > 0.0 else 0.0
            total = _reject(r, pd[node] if mode != DETERMINISTIC else r, scale, x, mode)
            if not total > 0.0:
                stats[UNDERFLOWS] += 1
                r[:] = p
            else:
                inv = 1.0 / total
                for v in range(r.shape[0]):
                    r[v] *= inv
            if mode == WITHOUT_REPLACEMENT:
                rem -= pd[node, x]
            child = ns[child]
            s += 1
        if accepted < 0:
            out[depth] = _sample_row(r, bsum, tmp, position_uniform(seed, depth, Stream.RESIDUAL))
            stats[DEPTH] = depth
            return
        out[depth] = toks[accepted]
        path[depth] = accepted
        node = accepted
        depth += 1


@parallel_kernel
def tree_rows(pt, pd, mode, toks, fc, ns, seeds, out, path, stats):
    V = pt.shape[2]
    nb = block_count(V)
    for b in prange(pt.shape[0]):
        r = np.empty(V)
        bsum = np.empty(nb)
        tmp = np.empty(BLOCK)
        tree_row(pt[b], pd[b], mode, (toks[b], fc[b], ns[b]), seeds[b], out[b], path[b], stats[b], (r, bsum, tmp))


@kernel
def check_trees(fc, ns, nn, depth_out):
    """Walk each row's tree from node 0: (row, node, code) of the first problem, or (-1, -1, TREE_OK);
    depth_out[b] = the depth of row b's tree."""
    B, N = fc.shape
    for b in range(B):
        seen = np.zeros(N, np.int64)
        depth = np.zeros(N, np.int64)
        stack = np.empty(N + 1, np.int64)
        stack[0] = 0
        seen[0] = 1
        top = 1
        maxd = 0
        while top > 0:
            top -= 1
            n = stack[top]
            c = fc[b, n]
            while c >= 0:
                if c >= nn[b]:
                    return b, n, OUT_OF_RANGE
                if seen[c]:
                    return b, c, REACHED_TWICE
                seen[c] = 1
                depth[c] = depth[n] + 1
                maxd = max(maxd, depth[c])
                stack[top] = c
                top += 1
                c = ns[b, c]
        for n in range(nn[b]):
            if not seen[n]:
                return b, n, UNREACHABLE
        depth_out[b] = maxd
    return NONE, NONE, TREE_OK


@kernel
def siblings_from_parent(parent, nn, fc, ns):
    """first-child / next-sibling arrays from a validated parent array (siblings in index order)."""
    B, N = parent.shape
    for b in range(B):
        for n in range(N):
            fc[b, n] = NONE
            ns[b, n] = NONE
        for n in range(nn[b] - 1, 0, -1):  # reverse order: prepend, so siblings end in index order
            a = parent[b, n]
            ns[b, n] = fc[b, a]
            fc[b, a] = n


@parallel_kernel
def beta_iid(P, Q, w, out):
    """beta = 1 - prod_s (1 - a_s), a_s = sum min(r_s, q), r_{s+1} = max(r_s - q, 0) / (1 - a_s), r_1 = p."""
    R, V = P.shape
    for i in prange(R):
        r = np.empty(V)
        t = np.empty(V)
        r[:] = P[i]
        rej = 1.0
        for s in range(w):
            for v in range(V):
                t[v] = min(r[v], Q[i, v])
            a = min(lane_sum(t, 0, V), 1.0)
            rej *= 1.0 - a
            if not rej > 0.0 or s == w - 1:
                break
            for v in range(V):
                d = r[v] - Q[i, v]
                r[v] = d if d > 0.0 else 0.0
            total = lane_sum(r, 0, V)
            if not total > 0.0:
                break
            for v in range(V):
                r[v] /= total
        out[i] = 1.0 - rej
