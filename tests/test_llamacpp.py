"""llama.cpp ``--kl-divergence-base`` files as dumps (fastspec.io.llamacpp): a writer transcribed from llama.cpp's
``tools/perplexity/perplexity.cpp`` (ggml-org/llama.cpp 050fc7f3), alpha against the float logits within the
quantization bound, the CLI, hostile files and bounded memory."""
from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pytest
from typer.testing import CliRunner

from fastspec import save_dump
from fastspec.errors import DumpFormatError, InvalidInput
from fastspec.acceptance import dump_acceptance
from fastspec.io import Dump, open_dump
from fastspec.io.llamacpp import LlamaCppDump, load_llamacpp, row_width
from fastspec_cli.main import app

runner = CliRunner()
F32 = np.float32


# ---- llama.cpp's writer, transcribed -----------------------------------------------------------------------------
def _nearest_int(f: np.ndarray) -> np.ndarray:
    """``nearest_int``: float val = fval + 12582912.f; bits & 0x007fffff - 0x00400000."""
    val = (f.astype(F32) + F32(12582912.0)).astype(F32)
    return (val.view(np.int32) & 0x007FFFFF) - 0x00400000


def _log_softmax_u16(logits: np.ndarray, n_vocab: int) -> np.ndarray:
    """``log_softmax(int n_vocab, const float * logits, uint16_t * log_prob, int tok)``: one row of nv uint16."""
    x = logits.astype(F32)
    max_logit, min_logit = F32(x.max()), F32(x.min())
    min_logit = max(min_logit, F32(max_logit - F32(16)))
    sum_exp = float(np.sum(np.exp((x - max_logit).astype(F32)).astype(np.float64)))
    log_sum_exp = F32(np.log(sum_exp))
    min_log_prob = F32(F32(min_logit - max_logit) - log_sum_exp)
    scale = F32(F32(max_logit - min_logit) / F32(65535.0))
    row = np.zeros(row_width(n_vocab), np.uint16)  # std::vector<uint16_t>: zero-initialised, padding never written
    row[:4] = np.array([scale, min_log_prob], F32).view(np.uint16)
    if scale:
        inv_scale = F32(F32(1) / scale)
        q = _nearest_int((inv_scale * (x - min_logit).astype(F32)).astype(F32))
        row[4:4 + n_vocab] = np.where(x > min_logit, q, 0).astype(np.uint16)
    return row


def write_kld(path, tokens: np.ndarray, logits: np.ndarray) -> str:
    """``perplexity()`` with ``--kl-divergence-base path``: ``tokens`` int [n_chunk, n_ctx], ``logits`` float
    [n_chunk, n_ctx, n_vocab] (every position; only positions first .. n_ctx-2 are written)."""
    n_chunk, n_ctx, n_vocab = logits.shape
    first = n_ctx // 2
    with open(path, "wb") as fh:
        fh.write(b"_logits_")
        fh.write(np.int32(n_ctx).tobytes())
        fh.write(np.int32(n_vocab).tobytes())
        fh.write(np.int32(n_chunk).tobytes())
        fh.write(tokens.astype(np.int32).tobytes())
        for i in range(n_chunk):
            rows = [_log_softmax_u16(logits[i, first + j], n_vocab) for j in range(n_ctx - 1 - first)]
            fh.write(np.stack(rows).tobytes())
    return str(path)


def _bound(scales: np.ndarray, temperature: float) -> np.ndarray:
    """Per-position bound on |alpha_file - alpha_float| from one side's quantization step (scale/2 + float32
    rounding): TV(p, p') <= (e^(2 d) - 1)/2."""
    d = (scales.astype(np.float64) / 2 + 2e-6) / temperature
    return (np.expm1(2 * d)) / 2


def _row_scales(path, n_ctx, V):
    with open(path, "rb") as fh:
        data = fh.read()
    N = int(np.frombuffer(data, "<i4", 1, 16)[0])
    first = n_ctx // 2
    T = n_ctx - 1 - first
    off = 20 + 4 * N * n_ctx
    rows = np.frombuffer(data, "<u2", N * T * row_width(V), off).reshape(N * T, row_width(V))
    return np.ascontiguousarray(rows[:, :4]).view("<f4")[:, 0].reshape(N, T)


