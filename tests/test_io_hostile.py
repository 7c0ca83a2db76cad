"""Issue #12, dump I/O and shards: hostile and careless inputs (each test failed before its fix).

Entries that are not regular files (FIFOs, devices, dangling links) are refused before anything is opened, so a
regression would hang: every call that could block on a FIFO runs through :func:`_no_hang`, which unblocks the
reader and fails the test instead of hanging the suite.
"""
from __future__ import annotations

import json
import os
import threading
import zipfile

import numpy as np
import pytest
from typer.testing import CliRunner

import shardutil
from fastspec import load_dump, save_dump
from fastspec.acceptance import dump_acceptance
from fastspec.errors import DumpFormatError, DumpNotFound, InvalidInput, InvalidType
from fastspec.io.shards import ShardedDump, is_sharded
from fastspec.io import open_dump
from fastspec.simulation import simulate
from fastspec_cli.main import app

runner = CliRunner()
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")


def _no_hang(fn, fifos=(), timeout=30.0):
    """``fn()``'s value, or the exception it raised; fails the test if it blocks (e.g. opened a FIFO)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        for f in fifos:  # a reader blocked in open(): give it a writer that closes at once, so the thread ends
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        t.join(timeout)
        pytest.fail(f"blocked for {timeout:.0f} s: a FIFO was opened")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def _dense(N=2, T=5, V=11, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((N, T, V)).astype(dtype)
    return P, (P + rng.standard_normal((N, T, V))).astype(dtype)


# --------------------------------------------------------------- non-regular entries (FIFOs, devices, links)
def _shard_set(tmp_path):
    _, sdir, paths = shardutil.write(tmp_path, shardutil.make_data(5))
    return sdir, paths


@needs_fifo
@pytest.mark.parametrize("entry,kind", [("part-9.npz", "fifo"), ("part-9.npz", "dangling"), ("part-9", "dangling"),
                                        ("part-9", "fifo"), ("part-9", "device")])
def test_shard_set_refuses_non_regular_entries(tmp_path, entry, kind):
    sdir, _ = _shard_set(tmp_path)
    full = os.path.join(sdir, entry)
    if kind == "fifo":
        os.mkfifo(full)
    elif kind == "dangling":
        os.symlink(os.path.join(sdir, "gone.npz"), full)
    else:  # a link to a character device
        if not os.path.exists("/dev/null"):
            pytest.skip("no /dev/null")
        os.symlink("/dev/null", full)
    fifos = [full] if kind == "fifo" else []
    with pytest.raises(DumpFormatError, match=rf"{entry}.*(FIFO|dangling|device)"):
        _no_hang(lambda: ShardedDump(sdir), fifos)
    assert _no_hang(lambda: is_sharded(sdir), fifos)  # it is a shard set: opening it says what is wrong
    r = _no_hang(lambda: runner.invoke(app, ["inspect", sdir, "--json"]), fifos)
    assert r.exit_code == 2 and entry in r.stderr and r.stdout == "", r.output


@needs_fifo
def test_shard_subdirectory_with_only_a_fifo_is_not_dropped(tmp_path):
    sdir, _ = _shard_set(tmp_path)
    sub = os.path.join(sdir, "part-9")
    os.makedirs(sub)
    os.mkfifo(os.path.join(sub, "target_logits.npy"))  # looks like a shard: it holds a .npy entry
    with pytest.raises(DumpFormatError, match=r"part-9: array 'target_logits': target_logits.npy is a FIFO"):
        _no_hang(lambda: ShardedDump(sdir), [os.path.join(sub, "target_logits.npy")])


def test_dot_entries_are_ignored_everywhere(tmp_path):
    sdir, _ = _shard_set(tmp_path)
    os.symlink(os.path.join(sdir, "gone.npz"), os.path.join(sdir, ".partial.npz"))  # hidden: ignored
    assert len(ShardedDump(sdir).shards) == 4
    d = save_dump(tmp_path / "one", *_dense())
    (tmp_path / "one" / "._target_logits.npy").write_bytes(b"\0\0resource fork")  # e.g. macOS AppleDouble
    with load_dump(d) as x:
        assert x.drafts == ("draft",)


@needs_fifo
def test_fifo_or_device_as_the_dump_is_refused_before_reading(tmp_path, monkeypatch):
    fifo = str(tmp_path / "pipe.npz")
    os.mkfifo(fifo)
    with pytest.raises(DumpFormatError, match=r"pipe.npz: is a FIFO"):
        _no_hang(lambda: load_dump(fifo), [fifo])
    r = _no_hang(lambda: runner.invoke(app, ["inspect", fifo]), [fifo])
    assert r.exit_code == 2 and "pipe.npz: is a FIFO" in r.stderr, r.output
    if os.path.exists("/dev/zero"):  # reading it never ends (and memory grows): it must not be read at all
        def never(*_a, **_k):
            raise AssertionError("/dev/zero was read")

        monkeypatch.setattr(zipfile, "is_zipfile", never)
        monkeypatch.setattr(zipfile, "ZipFile", never)
        with pytest.raises(DumpFormatError, match="/dev/zero: is a character device"):
            load_dump("/dev/zero")


@needs_fifo
def test_fifo_inside_a_dump_directory_is_refused(tmp_path):
    d = save_dump(tmp_path / "d", *_dense())
    os.remove(os.path.join(d, "draft_logits.npy"))
    fifo = os.path.join(d, "draft_logits.npy")
    os.mkfifo(fifo)
    with pytest.raises(DumpFormatError, match=r"array 'draft_logits': draft_logits.npy is a FIFO"):
        _no_hang(lambda: load_dump(d), [fifo])
    os.remove(fifo)
    os.makedirs(fifo)  # a directory named like an array
    with pytest.raises(DumpFormatError, match=r"array 'draft_logits': draft_logits.npy is a directory"):
        load_dump(d)
    os.rmdir(fifo)
    os.symlink(os.path.join(d, "gone"), fifo)
    with pytest.raises(DumpFormatError, match=r"array 'draft_logits': draft_logits.npy is a dangling symbolic link"):
        load_dump(d)


def test_dangling_link_as_the_dump(tmp_path):
    link = tmp_path / "d.npz"
    os.symlink(tmp_path / "gone.npz", link)
    with pytest.raises(DumpNotFound, match="dangling symbolic link"):
        load_dump(link)


# --------------------------------------------------------------- integrity of stored .npz members
def _member(path, name):
    """(file offset, size) of stored member ``name`` (its .npy header, then the data) in the .npz at ``path``."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name + ".npy")
    with open(path, "rb") as fh:
        fh.seek(info.header_offset + 26)
        n, m = np.frombuffer(fh.read(4), "<u2")
    return info.header_offset + 30 + int(n) + int(m), info.file_size


