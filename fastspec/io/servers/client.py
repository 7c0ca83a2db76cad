"""One HTTP client per server: a deadline per request, bounded bodies, bounded concurrency, retries with back-off,
and a stop event that ends everything in flight.

Standard library only (``http.client``).  ``timeout`` is a deadline for the whole request -- connecting, sending,
the headers and every byte of the body: a server that drips one byte at a time cannot hold a run past it (the
socket's timeout is set to the time left before each read, the deadline is checked after each, and a watchdog
thread shuts the socket down when it passes).  A response body is read in chunks up to a bound the caller gives
(:func:`body_bound`: it scales with the number of token entries the answer may hold), never held whole beyond it.
Transient failures -- connection refused or reset, a deadline passed, HTTP 429 and 5xx -- are retried up to
``retries`` times with back-off ``backoff * 2**attempt`` seconds (capped at 30 s); any other 4xx, a redirect, a
body over the bound or a body that is not JSON is never retried.  When the ``stop`` event is set (an interrupt)
no new attempt starts, a back-off sleep ends at once and a request in flight is cut off (:class:`Stopped`).  Every
failure is a :class:`ServerError` whose one-line message names the server (its role and URL) and the request.
"""
from __future__ import annotations

import errno
import http.client
import json
import math
import os
import re
import selectors
import socket
import ssl
import threading
import time
import urllib.parse

from ...errors import FastspecError, InvalidInput

__all__ = ["ServerError", "Stopped", "HttpClient", "check_url", "check_timeout", "body_bound", "MAX_TIMEOUT_S"]

#: the longest deadline a request may be given (a day); ``inf`` is refused (a deadline must end)
MAX_TIMEOUT_S = 86400.0
#: response-body bound: BODY_SLACK + BYTES_PER_ENTRY * entries, where ``entries`` is the number of token entries
#: (ids, top-k entries, logprobs) the answer may hold.  The widest entry servers send is vLLM's prompt_logprobs
#: entry ``"123456": {"logprob": -1.2345678901234567, "rank": 123456, "decoded_token": "..."}`` (~80 bytes with
#: a short token text); 256 bytes leaves room for escaped token texts.  BODY_SLACK covers the envelope (model name,
#: usage, other fields).  Answers without token entries (model list, version, tokenizer probes) get the slack.
BYTES_PER_ENTRY = 256
BODY_SLACK = 1 << 20
_CHUNK = 1 << 16
_POLL_S = 0.05
_PENDING = {errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EAGAIN}


def body_bound(entries: int) -> int:
    """The most bytes a response body holding ``entries`` token entries may have: BODY_SLACK + 256 * entries."""
    return BODY_SLACK + BYTES_PER_ENTRY * max(0, int(entries))


class ServerError(FastspecError, RuntimeError):
    """A server failed to answer a request usefully (a runtime failure: exit 1 on the command line)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body


class Stopped(ServerError):
    """The run was stopped (an interrupt) before this request could finish."""


_HOST = re.compile(r"[A-Za-z0-9._~%!$&'()*+,;=-]+")


def check_url(url: str, what: str = "server URL") -> str:
    """``url`` without a trailing slash when it is an http(s) URL with a host; InvalidInput otherwise."""
    if not isinstance(url, str):
        raise InvalidInput(f"{what} must be a string, got {type(url).__name__}")
    u = url.strip()
    example = "give an http:// or https:// URL with a host, e.g. http://127.0.0.1:8000"
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in u):
        raise InvalidInput(f"{what} {url!r}: a URL holds no spaces or control characters; {example}")
    try:
        parts = urllib.parse.urlsplit(u)
        host = parts.hostname
    except ValueError as exc:
        raise InvalidInput(f"{what} {url!r} is not a URL ({' '.join(str(exc).split())}); {example}") from None
    if parts.scheme not in ("http", "https") or not host:
        raise InvalidInput(f"{what} {url!r}: {example}")
    if "@" in parts.netloc:
        raise InvalidInput(f"{what} {url!r}: credentials in the URL are not sent; give the host alone, e.g. "
                           "http://127.0.0.1:8000")
    if parts.query or parts.fragment or u.endswith(("?", "#")):
        raise InvalidInput(f"{what} {url!r}: give the server's base URL without a query or fragment")
    if not parts.netloc.startswith("[") and not _HOST.fullmatch(host):
        raise InvalidInput(f"{what} {url!r}: {host!r} is not a host name; {example}")
    try:
        _ = parts.port
    except ValueError:
        raise InvalidInput(f"{what} {url!r}: the port is not a number in [0, 65535]") from None
    return u.rstrip("/")


def check_timeout(timeout, what: str = "timeout") -> float:
    """``timeout`` as a float when it is a number of seconds in (0, MAX_TIMEOUT_S]; InvalidInput otherwise."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidInput(f"{what} = {timeout!r} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    t = float(timeout)
    if not (0 < t <= MAX_TIMEOUT_S):
        raise InvalidInput(f"{what} = {timeout!r} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}] (a deadline "
                           "for each request, a day at most)")
    return t