def _make(tmp_path, N=3, n_ctx=16, V=33, seed=0, spread=2.0, clip=7.0, low=None):
    """A target and two drafts over the same text, written as llama.cpp does; also the float logits dump."""
    rng = np.random.default_rng(seed)
    tgt = np.clip(rng.normal(0, spread, (N, n_ctx, V)), -clip, clip).astype(F32)
    drafts = {"near": np.clip(tgt + rng.normal(0, 0.5, tgt.shape), -clip, clip).astype(F32),
              "far": np.clip(tgt + rng.normal(0, 2.0, tgt.shape), -clip, clip).astype(F32)}
    if low is not None:  # entries far below the maximum: llama.cpp clamps them to the floor
        for a in (tgt, *drafts.values()):
            a[..., :low] -= 40
    tokens = rng.integers(0, V, (N, n_ctx))
    files = {"target": write_kld(tmp_path / "t.kld", tokens, tgt)}
    for n, a in drafts.items():
        files[n] = write_kld(tmp_path / f"{n}.kld", tokens, a)
    man = tmp_path / "m.json"
    man.write_text(json.dumps({"target": "t.kld", "drafts": {n: f"{n}.kld" for n in drafts}}))
    first = n_ctx // 2
    T = n_ctx - 1 - first
    sl = slice(first, first + T)
    dense = save_dump(tmp_path / "float.npz", tgt[:, sl], {n: a[:, sl] for n, a in drafts.items()},
                      tokens=tokens[:, first + 1:])
    return dict(man=str(man), files=files, dense=str(dense), tokens=tokens, tgt=tgt, drafts=drafts, N=N, T=T, V=V,
                n_ctx=n_ctx, first=first)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    return _make(tmp_path_factory.mktemp("kld"))


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


# ---- format and protocol ----------------------------------------------------------------------------------------
def test_structure_tokens_prompt(made):
    with open_dump(made["man"]) as d:
        assert isinstance(d, LlamaCppDump)
        assert d.kind == "dense" and d.drafts == ("far", "near") and (d.N, d.T, d.V) == (3, 7, 33)
        np.testing.assert_array_equal(d.lengths, [7, 7, 7])
        first = made["first"]
        np.testing.assert_array_equal(d.tokens, made["tokens"][:, first + 1:])
        np.testing.assert_array_equal(d.prompt_tokens, made["tokens"][:, :first + 1])
        np.testing.assert_array_equal(d.prompt_lengths, [first + 1] * 3)
        desc = d.describe()
        assert desc["format"] == "llama.cpp kl-divergence-base" and desc["size_on_disk"] > 0
        assert {a["name"] for a in desc["arrays"]} >= {"target_logits", "draft_logits__near", "draft_logits__far"}
    with open_dump(made["files"]["target"]) as d:  # a bare file: target only
        assert isinstance(d, LlamaCppDump) and d.drafts == () and d.prompt_tokens is not None


def test_decoded_rows_match_log_softmax(made):
    first, T = made["first"], made["T"]
    with load_llamacpp(made["man"]) as d:
        got = np.concatenate([c.target for c in d.iter_chunks(max_bytes=200)]).reshape(made["N"], T, -1)
    x = made["tgt"][:, first:first + T].astype(np.float64)
    ref = x - x.max(-1, keepdims=True)
    ref -= np.log(np.exp(ref).sum(-1, keepdims=True))
    step = _row_scales(made["files"]["target"], made["n_ctx"], made["V"])
    assert (np.abs(got - ref) <= step[..., None] / 2 + 2e-6).all()
    assert got.dtype == np.float32


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_alpha_within_quantization_bound(made, temperature):
    with open_dump(made["man"]) as d, open_dump(made["dense"]) as f:
        a = dump_acceptance(d, temperature=temperature)
        b = dump_acceptance(f, temperature=temperature)
    st = _row_scales(made["files"]["target"], made["n_ctx"], made["V"])
    for name in ("near", "far"):
        sd = _row_scales(made["files"][name], made["n_ctx"], made["V"])
        bound = _bound(st, temperature) + _bound(sd, temperature)
        diff = np.abs(a[name].alpha - b[name].alpha)
        assert (diff <= bound).all(), (diff.max(), bound.min())
        assert diff.max() > 0  # the file really is quantized


