"""Multi-candidate and token-tree verification (recursive rejection sampling).

At a tree node with target distribution p (the target's next-token distribution after the node's path) the
node's children are candidates for the next token, judged in order: starting from r = p, candidate x_s is
accepted with probability min(1, r(x_s) / g_s(x_s)), where g_s is the distribution x_s was drawn from; on
rejection r <- max(r - g_s, 0) / sum.  An accepted candidate's own children are judged next; when every child
of a node is rejected a token is sampled from r and the step ends; at a leaf a bonus token is sampled from its
target distribution.  The emitted tokens follow the target exactly (:mod:`fastspec.exact` is the Fraction
reference).  Proposals (``sampling``, :data:`fastspec.methods.CANDIDATE_SAMPLING`):

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

Randomness: :func:`~fastspec._numba.rng.candidate_uniform` ``(row_seed, depth, sibling)``, and the residual /
bonus streams keyed by depth: deterministic whatever the thread count, batch composition or row order.
The page that explains it: ``docs/guide/block-and-candidates.md``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._kernels import tree as K
from ._kernels.codes import CANDIDATE_CODES, NONE, PAD
from ._numba.rng import row_seeds
from .errors import InvalidInput, InvalidType
from .methods import CANDIDATE_SAMPLING, check_candidate_sampling
from .params import per_row
from .processing import probabilities, validate_logits
from .verify import validate_probs

__all__ = ["SAMPLING", "TreeVerifyResult", "verify_tree_probs", "verify_tree_logits", "parent_from_siblings",
           "candidate_acceptance"]

SAMPLING = tuple(CANDIDATE_SAMPLING)


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


def _int_array(name, a, shape):
    arr = np.asarray(a)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidType(f"{name} must be an integer array of shape {list(shape)}, got dtype {arr.dtype}")
    if arr.shape != shape:
        raise InvalidInput(f"{name} must have shape {list(shape)}, got shape {list(arr.shape)}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def parent_from_siblings(first_child, next_sibling):
    """parent [..., N] from first-child / next-sibling arrays (-1 = none); the parent of the root is -1.

    A node reached twice (a cycle in a sibling list, or a shared child) raises InvalidInput."""
    fc = np.asarray(first_child)
    ns = np.asarray(next_sibling)
    if fc.shape != ns.shape or fc.ndim < 1:
        raise InvalidInput(f"first_child {list(fc.shape)} and next_sibling {list(ns.shape)} must have the same "
                           "shape [..., N]")
    for name, a in (("first_child", fc), ("next_sibling", ns)):
        if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
            raise InvalidType(f"{name} must be an integer array, got dtype {a.dtype}")
    N = fc.shape[-1]
    bad = (fc < NONE) | (fc >= N) | (ns < NONE) | (ns >= N)
    if bad.any():
        idx = [int(i) for i in np.argwhere(bad)[0]]
        raise InvalidInput(f"first_child/next_sibling{idx}: node ids must lie in [-1, {N})")
    parent = np.full(fc.shape, NONE, dtype=np.int64)
    for idx in np.ndindex(fc.shape[:-1]):
        seen = np.zeros(N, bool)
        for n in range(N):
            c = int(fc[idx + (n,)])
            while c >= 0:
                if seen[c]:
                    raise InvalidInput(f"tree {list(idx)}: node {c} is reached twice (a cycle in a sibling list "
                                       "or a shared child); each node must have exactly one parent")
                seen[c] = True
                parent[idx + (c,)] = n
                c = int(ns[idx + (c,)])
    return parent


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
            raise InvalidInput(f"num_nodes[{b}] = {int(nn[b])} is outside [1, {N}]: count the root (node 0) and its "
                               f"descendants in row {b}")
    inside = np.arange(N)[None, :] < nn[:, None]
    if (parent is None) == (first_child is None and next_sibling is None):
        raise InvalidInput("give the tree either as parent=[B, N] or as first_child=[B, N] and next_sibling=[B, N]")
    if parent is not None:
        par = _int_array("parent", parent, (B, N))
        idx = np.arange(N)[None, :]
        bad = inside & (idx > 0) & ((par < 0) | (par >= idx))
        if bad.any():
            b, n = (int(v) for v in np.argwhere(bad)[0])
            raise InvalidInput(f"parent[{b}, {n}] = {int(par[b, n])} is invalid: node n >= 1 needs a parent in "
                               "[0, n) (node 0 is the root; number nodes so parents come first)")
        fc = np.empty((B, N), np.int64)
        ns = np.empty((B, N), np.int64)
        K.siblings_from_parent(np.where(inside, par, 0), nn, fc, ns)
    else:
        if first_child is None or next_sibling is None:
            raise InvalidInput("first_child and next_sibling must be given together")
        fc = _int_array("first_child", first_child, (B, N))
        ns = _int_array("next_sibling", next_sibling, (B, N))
        for name, a in (("first_child", fc), ("next_sibling", ns)):
            bad = inside & ((a < NONE) | (a >= nn[:, None]))
            if bad.any():
                b, n = (int(v) for v in np.argwhere(bad)[0])
                raise InvalidInput(f"{name}[{b}, {n}] = {int(a[b, n])} is invalid: use a node id in [1, num_nodes) "
                                   "or -1")
        fc = np.where(inside, fc, NONE)
        ns = np.where(inside, ns, NONE)
    depth = np.zeros(B, np.int64)
    b, n, code = K.check_trees(fc, ns, nn, depth)
    if code != K.TREE_OK:
        what = {K.OUT_OF_RANGE: "is out of range", K.REACHED_TWICE: "is reached twice (a cycle or a shared child)",
                K.UNREACHABLE: "is not reachable from the root"}[code]
        raise InvalidInput(f"tree row {b}: node {n} {what}; each node must have exactly one parent")
    bad = inside & (np.arange(N)[None, :] > 0) & ((toks < 0) | (toks >= V))
    if bad.any():
        b, n = (int(v) for v in np.argwhere(bad)[0])
        raise InvalidInput(f"tree_tokens[{b}, {n}] = {int(toks[b, n])} is invalid: token ids must lie in [0, {V})")
    return np.where(inside, toks, 0), fc, ns, depth


def _check_siblings(toks, fc, ns, pd, candidate_sampling):
    """Distinct siblings (without replacement, deterministic) and q(x) > 0 under the parent's draft."""
    B, N = toks.shape
    for b in range(B):
        for n in range(N):
            c = fc[b, n]
            seen = set()
            while c >= 0:
                x = int(toks[b, c])
                if candidate_sampling != "iid" and x in seen:
                    raise InvalidInput(f"tree_tokens[{b}, {c}] = {x} repeats a sibling's token: with "
                                       f"candidate_sampling {candidate_sampling!r} the children of a node must be "
                                       "distinct")
                seen.add(x)
                if candidate_sampling != "deterministic" and not pd[b, n, x] > 0:
                    raise InvalidInput(f"tree_tokens[{b}, {c}] = {x} has draft probability 0 under "
                                       f"draft_probs[{b}, {n}] (its parent): a candidate must have been drawn from "
                                       "the draft distribution (use candidate_sampling='deterministic' for point "
                                       "masses)")
                c = ns[b, c]