def _patch(path, at, data: bytes):
    with open(path, "r+b") as fh:
        fh.seek(at)
        fh.write(data)


def _corrupt_logit(path, name, value=1e30, index=7, nbytes=4 * 2 * 5 * 11):
    """Overwrite one float32 logit of stored member ``name`` (a valid value: only the CRC can tell)."""
    start, size = _member(path, name)
    _patch(path, start + size - nbytes + 4 * index, np.float32(value).tobytes())


@pytest.fixture
def damaged(tmp_path):
    P, Q = _dense()
    good = save_dump(tmp_path / "good.npz", P, {"near": Q, "far": P + 1}, lengths=[5, 4])
    bad = save_dump(tmp_path / "bad.npz", P, {"near": Q, "far": P + 1}, lengths=[5, 4])
    _corrupt_logit(bad, "draft_logits__near")
    return good, bad


def test_alpha_pass_checks_the_crc_of_stored_members(damaged):
    good, bad = damaged
    with pytest.raises(DumpFormatError, match=r"bad.npz: array 'draft_logits__near': CRC-32 mismatch"):
        dump_acceptance(bad)
    with load_dump(bad) as d:  # structure is fine; the pass that reads the member checks it
        with pytest.raises(DumpFormatError, match="CRC-32 mismatch"):
            for _ in d.iter_chunks(max_bytes=100):
                pass
        res = dump_acceptance(d, verify_integrity=False)  # the explicit opt-out
        assert not np.array_equal(res["near"].alpha, dump_acceptance(good)["near"].alpha)
        far = dump_acceptance(d, drafts=["far"])  # a pass that never reads the damaged member does not check it
        np.testing.assert_array_equal(far["far"].alpha, dump_acceptance(good, drafts=["far"])["far"].alpha)
    with load_dump(bad, verify_integrity=False) as d:
        dump_acceptance(d)
        with pytest.raises(DumpFormatError, match="CRC-32 mismatch"):  # validate() checks everything
            d.validate()
    with pytest.raises(DumpFormatError, match="CRC-32 mismatch"):
        simulate(bad, k=2, trials=20)
    simulate(bad, k=2, trials=20, verify_integrity=False)
    with pytest.raises(DumpFormatError, match="CRC-32 mismatch"):
        simulate(bad, k=2, trials=4, mode="token", drafts=["near"])


