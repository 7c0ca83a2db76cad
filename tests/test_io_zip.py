"""A damaged zip directory must not drop arrays silently (each test failed before the fix).

Python's zipfile walks the central directory until the byte count of the end record is used up and never
compares the entries it found with the count the end record holds: one damaged comment length made it list 5
of the 9 members of ``data/synthetic_pair.npz``, and the dump then loaded without ``lengths`` and its sampling
metadata (padding rows analysed, α moved).  :mod:`fastspec.io.zipdir` checks the end records, the central
directory, the local headers and the members' extents against each other before any member is used.
"""
from __future__ import annotations

import io
import os
import shutil
import struct
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import load_dump, save_dump
from fastspec.acceptance import dump_acceptance
from fastspec.errors import DumpFormatError
from fastspec.io.shards import ShardedDump
from fastspec.simulation import simulate
from fastspec_cli.main import app

runner = CliRunner()
SYNTHETIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "synthetic_pair.npz")
DAMAGED = "the archive is damaged; re-save it"


def _end(raw) -> int:
    return bytes(raw).rindex(b"PK\x05\x06")


def _entries(raw) -> dict:
    """{member name: byte offset of its central directory entry} (walked from the end record's offset)."""
    out, pos = {}, struct.unpack_from("<I", raw, _end(raw) + 16)[0]
    while bytes(raw[pos:pos + 4]) == b"PK\x01\x02":
        n, m, k = struct.unpack_from("<HHH", raw, pos + 28)
        out[bytes(raw[pos + 46:pos + 46 + n]).decode()] = pos
        pos += 46 + n + m + k
    return out


def _write(path, raw) -> str:
    with open(path, "wb") as fh:
        fh.write(bytes(raw))
    return str(path)


def _damaged_comment_length(tmp_path):
    """The issue's archive: a copy of synthetic_pair.npz whose ``tokens.npy`` directory entry declares a
    65535-byte comment (its 2-byte field at offset 32 of the entry)."""
    raw = bytearray(open(SYNTHETIC, "rb").read())
    struct.pack_into("<H", raw, _entries(raw)["tokens.npy"] + 32, 0xFFFF)
    return _write(tmp_path / "pair.npz", raw)