def test_clamped_tail_dropped_and_kept(tmp_path):
    m = _make(tmp_path, low=5)
    first, T = m["first"], m["T"]
    with open_dump(m["dense"]) as f:
        exact = dump_acceptance(f)["near"].alpha
    with load_llamacpp(m["man"]) as d:
        c = next(d.iter_chunks(max_bytes=10**9))
        assert np.isneginf(c.target[:, :5]).all() and np.isfinite(c.target[:, 5:]).all()
        drop = dump_acceptance(d)["near"].alpha
    with load_llamacpp(target=m["files"]["target"], drafts={"near": m["files"]["near"]}, tail="keep") as d:
        c = next(d.iter_chunks(max_bytes=10**9))
        assert np.isfinite(c.target).all()
        keep = dump_acceptance(d)["near"].alpha
    st = _row_scales(m["files"]["target"], m["n_ctx"], m["V"])
    sd = _row_scales(m["files"]["near"], m["n_ctx"], m["V"])
    assert (st * 65535 > 15.99).all()  # every row was clamped
    tail = 2 * 5 * np.exp(-16.0 + 1e-3)  # n0 entries at the floor, each below p_max e^-16, per side
    bound = _bound(st, 1.0) + _bound(sd, 1.0)
    assert (np.abs(drop - exact) <= bound).all()  # the real tail here is e^-40: dropping it is exact
    assert (np.abs(keep - exact) <= bound + tail).all()
    del first, T


def test_chunks_bounded_memory(tmp_path):
    m = _make(tmp_path, N=4, n_ctx=41, V=256, seed=2)  # odd n_ctx, even V (the fixture: even n_ctx, odd V)
    with load_llamacpp(m["man"]) as d:
        file_bytes = d.size_on_disk
        row = 4 * d.V
        max_bytes = 3 * row
        tracemalloc.start()
        try:
            n = 0
            for c in d.iter_chunks(max_bytes=max_bytes):
                assert c.stop - c.start <= 3 and c.target.shape == (c.stop - c.start, d.V)
                n += c.stop - c.start
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert n == d.N * d.T
        # decoded: one chunk per role (3 roles) plus temporaries of one chunk; far below the files' size
        assert peak < 12 * max_bytes + 64 * 1024 and peak < file_bytes / 4, (peak, file_bytes)
        d.validate(max_bytes=max_bytes)


# ---- the CLI ------------------------------------------------------------------------------------------------------
def test_cli_inspect_and_simulate_agree_with_float_dump(made):
    r = run("inspect", made["man"], "--json", "--k", "2")
    assert r.exit_code == 0, r.stderr
    a = json.loads(r.stdout)
    r = run("inspect", made["dense"], "--json", "--k", "2")
    assert r.exit_code == 0, r.stderr
    b = json.loads(r.stdout)
    assert a["format"] == "llama.cpp kl-divergence-base" and a["N"] == b["N"] and a["T"] == b["T"]
    tol = 2 * (np.expm1(2 * (16 / 65535 / 2 + 2e-6)) / 2)
    for name in ("near", "far"):
        assert abs(a["acceptance"][name]["alpha"]["mean"] - b["acceptance"][name]["alpha"]["mean"]) <= tol
    _close_numbers(a, b, tol * 2, skip=("path", "format", "size_on_disk", "arrays", "files", "n_ctx", "tail",
                                        "dump", "warnings", "has_prompt_tokens", "metadata", "sampling_source"))
    r1 = run("simulate", made["man"], "--k", "1,2", "--json", "--seed", "1")
    assert r1.exit_code == 0, r1.stderr
    r2 = run("simulate", made["dense"], "--k", "1,2", "--json", "--seed", "1")
    assert r2.exit_code == 0, r2.stderr
    s1, s2 = json.loads(r1.stdout), json.loads(r2.stdout)
    assert len(s1["results"]) == len(s2["results"]) == 4
    for x, y in zip(s1["results"], s2["results"], strict=True):
        assert (x["draft"], x["k"]) == (y["draft"], y["k"])
        assert abs(x["alpha"] - y["alpha"]) <= tol
        assert abs(x["mean_acceptance_length_exact"] - y["mean_acceptance_length_exact"]) <= 3 * tol
    r = run("simulate", made["files"]["target"], "--k", "1,2", "--json")  # bare file: the n-gram draft
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["results"][0]["draft"].startswith("ngram")


