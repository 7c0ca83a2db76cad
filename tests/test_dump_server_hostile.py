"""``fastspec dump-server`` against hostile servers and hostile arguments (issue 30, items 5-14, 19, 23, 24).

Each test names its item.  The fake servers are tests/test_server_dump.py's, with a hook that rewrites the answers
of one prompt (prompt 1) so that prompt 0 is staged before the bad answer arrives.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from fastspec.errors import InvalidInput
from fastspec.io import load_dump
from fastspec.io.servers import ServerError
from fastspec.server_dump import dump_from_servers, staging_dir
from test_server_dump import PROMPTS, Fake, _cli, _one_line_error, _prompts_file, started_servers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Hostile(Fake):
    """A Fake whose answers go through ``hook(path, body, (status, obj)) -> None | replacement``."""

    def __init__(self, hook=None, **kw):
        super().__init__(**kw)
        self.hook = hook

    def handle(self, method, path, body):
        r = super().handle(method, path, body)
        if self.hook is not None and isinstance(r, tuple) and r[0] == 200:
            new = self.hook(path, body, r[1])
            if new is not None:
                return new
        return r


@pytest.fixture
def hostile():
    yield from started_servers(Hostile)


def _is_prompt(body, p):
    seq = (body or {}).get("prompt") or (body or {}).get("input_ids") or []
    return list(seq[:len(p)]) == list(p)


def _scoring(body):
    return "prompt_logprobs" in body or (body.get("sampling_params") or {}).get("max_new_tokens") == 0


def _on_prompt1_score(fn):
    """A hook applying ``fn(choice)`` to the vLLM score answer of prompt 1 (its last position's entry)."""
    def hook(path, body, obj):
        if path == "/v1/completions" and _is_prompt(body, PROMPTS[1]) and _scoring(body):
            out = json.loads(json.dumps(obj))
            ch = out["choices"][0]
            fn(ch, body)
            return 200, out
        return None
    return hook


def _last_entry(ch):
    return ch["prompt_logprobs"][-1]


def _run(url, tmp_path, *extra, prompts=PROMPTS[:3]):
    out = tmp_path / "x.npz"
    r = _cli("dump-server", "--target", url, "--prompts", _prompts_file(tmp_path, prompts), "--out", out,
             "--max-new-tokens", 3, "--top-logprobs", 4, "--concurrency", 1, "--retries", 0, *extra)
    return r, out


# ---------------------------------------------------------------------------------------- 7, 9: answers checked
def _mass_over_1(ch, _b):
    for v in _last_entry(ch).values():
        v["logprob"] = math.log(0.6)


def _negative_id(ch, _b):
    _last_entry(ch)["-3"] = {"logprob": -5.0, "rank": 3}


def _padded_beside(ch, _b):
    e = _last_entry(ch)
    k = next(iter(e))
    e["0" + k] = dict(e[k])


def _space_padded(ch, _b):
    e = _last_entry(ch)
    k = next(k for k, v in e.items() if v.get("rank", 99) > 1 or len(e) == 1)
    e[" " + k] = e.pop(k)


def _logprob_false(ch, _b):
    next(iter(_last_entry(ch).values()))["logprob"] = False


def _sampled_minus_inf(ch, body):
    _last_entry(ch)[str(body["prompt"][-1])]["logprob"] = -math.inf


def _id_beyond_int32(ch, _b):
    _last_entry(ch)["4294967296"] = {"logprob": -30.0, "rank": 2}


BAD_SCORES = {"probabilities sum over 1": (_mass_over_1, "sum to"),
              "negative id": (_negative_id, "not a token id"),
              "'07' beside '7'": (_padded_beside, "not a token id"),
              "' 5'": (_space_padded, "not a token id"),
              "logprob false": (_logprob_false, "not a number"),
              "-inf sampled token": (_sampled_minus_inf, "finite"),
              "id beyond int32": (_id_beyond_int32, "not a token id")}


@pytest.mark.parametrize("case", list(BAD_SCORES))
def test_item7_9_bad_score_answers_exit_1_naming_server_and_prompt_and_stage_nothing(hostile, tmp_path, case):
    fn, message = BAD_SCORES[case]
    _f, url = hostile(_on_prompt1_score(fn), name="toy")
    r, out = _run(url, tmp_path)
    line = _one_line_error(r, 1)
    assert message in line and f"target server {url}" in line and "prompt 1" in line, line
    staged = os.listdir(staging_dir(str(out)))
    assert "prompt-000000.json" in staged and "prompt-000001.json" not in staged
    assert not out.exists()


def _generate_hook(replace):
    def hook(path, body, obj):
        if path == "/v1/completions" and _is_prompt(body, PROMPTS[1]) and not _scoring(body):
            return 200, replace(obj)
        return None
    return hook


@pytest.mark.parametrize("replace, message", [
    (lambda o: dict(o, choices=[dict(o["choices"][0], token_ids=[-1, 5, 6])]), "not a token id"),
    (lambda o: dict(o, choices=[dict(o["choices"][0], token_ids=[5, 2 ** 40, 6])]), "not a token id"),
    (lambda o: dict(o, choices=[dict(o["choices"][0], token_ids=[5, True, 6])]), "not a token id"),
    (lambda o: dict(o, choices=["x"]), "no choices"),
    (lambda o: dict(o, choices={"0": 1}), "no choices"),
    (lambda _o: [1, 2], "no choices"),
])
def test_item7_9_bad_continuations_exit_1(hostile, tmp_path, replace, message):
    _f, url = hostile(_generate_hook(replace), name="toy")
    r, out = _run(url, tmp_path)
    line = _one_line_error(r, 1)
    assert message in line and url in line and "prompt 1" in line, line
    assert "prompt-000001.json" not in os.listdir(staging_dir(str(out)))


def test_item7_sglang_duplicate_and_bad_entries(hostile, tmp_path):
    def hook(path, body, obj):
        if path == "/generate" and _is_prompt(body, PROMPTS[1]) and _scoring(body):
            top = obj["meta_info"]["input_top_logprobs"]
            top[-1] = [top[-1][0], top[-1][0]] + top[-1][2:]
        return None

    _f, url = hostile(hook, kind="sglang", name="toy")
    r, _out = _run(url, tmp_path, "--engine", "sglang")
    line = _one_line_error(r, 1)
    assert "listed twice" in line and url in line and "prompt 1" in line


# ---------------------------------------------------------------------------------------- 8, 19: the resume
def _partial_run(hostile, tmp_path):
    """A run that staged prompt 0 and failed on prompt 1 (HTTP 400); returns (healthy server url, out)."""
    f, url = hostile(None, name="toy")
    f.faults = lambda path, body, _n: (400, {"error": {"message": "no"}}) \
        if path == "/v1/completions" and _is_prompt(body, PROMPTS[1]) else None
    r, out = _run(url, tmp_path)
    _one_line_error(r, 1)
    f.faults = None
    return url, out


@pytest.mark.parametrize("poison, why", [
    (lambda rec: rec["models"]["target"]["logprobs"][0].__setitem__(0, 0.0) or
     rec["models"]["target"]["logprobs"][0].__setitem__(1, 0.0), "sum to"),   # a bad answer staged by 7aba47f
    (lambda rec: rec.__setitem__("continuation", [-1] + rec["continuation"][1:]), "not a token id"),
    (lambda rec: rec["models"].pop("target"), "models"),
    ("{not json", "not valid JSON"),                                           # 19: a corrupt staged file
    ("", "not valid JSON"),
    ('{"i": 0}', "no continuation"),
    ("[" * 100000, "RecursionError"),
    (b"\xff\xfe", "UnicodeDecodeError"),
])
def test_item8_19_an_unusable_staged_prompt_is_fetched_again_and_named(hostile, tmp_path, poison, why):
    url, out = _partial_run(hostile, tmp_path)
    path = os.path.join(staging_dir(str(out)), "prompt-000000.json")
    good = json.loads(open(path, encoding="utf-8").read())
    if callable(poison):
        rec = json.loads(json.dumps(good))
        poison(rec)
        text = json.dumps(rec).encode()
    else:
        text = poison if isinstance(poison, bytes) else poison.encode()
    with open(path, "wb") as fh:
        fh.write(text)
    others = [n for n in os.listdir(staging_dir(str(out))) if n.startswith("prompt-") and not n.endswith("00.json")]
    r, _ = _run(url, tmp_path, "--json")
    assert r.exit_code == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if "staged prompt file" in ln]
    assert len(warn) == 1 and path in warn[0] and why in warn[0] and "fetched again" in warn[0], r.stderr
    assert json.loads(r.stdout)["resumed"] == len(others)   # prompt 2 may have finished while 1 failed
    with load_dump(str(out)) as d:
        d.validate()
    assert list(np.load(out)["tokens"][0]) == good["continuation"]