def verify_tree_probs(target_probs, draft_probs, tree_tokens, *, parent=None, first_child=None, next_sibling=None,
                      num_nodes=None, candidate_sampling="iid", seed=0) -> TreeVerifyResult:
    """Verify a batch of token trees from processed probabilities (see the module docstring).

    target_probs: [B, N, V]; draft_probs: [B, N, V], or None with ``candidate_sampling="deterministic"``;
    tree_tokens: int [B, N]; the tree as ``parent`` [B, N] or ``first_child`` and ``next_sibling`` [B, N];
    num_nodes: int [B] for ragged trees; seed: scalar or int64 [B].  A chain (``parent[n] = n - 1``) with
    ``candidate_sampling="iid"`` is token verification; w candidates per position are a tree whose nodes have w
    children.
    """
    candidate_sampling = check_candidate_sampling(candidate_sampling)
    pt = validate_probs("target_probs", target_probs, 3)
    B, N, V = pt.shape
    if N < 1:
        raise InvalidInput(f"target_probs must have at least the root node, got shape {list(pt.shape)}")
    if draft_probs is None:
        if candidate_sampling != "deterministic":
            raise InvalidInput(f"draft_probs is needed with candidate_sampling={candidate_sampling!r}; pass "
                               "candidate_sampling='deterministic' for point-mass candidates")
        pd = np.zeros((B, N, 1))
    else:
        pd = validate_probs("draft_probs", draft_probs, 3)
        if pd.shape != (B, N, V):
            raise InvalidInput(f"draft_probs must have shape [B, N, V] = [{B}, {N}, {V}], got {list(pd.shape)}")
    toks, fc, ns, depth = _validate_tree(tree_tokens, parent, first_child, next_sibling, num_nodes, B, N, V)
    _check_siblings(toks, fc, ns, pd, candidate_sampling)
    seeds = row_seeds(seed, B)
    D = int(depth.max()) if B else 0
    out = np.full((B, D + 1), PAD, dtype=np.int64)
    path = np.full((B, D + 1), NONE, dtype=np.int64)
    stats = np.zeros((B, 2), dtype=np.int64)
    if B:
        K.tree_rows(pt, pd, CANDIDATE_CODES[candidate_sampling], toks, fc, ns, seeds, out, path, stats)
    acc = stats[:, K.DEPTH].copy()
    return TreeVerifyResult(out, path, acc, acc + 1, stats[:, K.UNDERFLOWS].copy())