def _close_numbers(a, b, tol, skip=(), where="$"):
    """Every number of ``b`` found in ``a`` at the same place is within ``tol`` (structure otherwise equal)."""
    if isinstance(b, dict):
        for k, v in b.items():
            if k in skip or k not in a:
                continue
            _close_numbers(a[k], v, tol, skip, f"{where}.{k}")
    elif isinstance(b, list) and isinstance(a, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close_numbers(x, y, tol, skip, f"{where}[{i}]")
    elif isinstance(b, float) and isinstance(a, (int, float)):
        assert abs(a - b) <= tol * max(1.0, abs(b)), (where, a, b)


# ---- hostile files ------------------------------------------------------------------------------------------------
def _hostile(tmp_path, made, how):
    src = open(made["files"]["near"], "rb").read()
    tgt = made["files"]["target"]
    bad = tmp_path / "bad.kld"
    V, n_ctx, N = made["V"], made["n_ctx"], made["N"]
    if how == "truncated":
        bad.write_bytes(src[:-3])
    elif how == "trailing":
        bad.write_bytes(src + b"\0\0")
    elif how == "short header":
        bad.write_bytes(src[:14])
    elif how == "magic":
        bad.write_bytes(b"_logitz_" + src[8:])
    elif how == "huge vocab":
        bad.write_bytes(src[:12] + np.int32(2 ** 30).tobytes() + src[16:])
    elif how == "huge vocab ok range":
        bad.write_bytes(src[:12] + np.int32(2 ** 24).tobytes() + src[16:])
    elif how == "huge ctx":
        bad.write_bytes(src[:8] + np.int32(2 ** 31 - 1).tobytes() + src[12:])
    elif how == "negative chunks":
        bad.write_bytes(src[:16] + np.int32(-1).tobytes() + src[20:])
    elif how == "token out of range":
        b = bytearray(src)
        b[20:24] = np.int32(V + 5).tobytes()
        bad.write_bytes(bytes(b))
    elif how == "nan":
        b = bytearray(src)
        off = 20 + 4 * N * n_ctx + 2 * row_width(V) * 4  # row 4's scale
        b[off:off + 4] = np.float32(np.nan).tobytes()
        bad.write_bytes(bytes(b))
    elif how == "positive":
        b = bytearray(src)
        off = 20 + 4 * N * n_ctx + 4  # row 0's min_log_prob
        b[off:off + 4] = np.float32(3.0).tobytes()
        bad.write_bytes(bytes(b))
    elif how == "tokens differ":
        b = bytearray(src)
        t0 = int(np.frombuffer(src, "<i4", 1, 20 + 4 * 5)[0])
        b[40:44] = np.int32((t0 + 1) % V).tobytes()
        bad.write_bytes(bytes(b))
    elif how == "vocab differs":
        m = _make(tmp_path / "v", N=N, n_ctx=n_ctx, V=V + 1) if (tmp_path / "v").mkdir() is None else None
        bad = m["files"]["near"]
    elif how == "ctx differs":
        m = _make(tmp_path / "c", N=N, n_ctx=n_ctx + 2, V=V) if (tmp_path / "c").mkdir() is None else None
        bad = m["files"]["near"]
    man = tmp_path / "bad.json"
    if how == "token out of range":  # in the target file (a draft's tokens must equal the target's)
        tgt, bad = str(bad), tgt
    man.write_text(json.dumps({"target": tgt, "drafts": {"x": str(bad)}}))
    return str(man), str(bad)


def tgt_of(man):
    return json.load(open(man))["target"]


HOSTILE = [
    ("truncated", "truncated"), ("trailing", "trailing bytes"), ("short header", "truncated header"),
    ("magic", "magic"), ("huge vocab", "n_vocab 1073741824 is out of range"), ("huge vocab ok range", "truncated"),
    ("huge ctx", "truncated"), ("negative chunks", "n_chunk -1"), ("token out of range", "outside the vocabulary"),
    ("nan", "scale is not finite"), ("positive", "min_log_prob is positive"), ("tokens differ", "same text"),
    ("vocab differs", "n_vocab 34 differs"), ("ctx differs", "n_ctx 18 differs"),
]


@pytest.mark.parametrize("how,needle", HOSTILE)
def test_hostile_files(tmp_path, made, how, needle):
    man, bad = _hostile(tmp_path, made, how)
    if how in ("nan", "positive"):  # found when the rows are read: the alpha pass
        r = run("inspect", man)
    else:
        with pytest.raises(DumpFormatError, match=needle) as ei:
            open_dump(man)
        assert (tgt_of(man) if how == "token out of range" else bad) in str(ei.value)
        r = run("inspect", man)
    assert r.exit_code == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr, r.stderr
    r = run("simulate", man, "--k", "1,2")
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"), ('{"target": 3}', "'target' must be"), ('{"tgt": "a"}', "unknown key"),
    ('{"target": "t.kld", "drafts": {"a__b": "near.kld"}}', "draft name"),
    ('{"target": "missing.kld"}', "no such file"), ("[1, 2]", None),
    # issue #30, item 17: a NUL byte gave "ValueError: embedded null byte", exit 1
    ('{"target": "t\\u0000.kld"}', "'target' = 't\\x00.kld' holds a NUL byte"),
    ('{"target": "t.kld", "drafts": {"near": "near.kld\\u0000"}}', "'drafts'['near'] = 'near.kld\\x00' holds a NUL"),
])
def test_bad_manifests(made, tmp_path, text, needle):
    import os
    import shutil

    for f in ("t.kld", "near.kld"):
        shutil.copy(os.path.join(os.path.dirname(made["man"]), f), tmp_path / f)
    man = tmp_path / "m.json"
    man.write_text(text)
    r = run("inspect", man)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    if needle:
        assert needle in r.stderr, r.stderr


