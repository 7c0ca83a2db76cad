"""Multi-candidate and token-tree verification (recursive rejection sampling).

At a tree node with target distribution p (the target's next-token distribution after the node's path) the
node's children are candidates for the next token, judged in order: starting from r = p, candidate x_s is
accepted with probability min(1, r(x_s) / g_s(x_s)), where g_s is the distribution x_s was drawn from; on
rejection r <- max(r - g_s, 0) / sum.  An accepted candidate's own children are judged next; when every child
of a node is rejected a token is sampled from r and the step ends; at a leaf a bonus token is sampled from its
target distribution.  The emitted tokens follow the target exactly
(:func:`fastspec.exact.candidate_block_distribution` is the Fraction reference).  Proposals (``sampling``):

* ``"iid"`` -- the children were drawn i.i.d. from the node's draft distribution q (SpecInfer); g_s = q;
* ``"without_replacement"`` -- drawn one after another from q with the earlier siblings removed and
  renormalized (recursive speculative decoding); g_s = q off the earlier siblings / (1 - their q mass);
  siblings must be distinct;
* ``"deterministic"`` -- chosen without randomness (top-w of the draft, n-gram or prompt-lookup trees):
  each child is a point mass, accepted with probability r(x); siblings must be distinct; no draft needed.

Trees are packed as inference engines pack them: node 0 is the root (the last committed token; its own token is
ignored), and either ``parent[n]`` (``parent[0] = -1``, ``0 <= parent[n] < n``; siblings in index order) or
``first_child[n]`` / ``next_sibling[n]`` (-1 for none; siblings in list order).  ``target_probs[b, n]`` is
the target's distribution after node n's path, ``draft_probs[b, n]`` the draft distribution node n's children
were drawn from.

Randomness: ``uniform(row_seed, depth, PURPOSE_CANDIDATE, s)`` for the s-th sibling at tree depth ``depth``,
``(row_seed, depth, PURPOSE_RESIDUAL, 0)`` for the residual and ``(row_seed, depth, PURPOSE_BONUS, 0)`` for the
bonus token: deterministic whatever the thread count, batch composition or row order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._jit import kernel, parallel_kernel, prange
from ._process import probabilities, validate_logits, validate_sampling_params
from ._rng import PURPOSE_BONUS, PURPOSE_CANDIDATE, PURPOSE_RESIDUAL, row_seeds, uniform

__all__ = ["SAMPLING", "TreeVerifyResult", "verify_tree_probs", "verify_tree_logits", "parent_from_siblings",
           "candidate_acceptance"]

SAMPLING = ("iid", "without_replacement", "deterministic")
_MODE = {"iid": 0, "without_replacement": 1, "deterministic": 2}


@dataclass(frozen=True)
class TreeVerifyResult:
    """Result of one batched tree verify step.

    tokens: int64 [B, D+1] -- the accepted path's tokens, then the recovered or bonus token, then -1
        (D = the deepest tree in the batch).
    path: int64 [B, D+1] -- node ids of the accepted path (root excluded), then -1: the KV entries to keep.
    num_accepted: int64 [B]; num_emitted: int64 [B] (num_accepted + 1).
    residual_underflows: int64 [B] -- 1 where a residual summed to 0 in floating point and the token was
        sampled from the node's target distribution instead.
    """

    tokens: np.ndarray
    path: np.ndarray
    num_accepted: np.ndarray
    num_emitted: np.ndarray
    residual_underflows: np.ndarray


@kernel
def _sample_weights(r, total, u):
    """Inverse CDF over non-negative weights r with sum ``total``; the last positive index on fall-off."""
    target = u * total
    c = 0.0
    last = -1
    for v in range(r.shape[0]):
        if r[v] > 0.0:
            last = v
            c += r[v]
            if c >= target:
                return v
    return last


@kernel
def _tree_row(pt, pd, mode, toks, fc, ns, seed, out, path, stats, r):
    V = pt.shape[1]
    node = 0
    depth = 0
    while True:
        p = pt[node]
        child = fc[node]
        if child < 0:  # leaf: bonus token
            total = 0.0
            for v in range(V):
                r[v] = p[v]
                total += p[v]
            out[depth] = _sample_weights(r, total, uniform(seed, depth, PURPOSE_BONUS, 0))
            stats[0] = depth
            return
        rem = 0.0  # draft mass not yet drawn (without replacement): the real row sum, not 1 - used
        for v in range(V):
            r[v] = p[v]
            rem += pd[node, v] if mode == 1 else 0.0
        s = 0
        accepted = -1
        while child >= 0:
            x = toks[child]
            if mode == 2:
                gx = 1.0
            else:
                # proposal probability of x: q(x) over the mass still undrawn, at most 1 (a point mass
                # when rounding leaves no other mass)
                gx = (min(1.0, pd[node, x] / rem) if rem > 0.0 else 1.0) if mode == 1 else pd[node, x]
            if uniform(seed, depth, PURPOSE_CANDIDATE, s) * gx <= r[x]:
                accepted = child
                break
            # rejection: r <- max(r - g, 0) / sum
            total = 0.0
            if mode == 2:
                r[x] = 0.0
                for v in range(V):
                    total += r[v]
            else:
                scale = (1.0 / rem if rem > 0.0 else 0.0) if mode == 1 else 1.0
                for v in range(V):
                    d = r[v] - pd[node, v] * scale
                    d = d if d > 0.0 else 0.0
                    r[v] = d
                    total += d
            if not total > 0.0:
                stats[1] += 1
                for v in range(V):
                    r[v] = p[v]
                total = 1.0
            else:
                inv = 1.0 / total
                for v in range(V):
                    r[v] *= inv
            if mode == 1:
                rem -= pd[node, x]
            child = ns[child]
            s += 1
        if accepted < 0:
            total = 0.0
            for v in range(V):
                total += r[v]
            out[depth] = _sample_weights(r, total, uniform(seed, depth, PURPOSE_RESIDUAL, 0))
            stats[0] = depth
            return
        out[depth] = toks[accepted]
        path[depth] = accepted
        node = accepted
        depth += 1


@parallel_kernel
def _tree_kernel(pt, pd, mode, toks, fc, ns, seeds, out, path, stats):
    for b in prange(pt.shape[0]):
        r = np.empty(pt.shape[2])
        _tree_row(pt[b], pd[b], mode, toks[b], fc[b], ns[b], seeds[b], out[b], path[b], stats[b], r)


@kernel
def _check_tree(fc, ns, nn, depth_out):
    """Walk each row's tree from node 0: returns (row, node, code) of the first problem or (-1, -1, 0).
    code 1: node id out of range, 2: node reached twice (cycle or shared child), 3: node never reached."""
    B, N = fc.shape
    for b in range(B):
        seen = np.zeros(N, np.int64)
        depth = np.zeros(N, np.int64)
        stack = np.empty(N + 1, np.int64)
        top = 0
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
                    return b, n, 1
                if seen[c]:
                    return b, c, 2
                seen[c] = 1
                depth[c] = depth[n] + 1
                maxd = max(maxd, depth[c])
                stack[top] = c
                top += 1
                c = ns[b, c]
        for n in range(nn[b]):
            if not seen[n]:
                return b, n, 3
        depth_out[b] = maxd
    return -1, -1, 0


@kernel
def _siblings_from_parent(parent, nn, fc, ns):
    B, N = parent.shape
    for b in range(B):
        for n in range(N):
            fc[b, n] = -1
            ns[b, n] = -1
        for n in range(nn[b] - 1, 0, -1):  # reverse order: prepend, so siblings end in index order
            a = parent[b, n]
            ns[b, n] = fc[b, a]
            fc[b, a] = n


def parent_from_siblings(first_child, next_sibling):
    """parent [..., N] from first-child / next-sibling arrays (-1 = none); parent of the root is -1."""
    fc = np.asarray(first_child)
    ns = np.asarray(next_sibling)
    parent = np.full(fc.shape, -1, dtype=np.int64)
    for idx in np.ndindex(fc.shape[:-1]):
        for n in range(fc.shape[-1]):
            c = fc[idx + (n,)]
            while c >= 0:
                parent[idx + (c,)] = n
                c = ns[idx + (c,)]
    return parent


def _int_array(name, a, shape):
    arr = np.asarray(a)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array of shape {list(shape)}, got dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got shape {list(arr.shape)}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _validate_tree(tree_tokens, parent, first_child, next_sibling, num_nodes, B, N, V):
    toks = _int_array("tree_tokens", tree_tokens, (B, N))
    if num_nodes is None:
        nn = np.full(B, N, dtype=np.int64)
    else:
        nn = np.asarray(num_nodes)
        if nn.ndim == 0:
            nn = np.full(B, int(nn))
        nn = _int_array("num_nodes", nn, (B,))
        bad = (nn < 1) | (nn > N)
        if bad.any():
            b = int(np.flatnonzero(bad)[0])
            raise ValueError(f"num_nodes[{b}] = {nn[b]} is outside [1, {N}]: count the root (node 0) and its "
                             f"descendants in row {b}")
    inside = np.arange(N)[None, :] < nn[:, None]
    if (parent is None) == (first_child is None and next_sibling is None):
        raise ValueError("give the tree either as parent=[B, N] or as first_child=[B, N] and next_sibling=[B, N]")
    if parent is not None:
        par = _int_array("parent", parent, (B, N))
        idx = np.arange(N)[None, :]
        bad = inside & (idx > 0) & ((par < 0) | (par >= idx))
        if bad.any():
            b, n = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"parent[{b}, {n}] = {par[b, n]} is invalid: node n >= 1 needs a parent in [0, n) "
                             "(node 0 is the root; number nodes so parents come first)")
        par = np.where(inside, par, 0)
        fc = np.empty((B, N), np.int64)
        ns = np.empty((B, N), np.int64)
        _siblings_from_parent(par, nn, fc, ns)
    else:
        if first_child is None or next_sibling is None:
            raise ValueError("first_child and next_sibling must be given together")
        fc = _int_array("first_child", first_child, (B, N))
        ns = _int_array("next_sibling", next_sibling, (B, N))
        for name, a in (("first_child", fc), ("next_sibling", ns)):
            bad = inside & ((a < -1) | (a >= nn[:, None]))
            if bad.any():
                b, n = (int(v) for v in np.argwhere(bad)[0])
                raise ValueError(f"{name}[{b}, {n}] = {a[b, n]} is invalid: use a node id in [1, num_nodes) or -1")
        fc = np.where(inside, fc, -1)
        ns = np.where(inside, ns, -1)
    depth = np.zeros(B, np.int64)
    b, n, code = _check_tree(fc, ns, nn, depth)
    if code:
        what = {1: "is out of range", 2: "is reached twice (a cycle or a shared child)",
                3: "is not reachable from the root"}[code]
        raise ValueError(f"tree row {b}: node {n} {what}; each node must have exactly one parent")
    bad = inside & (np.arange(N)[None, :] > 0) & ((toks < 0) | (toks >= V))
    if bad.any():
        b, n = (int(v) for v in np.argwhere(bad)[0])
        raise ValueError(f"tree_tokens[{b}, {n}] = {toks[b, n]} is invalid: token ids must lie in [0, {V})")
    toks = np.where(inside, toks, 0)
    return toks, fc, ns, nn, depth


def _check_siblings(toks, fc, ns, pd, mode):
    """Distinct siblings (without replacement, deterministic) and q(x) > 0 under the parent's draft."""
    B, N = toks.shape
    for b in range(B):
        for n in range(N):
            c = fc[b, n]
            seen = set()
            while c >= 0:
                x = int(toks[b, c])
                if mode != 0 and x in seen:
                    raise ValueError(f"tree_tokens[{b}, {c}] = {x} repeats a sibling's token: with sampling "
                                     f"{SAMPLING[mode]!r} the children of a node must be distinct")
                seen.add(x)
                if mode != 2 and not pd[b, n, x] > 0:
                    raise ValueError(f"tree_tokens[{b}, {c}] = {x} has draft probability 0 under "
                                     f"draft_probs[{b}, {n}] (its parent): a candidate must have been drawn "
                                     "from the draft distribution (use sampling='deterministic' for point masses)")
                c = ns[b, c]