def test_cli_checks_integrity_by_default(damaged):
    _, bad = damaged
    for cmd in (["inspect", bad, "--json"], ["simulate", bad, "--k", "2", "--trials", "20", "--json"]):
        r = runner.invoke(app, cmd)
        assert r.exit_code == 2 and "bad.npz: array 'draft_logits__near': CRC-32 mismatch" in r.stderr, r.output
        assert "--" not in r.stderr.split("CRC-32")[1]  # library wording: no flag named
        r = runner.invoke(app, cmd + ["--no-integrity-check"])
        assert r.exit_code == 0, r.output
        json.loads(r.stdout)


def test_small_arrays_and_shards_are_checked(tmp_path):
    P, Q = _dense()
    p = save_dump(tmp_path / "l.npz", P, Q, lengths=[5, 4])
    with zipfile.ZipFile(p) as zf:
        info = zf.getinfo("lengths.npy")
    raw = bytearray(open(p, "rb").read())
    at = raw.index(np.array([5, 4]).tobytes(), info.header_offset)
    raw[at:at + 8] = np.int64(3).tobytes()  # still a valid length
    open(p, "wb").write(bytes(raw))
    with pytest.raises(DumpFormatError, match=r"array 'lengths': CRC-32 mismatch"):
        load_dump(p)
    assert load_dump(p, verify_integrity=False).lengths.tolist() == [3, 4]
    _, sdir, paths = shardutil.write(tmp_path / "s", shardutil.make_data(6))
    _corrupt_npz_member(paths[2], "draft_logits__far")
    with pytest.raises(DumpFormatError, match=r"shard 2 of 4: .*part-2.npz: array 'draft_logits__far': CRC-32"):
        dump_acceptance(ShardedDump(sdir))
    dump_acceptance(ShardedDump(sdir, verify_integrity=False))
    with pytest.raises(DumpFormatError, match="CRC-32"):
        for _ in ShardedDump(sdir).iter_chunks():
            pass


def _corrupt_npz_member(path, name):
    """Flip the lowest bit of the last float16 of stored member ``name`` (still a valid logit)."""
    start, size = _member(path, name)
    with open(path, "rb") as fh:
        fh.seek(start + size - 2)
        low = fh.read(1)[0]
    _patch(path, start + size - 2, bytes([low ^ 1]))


def test_compressed_member_crc_is_checked_by_the_chunked_reader(tmp_path):
    import struct

    P, Q = _dense(V=5000)  # larger than what opening the member decompresses to read its header
    p = save_dump(tmp_path / "c.npz", P, Q, compressed=True)
    with zipfile.ZipFile(p) as zf:
        crc = zf.getinfo("draft_logits.npy").CRC
    raw = open(p, "rb").read().replace(struct.pack("<I", crc), struct.pack("<I", crc ^ 1))
    open(p, "wb").write(raw)
    with load_dump(p, verify_integrity=False) as d:  # the decompressor's own check cannot be turned off
        with pytest.raises(DumpFormatError, match="array 'draft_logits'.*CRC"):
            dump_acceptance(d)


