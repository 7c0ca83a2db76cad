"""Dump loader: round trips in every layout, bounded chunks, and refusal of malformed dumps."""
from __future__ import annotations

import os
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastspec.io import load_dump, save_dump


def _dense(N=2, T=5, V=11, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((N, T, V)).astype(dtype), rng.standard_normal((N, T, V)).astype(dtype)


@pytest.mark.parametrize("layout", ["npz", "npz-compressed", "dir"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_round_trip_and_chunks(tmp_path, layout, dtype):
    P, Q = _dense(dtype=dtype)
    name = "d.npz" if layout.startswith("npz") else "d"
    tokens = np.arange(10).reshape(2, 5)
    path = save_dump(tmp_path / name, P, {"tiny": Q, "big": P}, tokens=tokens, lengths=[5, 3], temperature=0.7,
                     top_k=0, compressed=layout == "npz-compressed")
    with load_dump(path) as d:
        assert d.kind == "dense" and d.drafts == ("big", "tiny") and (d.N, d.T, d.V) == (2, 5, 11)
        assert d.metadata == {"temperature": 0.7, "top_k": 0}
        np.testing.assert_array_equal(d.lengths, [5, 3])
        np.testing.assert_array_equal(d.tokens, tokens)
        desc = d.describe()
        assert desc["size_on_disk"] > 0
        assert {a["name"] for a in desc["arrays"]} >= {"target_logits", "draft_logits__tiny"}
        for max_bytes in (1, 100, 10**9):
            chunks = list(d.iter_chunks(max_bytes=max_bytes))
            got = np.concatenate([c.target for c in chunks])
            np.testing.assert_array_equal(got, P.reshape(-1, 11))
            np.testing.assert_array_equal(np.concatenate([c.drafts["tiny"] for c in chunks]), Q.reshape(-1, 11))
            assert all((c.stop - c.start) * 11 * P.itemsize <= max(max_bytes, 11 * P.itemsize) for c in chunks)
            np.testing.assert_array_equal(np.concatenate([c.valid for c in chunks]),
                                          [1, 1, 1, 1, 1, 1, 1, 1, 0, 0])
        d.validate()


def test_single_sequence_and_sparse(tmp_path):
    P, Q = _dense(N=1)
    p = save_dump(tmp_path / "one.npz", P[0], Q[0])
    with load_dump(p) as d:
        assert (d.N, d.T, d.V) == (1, 5, 11) and d.drafts == ("draft",)
    ids = np.tile(np.arange(3), (2, 4, 1))
    lp = np.log(np.full((2, 4, 3), 0.2))
    p = save_dump(tmp_path / "s.npz", (ids, lp), {"x": (ids[..., :2], lp[..., :2])})
    with load_dump(p, validate=True) as d:
        assert d.kind == "sparse" and d.V is None and d.k == {"target": 3, "draft:x": 2}


def test_memmap_is_used_for_npy_and_stored_npz(tmp_path):
    P, Q = _dense()
    for name in ("m.npz", "mdir"):
        with load_dump(save_dump(tmp_path / name, P, Q)) as d:
            assert d.arrays["target_logits"].storage in ("npy", "npz-stored")
            c = next(d.iter_chunks())
            assert not c.target.flags.writeable  # a view of the mapped file, not a copy


def _write_npz(path, arrays, compressed=False):
    (np.savez_compressed if compressed else np.savez)(path, **arrays)
    return path


def _base():
    P, Q = _dense()
    return {"target_logits": P, "draft_logits": Q}


@pytest.mark.parametrize("mutate,pattern", [
    (lambda a: a.update(draft_logits=a["draft_logits"][:, :, :5]), "vocabulary 5"),
    (lambda a: a.update(draft_logits=a["draft_logits"][:1]), "leading"),
    (lambda a: a.update(drafty_logits=a.pop("draft_logits")), "unknown name"),
    (lambda a: a.pop("target_logits"), "missing the target"),
    (lambda a: a.update(target_logits=a["target_logits"].astype(np.int32)), "dtype int32"),
    (lambda a: a.update(lengths=np.array([5, 0])), r"'lengths': index 1"),
    (lambda a: a.update(lengths=np.array([5, 6])), r"'lengths': index 1"),
    (lambda a: a.update(tokens=np.full((2, 5), 11)), r"'tokens': index \[0, 0\]"),
    (lambda a: a.update(temperature=np.array(-1.0)), "'temperature'"),
    (lambda a: a.update(top_p=np.array([0.5, 0.5])), "'top_p'"),
    (lambda a: a.update(target_logits=np.zeros((2, 0, 11), np.float32)), "empty"),
    (lambda a: a.update(target_topk_ids=np.zeros((2, 5, 2), np.int64)), "both dense"),
    (lambda a: a.update(target_logits__x=a["target_logits"]), "no __name"),
    (lambda a: a.update(draft_topk_ids__s=np.zeros((2, 5, 2), np.int64)), "draft_topk_logprobs__s"),
])
def test_structural_errors(tmp_path, mutate, pattern):
    arrays = _base()
    mutate(arrays)
    path = _write_npz(tmp_path / "bad.npz", arrays)
    with pytest.raises(ValueError, match=pattern) as ei:
        load_dump(path)
    assert "bad.npz" in str(ei.value)


@pytest.mark.parametrize("where,value,pattern", [
    ((1, 2, 3), np.nan, r"'draft_logits': NaN at index \[1, 2, 3\]"),
    ((0, 4, 0), np.inf, r"'draft_logits': \+inf at index \[0, 4, 0\]"),
])
def test_value_errors_name_array_and_index(tmp_path, where, value, pattern):
    arrays = _base()
    arrays["draft_logits"][where] = value
    for compressed in (False, True):
        path = _write_npz(tmp_path / f"v{compressed}.npz", arrays, compressed)
        with pytest.raises(ValueError, match=pattern):
            load_dump(path, validate=True)
        from fastspec.acceptance import dump_acceptance
        with pytest.raises(ValueError, match=r"'draft_logits'.*\[" + str(where[0])):
            dump_acceptance(path)


def test_all_masked_row_and_padding_ignored(tmp_path):
    arrays = _base()
    arrays["target_logits"][1, 4, :] = -np.inf
    p = _write_npz(tmp_path / "m.npz", arrays)
    with pytest.raises(ValueError, match=r"row \[1, 4\] has no finite logit"):
        load_dump(p, validate=True)
    arrays["lengths"] = np.array([5, 4])  # now it is padding
    p = _write_npz(tmp_path / "m2.npz", arrays)
    load_dump(p, validate=True).close()


def test_sparse_value_errors(tmp_path):
    ids = np.tile(np.arange(3), (2, 4, 1))
    lp = np.log(np.full((2, 4, 3), 0.2))
    def check(pattern, **over):
        arrays = {"target_topk_ids": ids, "target_topk_logprobs": lp, "draft_topk_ids": ids,
                  "draft_topk_logprobs": lp, "vocab_size": np.array(3)}
        arrays.update(over)
        p = _write_npz(tmp_path / "s.npz", arrays)
        with pytest.raises(ValueError, match=pattern):
            load_dump(p, validate=True)
    bad = ids.copy()
    bad[1, 2, 1] = 3
    check(r"'draft_topk_ids': id 3 at index \[1, 2, 1\]", draft_topk_ids=bad)
    bad = ids.copy()
    bad[0, 1, 2] = 0
    check(r"row \[0, 1\] lists an id twice", target_topk_ids=bad)
    bad = lp.copy()
    bad[1, 0, 0] = 0.5
    check(r"'target_topk_logprobs': value 0.5 at index \[1, 0, 0\]", target_topk_logprobs=bad)
    bad = np.log(np.full((2, 4, 3), 0.5))
    check("summing to 1.5", draft_topk_logprobs=bad)
    check("draft_topk_ids", draft_topk_ids=ids.astype(np.float32))
    check("exceeds vocab_size", vocab_size=np.array(2))


def test_refuses_object_arrays_truncation_and_bombs(tmp_path):
    # object array: refused from the header, never unpickled
    p = tmp_path / "obj.npz"
    np.savez(p, target_logits=np.array([[1.0]], dtype=object), draft_logits=np.zeros((1, 1)))
    with pytest.raises(ValueError, match="object arrays"):
        load_dump(p)
    # truncated archive
    good = _write_npz(tmp_path / "g.npz", _base())
    raw = open(good, "rb").read()
    for cut in (10, len(raw) // 2, len(raw) - 30):
        t = tmp_path / f"t{cut}.npz"
        t.write_bytes(raw[:cut])
        with pytest.raises(ValueError):
            load_dump(t, validate=True)
    # zip bomb: a huge zero array compresses ~1000x
    p = tmp_path / "bomb.npz"
    zeros = np.zeros((64, 64, 4096), np.float32)
    np.savez_compressed(p, target_logits=zeros, draft_logits=zeros)
    with pytest.raises(ValueError, match="zip bomb"):
        load_dump(p)
    # not a dump at all
    (tmp_path / "junk.npz").write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an .npz"):
        load_dump(tmp_path / "junk.npz")
    with pytest.raises(FileNotFoundError):
        load_dump(tmp_path / "nope.npz")
    # directory with a missing member / truncated member
    d = save_dump(tmp_path / "dd", *_dense())
    os.remove(os.path.join(d, "draft_logits.npy"))
    with load_dump(d) as td:  # what is left is a valid target-only dump
        assert td.drafts == ()
    d = save_dump(tmp_path / "dt", *_dense())
    f = os.path.join(d, "target_logits.npy")
    data = open(f, "rb").read()
    open(f, "wb").write(data[:-7])
    with pytest.raises(ValueError, match="truncated"):
        load_dump(d)


def test_corrupt_compressed_member(tmp_path):
    p = _write_npz(tmp_path / "c.npz", _base(), compressed=True)
    raw = bytearray(open(p, "rb").read())
    with zipfile.ZipFile(p) as zf:
        info = zf.getinfo("draft_logits.npy")
    mid = info.header_offset + 30 + len("draft_logits.npy") + info.compress_size // 2
    raw[mid] ^= 0xFF
    q = tmp_path / "c2.npz"
    q.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="draft_logits"):
        load_dump(q, validate=True)


def test_corrupt_stored_member_detected_by_crc(tmp_path):
    p = _write_npz(tmp_path / "s.npz", _base())
    raw = bytearray(open(p, "rb").read())
    with zipfile.ZipFile(p) as zf:
        info = zf.getinfo("draft_logits.npy")
    raw[info.header_offset + 30 + len("draft_logits.npy") + info.file_size - 5] ^= 0x01  # still a valid float
    q = tmp_path / "s2.npz"
    q.write_bytes(bytes(raw))
    load_dump(q).close()  # structure is fine
    with pytest.raises(ValueError, match="'draft_logits': CRC-32 mismatch"):
        load_dump(q, validate=True)


def test_save_dump_validates_before_writing(tmp_path):
    P, Q = _dense()
    Q[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        save_dump(tmp_path / "x.npz", P, Q)
    assert not (tmp_path / "x.npz").exists()
    with pytest.raises(ValueError, match="name"):
        save_dump(tmp_path / "y.npz", P, {"a__b": P})


# ---------------------------------------------------------------- fuzzing
_names = st.sampled_from(["target_logits", "draft_logits", "draft_logits__x", "target_topk_ids", "draft_topk_ids",
                          "target_topk_logprobs", "draft_topk_logprobs", "tokens", "lengths", "temperature",
                          "top_p", "vocab_size", "garbage"])
_dtypes = st.sampled_from([np.float16, np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_, np.complex64])


@st.composite
def _arrays(draw):
    out = {}
    for name in draw(st.lists(_names, min_size=1, max_size=5, unique=True)):
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
        dt = draw(_dtypes)
        n = int(np.prod(shape)) if shape else 1
        vals = draw(st.lists(st.sampled_from([0, 1, -1, 3, 0.5, -2.0, np.nan, np.inf, -np.inf, 100]),
                             min_size=n, max_size=n))
        with np.errstate(all="ignore"):
            a = np.array(vals, dtype=np.float64)
            if np.dtype(dt).kind in "iub":
                a = np.nan_to_num(a, nan=0, posinf=7, neginf=-7)
            out[name] = a.astype(dt).reshape(shape)
    return out


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_arrays(), st.booleans(), st.integers(0, 3))
def test_fuzz_malformed_dumps_only_raise_valueerror(tmp_path, arrays, compressed, cut_kind):
    p = tmp_path / "f.npz"
    _write_npz(p, arrays, compressed)
    if cut_kind == 1:
        raw = p.read_bytes()
        p.write_bytes(raw[: len(raw) * 2 // 3])
    elif cut_kind == 2:
        raw = bytearray(p.read_bytes())
        raw[len(raw) // 3] ^= 0x5A
        p.write_bytes(bytes(raw))
    try:
        d = load_dump(p, validate=True)
    except ValueError:
        return
    # accepted: then everything must be well-formed and the analysis must run and be in range
    from fastspec.acceptance import dump_acceptance
    with d:
        res = dump_acceptance(d)
        for r in res.values():
            vals = [r.alpha] if r.exact else [r.lower, r.upper]
            for v in vals:
                assert np.isfinite(v).all() and (v >= 0).all() and (v <= 1).all()


# ---------------------------------------------------------------- the io package: typed errors, one rule each
def _npy_bytes(header: str) -> bytes:
    """A .npy file (version 1.0) with a hand-written header and no data."""
    h = header.encode("latin1")
    h += b" " * (64 - (10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h


def test_typed_errors(tmp_path):
    from fastspec.errors import DumpFormatError, DumpNotFound, InvalidInput, InvalidType

    with pytest.raises(DumpNotFound) as ei:
        load_dump(tmp_path / "nope.npz")
    assert isinstance(ei.value, FileNotFoundError) and isinstance(ei.value, ValueError)
    (tmp_path / "junk.npz").write_bytes(b"hello world")
    with pytest.raises(DumpFormatError, match="junk.npz"):
        load_dump(tmp_path / "junk.npz")
    arrays = _base()
    arrays["draft_logits"][0, 1, 2] = np.nan
    with pytest.raises(DumpFormatError, match=r"v.npz: array 'draft_logits': NaN at index \[0, 1, 2\]"):
        load_dump(_write_npz(tmp_path / "v.npz", arrays), validate=True)
    P, Q = _dense()
    with pytest.raises(InvalidInput, match="layout"):
        save_dump(tmp_path / "x", P, Q, layout="zip")
    with pytest.raises(InvalidType, match="object"):
        save_dump(tmp_path / "x.npz", P, Q, tokens=np.array([[None]], dtype=object))
    with pytest.raises(InvalidType, match="path"):
        load_dump(3.5)
    with load_dump(save_dump(tmp_path / "ok.npz", P, Q)) as d:
        with pytest.raises(InvalidInput, match="no draft named 'zz'"):
            next(d.iter_chunks(drafts=["zz"]))


def test_from_arrays_checks_like_a_file():
    from fastspec.errors import DumpFormatError
    from fastspec.io import Dump

    ids = np.tile(np.arange(3), (1, 8, 1))
    lp = np.log(np.full((1, 8, 3), 0.3))
    arrays = {"target_topk_ids": ids, "target_topk_logprobs": lp, "draft_topk_ids": ids[..., :2],
              "draft_topk_logprobs": lp[..., :2], "vocab_size": np.asarray(5)}
    d = Dump.from_arrays(arrays).validate()  # as acceptance_bounds builds them
    assert d.kind == "sparse" and (d.N, d.T, d.V) == (1, 8, 5) and d.k == {"target": 3, "draft:draft": 2}
    assert d.describe()["format"] == "memory" and d.size_on_disk == 0
    bad = dict(arrays, draft_topk_ids=np.where(ids[..., :2] == 1, 7, ids[..., :2]))
    with pytest.raises(DumpFormatError, match=r"<arrays>: array 'draft_topk_ids': id 7 at index \[0, 0, 1\]"):
        Dump.from_arrays(bad).validate()
    with pytest.raises(DumpFormatError, match="mine: array 'bogus': unknown name"):
        Dump.from_arrays(dict(arrays, bogus=np.zeros(2)), path="mine")


@pytest.mark.parametrize("name,value,pattern", [
    ("temperature", 1e-310, "too small"),  # fastspec.params' rule (1/T overflows), not a local restatement
    ("top_p", 0.0, r"use a value in \(0, 1\]"),
    ("min_p", 1.0, r"use a value in \[0, 1\)"),
    ("top_k", 2.5, "integer"),
    ("top_k", -1, "top_k = -1 is invalid"),
    ("vocab_size", 0, r"\[1, 2\*\*63\)"),
])
def test_metadata_follows_sampling_params(tmp_path, name, value, pattern):
    arrays = _base()
    arrays[name] = np.asarray(value)
    with pytest.raises(ValueError, match=pattern) as ei:
        load_dump(_write_npz(tmp_path / "m.npz", arrays))
    assert f"m.npz: array {name!r}" in str(ei.value)


def test_metadata_values_normalized(tmp_path):
    arrays = dict(_base(), temperature=np.float16(0.5), top_k=np.float64(40.0), top_p=np.int64(1), min_p=np.float32(0))
    with load_dump(_write_npz(tmp_path / "m.npz", arrays)) as d:
        assert d.metadata == {"temperature": 0.5, "top_k": 40, "top_p": 1.0, "min_p": 0.0}
        assert type(d.metadata["top_k"]) is int and type(d.metadata["top_p"]) is float


def test_one_draft_name_rule(tmp_path):
    import fastspec.io
    from fastspec.io import format as fmt

    assert fastspec.io.check_draft_name is fmt.check_draft_name
    assert fastspec.io.DRAFT_NAME_PATTERN == fmt.DRAFT_NAME_PATTERN
    for bad in ("a__b", "-x", "", "x y", 3):
        with pytest.raises(ValueError, match="invalid"):
            fastspec.io.check_draft_name(bad)
    arrays = dict(_base(), draft_logits__a__b=_base()["draft_logits"])  # the loader applies the same rule
    with pytest.raises(ValueError, match=r"array 'draft_logits__a__b': draft name 'a__b' is invalid"):
        load_dump(_write_npz(tmp_path / "n.npz", arrays))


def test_two_arrays_for_one_draft_are_refused(tmp_path):
    arrays = dict(_base(), draft_logits__draft=_base()["draft_logits"] + 1)  # both are the draft named 'draft'
    with pytest.raises(ValueError, match="'draft_logits' and 'draft_logits__draft' both hold logits"):
        load_dump(_write_npz(tmp_path / "two.npz", arrays))


def test_two_sparse_pairs_for_one_draft_are_refused(tmp_path):
    rng = np.random.default_rng(0)
    ids = np.argsort(rng.standard_normal((2, 4, 20)), -1)[..., :5].astype(np.int32)
    lp = np.log(np.full((2, 4, 5), 0.1, np.float32))
    arrays = {"target_topk_ids": ids, "target_topk_logprobs": lp, "draft_topk_ids": ids,
              "draft_topk_logprobs": lp, "draft_topk_ids__draft": ids, "draft_topk_logprobs__draft": lp,
              "vocab_size": np.array(20)}
    with pytest.raises(ValueError, match="'draft_topk_ids' and 'draft_topk_ids__draft' both hold"):
        load_dump(_write_npz(tmp_path / "two.npz", arrays))


@pytest.mark.parametrize("header,pattern", [
    ("{'descr': '<f2', 'fortran_order': False, 'shape': (16777216, 16, 34359738368), }", "truncated"),  # no wrap
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3), }", "negative dimension"),
    ("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': '''}", "not a valid .npy header"),
])
def test_hostile_npy_headers(tmp_path, header, pattern):
    from fastspec.errors import DumpFormatError

    d = save_dump(tmp_path / "d", *_dense())
    with open(os.path.join(d, "target_logits.npy"), "wb") as fh:
        fh.write(_npy_bytes(header))
    with pytest.raises(DumpFormatError, match=f"array 'target_logits': .*{pattern}"):
        load_dump(d)


def test_tunables_come_from_config():
    import fastspec.io
    from fastspec import config

    assert fastspec.io.DEFAULT_CHUNK_BYTES == config.DEFAULT_CHUNK_BYTES


def test_typed_errors_name_the_argument_at_fault(tmp_path):
    """InvalidInput / InvalidType carry the argument's name (``.argument``), set by the check helpers and the raise
    sites of the formats; the message is unchanged (it names the argument too)."""
    import pickle

    from fastspec.errors import InvalidInput, InvalidType, check_int
    from fastspec.io import ShardedDump, open_dump
    from fastspec.ngram import NgramProposer, parse_ngram_draft

    with pytest.raises(InvalidInput) as e:
        check_int("retries", -1, 0)
    assert e.value.argument == "retries" and str(e.value) == "retries = -1 must be an integer >= 0"
    with pytest.raises(InvalidType) as e:
        check_int("k", 1.5, 1)
    assert e.value.argument == "k" and str(e.value) == "k = 1.5 must be an integer >= 1"
    assert pickle.loads(pickle.dumps(e.value)).argument == "k"  # crosses a process (Dask) intact
    assert InvalidInput("no single argument").argument is None
    with pytest.raises(InvalidType) as e:
        open_dump(3)
    assert e.value.argument == "source"
    p = save_dump(tmp_path / "d.npz", *_dense())
    with open_dump(p) as d, pytest.raises(InvalidInput) as e:
        d.select_drafts(["nope"])
    assert e.value.argument == "drafts" and "no draft named 'nope'" in str(e.value)
    with pytest.raises(InvalidInput) as e:
        ShardedDump([p], threads_per_worker=0)
    assert e.value.argument == "threads_per_worker"
    with pytest.raises(InvalidInput) as e:
        parse_ngram_draft("ngram5-2", 4)
    assert e.value.argument == "spec"
    with pytest.raises(InvalidInput) as e:
        NgramProposer(4, 3, 2)
    assert e.value.argument == "min_n"
    with pytest.raises(InvalidInput) as e:
        save_dump(tmp_path / "x.npz", *_dense(), layout="zip")
    assert e.value.argument == "layout"


def test_open_dump_opens_every_kind(tmp_path):
    """One opener: an .npz file, a directory of .npy files, a directory of shards, a list of shard paths; a
    context manager that closes what it opened; typed errors that name the path."""
    from fastspec.errors import DumpNotFound
    from fastspec.io import Dump, ShardedDump, open_dump

    t, d = _dense()
    npz = save_dump(tmp_path / "a.npz", t, d)
    npy = save_dump(tmp_path / "b", t, d, layout="dir")
    os.makedirs(tmp_path / "set")
    s1 = save_dump(tmp_path / "set" / "s1.npz", t, d)
    s2 = save_dump(tmp_path / "set" / "s2.npz", t, d)
    with open_dump(npz) as x:
        assert type(x) is Dump and x.N == 2
    assert x._zf is None  # closed on exit
    with open_dump(npy) as x:
        assert type(x) is Dump and x.describe()["format"] == "directory of .npy"
    with open_dump(tmp_path / "set") as x:
        assert isinstance(x, ShardedDump) and x.N == 4
    with open_dump([s1, s2]) as x:
        assert isinstance(x, ShardedDump) and x.shards == [s1, s2]
    with pytest.raises(DumpNotFound, match="nope.npz"):
        open_dump(tmp_path / "nope.npz")