def test_item8_a_staged_prompt_that_cannot_be_removed_names_the_command(hostile, tmp_path):
    url, out = _partial_run(hostile, tmp_path)
    path = os.path.join(staging_dir(str(out)), "prompt-000000.json")
    os.unlink(path)
    os.makedirs(os.path.join(path, "sub"))
    r, _ = _run(url, tmp_path)
    line = _one_line_error(r, 2)
    assert path in line and f"rm -r {path}" in line


# ---------------------------------------------------------------------------------------- 5: the deadline
def test_item5_a_dripping_server_is_held_to_the_deadline(hostile, tmp_path):
    body = json.dumps({"object": "list", "data": [{"id": "toy"}], "pad": "x" * 2000}).encode()
    f, url = hostile(None, name="toy")
    f.faults = lambda path, _b, _n: ("raw", 200, body, {"drip": 0.05}) if path == "/v1/models" else None
    result = {}

    def go():
        t0 = time.monotonic()
        try:
            dump_from_servers(tmp_path / "d.npz", url, {}, PROMPTS[:1], max_new_tokens=2, top_logprobs=2,
                              timeout=1.0, retries=0)
        except ServerError as exc:
            result["error"] = str(exc)
        result["s"] = time.monotonic() - t0

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(15)   # 7aba47f: one byte per 0.05 s of a 2 kB body, each read under the 1 s timeout: ~100 s
    assert not t.is_alive(), "the dripping server held the request past its deadline"
    assert result["s"] < 5 and "deadline" in result["error"] and url in result["error"], result


