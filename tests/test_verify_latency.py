"""The latency path of verify_logits (one row, scalar parameters, one integer seed: a single kernel dispatch).

It must give exactly what the general path gives -- the same tokens, counts, dtypes and shapes for every
configuration, and the same error (type and words) for every bad input -- and it must really be taken in the
case it exists for (a spy counts its kernel calls, so these tests fail if the path silently stops being used).
``num_draft=[K]`` means the same thing as ``num_draft=None`` and forces the general path.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastspec.verify as verify_module
from fastspec import row_seeds, verify_logits
from fastspec._kernels import token as token_kernels

FIELDS = ("tokens", "num_accepted", "num_emitted", "residual_underflows", "num_draft")


@pytest.fixture
def spy(monkeypatch):
    """Counts calls of the latency kernel."""
    calls = []
    real = token_kernels.verify_one_row

    def counted(*args):
        calls.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(token_kernels, "verify_one_row", counted)
    return calls


def _row(K, V, dtype=np.float32, seed=0, noise=0.3):
    rng = np.random.default_rng(seed)
    xt = (rng.standard_normal((1, K + 1, V)) * 2).astype(dtype)
    xd = (xt[:, :K].astype(np.float64) + rng.standard_normal((1, K, V)) * noise).astype(dtype)
    toks = xd.astype(np.float64).argmax(-1)
    return xt, xd, toks


def _general(xt, xd, toks, **kw):
    return verify_logits(xt, xd, toks, num_draft=np.full(1, toks.shape[1]), **kw)


def _same(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype == np.int64, f
        assert x.shape == y.shape, f
        assert (x == y).all(), f


CONFIGS = [
    dict(),
    dict(temperature=0.7, seed=3),
    dict(temperature=0.0, seed=5),  # greedy
    dict(temperature=1, top_k=40, seed=2 ** 63 + 11),  # int temperature, a seed above 2**63
    dict(top_p=0.9, seed=-4),
    dict(min_p=0.05, temperature=1.3, seed=12345678901234),
    dict(top_k=5, top_p=0.8, min_p=0.01, seed=9),
]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize("kw", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_latency_path_gives_the_general_paths_result(spy, dtype, draft, kw):
    xt, xd, toks = _row(4, 5003, dtype, seed=len(spy))
    d = xd if draft else None
    fast = verify_logits(xt, d, toks, **kw)
    assert len(spy) == 1  # the latency path ran (and succeeded)
    _same(fast, _general(xt, d, toks, **kw))
    assert len(spy) == 1  # the general path does not use it


def test_latency_path_row_matches_the_batched_row(spy):
    """Row 0 alone with the scalar seed = row 0 of a batch (the derived per-row seed), across many seeds, with
    every outcome (accepted drafts, recovered and bonus tokens) occurring."""
    xt, xd, toks = _row(3, 300, seed=1, noise=1.0)
    big_t = np.concatenate([xt, xt[:, :, ::-1]])
    big_d = np.concatenate([xd, xd[:, :, ::-1]])
    big_toks = np.concatenate([toks, 299 - toks])
    accepted = set()
    for seed in range(100):
        one = verify_logits(xt, xd, toks, seed=seed)
        both = verify_logits(big_t, big_d, big_toks, seed=seed)
        assert (one.tokens[0] == both.tokens[0]).all()
        assert one.num_accepted[0] == both.num_accepted[0]
        assert both.num_draft.tolist() == [3, 3]
        accepted.add(int(one.num_accepted[0]))
    assert len(spy) == 100
    assert accepted == {0, 1, 2, 3}
    assert (verify_logits(xt, xd, toks, seed=row_seeds(7, 1)).tokens
            == verify_logits(xt, xd, toks, seed=7).tokens).all()


def _error(fn):
    with pytest.raises((ValueError, TypeError)) as e:
        fn()
    return type(e.value), str(e.value)


def _bad_inputs():
    xt, xd, toks = _row(4, 4001, seed=7)
    cases = {}
    t = toks.copy()
    t[0, 2] = 4001
    cases["token id = V"] = (xt, xd, t, {})
    t = toks.copy()
    t[0, 3] = -1
    cases["token id -1"] = (xt, xd, t, {})
    x = xt.copy()
    x[0, 4, 17] = np.nan  # the bonus position, never visited when a draft is rejected
    cases["NaN in the last target row"] = (x, xd, toks, {})
    y = xd.copy()
    y[0, 3, :] = -np.inf
    cases["draft row all -inf"] = (xt, y, toks, {})
    y = xd.copy()
    y[0, 3, toks[0, 3]] = -np.inf
    cases["q = 0 at the last position"] = (xt, y, toks, {})
    t = toks.copy()
    t[0, 1] = int(np.argsort(xd[0, 1])[0])  # the least likely token: cut by top-k
    cases["cut by top-k"] = (xt, xd, t, dict(top_k=3))
    cases["negative temperature"] = (xt, xd, toks, dict(temperature=-1.0))
    cases["bool temperature"] = (xt, xd, toks, dict(temperature=True))
    cases["top_p 0"] = (xt, xd, toks, dict(top_p=0.0))
    cases["float top_k"] = (xt, xd, toks, dict(top_k=2.5))
    cases["seed 2**64"] = (xt, xd, toks, dict(seed=2 ** 64))
    cases["seed -2**63-1"] = (xt, xd, toks, dict(seed=-2 ** 63 - 1))
    cases["float seed"] = (xt, xd, toks, dict(seed=1.5))
    cases["method"] = (xt, xd, toks, dict(method="tokens"))
    cases["draft shape"] = (xt, xd[:, :3], toks, {})
    cases["tokens shape"] = (xt, xd, toks[:, :3], {})
    cases["no positions"] = (xt[:, :0], xd[:, :0], toks[:, :0], {})
    return cases


BAD = _bad_inputs()


@pytest.mark.parametrize("name", list(BAD))
def test_latency_path_errors_are_the_general_paths(name):
    xt, xd, toks, kw = BAD[name]
    got = _error(lambda: verify_logits(xt, xd, toks, **kw))
    kw_general = dict(kw, method=kw.get("method", "token"))
    want = _error(lambda: verify_logits(xt, xd, toks, num_draft=np.full(1, max(toks.shape[1], 0)), **kw_general)) \
        if toks.shape[1] == xt.shape[1] - 1 and xt.shape[1] >= 1 else got
    assert got == want
    assert got[1]  # a message, naming what is wrong


def test_bad_value_errors_name_the_place():
    xt, xd, toks, _ = BAD["NaN in the last target row"]
    assert "target_logits[0, 4, 17]" in _error(lambda: verify_logits(xt, xd, toks))[1]
    xt, xd, toks, _ = BAD["q = 0 at the last position"]
    assert "draft_tokens[0, 3]" in _error(lambda: verify_logits(xt, xd, toks))[1]
    xt, xd, toks, _ = BAD["token id = V"]
    assert "draft_tokens[0, 2] = 4001" in _error(lambda: verify_logits(xt, xd, toks))[1]


@pytest.mark.parametrize("case", ["strided", "fortran", "list", "int32 tokens", "per-row seed", "numpy scalar temp",
                                  "batch of 2", "float64 draft"])
def test_other_inputs_take_the_general_path_with_the_same_result(spy, case):
    xt, xd, toks = _row(2, 999, seed=3)
    kw = dict(seed=4)
    want = verify_logits(xt, xd, toks, **kw)
    assert len(spy) == 1
    if case == "strided":
        wide = np.zeros((1, 3, 999 * 2), np.float32)
        wide[:, :, ::2] = xt
        xt = wide[:, :, ::2]
    elif case == "fortran":
        xt, xd = np.asfortranarray(xt), np.asfortranarray(xd)
    elif case == "list":
        xt = xt.tolist()
    elif case == "int32 tokens":
        toks = toks.astype(np.int32)
    elif case == "per-row seed":
        kw = dict(seed=row_seeds(4, 1))
    elif case == "float64 draft":  # mixed dtypes: read as they are (float32 -> float64 is exact)
        xd = xd.astype(np.float64)
    elif case == "numpy scalar temp":
        kw = dict(seed=4, temperature=np.float64(1.0))
    else:
        xt, xd, toks = np.concatenate([xt, xt]), np.concatenate([xd, xd]), np.concatenate([toks, toks])
        kw = dict(seed=row_seeds(4, 1).repeat(2))
    got = verify_logits(xt, xd, toks, **kw)
    assert len(spy) == 1  # not the latency path
    assert (got.tokens == want.tokens[[0] * len(got.tokens)]).all()


def test_scalar_configuration_table_stays_small():
    xt, xd, toks = _row(1, 50, seed=2)
    for i in range(300):
        verify_logits(xt, xd, toks, temperature=0.5 + i * 1e-3)
    assert 0 < len(verify_module._scalar_configs) <= 256


def test_latency_path_results_are_independent_arrays():
    """Fields are separate arrays: writing one (a caller's bookkeeping) changes no other and no later call."""
    xt, xd, toks = _row(3, 100, seed=4)
    a = verify_logits(xt, xd, toks, seed=1)
    want = a.num_emitted.copy()
    a.num_accepted[:] = 99
    a.tokens[:] = -7
    assert (a.num_emitted == want).all()
    b = verify_logits(xt, xd, toks, seed=1)
    assert (b.num_emitted == want).all() and (b.tokens >= -1).all()


@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("dtypes", [(np.float32, np.float64), (np.float16, np.float32), (np.float64, np.float16)])
def test_target_and_draft_may_have_different_dtypes(method, dtypes):
    """Regression: a float32 target with a float64 draft raised a Numba TypingError (an internal traceback) in
    token verification.  Each array is read as it is; widening is exact, so the result equals the float64 pair."""
    rng = np.random.default_rng(5)
    B, K, V = 3, 3, 700
    xt = (rng.standard_normal((B, K + 1, V)) * 2).astype(dtypes[0])
    xd = (xt[:, :K].astype(np.float64) + rng.standard_normal((B, K, V))).astype(dtypes[1])
    toks = xd.astype(np.float64).argmax(-1)
    # one row (the serial kernel) for every pair; a batch (the parallel kernel, compiled once more per pair of
    # types, some 10 s each) for the first pair
    for b in ((B, 1) if dtypes == (np.float32, np.float64) else (1,)):
        got = verify_logits(xt[:b], xd[:b], toks[:b], seed=2, method=method, top_k=50)
        want = verify_logits(xt[:b].astype(np.float64), xd[:b].astype(np.float64), toks[:b], seed=2, method=method,
                             top_k=50)
        _same(got, want)


# --------------------------------------------------------------------------------------------- validate="visited"
@pytest.mark.parametrize("method", ["token", "block"])
@pytest.mark.parametrize("B", [1, 4])
@pytest.mark.parametrize("kw", CONFIGS[:5], ids=[str(i) for i in range(5)])
def test_visited_mode_gives_the_same_tokens(method, B, kw):
    rng = np.random.default_rng(B)
    K, V = 4, 2003
    xt = (rng.standard_normal((B, K + 1, V)) * 2).astype(np.float32)
    xd = (xt[:, :K] + rng.standard_normal((B, K, V)) * 0.7).astype(np.float32)
    toks = xd.argmax(-1)
    for d in (xd, None):
        _same(verify_logits(xt, d, toks, method=method, validate="visited", **kw),
              verify_logits(xt, d, toks, method=method, **kw))


def _rejects_at_0():
    """A row whose first draft is rejected for seed 0 (its later positions are never reached)."""
    for s in range(100):
        xt, xd, toks = _row(4, 3001, seed=s, noise=2.0)
        if verify_logits(xt, xd, toks).num_accepted[0] == 0:
            return xt, xd, toks
    raise AssertionError("no rejection found")


@pytest.mark.parametrize("method, problem", [("token", "nan target row 3"), ("token", "+inf draft row 2"),
                                             ("token", "draft row 3 all -inf"), ("token", "q = 0 at 2"),
                                             ("block", "nan target row 4")])
def test_visited_mode_skips_only_positions_never_reached(method, problem):
    """Token verification of a row rejected at position 0 reads no later row; block verification reads every
    drafted position but not the bonus position when a draft is rejected."""
    xt, xd, toks = _rejects_at_0()
    want = verify_logits(xt, xd, toks, method=method)
    bt, bd = xt.copy(), xd.copy()
    if problem.startswith("nan target row"):
        bt[0, int(problem[-1]), 9] = np.nan
    elif problem == "+inf draft row 2":
        bd[0, 2, 9] = np.inf
    elif problem == "draft row 3 all -inf":
        bd[0, 3] = -np.inf
    else:
        bd[0, 2, toks[0, 2]] = -np.inf
    with pytest.raises(ValueError):
        verify_logits(bt, bd, toks, method=method)  # the default reports it whatever the random path
    _same(verify_logits(bt, bd, toks, method=method, validate="visited"), want)


@pytest.mark.parametrize("method", ["token", "block"])
def test_visited_mode_still_checks_what_it_reads(method):
    xt, xd, toks = _rejects_at_0()
    for arr, name in ((xt, "target_logits[0, 0, 9]"), (xd, "draft_logits[0, 0, 9]")):
        bad = arr.copy()
        bad[0, 0, 9] = np.nan
        args = (bad, xd, toks) if arr is xt else (xt, bad, toks)
        got = _error(lambda: verify_logits(*args, method=method, validate="visited"))
        assert got == _error(lambda: verify_logits(*args, method=method))
        assert name in got[1]
    bd = xd.copy()
    bd[0, 0, toks[0, 0]] = -np.inf
    assert "draft_tokens[0, 0]" in _error(lambda: verify_logits(xt, bd, toks, method=method, validate="visited"))[1]


@pytest.mark.parametrize("bad", ["some", "", None, 1, True])
def test_unknown_validate_mode_is_refused(bad):
    xt, xd, toks = _row(2, 50)
    with pytest.raises(ValueError, match="validate .* is unknown: use 'all'"):
        verify_logits(xt, xd, toks, validate=bad)
    with pytest.raises(ValueError, match="validate .* is unknown"):
        verify_logits(np.concatenate([xt, xt]), np.concatenate([xd, xd]), np.concatenate([toks, toks]), validate=bad)


@pytest.mark.slow
@pytest.mark.parametrize("where", ["t1", "t2", "t4", "d1", "d3"])
def test_rows_too_large_to_read_all_ahead_are_still_each_validated(where):
    """Rows whose logits exceed READ_AHEAD_BYTES read only the next position ahead: every row is still validated
    (a NaN anywhere is reported, whatever the path) and the tokens are those of validate='visited'."""
    from fastspec.config import READ_AHEAD_BYTES

    K, V = 4, (1 << 18) + 3
    assert (2 * K + 1) * V * 8 > READ_AHEAD_BYTES
    rng = np.random.default_rng(11)
    xt = rng.standard_normal((2, K + 1, V)) * 2
    xd = xt[:, :K] + rng.standard_normal((2, K, V)) * 0.05  # row 0: close (long acceptance)
    xd[1] = rng.standard_normal((K, V)) * 2  # row 1: far (rejected early)
    toks = xd.argmax(-1)
    for b in (slice(0, 1), slice(1, 2), slice(0, 2)):
        _same(verify_logits(xt[b], xd[b], toks[b], seed=5), verify_logits(xt[b], xd[b], toks[b], seed=5,
                                                                          validate="visited"))
    bt, bd = xt.copy(), xd.copy()
    (bt if where[0] == "t" else bd)[1, int(where[1]), 77] = np.nan
    name = ("target_logits" if where[0] == "t" else "draft_logits") + f"[1, {where[1]}, 77]"
    for b in (slice(1, 2), slice(0, 2)):
        want = name.replace("[1,", "[0,", 1) if b.start == 1 else name  # row 1 alone is row 0 of its batch
        assert want in _error(lambda b=b: verify_logits(bt[b], bd[b], toks[b], seed=5))[1]