# --------------------------------------------------------------- shapes, values and arguments
def _npy_header(descr, shape) -> bytes:
    h = ("{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))).encode()
    h += b" " * (64 - (10 + len(h) + 1) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h


def _sparse_npy(path, descr, shape):
    """A .npy file of ``shape`` whose data is a hole (sparse file: no disk space)."""
    head = _npy_header(descr, shape)
    with open(path, "wb") as fh:
        fh.write(head)
        try:
            fh.truncate(len(head) + int(np.prod(shape, dtype=object)) * np.dtype(descr).itemsize)
        except OSError as exc:
            pytest.skip(f"no sparse file of that size here: {exc}")


@pytest.mark.parametrize("shape,pattern", [((2 ** 32 + 1, 1), "4294967297 positions"),
                                           ((1, 2, 2 ** 24 + 1), "last dimension 16777217")])
def test_absurd_shapes_are_refused_with_file_and_array(tmp_path, shape, pattern):
    d = tmp_path / "sp"
    d.mkdir()
    for name in ("target_logits", "draft_logits"):
        _sparse_npy(d / f"{name}.npy", "<f2", shape)
    with pytest.raises(DumpFormatError, match=rf"sp: array '(target|draft)_logits': .*{pattern}"):
        load_dump(d)


def test_uint64_values_are_not_wrapped(tmp_path):
    P, Q = _dense()
    np.savez(tmp_path / "t.npz", target_logits=P, draft_logits=Q, tokens=np.full((2, 5), 2 ** 64 - 1, np.uint64))
    with pytest.raises(DumpFormatError, match=r"array 'tokens': index \[0, 0\] is 18446744073709551615"):
        load_dump(tmp_path / "t.npz")
    np.savez(tmp_path / "l.npz", target_logits=P, draft_logits=Q, lengths=np.array([2 ** 64 - 1, 3], np.uint64))
    with pytest.raises(DumpFormatError, match=r"array 'lengths': index 0 is 18446744073709551615"):
        load_dump(tmp_path / "l.npz")
    ids = np.tile(np.arange(3, dtype=np.uint64), (2, 4, 1))
    ids[1, 2, 0] = 2 ** 64 - 1  # no vocab_size: ids must still fit int64
    lp = np.log(np.full((2, 4, 3), 0.2))
    np.savez(tmp_path / "s.npz", target_topk_ids=ids, target_topk_logprobs=lp, draft_topk_ids=ids[..., :2],
             draft_topk_logprobs=lp[..., :2])
    with pytest.raises(DumpFormatError, match=r"array 'target_topk_ids': id 18446744073709551615 at index \[1, 2, 0\]"):
        load_dump(tmp_path / "s.npz", validate=True)


def test_draft_named_target_is_refused(tmp_path):
    from fastspec.io import check_draft_name

    with pytest.raises(InvalidInput, match="'target' is reserved"):
        check_draft_name("target")
    P, Q = _dense()
    np.savez(tmp_path / "t.npz", target_logits=P, draft_logits__target=Q)
    with pytest.raises(DumpFormatError, match=r"array 'draft_logits__target': draft name 'target' is reserved"):
        load_dump(tmp_path / "t.npz")
    with pytest.raises(InvalidInput, match="reserved"):
        save_dump(tmp_path / "u.npz", P, {"target": Q})


@pytest.mark.parametrize("value,error", [(0, InvalidInput), (-5, InvalidInput), (2 ** 40, InvalidInput),
                                         (1.5, InvalidType), (True, InvalidType), ("64", InvalidType)])
def test_max_bytes_is_validated(tmp_path, value, error):
    P, Q = _dense()
    p = save_dump(tmp_path / "m.npz", P, Q)
    with load_dump(p) as d:
        with pytest.raises(error, match="max_bytes"):
            next(d.iter_chunks(max_bytes=value))
        with pytest.raises(error, match="max_bytes"):
            d.validate(max_bytes=value)
    with pytest.raises(error, match="max_bytes"):
        load_dump(p, validate=True, max_bytes=value)
    with pytest.raises(error, match="max_bytes"):
        dump_acceptance(p, max_bytes=value)
    with pytest.raises(error, match="max_bytes"):
        dump_acceptance(ShardedDump([p]), max_bytes=value)


def test_a_draft_selected_twice_is_refused(tmp_path):
    P, Q = _dense()
    p = save_dump(tmp_path / "d.npz", P, {"a": Q, "b": P})
    with pytest.raises(InvalidInput, match="'a' is selected twice"):
        dump_acceptance(p, drafts=["a", "b", "a"])
    with load_dump(p) as d, pytest.raises(InvalidInput, match="'a' is selected twice"):
        next(d.iter_chunks(drafts=["a", "a"]))
    # the simulate command documents "a repeated --draft counts once" (tests/test_cli_inputs.py): it selects
    # each name once before the library sees them
    assert set(dump_acceptance(p, drafts=["b", "a"])) == {"a", "b"}
    with open_dump(p) as d:
        assert d.select_drafts("a") == ("a",)  # one name


# --------------------------------------------------------------- memory: a dump larger than the address space
def _sparse_stored_npz(path, arrays: dict) -> int:
    """An ``np.savez``-like stored .npz of zero arrays ``{name: (descr, shape)}`` whose data are holes (no disk
    space), with correct CRC-32s; returns its size."""
    import struct
    import zlib

    zeros = memoryview(bytes(16 << 20))
    central = b""
    with open(path, "wb") as fh:
        for name, (descr, shape) in arrays.items():
            head, fname = _npy_header(descr, shape), f"{name}.npy".encode()
            data = int(np.prod(shape)) * np.dtype(descr).itemsize
            crc, left = zlib.crc32(head), data
            while left:
                crc = zlib.crc32(zeros[:min(left, len(zeros))], crc)
                left -= min(left, len(zeros))
            fields = (0, 0, 0, 0, crc, len(head) + data, len(head) + data, len(fname))  # flags .. name length
            central += struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, *fields, 0, 0, 0, 0, 0, fh.tell()) + fname
            fh.write(struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, *fields, 0) + fname + head)
            fh.seek(data, os.SEEK_CUR)
        start = fh.tell()
        fh.write(central + struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, len(arrays), len(arrays), len(central),
                                       start, 0))
        return fh.tell()


