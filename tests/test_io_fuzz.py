"""Mutation fuzzing of valid dumps (issue #12): whatever the bytes, loading and a full α pass either succeed or
raise one of the documented errors -- never OSError, tokenize's TokenError, struct.error, zlib.error,
MemoryError, ...

Three containers are mutated: a stored ``.npz`` (memory-mapped, CRC-checked as read), a deflated ``.npz``
(streamed) and a directory of ``.npy`` files.  Mutations: byte flips anywhere, changes to the numeric fields of
the zip structures (offsets, sizes, lengths: what made ``seek`` fail) and to the ``.npy`` header text (what made
the header parser fail), truncations and insertions.  Bounded: a fixed number of derandomized examples per
container (the suite's hypothesis profile), each on a dump of a few hundred bytes.
"""
from __future__ import annotations

import io
import os
import shutil
import struct
import zipfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastspec import load_dump, save_dump
from fastspec.acceptance import dump_acceptance
from fastspec.errors import DumpFormatError, DumpNotFound, InvalidInput

DOCUMENTED = (DumpFormatError, DumpNotFound, InvalidInput)


def _arrays(seed=0, N=2, T=3, V=8):
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((N, T, V)).astype(np.float16)
    return P, {"a": (P + rng.standard_normal((N, T, V))).astype(np.float16)}


def _layout(raw: bytes) -> dict:
    """Where a reader trusts the bytes of a file: the numeric fields of a zip archive (end records, central
    directory entries, local headers: offsets, sizes, counts, name/extra/comment lengths, flags, methods), the
    starts of the .npy headers, and ``directory``: the fields of the end records and the central directory alone.
    A directory's .npy file has one header at 0 and no zip fields.  (A zip64 archive's directory extras hold its
    real member offsets: the local header offsets are read through zipfile, which decodes them.)"""
    if not raw.startswith(b"PK"):
        return {"fields": [], "heads": [0], "directory": []}
    end = raw.rindex(b"PK\x05\x06")
    groups = [[(end + o, w) for o, w in ((8, 2), (10, 2), (12, 4), (16, 4), (20, 2))], [], []]
    if raw[end - 20:end - 16] == b"PK\x06\x07":  # zip64 locator and end record
        z64 = end - 20 - 56
        groups[0] += [(end - 20 + o, w) for o, w in ((4, 4), (8, 8), (16, 4))]
        groups[0] += [(z64 + o, w) for o, w in ((4, 8), (16, 4), (20, 4), (24, 8), (32, 8), (40, 8), (48, 8))]
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        offsets = [info.header_offset for info in zf.infolist()]
    heads, pos = [], raw.index(b"PK\x01\x02")
    for local in offsets:
        n, m, c = struct.unpack_from("<HHH", raw, pos + 28)
        groups[1] += [(pos + o, w) for o, w in ((8, 2), (10, 2), (20, 4), (24, 4), (28, 2), (30, 2), (32, 2),
                                                (34, 2), (42, 4))]
        groups[2] += [(local + o, w) for o, w in ((6, 2), (8, 2), (18, 4), (22, 4), (26, 2), (28, 2))]
        heads.append(local + 30 + sum(struct.unpack_from("<HH", raw, local + 26)))
        pos += 46 + n + m + c
    return {"fields": groups, "heads": heads, "directory": groups[0] + groups[1]}


@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """{container: {relative file: (bytes, layout)}} of one valid dense dump in each container."""
    root = tmp_path_factory.mktemp("orig")
    P, drafts = _arrays()
    kw = dict(tokens=np.zeros((2, 3), np.int64), lengths=[3, 2], temperature=0.9)
    save_dump(root / "stored.npz", P, drafts, **kw)
    save_dump(root / "deflated.npz", P, drafts, compressed=True, **kw)
    limits = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 64, 2  # zip64 end records and directory extras
    try:
        save_dump(root / "zip64.npz", P, drafts, **kw)
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = limits
    save_dump(root / "dir", P, drafts, **kw)
    files = {name: {"": root / name} for name in ("stored.npz", "deflated.npz", "zip64.npz")}
    files["dir"] = {f: root / "dir" / f for f in sorted(os.listdir(root / "dir"))}
    assert b"PK\x06\x06" in files["zip64.npz"][""].read_bytes()
    return {c: {f: (p.read_bytes(), _layout(p.read_bytes())) for f, p in fs.items()} for c, fs in files.items()}


