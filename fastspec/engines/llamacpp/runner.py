"""llama.cpp's ``llama-server``, started and stopped by fastspec on a free loopback port.

:func:`find_binary` finds ``llama-server`` (``binary=``, else ``$FASTSPEC_LLAMACPP_BIN``: the binary or its
directory, else ``~/.cache/fastspec/llama.cpp-11434/bin`` as ``scripts/llamacpp_build.sh`` leaves it).
:class:`Server` (a context manager) starts ``llama-server -m TARGET [-md DRAFT --spec-type draft-simple ...]`` on
127.0.0.1 with ``-t``/``-td`` threads and one slot, waits until ``/health`` answers 200 and kills the process on
exit (also when the caller fails).  :meth:`Server.complete` posts one ``/completion`` request (token ids in, token
ids out, ``cache_prompt``) and returns llama.cpp's answer.

Every failure is :class:`~fastspec.engines.errors.EngineError` with one line: a missing binary, a server that exits
while loading (with its last log line: a GGUF llama.cpp refuses, a flag it does not have), one that drops its
``-md`` draft (a draft whose vocabulary llama.cpp refuses: it logs the error and serves without speculation), one
that dies or stops answering mid-run, an answer without ``timings``.  Only the standard
library is used (``http.client``); nothing is written to disk.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from typing import Mapping, Sequence

from ..errors import EngineError

__all__ = ["DEFAULT_BIN", "BUILD_HINT", "find_binary", "free_port", "Server", "server_args"]

DEFAULT_BIN = os.path.join(os.path.expanduser("~"), ".cache", "fastspec", "llama.cpp-11434", "bin")
BUILD_HINT = ("build it with scripts/llamacpp_build.sh and set FASTSPEC_LLAMACPP_BIN to the directory it prints "
              "(or pass --llamacpp-bin)")


#: what llama-server logs when it drops its draft and serves without speculation (server-context.cpp, load_model)
_NO_SPECULATION = "failed to initialize speculative decoding context"


def find_binary(binary: str | None = None, tool: str = "llama-server") -> str:
    """The path of llama.cpp's ``tool``: ``binary`` (the file or its directory), else ``$FASTSPEC_LLAMACPP_BIN``,
    else :data:`DEFAULT_BIN`.  EngineError (one line) when it is not an executable file."""
    where = binary or os.environ.get("FASTSPEC_LLAMACPP_BIN") or DEFAULT_BIN
    path = os.path.join(where, tool) if os.path.isdir(where) else where
    if os.path.sep not in path:
        path = shutil.which(path) or path
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise EngineError(f"llamacpp: no {tool} at {path}; {BUILD_HINT}")
    return path


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's choice)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_args(target: str, *, draft: str | None = None, k: int = 3, n_min: int = 0, p_min: float = 0.0,
                draft_sampling: str = "greedy", threads: int = 1, ctx: int = 2048,
                extra: Sequence[str] = ()) -> list:
    """llama-server's arguments after the binary and before ``--host/--port`` (speculation when ``draft``)."""
    args = ["-m", target, "-t", str(threads), "-tb", str(threads), "-c", str(ctx), "-np", "1", "--no-webui"]
    if draft is not None:
        args += ["-md", draft, "-td", str(threads), "-tbd", str(threads), "--spec-type", "draft-simple",
                 "--spec-draft-n-max", str(k), "--spec-draft-n-min", str(n_min), "--spec-draft-p-min", repr(p_min),
                 "--spec-draft-sampling", draft_sampling]
    return args + list(extra)


#: the time and level llama.cpp's log puts before each line ("0.00.004.898 E ")
_STAMP = re.compile(r"^\d+(\.\d+)+ [A-Z] ")