def verify_tree_probs(target_probs, draft_probs, tree_tokens, *, parent=None, first_child=None, next_sibling=None,
                      num_nodes=None, sampling="iid", seed=0) -> TreeVerifyResult:
    """Verify a batch of token trees from processed probabilities (see the module docstring).

    target_probs: [B, N, V]; draft_probs: [B, N, V], or None with ``sampling="deterministic"``;
    tree_tokens: int [B, N]; the tree as ``parent`` [B, N] or ``first_child`` and ``next_sibling`` [B, N];
    num_nodes: int [B] for ragged trees; seed: scalar or int64 [B].  A chain (``parent[n] = n - 1``) with
    ``sampling="iid"`` is token verification; w candidates per position are a tree whose nodes have w children.
    """
    from .verify import _validate_probs

    if sampling not in SAMPLING:
        raise ValueError(f"sampling {sampling!r} is unknown; choose one of: {', '.join(SAMPLING)}")
    mode = _MODE[sampling]
    pt = _validate_probs("target_probs", target_probs, 3)
    B, N, V = pt.shape
    if N < 1:
        raise ValueError(f"target_probs must have at least the root node, got shape {list(pt.shape)}")
    if draft_probs is None:
        if mode != 2:
            raise ValueError(f"draft_probs is needed with sampling={sampling!r}; pass sampling='deterministic' "
                             "for point-mass candidates")
        pd = np.zeros((B, N, 1))
    else:
        pd = _validate_probs("draft_probs", draft_probs, 3)
        if pd.shape != (B, N, V):
            raise ValueError(f"draft_probs must have shape [B, N, V] = [{B}, {N}, {V}], got {list(pd.shape)}")
    toks, fc, ns, nn, depth = _validate_tree(tree_tokens, parent, first_child, next_sibling, num_nodes, B, N, V)
    if draft_probs is not None or mode != 2:
        _check_siblings(toks, fc, ns, pd, mode)
    else:
        _check_siblings(toks, fc, ns, None, mode)
    seeds = row_seeds(seed, B)
    D = int(depth.max()) if B else 0
    out = np.full((B, D + 1), -1, dtype=np.int64)
    path = np.full((B, D + 1), -1, dtype=np.int64)
    stats = np.zeros((B, 2), dtype=np.int64)
    if B:
        _tree_kernel(np.ascontiguousarray(pt), np.ascontiguousarray(pd), mode, toks, fc, ns, seeds, out, path,
                     stats)
    acc = stats[:, 0].copy()
    return TreeVerifyResult(out, path, acc, acc + 1, stats[:, 1].copy())