def test_a_nul_byte_in_a_base_file_path_is_a_format_error():
    """Issue #30, item 17, the library side: a path that no file system takes is named, not a ValueError."""
    with pytest.raises(DumpFormatError, match="NUL byte"):
        LlamaCppDump("t\x00.kld")


@pytest.mark.parametrize("how", ["nan", "positive"])
def test_row_header_errors_print_plain_numbers(tmp_path, made, how):
    """Issue #30, item 23: llama.cpp row errors printed numpy's repr, `scale=np.float32(nan)`."""
    man, _ = _hostile(tmp_path, made, how)
    r = run("inspect", man)
    assert r.exit_code == 2, r.stderr
    assert "np.float32" not in r.stderr and "float32(" not in r.stderr, r.stderr
    assert ("scale=nan" if how == "nan" else "min_log_prob=3.0)") in r.stderr, r.stderr


def test_scheduler_refused_and_not_a_dump(made, tmp_path):
    with pytest.raises(InvalidInput, match="without a scheduler"):
        open_dump(made["man"], client=object())
    p = save_dump(tmp_path / "x.npz", np.zeros((1, 2, 3)), np.zeros((1, 2, 3)))
    with open_dump(p) as d:
        assert isinstance(d, Dump)  # ordinary dumps are untouched by the routing