def _short(text: str, limit: int = 200) -> str:
    """``text`` on one line, unprintable characters as '?', at most ``limit`` characters (then '...')."""
    text = "".join(c if c.isprintable() else "?" for c in " ".join(str(text).split()))
    return text if len(text) <= limit else text[:limit] + "..."


def _error_text(body: bytes) -> str:
    """The message of an error body: OpenAI-style ``{"error": {"message"}}``, ``{"detail"}``, else the text."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return _short(text)
    if isinstance(obj, dict):
        err = obj.get("error")
        if isinstance(err, dict) and "message" in err:
            return _short(err["message"])
        if isinstance(err, str):
            return _short(err)
        for key in ("message", "detail"):
            if key in obj:
                return _short(obj[key])
    return _short(text)


class _Watchdog:
    """One thread that shuts down the socket of every request past its deadline, or of every request once its
    stop event is set; it runs only while requests are in flight."""

    def __init__(self):
        self._lock = threading.Lock()
        self._active: dict = {}
        self._thread = None

    def add(self, key, sock, deadline: float, stop) -> None:
        with self._lock:
            self._active[key] = (sock, deadline, stop)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fastspec-http-watchdog", daemon=True)
                self._thread.start()

    def remove(self, key) -> None:
        with self._lock:
            self._active.pop(key, None)

    def _run(self) -> None:
        while True:
            time.sleep(_POLL_S)
            with self._lock:
                if not self._active:
                    self._thread = None
                    return
                now = time.monotonic()
                fire = [k for k, (_s, d, stop) in self._active.items() if now >= d or (stop is not None
                                                                                        and stop.is_set())]
                for k in fire:   # under the lock: the owner closes its socket only after remove()
                    try:
                        self._active.pop(k)[0].shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass


_WATCHDOG = _Watchdog()


class _Late(Exception):
    """The request's deadline passed."""


