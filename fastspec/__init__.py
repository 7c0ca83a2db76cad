"""fastspec: exact, fast and checkable speculative-decoding verification on the CPU, and offline what-if
analysis of draft models from logit dumps.

The library never imports typer, rich, torch or matplotlib; those belong to the command line (``fastspec_cli``)
or to optional extras (``fastspec.hf`` needs torch; it is not imported here).  The simulator is the package
:mod:`fastspec.simulation`; its entry point is the function ``fastspec.simulate(dump, k=4)`` (or with a
:class:`fastspec.simulation.SimulateConfig`).
"""
from __future__ import annotations

from ._version import __version__

from . import exact, ngram
from ._numba.rng import row_seeds
from .acceptance import DraftAcceptance, acceptance_bounds, acceptance_rates, dump_acceptance
from .analysis import SpecStats, expected_speedup, expected_tokens_closed_form, expected_tokens_per_step, optimal_k
from .candidates import (TreeVerifyResult, candidate_acceptance, parent_from_siblings, verify_tree_logits,
                         verify_tree_probs)
from .audit import AuditResult, OutputAudit, audit_output
from .errors import (ClusterError, DumpFormatError, DumpNotFound, FastspecError, InvalidInput, InvalidType,
                     MissingExtra)
from .io import Dump, ShardedDump, load_dump, open_dump, save_dump
from .ngram import NgramProposer
from .params import SamplingParams
from .processing import probabilities, sample_tokens
from .verify import VerifyResult, verify_logits, verify_probs
from . import simulation  # noqa: E402
from .simulation import DraftKResult, SimulateConfig, SimulationResult, simulate

__all__ = [
    "__version__",
    # verification
    "verify_logits", "verify_probs", "VerifyResult", "verify_tree_probs", "verify_tree_logits", "TreeVerifyResult",
    "parent_from_siblings", "candidate_acceptance", "row_seeds", "ngram", "NgramProposer",
    # processing
    "probabilities", "sample_tokens", "SamplingParams",
    # acceptance and expected figures
    "acceptance_rates", "acceptance_bounds", "dump_acceptance", "DraftAcceptance", "expected_tokens_per_step",
    "SpecStats", "expected_tokens_closed_form", "expected_speedup", "optimal_k",
    # dumps and simulation
    "open_dump", "load_dump", "save_dump", "Dump", "ShardedDump", "simulate", "simulation", "SimulateConfig",
    "SimulationResult", "DraftKResult",
    # auditing an engine's output (same distribution as the target's)
    "audit_output", "OutputAudit", "AuditResult",
    # the exact path and errors
    "exact", "FastspecError", "InvalidInput", "InvalidType", "DumpFormatError", "DumpNotFound", "ClusterError",
    "MissingExtra",
]
