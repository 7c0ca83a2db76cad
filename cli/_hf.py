"""What the real-model commands (``dump``, ``measure``, ``cost``) share: importing the hf extra, checking their
common options before any model is loaded, loading the models with progress, the EOS option, and SIGTERM handled
like Ctrl-C (so temporary files are removed)."""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Optional

import typer

from ._common import progress_bar, stderr_console
from ._options import FlagError, check_threads, option_errors


def import_hf():
    """fastspec.hf (transformers set to offline and quiet); without the extra, :class:`fastspec.errors.MissingExtra`
    naming it (the error boundary prints its one line, exit 1).

    Before torch (or Numba's thread pool) starts, OpenMP's idle threads are told to sleep rather than spin
    (``OMP_WAIT_POLICY=PASSIVE`` unless the environment says otherwise): torch and Numba share the OpenMP runtime,
    and on a busy machine spinning threads made a 135M-parameter decode step 4x slower and a sampling call 20x
    slower."""
    try:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from fastspec import hf

        hf.quiet_logging()
    except ImportError as exc:
        from fastspec.errors import MissingExtra

        raise MissingExtra(f"this command needs torch and transformers ({exc}); install the extra: pip install "
                           "'fastspec[hf]' (CPU torch: pip install torch==2.13.0)") from exc
    return hf


def check_options(*, prompts: str, threads: Optional[int]) -> None:
    """The options dump and measure share that their library configs do not hold, checked before torch is imported
    (so before any model is loaded): the prompts file exists, --threads (every other flag: the command's one table
    onto the library's config)."""
    if not os.path.isfile(prompts):
        raise FlagError(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")
    check_threads(threads)


def set_threads(hf, threads: Optional[int]) -> None:
    """torch's (and Numba's) thread count: --threads, already checked by :func:`check_threads`."""
    with option_errors("--threads"):
        hf.set_threads(threads)


def check_drafts(hf, drafts) -> dict:
    """{name: MODEL} of the --draft options, checked before any model is loaded: distinct valid names, and every
    n-gram specification parsed by the library's one parser (fastspec.hf.parse_ngram_spec, simulate's
    parse_ngram_draft, with its bounds); else one line naming --draft and the specification (exit 2)."""
    with option_errors("--draft"):
        return hf.parse_draft_specs(drafts)


def ignore_eos_option():
    return typer.Option(False, "--ignore-eos", help="Do not stop a row at an end-of-sequence token: every row runs "
                        "to --max-new-tokens (fixed-length runs, like vLLM's ignore_eos); recorded.")


def eos_ids(hf, model, tokenizer, ignore_eos: bool):
    """The EOS ids a run stops at: none with --ignore-eos, else the model's."""
    return None if ignore_eos else hf.eos_ids(model, tokenizer)


def load_models(hf, target: str, drafts):
    """(target, tokenizer, {name: draft}) with a progress line per model file when stderr is not a terminal
    (loading a model takes seconds to minutes)."""
    specs = hf.parse_draft_specs(drafts) if drafts else {}
    start, advance, _, stop = progress_bar(stderr_console(), "loading models", hf.model_files(specs), every=1)
    start()
    try:
        return hf.resolve_models(target, specs, progress=advance)
    finally:
        stop()


@contextmanager
def sigterm_as_interrupt():
    """While active (main thread only), SIGTERM raises KeyboardInterrupt like Ctrl-C, so ``finally`` blocks run
    (a killed ``dump`` removes its staging directory); the previous handler is restored on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(_signum, _frame):
        raise KeyboardInterrupt

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