class HttpClient:
    """JSON over HTTP to one server.

    ``name``: how messages call it (e.g. ``"target"`` or ``"draft 'q4'"``); ``base_url``: ``http://host:port``
    (any URL the user gives, loopback or not); ``timeout``: a deadline in seconds for each request as a whole
    (connect, send, headers, body; each retry gets a fresh one), in (0, 86400]; ``retries``: extra attempts on
    transient failures; ``backoff``: first wait in seconds; ``concurrency``: at most this many requests of this
    client in flight at once (a semaphore: callers in several threads queue); ``stop``: a
    :class:`threading.Event` that, once set, ends every attempt and back-off (:class:`Stopped`).  ``sleep`` is
    injectable for tests (default: wait on ``stop``).
    """

    def __init__(self, name: str, base_url: str, *, timeout: float = 600.0, retries: int = 3, backoff: float = 0.5,
                 concurrency: int = 4, api_key: str | None = None, sleep=None, stop: threading.Event | None = None):
        self.name = name
        self.base_url = check_url(base_url, f"{name} URL")
        self.timeout = check_timeout(timeout)
        if isinstance(retries, bool) or int(retries) != retries or retries < 0:
            raise InvalidInput(f"retries = {retries!r} must be an integer >= 0")
        if isinstance(concurrency, bool) or int(concurrency) != concurrency or concurrency < 1:
            raise InvalidInput(f"concurrency = {concurrency!r} must be an integer >= 1")
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not 0 <= backoff <= 30:
            raise InvalidInput(f"backoff = {backoff!r} must be a number of seconds in [0, 30]")
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.api_key = api_key
        self.stop = stop if stop is not None else threading.Event()
        self._slots = threading.BoundedSemaphore(int(concurrency))
        self._sleep = sleep if sleep is not None else self.stop.wait
        parts = urllib.parse.urlsplit(self.base_url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self.requests = 0   # attempts made (for tests and progress)
        self.retried = 0    # attempts that were retries

    def where(self, path: str) -> str:
        return f"{self.name} server {self.base_url}, {path}"

    def get(self, path: str, what: str | None = None, max_bytes: int | None = None):
        return self._request("GET", path, None, what, max_bytes)

    def post(self, path: str, body, what: str | None = None, max_bytes: int | None = None):
        return self._request("POST", path, body, what, max_bytes)

    # ------------------------------------------------------------------------------------------------ one attempt
    def _connect(self, deadline: float, key):
        """A connected socket; the connect is polled so that the deadline and the stop event end it."""
        err = None
        infos = socket.getaddrinfo(self._host, self._port, 0, socket.SOCK_STREAM)
        for af, kind, proto, _name, addr in infos:
            sock = socket.socket(af, kind, proto)
            try:
                sock.setblocking(False)
                rc = sock.connect_ex(addr)
                if rc in _PENDING:
                    with selectors.DefaultSelector() as sel:
                        sel.register(sock, selectors.EVENT_WRITE)
                        while True:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                raise _Late
                            if self.stop.is_set():
                                raise Stopped(f"{self.name} server {self.base_url}: stopped")
                            if sel.select(min(left, _POLL_S)):
                                rc = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                                break
                if rc:
                    raise OSError(rc, os.strerror(rc))  # ConnectionRefusedError and its kin
                sock.setblocking(True)
                _WATCHDOG.add(key, sock, deadline, self.stop)
                if self._https:
                    sock.settimeout(max(1e-3, deadline - time.monotonic()))
                    sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._host)
                    _WATCHDOG.add(key, sock, deadline, self.stop)
                return sock
            except (OSError, _Late, Stopped) as exc:
                _WATCHDOG.remove(key)
                sock.close()
                if not isinstance(exc, OSError):
                    raise
                err = exc
        raise err if err is not None else OSError(f"no address for {self._host}")

    def _once(self, method: str, path: str, data: bytes | None, max_bytes: int):
        """(status, body bytes) of one attempt; the body is read to ``max_bytes`` at most (an error body to 64 KiB)."""
        deadline = time.monotonic() + self.timeout
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        key = object()
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=self.timeout)
        sock = resp = None
        try:
            sock = conn.sock = self._connect(deadline, key)
            sock.settimeout(max(1e-3, deadline - time.monotonic()))
            conn.request(method, self._prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
            status = resp.status
            limit = max_bytes if 200 <= status < 300 else 65536
            length = resp.getheader("Content-Length")
            if 200 <= status < 300 and length is not None and length.strip().isdigit() and int(length) > limit:
                raise ServerError(f"the response is {int(length)} bytes, more than the {limit} bytes an answer to "
                                  "this request may take")
            chunks, got = [], 0
            while got <= limit:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _Late
                sock.settimeout(left)
                chunk = resp.read1(_CHUNK)
                if self.stop.is_set():
                    raise Stopped("stopped")
                if time.monotonic() > deadline:
                    raise _Late
                if not chunk:
                    if resp.length:   # read1 does not raise on a body cut short of its Content-Length
                        raise http.client.IncompleteRead(b"".join(chunks), resp.length)
                    break
                got += len(chunk)
                chunks.append(chunk)
            if got > limit:
                if not 200 <= status < 300:
                    return status, b"".join(chunks)[:limit], resp.getheader("Location")
                raise ServerError(f"the response is more than the {limit} bytes an answer to this request may take")
            return status, b"".join(chunks), resp.getheader("Location")
        finally:
            _WATCHDOG.remove(key)
            if resp is not None:
                resp.close()
            conn.close()
            if sock is not None:
                sock.close()

    def _request(self, method: str, path: str, body, what: str | None, max_bytes: int | None):
        label = f"{method} {path}" + (f" ({what})" if what else "")
        head = f"{self.name} server {self.base_url}: {label}"
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        limit = BODY_SLACK if max_bytes is None else int(max_bytes)
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
                self._sleep(min(30.0, self.backoff * 2 ** (attempt - 1)))
            if self.stop.is_set():
                raise Stopped(f"{head}: stopped (interrupted)")
            with self._slots:
                self.requests += 1
                t0 = time.monotonic()
                try:
                    status, raw, location = self._once(method, path, data, limit)
                except Stopped:
                    raise Stopped(f"{head}: stopped (interrupted)") from None
                except ServerError as exc:
                    raise ServerError(f"{head}: {exc}") from None
                except (_Late, socket.timeout, TimeoutError):
                    if self.stop.is_set():
                        raise Stopped(f"{head}: stopped (interrupted)") from None
                    last = f"no complete answer within the {self.timeout:g} s deadline"
                    continue
                except (ConnectionError, http.client.HTTPException, OSError, ssl.SSLError, ValueError) as exc:
                    if self.stop.is_set():
                        raise Stopped(f"{head}: stopped (interrupted)") from None
                    if time.monotonic() - t0 >= self.timeout:
                        last = f"no complete answer within the {self.timeout:g} s deadline"
                    else:
                        last = _short(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
                    continue
            if not 200 <= status < 300:
                text = _error_text(raw)
                msg = f"HTTP {status}" + (f": {text}" if text else "")
                if status == 429 or status >= 500:
                    last = msg
                    continue
                if 300 <= status < 400:
                    msg += f" (a redirect{' to ' + _short(location, 80) if location else ''}: not followed; give " \
                           "the server's own URL)"
                raise ServerError(f"{head}: {msg}", status=status, body=text)
            try:
                return json.loads(raw)
            except (ValueError, RecursionError):
                raise ServerError(f"{head}: the response is not JSON "
                                  f"({_short(raw.decode('utf-8', 'replace'), 80)!r})") from None
        tries = f"after {self.retries + 1} attempts" if self.retries else "(no retries)"
        raise ServerError(f"{head}: {last} {tries}")


def finite_or_none(x):
    """``x`` if it is a finite real number, else None (for metadata fields copied from a server's answer)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return x if math.isfinite(x) else None