#: the arrays of every original: an accepted mutant holds all of them
ARRAYS = {"target_logits", "draft_logits__a", "tokens", "lengths", "temperature"}


_u32 = st.integers(1, 2 ** 32 - 1)
_mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10 ** 6), st.integers(1, 255), st.just(0)),  # anywhere
    st.tuples(st.just("field"), st.integers(0, 2), st.integers(0, 99), _u32),  # a zip field: offsets, sizes, ...
    st.tuples(st.just("head"), st.integers(0, 99), st.integers(0, 127), st.integers(1, 255)),  # .npy header text
    st.tuples(st.just("truncate"), st.integers(0, 10 ** 6), st.just(0), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10 ** 6), st.integers(0, 255), st.integers(1, 8)),
)


#: a zip directory field changed by a small step (counts, lengths: one entry more or less) or set to a large
#: value (a comment length of 65535: zipfile stops at the directory's end with entries left unread)
_directory_mutation = st.one_of(
    st.tuples(st.just("step"), st.integers(0, 999), st.one_of(st.integers(-70, -1), st.integers(1, 70))),
    st.tuples(st.just("set"), st.integers(0, 999), st.sampled_from([0, 1, 0xFF, 0xFFFF, 0xFFFFFFFF, 2 ** 64 - 1])),
)


def _mutate_directory(raw: bytes, layout: dict, mutations) -> bytes:
    b = bytearray(raw)
    for kind, i, v in mutations:
        at, width = layout["directory"][i % len(layout["directory"])]
        old = int.from_bytes(b[at:at + width], "little")
        b[at:at + width] = ((old + v if kind == "step" else v) % (1 << 8 * width)).to_bytes(width, "little")
    return bytes(b)


def _mutate(raw: bytes, layout: dict, mutations) -> bytes:
    b = bytearray(raw)
    for kind, x, y, z in mutations:
        if kind == "field" and layout["fields"]:
            at, width = layout["fields"][x][y % len(layout["fields"][x])]
            value = int.from_bytes(b[at:at + width], "little") ^ (z % (1 << 8 * width) or 1)
            b[at:at + width] = value.to_bytes(width, "little")
            continue
        if not b:
            break
        if kind in ("head", "field"):
            at = (layout["heads"][x % len(layout["heads"])] + y) % len(b)
            b[at] ^= z % 255 + 1
        elif kind == "flip":
            b[x % len(b)] ^= y
        elif kind == "truncate":
            del b[x % len(b):]
        else:
            b[x % len(b):x % len(b)] = bytes([y]) * z
    return bytes(b)


def _load_and_analyse(path):
    try:
        with load_dump(path, validate=True) as d:
            arrays = set(d.arrays)
            res = dump_acceptance(d)
    except DOCUMENTED:
        return
    assert arrays == ARRAYS, f"accepted without {sorted(ARRAYS - arrays)}"  # nothing dropped silently
    for r in res.values():  # accepted: the answer is a valid one
        assert np.isfinite(r.alpha).all() and (r.alpha >= 0).all() and (r.alpha <= 1 + 1e-12).all()


@pytest.mark.slow
@pytest.mark.parametrize("container", ["stored.npz", "deflated.npz", "zip64.npz", "dir"])
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_dumps_raise_only_documented_errors(tmp_path, originals, container, data):
    files = originals[container]
    target = data.draw(st.sampled_from(sorted(files)), label="file")
    mutations = data.draw(st.lists(_mutation, min_size=1, max_size=3), label="mutations")
    path = tmp_path / container
    if container == "dir":
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir()
        for f, (raw, layout) in files.items():
            (path / f).write_bytes(_mutate(raw, layout, mutations) if f == target else raw)
    else:
        path.write_bytes(_mutate(*files[""], mutations))
    _load_and_analyse(path)


@pytest.mark.slow
@pytest.mark.parametrize("container", ["stored.npz", "deflated.npz", "zip64.npz"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(_directory_mutation, min_size=1, max_size=2))
def test_mutated_zip_directories_never_drop_members(tmp_path, originals, container, mutations):
    path = tmp_path / container
    path.write_bytes(_mutate_directory(*originals[container][""], mutations))
    _load_and_analyse(path)
