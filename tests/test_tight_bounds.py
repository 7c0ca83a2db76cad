"""Sparse alpha bounds with more than the top-k known (issue 22): extra known ids and the recorded token's logprob.

Every check is against exact arithmetic: small random distributions with rational probabilities (ties and zeros
included), the true alpha = sum_v min(p, q) as a Fraction, and a slow reference of the bound formula in
Fractions.  The interval must contain alpha, match the reference, and never be wider than the plain top-k one.
A deliberately broken variant (the known set treated as if it were the top-k, so the bound on an unknown id is
the smallest *known* probability) is shown to exclude the true alpha.  The format side: the new arrays are
validated like every other, old dumps read unchanged, and text metadata loads with ``allow_pickle=False``.
"""
from __future__ import annotations

import json
import math
import os
from fractions import Fraction

import numpy as np
import pytest

from fastspec.acceptance import acceptance_bounds, dump_acceptance
from fastspec.errors import DumpFormatError, InvalidInput
from fastspec.io import Dump, load_dump, save_dump

TOL = 1e-12


# ------------------------------------------------------------------------------------------ exact reference
def naive_bounds(p_known: dict, p_cap: Fraction, q_known: dict, q_cap: Fraction):
    """The bound formula of fastspec.acceptance in Fractions: ``*_known`` {id: probability} (everything known),
    ``*_cap``: the bound on every unknown probability (the smallest top-k one)."""
    rp = max(Fraction(0), 1 - sum(p_known.values(), Fraction(0)))
    rq = max(Fraction(0), 1 - sum(q_known.values(), Fraction(0)))
    A = sum((min(p_known[v], q_known[v]) for v in p_known.keys() & q_known.keys()), Fraction(0))
    Ad = sum((abs(p_known[v] - q_known[v]) for v in p_known.keys() & q_known.keys()), Fraction(0))
    B = p_known.keys() - q_known.keys()
    C = q_known.keys() - p_known.keys()
    b = sum((min(p_known[v], q_cap) for v in B), Fraction(0))
    bx = sum((max(p_known[v] - q_cap, Fraction(0)) for v in B), Fraction(0))
    c = sum((min(q_known[v], p_cap) for v in C), Fraction(0))
    cx = sum((max(q_known[v] - p_cap, Fraction(0)) for v in C), Fraction(0))
    u = min(min(b, rq) + rp, min(c, rp) + rq, b + c + min(rp, rq), 1 - A - (Ad + bx + cx) / 2)
    lo = min(A, Fraction(1))
    return lo, min(max(A + max(u, Fraction(0)), lo), Fraction(1))


def true_alpha(p, q) -> Fraction:
    return sum((min(a, b) for a, b in zip(p, q, strict=True)), Fraction(0))


def random_dist(rng, V):
    w = rng.integers(0, 5, V)
    if w.sum() == 0:
        w[rng.integers(V)] = 1
    return [Fraction(int(x), int(w.sum())) for x in w]


def top_k(rng, p, k):
    """A valid top-k list of p (ties broken at random: any choice keeps unlisted <= the smallest listed)."""
    order = sorted(range(len(p)), key=lambda v: (-p[v], rng.random()))
    return order[:k]


def logs(p, ids):
    return np.array([math.log(p[v]) if p[v] > 0 else -np.inf for v in ids], dtype=np.float64)


def padded(p, ids, m):
    """(ids, logprobs) of length m, unused slots (-1, -inf)."""
    out_i = np.full(m, -1, dtype=np.int64)
    out_l = np.full(m, -np.inf)
    out_i[:len(ids)] = ids
    out_l[:len(ids)] = logs(p, ids)
    return out_i, out_l


def random_case(rng, V):
    p, q = random_dist(rng, V), random_dist(rng, V)
    sp, sq = top_k(rng, p, int(rng.integers(1, V))), top_k(rng, q, int(rng.integers(1, V)))
    if rng.random() < 0.5:   # the server case: each side scores the other's top-k ids
        ep, eq = [v for v in sq if v not in sp], [v for v in sp if v not in sq]
    else:                    # any ids outside the top-k
        ep = [v for v in range(V) if v not in sp and rng.random() < 0.4]
        eq = [v for v in range(V) if v not in sq and rng.random() < 0.4]
    return p, q, sp, sq, ep, eq


def assert_contains(lo, hi, alpha, what=""):
    assert float(lo) - TOL <= float(alpha) <= float(hi) + TOL, (what, float(lo), float(alpha), float(hi))


