"""Fuzz ``dump-server`` against fake servers that mutate their answers at random (issue 30, "Also").

A seeded generator picks, per case, the engine (vLLM or SGLang), the drafts, the prompts and the arguments, and the
servers rewrite some of their answers: values (ids, logprobs, names: out of range, of the wrong type, NaN, +-inf,
padded keys), keys (renamed, dropped), lengths (lists cut or repeated), the HTTP status, the bytes themselves (a
drip slower than the deadline, a body cut short, garbage, a closed connection).  Every case must end like the
command line's contract: exit 0 with a dump that ``load_dump`` opens and validates, or one error with exit 1 (a
server failed) or 2 (bad input: e.g. servers that tokenize differently) -- never another exception (a traceback on
the command line), never a run past its deadline.

Most cases drive :func:`fastspec.io.servers.dump_from_servers` in-process (what ``fastspec dump-server`` calls),
mapping exceptions as the CLI's error boundary does; a few run the real CLI in a subprocess.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading
import time
import warnings

import numpy as np
import pytest

from fastspec.errors import FastspecError, InvalidInput, InvalidType
from fastspec.io import load_dump
from fastspec.params import SamplingParams
from fastspec.server_dump import dump_from_servers
from test_server_dump import Fake

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEED = 20261203
TIMEOUT = 0.3          # seconds: the deadline of every request in the fuzz
CASE_LIMIT_S = 8.0     # no case may run longer (at most 2 attempts of a few mutated requests, each <= TIMEOUT)

_VALUES = [-1, 0, 1, 7, 63, 64, 2 ** 31, 2 ** 40, 2 ** 70, -2 ** 63, 0.5, -0.5, 1.5, -1e-9, 1e-3, 2e-3, -1e308,
           1e308, float("nan"), float("inf"), float("-inf"), True, False, None, "", "x", "07", " 5", "-3", "5",
           [], {}, [1, 2], [[0.0, 1, None]], {"a": 1}, {"0": {"logprob": 0.0}}, "y" * 1000]
_KEYS = ["07", " 5", "-3", "x", "4294967296", "", "5", "rank", "logprob", "choices", "prompt_logprobs",
         "token_ids", "meta_info", "data", "id"]


#: how often each kind of mutation is drawn (a drip costs a whole deadline: rarer)
_KINDS = {"value": 0.30, "key": 0.10, "drop": 0.10, "length": 0.10, "type": 0.08, "status": 0.10, "cut": 0.08,
          "garbage": 0.06, "close": 0.05, "drip": 0.03}


class Mutating(Fake):
    """A Fake that rewrites its answers with probability ``p`` (a seeded generator, shared by its threads)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rng = None
        self.p = 0.0
        self.lock = threading.Lock()

    def handle(self, method, path, body):
        r = super().handle(method, path, body)
        with self.lock:
            if self.rng is None or self.rng.random() >= self.p:
                return r
            return _mutate(self.rng, r)


def _nodes(obj, out, parent=None, key=None, depth=0):
    """(parent, key) of every node of a JSON tree (lists and dicts), breadth limited."""
    if parent is not None:
        out.append((parent, key))
    if depth > 8 or len(out) > 4000:
        return out
    if isinstance(obj, dict):
        for k in list(obj):
            _nodes(obj[k], out, obj, k, depth + 1)
    elif isinstance(obj, list):
        for i in range(len(obj)):
            _nodes(obj[i], out, obj, i, depth + 1)
    return out


def _mutate(rng, r):
    if not (isinstance(r, tuple) and len(r) == 2):
        return r
    status, obj = r
    kind = rng.choice(list(_KINDS), p=list(_KINDS.values()))
    if kind == "status":
        return int(rng.choice([400, 404, 422, 429, 500, 503, 302])), {"error": {"message": "fuzzed"}}
    if kind == "close":
        return "close"
    data = json.dumps(obj).encode()
    if kind == "drip":
        return "raw", 200, data, {"drip": float(rng.choice([0.002, 0.05]))}
    if kind == "cut":
        cut = int(rng.integers(0, max(1, len(data))))
        return "raw", 200, data, {"cut": cut, "length": len(data) if rng.random() < 0.5 else None}
    if kind == "garbage":
        return "raw", int(rng.choice([200, 500])), bytes(rng.integers(0, 256, int(rng.integers(0, 64)),
                                                                      dtype=np.uint8)), {}
    if kind == "type":
        return status, _VALUES[int(rng.integers(len(_VALUES)))]
    obj = json.loads(data)
    nodes = _nodes(obj, [])
    if not nodes:
        return status, obj
    parent, key = nodes[int(rng.integers(len(nodes)))]
    if kind == "value":
        parent[key] = _VALUES[int(rng.integers(len(_VALUES)))]
    elif kind == "key" and isinstance(parent, dict):
        parent[_KEYS[int(rng.integers(len(_KEYS)))]] = parent.pop(key)
    elif kind == "drop":
        parent.pop(key) if isinstance(parent, dict) else parent.pop(key)
    elif kind == "length":
        target = parent[key]
        if isinstance(target, list) and target:
            parent[key] = target[:int(rng.integers(len(target)))] if rng.random() < 0.5 else target + target[:2]
        elif isinstance(parent, list):
            parent.append(parent[key])
    return status, obj


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    made = {}
    for kind in ("vllm", "sglang"):
        t = Mutating(kind=kind, name="toy")
        d = Mutating(kind=kind, name="toy-d", model_seed=3)
        made[kind] = (t, t.start(), d, d.start())
    # one clean run per engine first: the tight-bounds report compiles its kernels once (not a case's time)
    warm = tmp_path_factory.mktemp("warm")
    for kind, (_t, turl, _d, durl) in made.items():
        dump_from_servers(warm / f"{kind}.npz", turl, {"d": durl}, [[1, 2, 3]], engine=kind, max_new_tokens=2,
                          top_logprobs=2)
    yield made
    for t, _tu, d, _du in made.values():
        t.stop()
        d.stop()