def test_item5_the_cli_deadline_holds_with_dripped_headers_too(tmp_path):
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                srv.settimeout(0.2)
                c, _ = srv.accept()
            except OSError:
                continue
            try:
                for b in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"a" * 2000:
                    if stop.is_set():
                        break
                    c.sendall(bytes([b]))
                    time.sleep(0.05)
            except OSError:
                pass
            finally:
                c.close()

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        t0 = time.monotonic()
        r, _ = _run(url, tmp_path, "--timeout", 1)
        assert time.monotonic() - t0 < 10
        line = _one_line_error(r, 1)
        assert "deadline" in line and url in line
    finally:
        stop.set()
        srv.close()


# ---------------------------------------------------------------------------------------- 24: bounded bodies
@pytest.mark.parametrize("length", ["declared", "undeclared"])
def test_item24_an_answer_over_its_bound_is_refused_unread(hostile, tmp_path, length):
    def hook(path, body, obj):
        if path == "/v1/completions" and _scoring(body):
            data = json.dumps(dict(obj, pad="x" * (8 << 20))).encode()
            return "raw", 200, data, {"length": len(data) if length == "declared" else None}
        return None

    from fastspec.io.servers.client import body_bound

    _f, url = hostile(hook, name="toy")
    r, out = _run(url, tmp_path)
    line = _one_line_error(r, 1)
    bound = body_bound((len(PROMPTS[0]) + 3) * (4 + 3))   # the sequence's positions times (k + 3) entries
    assert f"more than the {bound} bytes" in line and f"target server {url}" in line and "prompt 0" in line
    assert not out.exists()


def test_item24_the_bound_scales_with_top_logprobs_and_tokens():
    from fastspec.io.servers.client import body_bound

    assert body_bound(10) < body_bound(1000) and body_bound(0) == 1 << 20
    assert body_bound(100 * (20 + 3)) - body_bound(0) == 256 * 2300