# ------------------------------------------------------------------------------------------ the bounds
def batched_bounds(cases, broken=False):
    """(lo, hi, lo_k, hi_k) per case from one acceptance_bounds call per (k_p, k_q) group; ``broken``: the wrong
    variant of :func:`broken_bounds` instead (lo_k, hi_k then None)."""
    out = [None] * len(cases)
    groups: dict = {}
    for i, (_p, _q, sp, sq, ep, eq) in enumerate(cases):
        key = (len(sp) + len(ep), len(sq) + len(eq)) if broken else (len(sp), len(sq))
        groups.setdefault(key, []).append(i)
    for idx in groups.values():
        c = [cases[i] for i in idx]
        if broken:
            kp, kq = [x[2] + x[4] for x in c], [x[3] + x[5] for x in c]
            lo, hi = acceptance_bounds(np.array(kp), np.array([logs(x[0], v) for x, v in zip(c, kp, strict=True)]),
                                       np.array(kq), np.array([logs(x[1], v) for x, v in zip(c, kq, strict=True)]))
            for j, i in enumerate(idx):
                out[i] = (lo[j], hi[j], None, None)
            continue
        ti, tl = np.array([x[2] for x in c]), np.array([logs(x[0], x[2]) for x in c])
        di, dl = np.array([x[3] for x in c]), np.array([logs(x[1], x[3]) for x in c])
        te = [padded(x[0], x[4], 8) for x in c]
        de = [padded(x[1], x[5], 8) for x in c]
        lo, hi = acceptance_bounds(ti, tl, di, dl,
                                   target_extra=(np.array([e[0] for e in te]), np.array([e[1] for e in te])),
                                   draft_extra=(np.array([e[0] for e in de]), np.array([e[1] for e in de])))
        lo_k, hi_k = acceptance_bounds(ti, tl, di, dl)
        for j, i in enumerate(idx):
            out[i] = (lo[j], hi[j], lo_k[j], hi_k[j])
    return out


def random_cases(seed, n):
    rng = np.random.default_rng(seed)
    return [random_case(rng, int(rng.integers(2, 8))) for _ in range(n)]


def test_known_ids_bounds_contain_alpha_match_the_fraction_reference_and_are_never_wider():
    cases = random_cases(2026, 3000)
    narrower = 0
    for case, ((p, q, sp, sq, ep, eq), (lo, hi, lo_k, hi_k)) in enumerate(zip(cases, batched_bounds(cases),
                                                                               strict=True)):
        alpha = true_alpha(p, q)
        assert_contains(lo, hi, alpha, case)
        assert_contains(lo_k, hi_k, alpha, case)
        assert lo >= lo_k - TOL and hi <= hi_k + TOL and hi - lo <= hi_k - lo_k + TOL, case
        # the reference: the known-set interval (caps from the top-k) intersected with the top-k one
        cap_p, cap_q = min(p[v] for v in sp), min(q[v] for v in sq)
        nk = naive_bounds({v: p[v] for v in sp}, cap_p, {v: q[v] for v in sq}, cap_q)
        nu = naive_bounds({v: p[v] for v in sp + ep}, cap_p, {v: q[v] for v in sq + eq}, cap_q)
        assert float(nk[0]) == pytest.approx(float(lo_k), abs=TOL) and float(nk[1]) == pytest.approx(float(hi_k),
                                                                                                      abs=TOL)
        want_lo = max(nk[0], nu[0])
        want_hi = max(min(nk[1], nu[1]), want_lo)
        assert float(lo) == pytest.approx(float(want_lo), abs=TOL) and float(hi) == pytest.approx(float(want_hi),
                                                                                                    abs=TOL), case
        narrower += (hi - lo) < (hi_k - lo_k) - 1e-9
    assert narrower > 600   # the extra ids do tighten (not a test that cannot fail)


def test_union_of_both_top_k_lists_is_exact_where_everything_is_known():
    # both sides know every id of the union, and the union covers both supports: alpha exactly
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4), Fraction(0)]
    q = [Fraction(1, 8), Fraction(5, 8), Fraction(0), Fraction(1, 4)]
    lo, hi = acceptance_bounds([0, 1, 2], logs(p, [0, 1, 2]), [1, 3, 0], logs(q, [1, 3, 0]),
                               target_extra=([3], logs(p, [3])), draft_extra=([2], logs(q, [2])))
    assert float(lo) == pytest.approx(float(true_alpha(p, q)), abs=TOL) and hi == pytest.approx(lo, abs=TOL)