def verify_tree_logits(target_logits, draft_logits, tree_tokens, *, parent=None, first_child=None,
                       next_sibling=None, num_nodes=None, candidate_sampling="iid", temperature=1.0, top_k=0, top_p=1.0,
                       min_p=0.0, seed=0) -> TreeVerifyResult:
    """:func:`verify_tree_probs` from raw logits [B, N, V]: both models processed with the same sampling
    parameters (``fastspec.probabilities``; one per row or scalars), then verified.  Materializes float64
    probabilities (B * N * V * 8 bytes per model)."""
    xt = validate_logits("target_logits", target_logits, ndim=3)
    B, N = xt.shape[0], xt.shape[1]
    prm = per_row(B, temperature, top_k, top_p, min_p)
    per_node = {name: np.repeat(getattr(prm, name), N).reshape(B, N) for name in prm._fields}
    pt = probabilities(xt, **per_node)
    pd = None
    if draft_logits is not None:
        xd = validate_logits("draft_logits", draft_logits, ndim=3)
        if xd.shape != xt.shape:
            raise InvalidInput(f"draft_logits must have the shape of target_logits {list(xt.shape)}, "
                               f"got {list(xd.shape)}")
        pd = probabilities(xd, **per_node)
    return verify_tree_probs(pt, pd, tree_tokens, parent=parent, first_child=first_child, next_sibling=next_sibling,
                             num_nodes=num_nodes, candidate_sampling=candidate_sampling, seed=seed)


def _candidate_width(w) -> int:
    if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, np.integer)):
        raise InvalidType(f"w must be an integer >= 1 (candidates per position), got {type(w).__name__} {w!r}")
    if w < 1:
        raise InvalidInput(f"w = {int(w)} is invalid: use an integer >= 1 (candidates per position)")
    return int(w)


def candidate_acceptance(p, q, w, *, candidate_sampling="iid", draft_logits=None):
    """Probability beta(w) that one of ``w`` candidates is accepted, per row of p, q [R, V] (probabilities).

    "iid": O(V w) closed form 1 - prod_s (1 - a_s), where a_s = sum_v min(r_s, q) and r_{s+1} is the normalized
    residual (r_1 = p); the residuals do not depend on which candidates were drawn.  "deterministic": the target
    mass of the candidate set, the w largest ``draft_logits`` (default: largest q), lowest id on ties.
    "without_replacement" depends on which candidates were drawn and is not computed here (InvalidInput).
    p and q are validated like :func:`verify_probs`'s (finite, non-negative, rows summing to 1)."""
    candidate_sampling = check_candidate_sampling(candidate_sampling, ("iid", "deterministic"),
                                        why=" (without replacement, the residual depends on which candidates were "
                                            "drawn)")
    w = _candidate_width(w)
    p = validate_probs("p", p, 2)
    q = validate_probs("q", q, 2)
    if p.shape != q.shape:
        raise InvalidInput(f"p {list(p.shape)} and q {list(q.shape)} must have the same shape [R, V]")
    if candidate_sampling == "iid":
        out = np.empty(p.shape[0])
        if p.shape[0]:
            K.beta_iid(p, q, w, out)
        return out
    key = q
    if draft_logits is not None:
        key = validate_logits("draft_logits", draft_logits, ndim=2)  # any float dtype: only its order matters
        if key.shape != p.shape:
            raise InvalidInput(f"draft_logits {list(key.shape)} must have the shape of p {list(p.shape)}")
    w = min(w, p.shape[1])
    idx = np.argsort(-key, axis=1, kind="stable")[:, :w]
    return np.minimum(np.take_along_axis(p, idx, 1).sum(1), 1.0)
