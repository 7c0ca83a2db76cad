"""One line on stderr while Numba compiles fastspec's kernels for more than about a second.

Compiled kernels are cached (see ``fastspec._numba.jit``), so this happens on the first run on a machine (or
after an upgrade) only.  A Numba compile event listener starts a timer when the first fastspec kernel starts
compiling and cancels it when no compilation is in progress; if it fires, the line is printed once.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

MESSAGE = ("fastspec: compiling the kernels for this machine (first run only; later runs load them from the cache "
           "in well under a second)")


def _listener_class():
    from numba.core import event

    class CompileNotice(event.Listener):
        def __init__(self, delay: float):
            self.delay = delay
            self.depth = 0
            self.timer = None
            self.shown = False
            self.lock = threading.Lock()

        def _ours(self, ev) -> bool:
            func = getattr(ev.data.get("dispatcher"), "py_func", None) if isinstance(ev.data, dict) else None
            return getattr(func, "__module__", "").startswith("fastspec")

        def on_start(self, ev):
            with self.lock:
                self.depth += 1
                if self.shown or self.timer is not None or not self._ours(ev):
                    return
                self.timer = threading.Timer(self.delay, self._show)
                self.timer.daemon = True
                self.timer.start()

        def on_end(self, _ev):
            with self.lock:
                self.depth = max(0, self.depth - 1)
                if self.depth == 0 and self.timer is not None:
                    self.timer.cancel()
                    self.timer = None

        def _show(self):
            with self.lock:
                if self.shown or self.depth == 0:
                    return
                self.shown = True
            sys.stderr.write(MESSAGE + "\n")
            sys.stderr.flush()

    return CompileNotice


@contextmanager
def compile_notice(delay: float = 1.0):
    """While active, announce kernel compilation that lasts longer than ``delay`` seconds (once)."""
    from numba.core import event

    listener = _listener_class()(delay)
    with event.install_listener("numba:compile", listener):
        try:
            yield listener
        finally:
            if listener.timer is not None:
                listener.timer.cancel()