def broken_bounds(p, q, sp, sq, ep, eq):
    """The wrong way: hand the top-k + extra lists over as if they were top-k lists (the smallest known
    probability then bounds every unknown id, which an extra id far below the k-th does not)."""
    return acceptance_bounds(sp + ep, logs(p, sp + ep), sq + eq, logs(q, sq + eq))


def test_the_broken_cap_is_caught():
    cases = random_cases(7, 3000)
    misses = sum(not (float(lo) - TOL <= float(true_alpha(c[0], c[1])) <= float(hi) + TOL)
                 for c, (lo, hi, _a, _b) in zip(cases, batched_bounds(cases, broken=True), strict=True))
    assert misses > 0   # the containment check above would have failed for this variant
    # one by hand: p's extra id 3 has p = 0, so the broken cap says p(1) = p(2) = 0 though they hold 1/2
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4), Fraction(0)]
    q = [Fraction(0), Fraction(1, 2), Fraction(1, 2), Fraction(0)]
    lo, hi = broken_bounds(p, q, [0], [1, 2], [3], [])
    assert float(hi) < float(true_alpha(p, q)) - 0.1
    lo, hi = acceptance_bounds([0], logs(p, [0]), [1, 2], logs(q, [1, 2]), target_extra=([3], logs(p, [3])))
    assert_contains(lo, hi, true_alpha(p, q))


def test_greedy_ignores_the_extras():
    lo, hi = acceptance_bounds([0, 1], np.log([0.5, 0.3]), [1, 0], np.log([0.6, 0.2]), greedy=True,
                               target_extra=([2], np.log([0.1])))
    assert lo == hi == 0.0


def test_bad_extras_are_refused_naming_the_array():
    with pytest.raises(InvalidInput, match="target_extra_ids.*top-k"):
        acceptance_bounds([0, 1], np.log([0.5, 0.3]), [1], [0.0], target_extra=([1], [-2.0]))
    with pytest.raises(InvalidInput, match="sum to"):
        acceptance_bounds([0, 1], np.log([0.5, 0.3]), [1], [0.0], target_extra=([2], np.log([0.5])))
    with pytest.raises(InvalidInput, match="-inf in an unused slot"):
        acceptance_bounds([0], [0.0], [1], [0.0], draft_extra=([-1], [-1.0]))
    with pytest.raises(InvalidInput, match="pair"):
        acceptance_bounds([0], [0.0], [1], [0.0], draft_extra=[[2]])


# ------------------------------------------------------------------------------------------ dumps
def random_dump(seed, N=3, T=40, V=7, kp=2, kq=3, extras=True, sampled=True):
    """Arrays of a sparse dump of random rational distributions, with tokens drawn from p, and the exact
    distributions (p[n][t], q[n][t])."""
    rng = np.random.default_rng(seed)
    P = [[random_dist(rng, V) for _ in range(T)] for _ in range(N)]
    Q = [[random_dist(rng, V) for _ in range(T)] for _ in range(N)]
    arr = {k: np.zeros((N, T, w), dtype=d) for k, w, d in (("target_topk_ids", kp, np.int64),
                                                           ("target_topk_logprobs", kp, np.float64),
                                                           ("draft_topk_ids", kq, np.int64),
                                                           ("draft_topk_logprobs", kq, np.float64))}
    ext = {r: (np.full((N, T, V), -1, np.int64), np.full((N, T, V), -np.inf)) for r in ("target", "draft")}
    tokens = np.zeros((N, T), np.int64)
    sl = {r: np.zeros((N, T)) for r in ("target", "draft")}
    for n in range(N):
        for t in range(T):
            p, q = P[n][t], Q[n][t]
            sp, sq = top_k(rng, p, kp), top_k(rng, q, kq)
            arr["target_topk_ids"][n, t], arr["target_topk_logprobs"][n, t] = sp, logs(p, sp)
            arr["draft_topk_ids"][n, t], arr["draft_topk_logprobs"][n, t] = sq, logs(q, sq)
            if rng.random() < 0.5:
                ep, eq = [v for v in sq if v not in sp], [v for v in sp if v not in sq]
                ext["target"][0][n, t], ext["target"][1][n, t] = padded(p, ep, V)
                ext["draft"][0][n, t], ext["draft"][1][n, t] = padded(q, eq, V)
            x = int(rng.choice(V, p=np.array([float(v) for v in p])))
            tokens[n, t] = x
            sl["target"][n, t], sl["draft"][n, t] = logs(p, [x])[0], logs(q, [x])[0]
    arr.update(tokens=tokens, vocab_size=np.asarray(V), temperature=np.asarray(1.0))
    if extras:
        for r, (i, lp) in ext.items():
            arr[f"{r}_extra_ids"], arr[f"{r}_extra_logprobs"] = i, lp
    if sampled:
        for r in ("target", "draft"):
            arr[f"{r}_sampled_logprob"] = sl[r]
    return arr, P, Q


