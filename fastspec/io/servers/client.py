"""One HTTP client per server: timeouts, bounded concurrency, retries with exponential back-off.

Standard library only (``urllib``).  Transient failures -- connection refused or reset, a timeout, HTTP 429 and
5xx -- are retried up to ``retries`` times with back-off ``backoff * 2**attempt`` seconds (capped at 30 s);
any other 4xx is never retried.  Every failure that remains is a :class:`ServerError` whose one-line message
names the server (its role and URL) and the request.
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from ...errors import FastspecError, InvalidInput

__all__ = ["ServerError", "HttpClient", "check_url"]

_MAX_BODY = 1 << 30  # a response larger than 1 GiB is refused, never read whole


class ServerError(FastspecError, RuntimeError):
    """A server failed to answer a request usefully (a runtime failure: exit 1 on the command line)."""

    def __init__(self, message: str, *, status: int | None = None, body: str = ""):
        super().__init__(message)
        self.status = status
        self.body = body


def check_url(url: str, what: str = "server URL") -> str:
    """``url`` without a trailing slash when it is an http(s) URL with a host; InvalidInput otherwise."""
    if not isinstance(url, str):
        raise InvalidInput(f"{what} must be a string, got {type(url).__name__}")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{what} {url!r}: give an http:// or https:// URL with a host, e.g. "
                           "http://127.0.0.1:8000")
    try:
        _ = parts.port
    except ValueError:
        raise InvalidInput(f"{what} {url!r}: the port is not a number in [0, 65535]") from None
    return url.strip().rstrip("/")


def _short(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _error_text(body: bytes) -> str:
    """The message of an error body: OpenAI-style ``{"error": {"message"}}``, ``{"detail"}``, else the text."""
    text = body.decode("utf-8", "replace")
    try:
        obj = json.loads(text)
    except ValueError:
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


class HttpClient:
    """JSON over HTTP to one server.

    ``name``: how messages call it (e.g. ``"target"`` or ``"draft 'q4'"``); ``base_url``: ``http://host:port``
    (any URL the user gives, loopback or not); ``timeout``: seconds per request (connect and each read);
    ``retries``: extra attempts on transient failures; ``backoff``: first wait in seconds; ``concurrency``: at
    most this many requests of this client in flight at once (a semaphore: callers in several threads queue).
    ``sleep`` is injectable for tests.
    """

    def __init__(self, name: str, base_url: str, *, timeout: float = 600.0, retries: int = 3, backoff: float = 0.5,
                 concurrency: int = 4, api_key: str | None = None, sleep=time.sleep):
        self.name = name
        self.base_url = check_url(base_url, f"{name} URL")
        if not (timeout > 0):
            raise InvalidInput(f"timeout = {timeout!r} must be > 0 seconds")
        if int(retries) != retries or retries < 0:
            raise InvalidInput(f"retries = {retries!r} must be an integer >= 0")
        if int(concurrency) != concurrency or concurrency < 1:
            raise InvalidInput(f"concurrency = {concurrency!r} must be an integer >= 1")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.api_key = api_key
        self._slots = threading.BoundedSemaphore(int(concurrency))
        self._sleep = sleep
        self.requests = 0   # attempts made (for tests and progress)
        self.retried = 0    # attempts that were retries

    def where(self, path: str) -> str:
        return f"{self.name} server {self.base_url}, {path}"

    def get(self, path: str, what: str | None = None):
        return self._request("GET", path, None, what)

    def post(self, path: str, body, what: str | None = None):
        return self._request("POST", path, body, what)

    def _once(self, method: str, path: str, data: bytes | None):
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - the user's own server
            raw = resp.read(_MAX_BODY + 1)
        if len(raw) > _MAX_BODY:
            raise ServerError(f"{self.where(path)}: the response is larger than 1 GiB")
        return raw

    def _request(self, method: str, path: str, body, what: str | None):
        label = f"{method} {path}" + (f" ({what})" if what else "")
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
                self._sleep(min(30.0, self.backoff * 2 ** (attempt - 1)))
            with self._slots:
                self.requests += 1
                try:
                    raw = self._once(method, path, data)
                except urllib.error.HTTPError as exc:
                    try:
                        text = _error_text(exc.read(65536))
                    except (OSError, http.client.HTTPException):
                        text = ""
                    msg = f"HTTP {exc.code}" + (f": {text}" if text else "")
                    if exc.code == 429 or exc.code >= 500:
                        last = msg
                        continue
                    raise ServerError(f"{self.name} server {self.base_url}: {label}: {msg}", status=exc.code,
                                      body=text) from None
                except (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError,
                        http.client.HTTPException, OSError) as exc:
                    reason = getattr(exc, "reason", exc)
                    last = f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
                    last = _short(last)
                    continue
            try:
                return json.loads(raw)
            except ValueError:
                raise ServerError(f"{self.name} server {self.base_url}: {label}: the response is not JSON "
                                  f"({_short(raw.decode('utf-8', 'replace'), 80)!r})") from None
        tries = f"after {self.retries + 1} attempts" if self.retries else "(no retries)"
        raise ServerError(f"{self.name} server {self.base_url}: {label}: {last} {tries}")
