"""fastspec: exact, fast and checkable speculative-decoding verification on the CPU.

The library never imports typer, rich, torch or matplotlib; those belong to the
CLI (``fastspec_cli``) or to optional extras.
"""
from __future__ import annotations

__version__ = "0.1.0"

from . import exact  # noqa: F401  (the Fraction reference path)
from ._rng import row_seeds  # noqa: F401
from ._process import probabilities  # noqa: F401
from .verify import VerifyResult, verify_logits, verify_probs  # noqa: F401
from .candidates import (TreeVerifyResult, candidate_acceptance, verify_tree_logits,  # noqa: F401
                         verify_tree_probs)
from .acceptance import (acceptance_bounds, acceptance_rates, dump_acceptance, expected_speedup,  # noqa: F401
                         expected_tokens_closed_form, expected_tokens_per_step, optimal_k)
from .io import load_dump, save_dump  # noqa: F401
from .shards import ShardedDump, load_any  # noqa: F401  (dask itself is imported only when a client is used)