@pytest.mark.parametrize("extras, sampled", [(True, True), (False, True), (True, False)])
def test_dump_bounds_with_known_ids_and_sampled_tokens(extras, sampled):
    arr, P, Q = random_dump(11, extras=extras, sampled=sampled)
    with Dump.from_arrays(arr) as d:
        d.validate()
        tight = dump_acceptance(d)["draft"]
        loose = dump_acceptance(d, beyond_topk=False)["draft"]
    narrower = 0
    for n in range(len(P)):
        for t in range(len(P[0])):
            a = true_alpha(P[n][t], Q[n][t])
            assert_contains(tight.lower[n, t], tight.upper[n, t], a, (n, t))
            assert tight.lower[n, t] >= loose.lower[n, t] - TOL and tight.upper[n, t] <= loose.upper[n, t] + TOL
            narrower += tight.upper[n, t] - tight.lower[n, t] < loose.upper[n, t] - loose.lower[n, t] - 1e-9
    assert narrower > 10
    # without the optional arrays the bounds are the plain top-k ones, bit for bit
    plain = {k: v for k, v in arr.items() if "extra" not in k and "sampled" not in k}
    with Dump.from_arrays(plain) as d:
        r = dump_acceptance(d)["draft"]
    np.testing.assert_array_equal(r.lower, loose.lower)
    np.testing.assert_array_equal(r.upper, loose.upper)


def test_sampled_token_alone_is_a_valid_known_id():
    # the recorded token lies outside both top-1 lists; knowing p(x) and q(x) narrows the interval
    p = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)]
    q = [Fraction(1, 4), Fraction(1, 2), Fraction(1, 4)]
    arr = {"target_topk_ids": np.array([[[0]]]), "target_topk_logprobs": logs(p, [0]).reshape(1, 1, 1),
           "draft_topk_ids": np.array([[[1]]]), "draft_topk_logprobs": logs(q, [1]).reshape(1, 1, 1),
           "tokens": np.array([[2]]), "target_sampled_logprob": logs(p, [2]).reshape(1, 1),
           "draft_sampled_logprob": logs(q, [2]).reshape(1, 1)}
    with Dump.from_arrays(arr) as d:
        r = dump_acceptance(d)["draft"]
        r0 = dump_acceptance(d, beyond_topk=False)["draft"]
    assert_contains(r.lower[0, 0], r.upper[0, 0], true_alpha(p, q))
    assert r.lower[0, 0] == pytest.approx(0.25) and r0.lower[0, 0] == 0.0
    assert r.upper[0, 0] - r.lower[0, 0] < r0.upper[0, 0] - r0.lower[0, 0]


def test_saved_dump_round_trip_without_pickle_and_describe(tmp_path):
    arr, _P, _Q = random_dump(3, N=2, T=5)
    tgt = (arr["target_topk_ids"], arr["target_topk_logprobs"])
    dr = (arr["draft_topk_ids"], arr["draft_topk_logprobs"])
    prov = {"source": "test", "servers": {"target": {"model": "m", "version": "1", "url": "http://x"}}}
    out = save_dump(tmp_path / "t.npz", tgt, {"q4": dr}, tokens=arr["tokens"], temperature=1.0, vocab_size=7,
                    sampled_logprobs={"target": arr["target_sampled_logprob"], "q4": arr["draft_sampled_logprob"]},
                    extras={"target": (arr["target_extra_ids"], arr["target_extra_logprobs"]),
                            "q4": (arr["draft_extra_ids"], arr["draft_extra_logprobs"])},
                    logprobs_mode="processed", provenance=prov)
    with np.load(out, allow_pickle=False) as z:
        assert json.loads(str(z["provenance"])) == prov and str(z["logprobs_mode"]) == "processed"
        assert "draft_extra_ids__q4" in z.files and "draft_sampled_logprob__q4" in z.files
    with load_dump(out) as d:
        d.validate()
        info = d.describe()
        assert info["provenance"] == prov and info["metadata"]["logprobs_mode"] == "processed"
        assert info["known_beyond_topk"] == {"target": ["sampled_logprob", "extra_ids"],
                                             "q4": ["sampled_logprob", "extra_ids"]}
    # an old dump: nothing new in its description
    with load_dump(save_dump(tmp_path / "o.npz", tgt, {"q4": dr}, tokens=arr["tokens"])) as d:
        info = d.describe()
        assert "provenance" not in info and "known_beyond_topk" not in info and not d.sampled_logprobs
        assert d.provenance is None and "logprobs_mode" not in d.metadata