def verify_tree_logits(target_logits, draft_logits, tree_tokens, *, parent=None, first_child=None,
                       next_sibling=None, num_nodes=None, sampling="iid", temperature=1.0, top_k=0, top_p=1.0,
                       min_p=0.0, seed=0) -> TreeVerifyResult:
    """:func:`verify_tree_probs` from raw logits [B, N, V]: both models processed with the same sampling
    parameters (``fastspec.probabilities``; one per row or scalars), then verified.  Materializes float64
    probabilities (B * N * V * 8 bytes per model)."""
    xt = validate_logits("target_logits", target_logits, ndim=3)
    B = xt.shape[0]
    t, k, p, mp = validate_sampling_params(B, temperature, top_k, top_p, min_p)
    rep = lambda a: np.repeat(a, xt.shape[1])  # noqa: E731
    pt = probabilities(xt, temperature=rep(t).reshape(B, -1), top_k=rep(k).reshape(B, -1),
                       top_p=rep(p).reshape(B, -1), min_p=rep(mp).reshape(B, -1))
    pd = None
    if draft_logits is not None:
        xd = validate_logits("draft_logits", draft_logits, ndim=3)
        if xd.shape != xt.shape:
            raise ValueError(f"draft_logits must have the shape of target_logits {list(xt.shape)}, "
                             f"got {list(xd.shape)}")
        pd = probabilities(xd, temperature=rep(t).reshape(B, -1), top_k=rep(k).reshape(B, -1),
                           top_p=rep(p).reshape(B, -1), min_p=rep(mp).reshape(B, -1))
    return verify_tree_probs(pt, pd, tree_tokens, parent=parent, first_child=first_child, next_sibling=next_sibling,
                             num_nodes=num_nodes, sampling=sampling, seed=seed)