@pytest.fixture
def workdir(tmp_path):
    """Where the cases write: memory (/dev/shm) where there is one -- each case fsyncs its staged files, which on
    a disk costs more than the rest of the case -- else the test's temporary directory."""
    import shutil
    import tempfile

    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        d = tempfile.mkdtemp(prefix="fastspec-fuzz-", dir=shm)
        try:
            yield pathlib.Path(d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path


def _case(rng):
    """The arguments of one case."""
    engine = "vllm" if rng.random() < 0.75 else "sglang"
    n = int(rng.integers(1, 3))
    prompts = [[int(x) for x in rng.integers(0, 64, int(rng.integers(1, 5)))] for _ in range(n)]
    temperature = float(rng.choice([0.0, 1.0]))
    return engine, dict(prompts=prompts, max_new_tokens=int(rng.integers(1, 4)), top_logprobs=int(rng.integers(1, 5)),
                        ignore_eos=bool(rng.random() < 0.5), seed=int(rng.integers(0, 2 ** 31)),
                        sampling=SamplingParams(temperature=temperature), concurrency=int(rng.integers(1, 3)),
                        retries=int(rng.integers(0, 2)), timeout=TIMEOUT, backoff=0.001), bool(rng.random() < 0.6)


def _arm(servers, engine, rng, p):
    t, turl, d, durl = servers[engine]
    for f in (t, d):
        f.rng = np.random.default_rng(rng.integers(2 ** 63))
        f.p = p
    return turl, durl


def _check_dump(out):
    with load_dump(str(out)) as d:
        d.validate()
        info = d.describe()
        assert info["kind"] == "sparse"


def _run_in_process(servers, tmp_path, case: int) -> int:
    rng = np.random.default_rng([SEED, case])
    engine, kw, with_draft = _case(rng)
    p = float(rng.choice([0.05, 0.15, 0.3]))
    turl, durl = _arm(servers, engine, rng, p)
    out = tmp_path / f"case{case}.npz"
    t0 = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dump_from_servers(out, turl, {"d": durl} if with_draft else {}, engine=engine, **kw)
        code = 0
    except (InvalidInput, InvalidType) as exc:     # the CLI: one line, exit 2
        code, msg = 2, str(exc)
    except FastspecError as exc:                   # ServerError: one line, exit 1
        code, msg = 1, str(exc)
    elapsed = time.monotonic() - t0
    assert elapsed < CASE_LIMIT_S, f"case {case}: {elapsed:.1f} s"
    if code == 0:
        _check_dump(out)
    else:
        assert msg.strip(), f"case {case}: an empty message"
        assert not out.exists()
        assert msg.isprintable(), f"case {case}: {msg!r}"
    for leftover in tmp_path.iterdir():
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    return code


def _fuzz(servers, tmp_path, cases):
    codes = {0: 0, 1: 0, 2: 0}
    for case in cases:
        codes[_run_in_process(servers, tmp_path, case)] += 1
    return codes


def test_fuzz_dump_server_quick(servers, workdir):
    codes = _fuzz(servers, workdir, range(60))
    assert codes[0] and codes[1], codes


@pytest.mark.slow
def test_fuzz_dump_server_1000_cases(servers, workdir):
    t0 = time.monotonic()
    codes = _fuzz(servers, workdir, range(1000, 2000))
    assert sum(codes.values()) == 1000
    assert codes[0] > 100 and codes[1] > 100, codes     # the mutations both pass and fail
    print(f"fuzz: {codes} in {time.monotonic() - t0:.1f} s")


@pytest.mark.subprocess
def test_fuzz_dump_server_cli(servers, tmp_path):
    """The real command line on a few fuzzed cases: exit 0 and a valid dump, or one error line with exit 1 or 2,
    never a traceback."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    seen = set()
    for case in range(5000, 5008):
        rng = np.random.default_rng([SEED, case])
        engine, kw, with_draft = _case(rng)
        turl, durl = _arm(servers, engine, rng, 0.3)
        pf = tmp_path / f"p{case}.jsonl"
        pf.write_text("".join(json.dumps({"prompt_token_ids": x}) + "\n" for x in kw["prompts"]))
        out = tmp_path / f"cli{case}.npz"
        args = [sys.executable, "-m", "fastspec_cli", "dump-server", "--engine", engine, "--target", turl,
                "--prompts", str(pf), "--out", str(out), "--max-new-tokens", str(kw["max_new_tokens"]),
                "--top-logprobs", str(kw["top_logprobs"]), "--seed", str(kw["seed"]), "--temperature",
                str(kw["sampling"].temperature), "--concurrency", str(kw["concurrency"]), "--retries",
                str(kw["retries"]), "--timeout", str(TIMEOUT)] + (["--draft", f"d={durl}"] if with_draft else []) \
            + (["--ignore-eos"] if kw["ignore_eos"] else [])
        r = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode in (0, 1, 2), (r.returncode, r.stderr)
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith("fastspec: error")]
        if r.returncode == 0:
            assert not errors
            _check_dump(out)
        else:
            assert len(errors) == 1, r.stderr
        seen.add(r.returncode)
    assert 0 in seen or 1 in seen