_UNDER_A_LIMIT = r"""
import json, resource, sys
from typer.testing import CliRunner
from fastspec_cli.main import app

big, small = sys.argv[1], sys.argv[2]
# the same code paths first (kernels compiled, Numba's and the CRC-32 threads started), then the limit
assert CliRunner().invoke(app, ["inspect", small, "--json"]).exit_code == 0
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
limit = vm + (384 << 20)
resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
r = CliRunner().invoke(app, ["inspect", big, "--json"])
print(json.dumps({"exit": r.exit_code, "stderr": r.stderr, "stdout": r.stdout, "limit": limit, "baseline": vm}))
"""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmSize from /proc (Linux)")
def test_dump_larger_than_the_address_space_limit(tmp_path):
    import subprocess
    import sys

    big = str(tmp_path / "big.npz")
    shape = (512, 64, 8192)  # 512 MiB of float16 per array, 1 GiB in all; a hole on disk
    size = _sparse_stored_npz(big, {"target_logits": ("<f2", shape), "draft_logits": ("<f2", shape)})
    small = str(tmp_path / "small.npz")  # 40 MiB: members large enough for the multi-threaded CRC-32
    _sparse_stored_npz(small, {"target_logits": ("<f2", (40, 64, 8192)), "draft_logits": ("<f2", (40, 64, 8192))})
    script = tmp_path / "limit.py"
    script.write_text(_UNDER_A_LIMIT)
    run = subprocess.run([sys.executable, str(script), big, small], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert size > 2 * (out["limit"] - out["baseline"])  # the dump could not have been mapped whole
    assert out["exit"] == 0, out["stderr"]
    info = json.loads(out["stdout"])
    assert info["acceptance"]["draft"]["alpha"]["mean"] == 1.0  # identical (all-zero) target and draft


def _under_limit(args, limit, env, timeout=90):
    """``(rc, stdout, stderr)`` of ``python -m fastspec_cli ARGS`` under an address-space limit of ``limit``
    bytes; rc None when it ran past ``timeout`` seconds (killed)."""
    import resource
    import subprocess
    import sys

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        r = subprocess.run([sys.executable, "-m", "fastspec_cli", *args], capture_output=True, text=True, env=env,
                           preexec_fn=cap, timeout=timeout, cwd=os.path.dirname(os.path.dirname(SMOLLM2)))
    except subprocess.TimeoutExpired as exc:
        text = [b.decode(errors="replace") if isinstance(b, bytes) else b or "" for b in (exc.stdout, exc.stderr)]
        return None, *text
    return r.returncode, r.stdout, r.stderr


SMOLLM2 = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "smollm2_exit_top64.npz")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not os.path.exists("/proc/self/status") or not hasattr(os, "fork"),
                    reason="RLIMIT_AS on a Linux process")