# --------------------------------------------------------------------------- per-position acceptance beta(w)

@parallel_kernel
def _beta_iid(P, Q, w, out):
    """beta = 1 - prod_s (1 - a_s), a_s = sum min(r_s, q), r_{s+1} = max(r_s - q, 0) / (1 - a_s)."""
    R, V = P.shape
    for i in prange(R):
        r = np.empty(V)
        for v in range(V):
            r[v] = P[i, v]
        rej = 1.0
        for s in range(w):
            a = 0.0
            for v in range(V):
                a += min(r[v], Q[i, v])
            a = min(a, 1.0)
            rej *= 1.0 - a
            if not rej > 0.0 or s == w - 1:
                break
            total = 0.0
            for v in range(V):
                d = r[v] - Q[i, v]
                d = d if d > 0.0 else 0.0
                r[v] = d
                total += d
            if not total > 0.0:
                break
            for v in range(V):
                r[v] /= total
        out[i] = 1.0 - rej


def candidate_acceptance(p, q, w, *, sampling="iid", draft_logits=None):
    """Probability beta(w) that one of ``w`` candidates is accepted, per row of p, q [R, V] (float64).

    "iid": O(V w) closed form 1 - prod_s (1 - a_s), where a_s = sum_v min(r_s, q) and r_{s+1} is the normalized
    residual (r_1 = p); the residuals do not depend on which candidates were drawn.  "deterministic": the target
    mass of the candidate set, the w largest ``draft_logits`` (default: largest q), lowest id on ties.
    "without_replacement" depends on which candidates were drawn and is not computed here (ValueError).
    """
    p = np.ascontiguousarray(p, dtype=np.float64)
    q = np.ascontiguousarray(q, dtype=np.float64)
    w = int(w)
    if w < 1:
        raise ValueError("w must be >= 1")
    if sampling == "iid":
        out = np.empty(p.shape[0])
        _beta_iid(p, q, w, out)
        return out
    if sampling == "deterministic":
        key = q if draft_logits is None else np.asarray(draft_logits, dtype=np.float64)
        w = min(w, p.shape[1])
        idx = np.argsort(-key, axis=1, kind="stable")[:, :w]
        return np.minimum(np.take_along_axis(p, idx, 1).sum(1), 1.0)
    raise ValueError(f"candidate_acceptance supports sampling 'iid' and 'deterministic', not {sampling!r}: "
                     "without replacement, the residual depends on which candidates were drawn")
