"""What the real-model commands (``dump``, ``measure``) share: importing the hf extra, and checking their common
options before any model is loaded."""
from __future__ import annotations

import os
from typing import Optional

from ._common import EXIT_RUNTIME, fail
from ._options import option_errors


def import_hf():
    """fastspec.hf (transformers set to offline and quiet), or a one-line error (exit 1) naming the extra."""
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        from fastspec import hf

        hf.quiet_logging()
    except ImportError as exc:
        fail(f"this command needs torch and transformers ({exc}); install the extra: pip install 'fastspec[hf]' "
             "(CPU torch: pip install torch==2.13.0)", EXIT_RUNTIME)
    return hf


def check_options(hf, *, max_new_tokens: int, prompts: str, threads: Optional[int],
                  top_k_save: Optional[int]) -> None:
    """The options dump and measure share (models are loaded only after these pass); sets torch's threads."""
    from fastspec.hf.args import check_max_new_tokens, positive_int

    if not os.path.isfile(prompts):
        fail(f"--prompts {prompts}: no such file (one prompt per line, or .jsonl with chat messages)")
    with option_errors("--max-new-tokens"):
        check_max_new_tokens(max_new_tokens)
    if top_k_save is not None:
        with option_errors("--top-k-save"):
            positive_int("top_k_save", top_k_save)
    with option_errors("--threads"):
        hf.set_threads(threads)