def test_issue_damaged_comment_length_is_refused_everywhere(tmp_path):
    bad = _damaged_comment_length(tmp_path)
    with zipfile.ZipFile(bad) as zf:  # the damage as reported: zipfile opens it and lists 5 of the 9 members
        assert zf.namelist() == ["target_logits.npy", "draft_logits__near.npy", "draft_logits__mid.npy",
                                 "draft_logits__far.npy", "tokens.npy"]
    message = f"pair.npz: the zip central directory lists 5 members but its end record counts 9: {DAMAGED}"
    for call in (lambda: load_dump(bad), lambda: load_dump(bad, validate=True), lambda: dump_acceptance(bad),
                 lambda: simulate(bad, k=2, trials=20), lambda: ShardedDump([SYNTHETIC, bad])):
        with pytest.raises(DumpFormatError, match=message):
            call()
    for cmd in (["inspect", bad], ["inspect", bad, "--json"], ["simulate", bad, "--k", "2", "--trials", "20"],
                ["simulate", bad, "--k", "1,2,4,8", "--json"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2, r.output
        assert r.stderr.splitlines() == [f"fastspec: error: {bad}: the zip central directory lists 5 members but "
                                         f"its end record counts 9: {DAMAGED}"], r.stderr
        assert r.stdout == ""
    with load_dump(SYNTHETIC) as d:  # the intact archive: every member
        assert len(d.arrays) == 9 and d.lengths is not None


# --------------------------------------------------------------- each kind of disagreement
def _pair(tmp_path, compressed):
    rng = np.random.default_rng(5)
    P = rng.standard_normal((3, 4, 7)).astype(np.float32)
    return save_dump(tmp_path / "d.npz", P, {"a": P + 1, "b": P - 1}, lengths=[4, 3, 2], temperature=0.8,
                     compressed=compressed)


def _count(raw, delta):  # the end record's total entry count (and the per-disk one, which must agree)
    e = _end(raw)
    for off in (8, 10):
        struct.pack_into("<H", raw, e + off, struct.unpack_from("<H", raw, e + off)[0] + delta)


def _count_total_only(raw):
    e = _end(raw)
    struct.pack_into("<H", raw, e + 10, struct.unpack_from("<H", raw, e + 10)[0] - 1)


def _cd_offset(raw):  # the directory's offset alone: zipfile then shifts every member's offset
    e = _end(raw)
    struct.pack_into("<I", raw, e + 16, struct.unpack_from("<I", raw, e + 16)[0] - 4)


def _local_offset_to(raw, member, other):  # one entry points at another member's local header
    cd = _entries(raw)
    struct.pack_into("<I", raw, cd[member] + 42, struct.unpack_from("<I", raw, cd[other] + 42)[0])


def _local_offset_shift(raw, member):
    cd = _entries(raw)
    struct.pack_into("<I", raw, cd[member] + 42, struct.unpack_from("<I", raw, cd[member] + 42)[0] + 1)


def _compressed_size(raw, member, delta):
    at = _entries(raw)[member] + 20
    struct.pack_into("<I", raw, at, struct.unpack_from("<I", raw, at)[0] + delta)


def _drop_entry(raw, member):
    """Remove ``member``'s entry from the central directory and fix the end record: a consistent directory
    that no longer lists bytes the archive holds."""
    cd, e = _entries(raw), _end(raw)
    pos = cd[member]
    n, m, k = struct.unpack_from("<HHH", raw, pos + 28)
    size = 46 + n + m + k
    del raw[pos:pos + size]
    e -= size
    for off in (8, 10):
        struct.pack_into("<H", raw, e + off, struct.unpack_from("<H", raw, e + off)[0] - 1)
    struct.pack_into("<I", raw, e + 12, struct.unpack_from("<I", raw, e + 12)[0] - size)


def _trailing(raw):
    raw += b"junk!"


def _comment_length(raw):
    struct.pack_into("<H", raw, _end(raw) + 20, 3)


MUTATIONS = [
    ("fewer", lambda r: _count(r, -1), "the zip central directory lists 5 members but its end record counts 4"),
    ("more", lambda r: _count(r, +1), "the zip central directory lists 5 members but its end record counts 6"),
    ("per-disk", _count_total_only, r"the zip end record counts 5 members on this disk but 4 in all"),
    ("offset", _cd_offset, r"puts the central directory at bytes \d+\.\.\d+ but it must end at byte \d+"),
    ("same-header", lambda r: _local_offset_to(r, "lengths.npy", "temperature.npy"),
     r"member 'lengths.npy': the local header at byte \d+ names another member"),
    ("shifted-header", lambda r: _local_offset_shift(r, "draft_logits__a.npy"),
     r"member 'draft_logits__a.npy': no local header at byte \d+, where the central directory puts it"),
    ("overlap", lambda r: _compressed_size(r, "target_logits.npy", 1), r"members 'target_logits.npy' and '\w+.npy'"
                                                                       r" overlap"),
    ("gap", lambda r: _compressed_size(r, "target_logits.npy", -1), r"bytes \d+\.\.\d+ belong to no member"),
    ("dropped", lambda r: _drop_entry(r, "lengths.npy"), r"bytes \d+\.\.\d+ belong to no member"),
    ("trailing", _trailing, r"declares a 0-byte comment but 5 bytes follow it"),
    ("comment", _comment_length, r"declares a 3-byte comment but 0 bytes follow it"),
]


@pytest.mark.parametrize("compressed", [False, True], ids=["stored", "deflated"])
@pytest.mark.parametrize("mutate,pattern", [m[1:] for m in MUTATIONS], ids=[m[0] for m in MUTATIONS])
def test_directory_disagreements_are_refused(tmp_path, compressed, mutate, pattern):
    path = _pair(tmp_path, compressed)
    raw = bytearray(open(path, "rb").read())
    mutate(raw)
    _write(path, raw)
    with pytest.raises(DumpFormatError, match=rf"d\.npz: .*{pattern}.*: {DAMAGED}$"):
        load_dump(path)
    r = runner.invoke(app, ["inspect", path, "--json"])
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and r.stderr.startswith("fastspec: error: "), \
        r.output


# --------------------------------------------------------------- zip64 end records
def _zip64_archive(path):
    """A small archive with zip64 end records and zip64 directory extras (as np.savez writes past 4 GiB or
    65535 members), made by lowering zipfile's limits while it writes."""
    rng = np.random.default_rng(1)
    P = rng.standard_normal((2, 3, 5)).astype(np.float32)
    saved = zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT
    zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = 100, 1
    try:
        with zipfile.ZipFile(path, "w") as zf:
            for name, a in (("target_logits", P), ("draft_logits", P + 1), ("lengths", np.array([3, 2]))):
                buf = io.BytesIO()
                np.lib.format.write_array(buf, a, allow_pickle=False)
                with zf.open(f"{name}.npy", "w", force_zip64=True) as fh:
                    fh.write(buf.getvalue())
    finally:
        zipfile.ZIP64_LIMIT, zipfile.ZIP_FILECOUNT_LIMIT = saved
    return str(path)


def test_zip64_end_records_are_checked(tmp_path):
    good = _zip64_archive(tmp_path / "z64.npz")
    raw = bytearray(open(good, "rb").read())
    assert raw.count(b"PK\x06\x06") == 1 and raw.count(b"PK\x06\x07") == 1
    with load_dump(good, validate=True) as d:
        assert sorted(d.arrays) == ["draft_logits", "lengths", "target_logits"] and d.lengths.tolist() == [3, 2]
    z64 = bytes(raw).rindex(b"PK\x06\x06")
    cases = [(z64 + 32, "<Q", 2, r"the zip end record counts 3 members but the zip64 end record counts 2"),
             (_end(raw) + 10, "<H", 2, r"the zip end record counts 2 members but the zip64 end record counts 3"),
             (z64 + 24, "<Q", 2, r"the zip64 locator or end record describes a multi-disk archive"),
             (z64 + 56 + 8, "<Q", 0, r"the zip64 end record at byte \d+ disagrees with its locator \(which points to "
                                     r"byte 0\)"),
             (z64 + 48, "<Q", 0, r"disagree on where the central directory lies")]
    for at, fmt, value, pattern in cases:
        bad = bytearray(raw)
        struct.pack_into(fmt, bad, at, value)
        p = _write(tmp_path / "bad.npz", bad)
        with pytest.raises(DumpFormatError, match=rf"bad\.npz: .*{pattern}.*{DAMAGED}"):
            load_dump(p)


# --------------------------------------------------------------- what other writers produce still loads
def test_archives_of_other_writers_load(tmp_path):
    rng = np.random.default_rng(2)
    P = rng.standard_normal((2, 3, 5)).astype(np.float32)
    arrays = {"target_logits": P, "draft_logits": P + 1, "lengths": np.array([3, 2])}

    class NoSeek:  # a pipe: zipfile writes data descriptors after each member
        def __init__(self, fh):
            self.fh = fh

        def write(self, b):
            return self.fh.write(b)

        def flush(self):
            self.fh.flush()

    for method in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        for how in ("pipe", "comment"):
            path = tmp_path / f"{how}-{method}.npz"
            with open(path, "wb") as out:
                with zipfile.ZipFile(NoSeek(out) if how == "pipe" else out, "w", compression=method) as zf:
                    for name, a in arrays.items():
                        buf = io.BytesIO()
                        np.lib.format.write_array(buf, a, allow_pickle=False)
                        zf.writestr(f"{name}.npy", buf.getvalue())
                    if how == "comment":
                        zf.comment = b"written by hand"
            with load_dump(path, validate=True) as d:
                assert sorted(d.arrays) == sorted(arrays) and d.lengths.tolist() == [3, 2]
    zip_tool = shutil.which("zip")
    if zip_tool:  # Info-ZIP: its own extra fields; streamed ("-") with data descriptors
        import subprocess

        src = tmp_path / "npy"
        src.mkdir()
        for name, a in arrays.items():
            np.save(src / f"{name}.npy", a)
        names = sorted(os.listdir(src))
        subprocess.run([zip_tool, "-q", "-0", str(tmp_path / "iz.npz"), *names], cwd=src, check=True)
        with open(tmp_path / "iz-stream.npz", "wb") as out:
            subprocess.run([zip_tool, "-q", "-fd", "-", *names], cwd=src, check=True, stdout=out)
        for f in ("iz.npz", "iz-stream.npz"):
            with load_dump(tmp_path / f, validate=True) as d:
                assert sorted(d.arrays) == sorted(arrays)
