"""The registries of verification methods and of candidate sampling: one list of names each, used by the
kernels' wrappers, the simulator, the exact path and the command line."""
from __future__ import annotations

from .errors import InvalidInput

__all__ = ["VERIFICATION_METHODS", "CANDIDATE_SAMPLING", "check_method", "check_candidate_sampling"]

#: name -> what it is (``verify_logits(method=...)``, ``simulate(verify=...)``, the exact enumerations)
VERIFICATION_METHODS = {
    "token": "token-by-token rejection sampling (Leviathan et al. 2023; Chen et al. 2023)",
    "block": "block verification (Sun et al. 2024, arXiv 2403.10444): judges the drafted block jointly",
}

#: name -> how the candidates of a tree node were proposed (``verify_tree_probs(candidate_sampling=...)``); the
#: kernels' integer codes are fastspec._kernels.codes.CANDIDATE_CODES
CANDIDATE_SAMPLING = {
    "iid": "drawn i.i.d. from the node's draft distribution (SpecInfer)",
    "without_replacement": "drawn one after another from the draft without the earlier siblings "
                           "(recursive speculative decoding)",
    "deterministic": "chosen without randomness (top-w of the draft, n-gram or prompt-lookup trees): point masses",
}


def check_method(method, allowed=None, *, name: str = "method") -> str:
    """``method`` if it names a verification method (of ``allowed``, default all), else InvalidInput (the
    argument is called ``name`` in the message)."""
    names = tuple(allowed or VERIFICATION_METHODS)
    if not isinstance(method, str) or method not in names:
        raise InvalidInput(f"{name} {method!r} is unknown; choose one of: {', '.join(map(repr, names))} (" + "; ".join(
            f"{n}: {VERIFICATION_METHODS[n]}" for n in names if n in VERIFICATION_METHODS) + ")")
    return method


def check_candidate_sampling(candidate_sampling, allowed=None, *, why: str = "") -> str:
    """``candidate_sampling`` if it names a candidate-sampling scheme (of ``allowed``, default all), else
    InvalidInput."""
    names = tuple(allowed or CANDIDATE_SAMPLING)
    if not isinstance(candidate_sampling, str) or candidate_sampling not in names:
        raise InvalidInput(f"candidate sampling {candidate_sampling!r} is not supported here; choose one of: "
                           f"{', '.join(names)}{why}")
    return candidate_sampling