# ---------------------------------------------------------------------------------------- 6: Ctrl-C
def _ctrl_c_as_from_a_shell():
    """In the child: Ctrl-C as an interactive shell leaves it (default).  A process inherits an ignored SIGINT, and
    Python then never turns it into KeyboardInterrupt: a library loaded by an earlier test in the same worker may
    have left it ignored, and the command under test then never saw the Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.subprocess
def test_item6_ctrl_c_stops_requests_and_retries_at_once(hostile, tmp_path):
    def hook(path, body, _obj):
        if path == "/v1/completions" and _is_prompt(body, PROMPTS[1]):
            return 503, {"error": {"message": "busy"}}            # retried, with back-off, again and again
        if path == "/v1/completions" and _is_prompt(body, PROMPTS[2]):
            return "raw", 200, b'{"x": ' + b" " * 100000, {"drip": 0.5}   # an answer that never ends
        return None

    _f, url = hostile(hook, name="toy")
    out = tmp_path / "c.npz"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "fastspec_cli", "dump-server", "--target", url, "--prompts",
                             str(_prompts_file(tmp_path, PROMPTS[:3])), "--out", str(out), "--max-new-tokens", "2",
                             "--top-logprobs", "2", "--concurrency", "3", "--retries", "100"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            preexec_fn=_ctrl_c_as_from_a_shell)
    try:
        staged = os.path.join(staging_dir(str(out)), "prompt-000000.json")
        deadline = time.monotonic() + 120
        while not os.path.exists(staged) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert os.path.exists(staged), proc.communicate(timeout=5)
        time.sleep(1.0)   # prompt 1 in its back-off, prompt 2 in a dripping read
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        try:
            _stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("dump-server still running 10 s after SIGINT")
        assert time.monotonic() - t0 < 5
        assert proc.returncode == 130   # 128 + SIGINT, as typer exits on every other command's Ctrl-C
        lines = [ln for ln in stderr.splitlines() if ln.startswith("fastspec: error")]
        assert len(lines) == 1 and lines[0].startswith("fastspec: error: interrupted; 1 finished prompt staged in ")\
            and "rerun the same command" in lines[0], stderr
        assert "Traceback" not in stderr
        assert sorted(n for n in os.listdir(staging_dir(str(out))) if n.startswith("prompt-")) == \
            ["prompt-000000.json"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_item6_the_stop_event_ends_a_back_off_and_a_request_in_flight(hostile):
    from fastspec.io.servers import HttpClient, Stopped

    f, url = hostile(None, name="toy")
    f.faults = lambda path, _b, _n: ("raw", 200, b" " * 100000, {"drip": 0.2}) if path == "/version" else \
        (503, {"error": {"message": "busy"}})
    stop = threading.Event()
    c = HttpClient("target", url, retries=100, backoff=20, timeout=600, stop=stop)
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        c.get("/v1/models")          # 503, then a 20 s back-off
    with pytest.raises(Stopped):
        c.get("/version")            # already stopped: no new attempt
    assert time.monotonic() - t0 < 3
    stop2 = threading.Event()
    c2 = HttpClient("target", url, retries=0, timeout=600, stop=stop2)
    threading.Timer(0.5, stop2.set).start()
    t0 = time.monotonic()
    with pytest.raises(Stopped):
        c2.get("/version")           # a dripping answer, cut off
    assert time.monotonic() - t0 < 3


# ---------------------------------------------------------------------------------------- 10-14: arguments
@pytest.mark.parametrize("value", ["inf", "1e308", "nan", "0", "-1", "86401"])
def test_item10_timeout_is_bounded(hostile, tmp_path, value):
    _f, url = hostile(None, name="toy")
    line = _one_line_error(_run(url, tmp_path, "--timeout", value)[0], 2)
    assert "--timeout" in line and "86400" in line
    with pytest.raises(InvalidInput, match="timeout"):
        dump_from_servers(tmp_path / "y.npz", url, {}, PROMPTS, timeout=float(value))


def test_item10_a_day_is_accepted(hostile, tmp_path):
    _f, url = hostile(None, name="toy")
    r, out = _run(url, tmp_path, "--timeout", 86400)
    assert r.exit_code == 0, r.stderr


@pytest.mark.parametrize("url", ["http://[::1", "http://a b", "http://a\tb:80", "http://host:80x", "http://",
                                 "http://user:pw@host:80", "http://host:80/?q=1", "http://a\x00b"])
def test_item11_malformed_urls_exit_2(tmp_path, url):
    pf = _prompts_file(tmp_path)
    line = _one_line_error(_cli("dump-server", "--target", url, "--prompts", pf, "--out", tmp_path / "x.npz"), 2)
    assert "--target" in line
    line = _one_line_error(_cli("dump-server", "--target", "http://127.0.0.1:1", "--draft", f"d={url}",
                                "--prompts", pf, "--out", tmp_path / "x.npz"), 2)
    assert "--draft" in line


def test_item11_ipv6_and_paths_are_still_urls():
    from fastspec.io.servers import check_url

    assert check_url("http://[::1]:8000/") == "http://[::1]:8000"
    assert check_url(" https://example.org/v1/proxy/ ") == "https://example.org/v1/proxy"


def _prompt_cases(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text("[" * 200000 + "\n")
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt_token_ids": [1, 2]}\n\xff\xfe\n')
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)
    nan = tmp_path / "nan.jsonl"
    nan.write_text('{"prompt_token_ids": [1, NaN]}\n')
    return {deep: "not valid JSON", latin: "not UTF-8", folder: "not a regular file", fifo: "not a regular file",
            nan: "not valid JSON", tmp_path / "missing.jsonl": "no such file"}


def test_item12_prompts_are_read_by_the_token_file_reader(tmp_path):
    for path, message in _prompt_cases(tmp_path).items():
        r = _cli("dump-server", "--target", "http://127.0.0.1:1", "--prompts", path, "--out", tmp_path / "x.npz")
        line = _one_line_error(r, 2)
        assert "--prompts" in line and message in line and str(path) in line, (path, line)


@pytest.mark.parametrize("seed", [-1, 2 ** 63, 2 ** 64 - 1])
def test_item13_seed_is_in_0_2_63(hostile, tmp_path, seed):
    _f, url = hostile(None, name="toy")
    assert "--seed" in _one_line_error(_run(url, tmp_path, "--seed", seed)[0], 2)
    with pytest.raises(InvalidInput, match="seed"):
        dump_from_servers(tmp_path / "y.npz", url, {}, PROMPTS, seed=seed)


def test_item13_the_largest_seed_runs(hostile, tmp_path):
    _f, url = hostile(None, name="toy")
    r, _ = _run(url, tmp_path, "--seed", 2 ** 63 - 1)
    assert r.exit_code == 0, r.stderr


def test_item14_a_repeated_model_role_is_refused(hostile, tmp_path):
    _f, url = hostile(None, name="toy")
    line = _one_line_error(_run(url, tmp_path, "--model", "target=a", "--model", "target=b")[0], 2)
    assert "--model target" in line and "twice" in line


# ---------------------------------------------------------------------------------------- 23: paths as typed
def test_item23_staging_and_out_paths_print_as_typed(hostile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    f, url = hostile(None, name="toy")
    f.faults = lambda path, body, _n: (400, {"error": {"message": "no"}}) \
        if path == "/v1/completions" and _is_prompt(body, PROMPTS[1]) else None
    pf = _prompts_file(tmp_path)
    common = ["--target", url, "--prompts", "prompts.jsonl", "--max-new-tokens", 2, "--top-logprobs", 2,
              "--concurrency", 1, "--retries", 0]
    _one_line_error(_cli("dump-server", *common, "--out", "rel.npz"), 1)
    assert staging_dir("rel.npz") == ".fastspec-servers-rel.npz.partial" and os.path.isdir(staging_dir("rel.npz"))
    line = _one_line_error(_cli("dump-server", *common, "--out", "rel.npz", "--seed", 3), 2)
    assert "unfinished run" in line and " .fastspec-servers-rel.npz.partial " in line and str(tmp_path) not in line
    line = _one_line_error(_cli("dump-server", *common, "--out", "nodir/x.npz"), 2)
    assert "directory nodir does not exist" in line and str(tmp_path) not in line
    assert pf.exists()


def test_item6_an_interrupt_is_raised_at_a_safe_point_not_inside_the_pool_wait():
    """Ctrl-C during the wait only marks the interrupt; the loop raises it itself.  Raised asynchronously it
    could land while ``concurrent.futures.wait`` holds the futures' locks, and a worker would hang on one."""
    from fastspec.server_dump import _DeferredInterrupt

    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)   # as Python sets it up (see above)
    try:
        with _DeferredInterrupt() as hit:
            assert not hit
            os.kill(os.getpid(), signal.SIGINT)   # delivered to the main thread: no KeyboardInterrupt here
            time.sleep(0.05)
            assert hit
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        with pytest.raises(KeyboardInterrupt):   # outside it, Ctrl-C is Python's again
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGINT, inherited)