def _last_line(path: str) -> str:
    """The log line that says why llama-server failed: the model loader's reason, else the last error line."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = [ln.strip() for ln in f.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    lines = [_STAMP.sub("", ln) for ln in lines]
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower() or "invalid" in ln.lower()]
    causes = [ln for ln in errors if "error loading model:" in ln]  # the loader's reason, not the exit that follows
    return ((causes or errors or lines or ["no log"])[-1])[:300]


class Server:
    """One llama-server process (module docstring).  ``args``: :func:`server_args`'s list; ``name``: how
    messages call this configuration."""

    def __init__(self, binary: str, args: Sequence[str], *, name: str = "llama-server", timeout_s: float = 300.0,
                 request_timeout_s: float = 600.0):
        self.binary, self.args, self.name = binary, list(args), name
        self.timeout_s, self.request_timeout_s = float(timeout_s), float(request_timeout_s)
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self._log = None

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _fail(self, what: str) -> EngineError:
        line = _last_line(self._log.name) if self._log is not None else "no log"
        return EngineError(f"llamacpp {self.name}: {what} ({line})")

    def start(self) -> None:
        self._log = tempfile.NamedTemporaryFile(prefix="fastspec-llama-server-", suffix=".log", delete=False)
        self.port = free_port()
        env = dict(os.environ)
        bindir = os.path.dirname(os.path.abspath(self.binary))
        env["LD_LIBRARY_PATH"] = bindir + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        try:
            self.proc = subprocess.Popen([self.binary, *self.args, "--host", "127.0.0.1", "--port", str(self.port)],
                                         stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        except OSError as exc:
            self.stop()
            raise EngineError(f"llamacpp {self.name}: cannot start {self.binary} ({exc.strerror})") from None
        deadline = time.monotonic() + self.timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                err = self._fail(f"llama-server exited with status {code} while loading")
                self.stop()
                raise err
            try:
                status, _ = self._request("GET", "/health", None, timeout=5.0)
                if status == 200:
                    self._check_speculation()
                    return
            except (OSError, http.client.HTTPException, ValueError):
                pass
            if time.monotonic() > deadline:
                err = self._fail(f"llama-server did not answer /health within {self.timeout_s:.0f} s")
                self.stop()
                raise err
            time.sleep(0.1)

    def _check_speculation(self) -> None:
        """llama-server that cannot speculate with its ``-md`` draft (a vocabulary it refuses) logs an error and
        serves without speculation: refused here, so no run is measured without its draft.  Read from ``/slots``
        (each slot's ``speculative``), else from the log."""
        if "-md" not in self.args:
            return
        try:
            status, slots = self._request("GET", "/slots", None, timeout=30.0)
            dropped = not any(bool(s.get("speculative")) for s in slots) if status == 200 else None
        except (OSError, http.client.HTTPException, ValueError, TypeError, AttributeError):
            dropped = None
        if dropped is None and self._log is not None:
            with open(self._log.name, "rb") as f:
                dropped = _NO_SPECULATION in f.read().decode("utf-8", "replace")
        if dropped:
            err = self._fail("llama-server runs without the draft")
            self.stop()
            raise err

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=30)
        self.proc = None
        if self._log is not None:
            self._log.close()
            with contextlib.suppress(OSError):
                os.unlink(self._log.name)
            self._log = None

    def _request(self, method: str, path: str, body, *, timeout: float):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, json.loads(data.decode("utf-8")) if data else None
        finally:
            conn.close()

    def complete(self, body: Mapping) -> dict:
        """POST ``/completion`` with ``body``; llama.cpp's JSON answer, which must hold ``timings`` and
        ``tokens``.  EngineError when the server died, did not answer, or answered otherwise."""
        if self.proc is None:
            raise EngineError(f"llamacpp {self.name}: the server is not running")
        try:
            status, ans = self._request("POST", "/completion", dict(body), timeout=self.request_timeout_s)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            try:  # a server that crashed closes the connection a moment before it is reaped
                code = self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                code = None
            what = f"llama-server exited with status {code} mid-run" if code is not None else \
                f"no answer to /completion ({type(exc).__name__})"
            raise self._fail(what) from None
        if status != 200 or not isinstance(ans, dict):
            msg = ans.get("error", {}).get("message") if isinstance(ans, dict) and \
                isinstance(ans.get("error"), dict) else None
            raise EngineError(f"llamacpp {self.name}: /completion answered HTTP {status}"
                              + (f": {str(msg)[:200]}" if msg else ""))
        if not isinstance(ans.get("timings"), dict):
            raise EngineError(f"llamacpp {self.name}: /completion answered without 'timings' (not a llama-server "
                              "of this version?)")
        if not isinstance(ans.get("tokens"), list):
            raise EngineError(f"llamacpp {self.name}: /completion answered without 'tokens'")
        return ans