def _bad(arr, change):
    a = {k: np.array(v, copy=True) for k, v in arr.items()}
    change(a)
    with pytest.raises(DumpFormatError) as e:
        Dump.from_arrays(a).validate()
    return str(e.value)


def test_malformed_known_arrays_are_refused():
    arr, _P, _Q = random_dump(5, N=2, T=4)
    assert "needs 'tokens'" in _bad(arr, lambda a: a.pop("tokens"))
    assert "shape" in _bad(arr, lambda a: a.update(target_sampled_logprob=np.zeros((2, 3))))
    assert "finite" in _bad(arr, lambda a: a["target_sampled_logprob"].__setitem__((1, 2), -np.inf))
    assert "<= 0" in _bad(arr, lambda a: a["draft_sampled_logprob"].__setitem__((0, 0), 0.5))
    assert "not NaN" in _bad(arr, lambda a: a["draft_sampled_logprob"].__setitem__((0, 0), np.nan))
    assert "float16" in _bad(arr, lambda a: a.update(draft_sampled_logprob=np.zeros((2, 4), np.int64)))
    assert "'draft_extra_logprobs' is missing" in _bad(arr, lambda a: a.pop("draft_extra_logprobs"))
    assert "differ in shape" in _bad(arr, lambda a: a.update(draft_extra_ids=a["draft_extra_ids"][..., :3]))
    assert "integer" in _bad(arr, lambda a: a.update(draft_extra_ids=a["draft_extra_ids"].astype(float)))

    def dup(a):
        a["target_extra_ids"][0, 0, 0] = a["target_topk_ids"][0, 0, 0]
        a["target_extra_logprobs"][0, 0, 0] = -5.0
    assert "outside the top-k" in _bad(arr, dup)
    assert "outside [0, 7)" in _bad(arr, lambda a: a["target_extra_ids"].__setitem__((0, 1, 0), 9))
    assert "no top-k arrays" in _bad(arr, lambda a: a.update(draft_sampled_logprob__other=np.zeros((2, 4))))
    assert "takes no __name" in _bad(arr, lambda a: a.update(target_extra_ids__x=a["target_extra_ids"]))
    assert "'raw' or 'processed'" in _bad(arr, lambda a: a.update(logprobs_mode=np.asarray("cooked")))
    assert "0-d string" in _bad(arr, lambda a: a.update(logprobs_mode=np.asarray(1)))
    assert "not valid JSON" in _bad(arr, lambda a: a.update(provenance=np.asarray("{not json")))
    assert "not valid JSON" in _bad(arr, lambda a: a.update(provenance=np.asarray('{"x": NaN}')))
    assert "JSON object" in _bad(arr, lambda a: a.update(provenance=np.asarray("[1, 2]")))
    assert "at most" in _bad(arr, lambda a: a.update(provenance=np.asarray(json.dumps({"x": "y" * 70000}))))
    dense = {"target_logits": np.zeros((2, 4, 7)), "draft_logits": np.zeros((2, 4, 7)), "tokens": arr["tokens"],
             "target_sampled_logprob": np.zeros((2, 4))}
    with pytest.raises(DumpFormatError, match="only a sparse top-k dump"):
        Dump.from_arrays(dense)


def test_padding_positions_are_never_read():
    arr, _P, _Q = random_dump(9, N=2, T=4)
    arr["lengths"] = np.array([4, 2])
    arr["target_sampled_logprob"][1, 3] = np.nan
    arr["target_extra_ids"][1, 2, 0] = 99
    with Dump.from_arrays(arr) as d:
        d.validate()
        assert d.sampled_logprobs["target"][1, 3] == 0.0


def test_sharded_known_dump_equals_the_merged_one(tmp_path):
    from fastspec.io import open_dump

    arr, _P, _Q = random_dump(21, N=4, T=6)
    os.makedirs(tmp_path / "sh")
    for i, (a, b) in enumerate(((0, 1), (1, 4))):
        np.savez(tmp_path / "sh" / f"part-{i}.npz",
                 **{k: (v[a:b] if v.ndim >= 2 else v) for k, v in arr.items()})
    with Dump.from_arrays(arr) as d:
        whole = dump_acceptance(d)["draft"]
    with open_dump(str(tmp_path / "sh")) as s:
        parts = dump_acceptance(s)["draft"]
    np.testing.assert_array_equal(whole.lower, parts.lower)
    np.testing.assert_array_equal(whole.upper, parts.upper)