def test_cli_under_an_address_space_limit_fails_in_one_line(tmp_path):
    """Under ``ulimit -v`` a run either works or prints one ``fastspec: error:`` line and exits 1.  Before: LLVM
    aborted while compiling or loading the kernels (``std::bad_alloc``, "LLVM ERROR: out of memory", rc 134),
    scipy's OpenBLAS spun forever in its start-up allocation or exited 130, library imports failed with a
    traceback -- depending on where between about 330 and 580 MiB the limit fell (2 CPUs).  The limits below span
    start-up (about 300 MiB) to comfortably enough, the two commands taking turns (both at 768 MiB); each run
    compiles the kernels afresh (an empty Numba cache), then the reported setting (768 MiB) runs 7 times on a warm
    cache."""
    base = {**os.environ, "COLUMNS": "120"}
    outcomes: list = []

    def check(args, limit, env):
        rc, out, err = _under_limit(args, limit, env)
        lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("fastspec: compiling")]
        what = f"{' '.join(args[:1])} under {limit >> 20} MiB: rc {rc}, stderr {err[-600:]!r}"
        assert rc is not None, f"hung: {what}"
        assert rc in (0, 1), what
        if rc == 0:
            assert out and not lines, what
        else:
            assert len(lines) == 1 and lines[0].startswith("fastspec: error: "), what
        outcomes.append(rc)

    commands = (["simulate", SMOLLM2, "--k", "1,2,4,8"], ["inspect", SMOLLM2])
    cold = [(256, 0), (320, 1), (384, 0), (450, 1), (512, 0), (576, 1), (768, 0), (768, 1)]
    for i, (mib, j) in enumerate(cold):
        check(commands[j], mib << 20, {**base, "NUMBA_CACHE_DIR": str(tmp_path / f"cold-{i}")})
    warm = {**base, "NUMBA_CACHE_DIR": str(tmp_path / "warm")}
    for n in range(7):
        check(commands[n % 2], 768 << 20, warm)
    assert 0 in outcomes  # the limits are not all refused


def test_parallel_crc32_is_zlibs():
    import zlib

    from fastspec.io.crc import BLOCK, crc32

    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 3 * BLOCK + 12345, dtype=np.uint8)
    for n in (0, 1, 2 * BLOCK, 2 * BLOCK + 1, data.size):
        for start in (0, 1, 0xFFFFFFFF):
            assert crc32(data[:n], start) == zlib.crc32(data[:n], start)
    if hasattr(os, "fork"):  # a forked child gets a pool of its own (the parent's threads do not exist there)
        pid = os.fork()
        if pid == 0:
            os._exit(0 if crc32(data) == zlib.crc32(data) else 1)
        assert os.waitpid(pid, 0)[1] == 0
